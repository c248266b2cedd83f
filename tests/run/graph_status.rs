//! `prodigy graph --status ID`: the plan with a run's state on it, for a finished job, a job
//! still writing its events, an unknown id and a workflow changed since the run.

use super::{Scratch, Value};

const WORKFLOW: &str = r#"name: graph-status
mode: mapreduce
map:
  input: "seq 1 3"
  agent_template:
    - shell: "test \"$ITEM\" != 2"
      on_failure:
        shell: "echo item $ITEM failed"
    - shell: "echo item $ITEM done"
error_policy:
  retry_config:
    max_attempts: 2
    backoff:
      fixed:
        delay: 10ms
reduce:
  - shell: "echo '${map.successful} ok'"
"#;

/// Runs the workflow to its end in a fresh scratch; returns the scratch and the job's id.
fn finished_job() -> (Scratch, String) {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("graph-status.yml"), WORKFLOW).unwrap();
    let run = scratch.run(
        &["run", "graph-status.yml", "-y", "--max-parallel", "1"],
        &[],
    );
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    let id = scratch
        .events()
        .iter()
        .find_map(|e| e["job_id"].as_str().map(str::to_owned))
        .unwrap();
    (scratch, id)
}

fn graph(scratch: &Scratch, args: &[&str]) -> (i32, String, String) {
    let out = scratch.run(args, &[]);
    (
        out.status.code().unwrap(),
        scratch.normalize(&String::from_utf8_lossy(&out.stdout)),
        scratch.normalize(&String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn a_finished_job_is_drawn_with_each_nodes_state_and_counts() {
    let (scratch, id) = finished_job();
    let (code, dot, stderr) = graph(&scratch, &["graph", "--status", &id]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "");
    insta::assert_snapshot!("graph_status_finished_dot", dot);
    let (_, mermaid, _) = graph(&scratch, &["graph", "--status", &id, "--format", "mermaid"]);
    insta::assert_snapshot!("graph_status_finished_mermaid", mermaid);
    let (_, json, _) = graph(&scratch, &["graph", "--status", &id, "--format", "json"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    let status = |label: &str| {
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["label"].as_str().unwrap().contains(label))
            .unwrap()["status"]
            .clone()
    };
    // Item 2 fails its first step in both of its runs and goes to the DLQ.
    assert_eq!(status("test \"$ITEM\" != 2")["items_ran"], 3);
    assert_eq!(status("test \"$ITEM\" != 2")["items_failed"], 1);
    assert_eq!(status("item failed")["count"], 2);
    assert_eq!(status("dead letter queue")["items_failed"], 1);
    assert_eq!(status("reduce")["state"], "succeeded");
    assert_eq!(status("success")["state"], "succeeded");
}

/// Items that went through the DLQ and left it (cleared here) still mark it reached.
#[test]
fn a_dlq_emptied_after_the_job_is_drawn_as_reached() {
    let (scratch, id) = finished_job();
    let cleared = scratch.run(&["dlq", "clear", "-y", &id], &[]);
    assert_eq!(cleared.status.code(), Some(0), "{cleared:?}");
    let (_, json, _) = graph(&scratch, &["graph", "--status", &id, "--format", "json"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    let dlq = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["label"] == "dead letter queue")
        .unwrap()["status"]
        .clone();
    assert_eq!(dlq["state"], "succeeded", "{dlq}");
    assert_eq!(dlq["note"], "1 item went through, none left", "{dlq}");
}

#[test]
fn a_job_still_writing_its_events_is_drawn_as_far_as_it_got() {
    let (scratch, id) = finished_job();
    // The job as it stood while its map phase ran: the events up to the second item's
    // first step, and half of the next line, not yet ended.
    let mut files = Vec::new();
    super::collect_files(&scratch.home().join("events"), &mut files);
    let file = files
        .into_iter()
        .find(|f| f.to_string_lossy().contains(&id))
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines
        .iter()
        .position(|l| l.contains("\"item_id\":\"item_1\"") && l.contains("step_started"))
        .unwrap();
    let mut partial = lines[..=cut].join("\n");
    partial.push('\n');
    partial.push_str(&lines[cut + 1][..10]);
    std::fs::write(&file, partial).unwrap();
    let (code, _, stderr) = graph(&scratch, &["graph", "--status", &id, "--format", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let (_, json, _) = graph(&scratch, &["graph", "--status", &id, "--format", "json"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    let state = |label: &str| {
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["label"].as_str().unwrap().contains(label))
            .unwrap()["status"]["state"]
            .clone()
    };
    assert_eq!(state("map: one agent"), "running");
    assert_eq!(state("test \"$ITEM\" != 2"), "running");
    assert_eq!(state("reduce"), "not_reached");
    assert_eq!(state("success"), "not_reached");
}

#[test]
fn an_unknown_id_names_the_ids_there_are() {
    let (scratch, id) = finished_job();
    let (code, stdout, stderr) = graph(&scratch, &["graph", "--status", "mapreduce-1-ffff"]);
    assert_eq!(code, 2);
    assert_eq!(stdout, "");
    assert!(stderr.contains("no run or job `[job]`"), "{stderr}");
    assert!(stderr.contains("`prodigy ls` lists them"), "{stderr}");
    assert!(stderr.contains(&scratch.normalize(&id)), "{stderr}");
}

#[test]
fn a_workflow_changed_since_the_run_is_drawn_with_a_warning() {
    let (scratch, id) = finished_job();
    let changed = WORKFLOW.replace("echo item $ITEM done", "echo item $ITEM finished");
    std::fs::write(scratch.project().join("graph-status.yml"), changed).unwrap();
    let (code, stdout, stderr) = graph(&scratch, &["graph", "--status", &id]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("digraph"), "{stdout}");
    assert_eq!(
        stderr,
        "warning: `[project]/graph-status.yml` changed since `[job]` started: the plan drawn may differ from the one it ran\n"
    );
}

#[test]
fn a_large_events_file_is_read_in_bounded_memory() {
    if !super::external::tool_available(
        "a_large_events_file_is_read_in_bounded_memory",
        "prlimit",
        "util-linux",
    ) {
        return;
    }
    let (scratch, id) = finished_job();
    let mut files = Vec::new();
    super::collect_files(&scratch.home().join("events"), &mut files);
    let file = files
        .into_iter()
        .find(|f| f.to_string_lossy().contains(&id))
        .unwrap();
    // 40 MiB of events the graph does not read (an agent's output lines), before the job's
    // own: read whole, as the command once did, they alone take more than the limit below.
    let mut text = String::new();
    let line = format!(
        r#"{{"timestamp":"2026-11-26T10:00:00.000Z","event_type":"command_output","line":"{}","agent_id":"agent-0","item_id":"item_0"}}"#,
        "x".repeat(300)
    );
    while text.len() < 40 << 20 {
        text.push_str(&line);
        text.push('\n');
    }
    text.push_str(&std::fs::read_to_string(&file).unwrap());
    std::fs::write(&file, text).unwrap();
    // At most 64 MiB of data (heap) for the process.
    let out = std::process::Command::new("prlimit")
        .arg(format!("--data={}", 64 << 20))
        .arg("--")
        .arg(assert_cmd::cargo::cargo_bin("prodigy"))
        .args(["graph", "--status", &id, "--format", "json"])
        .current_dir(scratch.project())
        .env("PRODIGY_HOME", scratch.home())
        .output()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dlq = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["label"].as_str().unwrap().contains("dead letter queue"))
        .unwrap();
    assert_eq!(dlq["status"]["items_failed"], 1);
}

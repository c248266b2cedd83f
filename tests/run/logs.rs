//! What a run keeps of every step's output (`prodigy logs ID`, `--step N`), and the run's
//! result (the reduce phase's output, a standard run's last step's) shown at normal
//! verbosity.

use super::Scratch;
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The run's id on its last line (`session …` or `job …`).
fn run_id(output: &Output) -> String {
    let text = stderr(output);
    regex::Regex::new(r"(session|mapreduce)-[0-9]+-[0-9a-f]+")
        .unwrap()
        .find_iter(&text)
        .last()
        .unwrap_or_else(|| panic!("no run id in:\n{text}"))
        .as_str()
        .to_owned()
}

const STANDARD: &str = "\
name: kept
commands:
  - shell: \"echo first-out; echo first-err >&2\"
  - shell: \"echo second-out; exit 3\"
    on_failure: true
  - shell: \"echo the-result\"
";

#[test]
fn a_standard_run_shows_its_last_steps_output_and_keeps_every_steps() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("wf.yml"), STANDARD).unwrap();
    let run = scratch.run(&["run", "--no-worktree", "wf.yml"], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    // At normal verbosity only the last step's output, on stdout.
    assert_eq!(stdout(&run), "the-result\n");
    let quiet = scratch.run(&["run", "-q", "--no-worktree", "wf.yml"], &[]);
    assert_eq!(stdout(&quiet), "");

    let id = run_id(&run);
    let listed = stdout(&scratch.run(&["logs", &id], &[]));
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(
        lines[0].starts_with("steps/step 1  [1] echo first-out"),
        "{listed}"
    );
    assert!(lines[0].contains("succeeded in "), "{listed}");
    assert!(lines[0].ends_with(", 20 bytes of output"), "{listed}");
    assert!(
        lines[1].starts_with("steps/step 2  [2] echo second-out; exit 3  ignored in "),
        "{listed}"
    );
    assert!(
        lines[2].starts_with("steps/step 3  [3] echo the-result  succeeded"),
        "{listed}"
    );

    let first = scratch.run(&["logs", &id, "--step", "1"], &[]);
    assert_eq!(stdout(&first), "first-out\nfirst-err\n");
    let second = scratch.run(&["logs", &id, "--step", "2"], &[]);
    assert_eq!(stdout(&second), "second-out\n");
    let missing = scratch.run(&["logs", &id, "--step", "7"], &[]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("has no step 7"),
        "{}",
        stderr(&missing)
    );

    let runs = stdout(&scratch.run(&["logs"], &[]));
    assert!(runs.contains(&format!("{id}  0 logs, 3 steps")), "{runs}");
}

const JOB: &str = "\
name: kept-job
mode: mapreduce
map:
  input: items.json
  agent_template:
    - shell: \"echo agent ${item.n}\"
    - shell: \"echo second ${item.n}; echo oops >&2\"
reduce:
  - shell: \"echo reduced ${map.successful} of ${map.total}\"
";

#[test]
fn a_job_shows_its_reduce_output_and_keeps_each_items_steps() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("wf.yml"), JOB).unwrap();
    std::fs::write(
        scratch.project().join("items.json"),
        r#"[{"n": 1}, {"n": 2}]"#,
    )
    .unwrap();
    let run = scratch.run(&["run", "--no-worktree", "wf.yml"], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    // The agents' output needs `-v`; the reduce phase's is the job's result.
    assert_eq!(stdout(&run), "reduced 2 of 2\n");

    let id = run_id(&run);
    let listed = stdout(&scratch.run(&["logs", &id], &[]));
    for line in [
        "item_0/step 1  [map 1] echo agent ${item.n}  succeeded",
        "item_0/step 2  [map 2] echo second ${item.n}; echo oops >&2  succeeded",
        "item_1/step 1  [map 1]",
        "item_1/step 2  [map 2]",
        "steps/step 1  [reduce 1] echo reduced",
    ] {
        assert!(listed.contains(line), "no `{line}` in:\n{listed}");
    }
    let item = stdout(&scratch.run(&["logs", &id, "--item", "item_1", "--step", "2"], &[]));
    assert_eq!(item, "second 2\noops\n");
    let only = stdout(&scratch.run(&["logs", &id, "--item", "item_0"], &[]));
    assert!(
        !only.contains("item_1") && !only.contains("steps/"),
        "{only}"
    );
    let reduce = stdout(&scratch.run(&["logs", &id, "--step", "1"], &[]));
    assert_eq!(reduce, "reduced 2 of 2\n");
}

/// Items are listed in their order, `item_2` before `item_10`, then the run's own steps.
#[test]
fn logs_list_items_in_their_order() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("wf.yml"), JOB).unwrap();
    let items: Vec<String> = (0..12).map(|n| format!("{{\"n\": {n}}}")).collect();
    std::fs::write(
        scratch.project().join("items.json"),
        format!("[{}]", items.join(", ")),
    )
    .unwrap();
    let run = scratch.run(&["run", "--no-worktree", "wf.yml"], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let id = run_id(&run);
    let listed = stdout(&scratch.run(&["logs", &id], &[]));
    let owners: Vec<&str> =
        listed
            .lines()
            .filter_map(|l| l.split('/').next())
            .fold(Vec::new(), |mut seen, o| {
                if seen.last() != Some(&o) {
                    seen.push(o);
                }
                seen
            });
    let expected: Vec<String> = (0..12)
        .map(|n| format!("item_{n}"))
        .chain(["steps".to_owned()])
        .collect();
    assert_eq!(owners, expected, "{listed}");
}

/// The run's logs directory, `logs/{repo}/{id}`.
fn logs_dir(scratch: &Scratch, id: &str) -> std::path::PathBuf {
    scratch.home().join("logs").join(scratch.repo()).join(id)
}

#[test]
fn a_map_of_silent_items_keeps_their_records_and_makes_no_directory_per_item() {
    let scratch = Scratch::new();
    let workflow = "\
name: quiet-job
mode: mapreduce
map:
  input: items.json
  max_parallel: 4
  agent_template:
    - shell: \"true\"
    - shell: \"test ${item.n} -ne 3 || echo three\"
";
    std::fs::write(scratch.project().join("wf.yml"), workflow).unwrap();
    let items: Vec<String> = (0..12).map(|n| format!(r#"{{"n": {n}}}"#)).collect();
    std::fs::write(
        scratch.project().join("items.json"),
        format!("[{}]", items.join(",")),
    )
    .unwrap();
    let run = scratch.run(&["run", "--no-worktree", "wf.yml"], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let id = run_id(&run);
    // Only the item that printed something has a directory, for its one output log.
    let dirs: Vec<String> = std::fs::read_dir(logs_dir(&scratch, &id))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs, ["item_3"]);
    let listed = stdout(&scratch.run(&["logs", &id], &[]));
    assert_eq!(listed.lines().count(), 24, "{listed}");
    for n in 0..12 {
        let line = format!("item_{n}/step 1  [map 1] true  succeeded in ");
        assert!(listed.contains(&line), "no `{line}` in:\n{listed}");
    }
    assert!(
        listed.contains("item_3/step 2  [map 2] test ${item.n} -ne 3 || echo three  succeeded")
            && listed.contains(", 6 bytes of output"),
        "{listed}"
    );
    let three = scratch.run(&["logs", &id, "--item", "item_3", "--step", "2"], &[]);
    assert_eq!(stdout(&three), "three\n");
    let quiet = scratch.run(&["logs", &id, "--item", "item_5", "--step", "2"], &[]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert!(
        stderr(&quiet).contains("printed nothing"),
        "{}",
        stderr(&quiet)
    );
    let runs = stdout(&scratch.run(&["logs"], &[]));
    assert!(runs.contains(&format!("{id}  0 logs, 24 steps")), "{runs}");
}

#[test]
fn the_step_files_of_an_earlier_version_are_still_shown() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("wf.yml"), STANDARD).unwrap();
    let run = scratch.run(&["run", "--no-worktree", "wf.yml"], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let id = run_id(&run);
    let listed = stdout(&scratch.run(&["logs", &id], &[]));
    // Kept as versions before kept them: a `step-NNNN.json` beside each step's output.
    let dir = logs_dir(&scratch, &id);
    let records = std::fs::read_to_string(dir.join("records.jsonl")).unwrap();
    for line in records.lines() {
        let mut record: serde_json::Value = serde_json::from_str(line).unwrap();
        let fields = record.as_object_mut().unwrap();
        let number = fields.remove("number").unwrap().as_u64().unwrap();
        assert_eq!(fields.remove("owner").unwrap(), "steps");
        std::fs::write(
            dir.join(format!("steps/step-{number:04}.json")),
            record.to_string(),
        )
        .unwrap();
    }
    std::fs::remove_file(dir.join("records.jsonl")).unwrap();
    let old = stdout(&scratch.run(&["logs", &id], &[]));
    assert_eq!(old, listed);
    assert!(
        old.contains("steps/step 2  [2] echo second-out; exit 3  ignored in "),
        "{old}"
    );
    let second = scratch.run(&["logs", &id, "--step", "2"], &[]);
    assert_eq!(stdout(&second), "second-out\n");
    let runs = stdout(&scratch.run(&["logs"], &[]));
    assert!(runs.contains(&format!("{id}  0 logs, 3 steps")), "{runs}");
}

//! Watching a run live (`prodigy status`, `prodigy ui`) while a slow job runs: a Claude
//! call's tool call shows as it streams, counts move, and the end is seen.

use std::time::Duration;

use serde_json::Value;

use super::{Scratch, stderr};

#[path = "../support/slow_job.rs"]
mod slow_job;

use slow_job::{job_id, slow_job};

fn status(scratch: &Scratch, id: &str) -> Value {
    let out = scratch.run(&["status", id, "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn status_shows_a_running_agents_claude_tool_call_then_the_finished_counts() {
    let scratch = Scratch::new();
    let mut child = slow_job(&scratch);
    let id = job_id(&scratch, &mut child);
    // Looked at again each time the run writes under the home, until an agent is seen
    // inside its Claude call, at a tool call.
    let mut seen = Value::Null;
    super::watch::until_changed_under(&scratch.home(), "a running Claude call", || {
        seen = status(&scratch, &id);
        seen["agents"]
            .as_array()
            .and_then(|a| a.first())
            .is_some_and(|agent| agent["tool"].is_string())
    });
    assert_eq!(seen["state"], "running");
    assert_eq!(seen["counts"]["total"], 3);
    let agent = &seen["agents"][0];
    assert!(agent["item_id"].as_str().unwrap().starts_with("item_"));
    assert_eq!(agent["step"], "/work on ${item}");
    assert!(agent["turns"].as_u64().unwrap() >= 1, "{agent}");
    assert!(agent["tool"].as_str().unwrap().starts_with("→ "), "{agent}");

    let out = child.finish();
    assert!(out.status.success(), "{}", stderr(&out));
    let end = status(&scratch, &id);
    assert_eq!(end["state"], "completed");
    assert_eq!(end["counts"]["succeeded"], 2);
    assert_eq!(end["counts"]["failed"], 1);
    assert_eq!(end["counts"]["dlq"], 1);
    assert_eq!(end["spend"]["calls"], 3);
    assert!(end["agents"].as_array().unwrap().is_empty());

    // Without an id: this repository's newest; as text.
    let out = scratch.run(&["status"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.starts_with(&format!("job {id} completed")), "{text}");
    assert!(
        text.contains(
            "items: 3/3 done (2 succeeded, 1 failed, 0 skipped), 0 running, 0 pending, 1 in DLQ"
        ),
        "{text}"
    );
    assert!(text.contains("Claude: 3 calls"), "{text}");
}

#[test]
fn status_of_an_unknown_id_is_a_usage_error() {
    let scratch = Scratch::new();
    let out = scratch.run(&["status", "mapreduce-1-00"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no run or job `mapreduce-1-00`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn status_watch_redraws_as_the_counts_change_and_ends_with_the_job() {
    use std::io::Read as _;
    let scratch = Scratch::new();
    let mut job = slow_job(&scratch);
    let id = job_id(&scratch, &mut job);
    let mut watch = scratch
        .command(&["status", &id, "--watch"], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its output, read on a thread until it ends, so the wait below is bounded.
    let mut stdout = watch.stdout.take().unwrap();
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = send.send(text);
    });
    let Ok(text) = receive.recv_timeout(Duration::from_mins(2)) else {
        let _ = watch.kill();
        let _ = watch.wait();
        panic!("`status --watch` did not end with the job");
    };
    let ended = watch.wait().unwrap();
    assert!(ended.success(), "{ended:?}");
    let job = job.finish();
    assert!(job.status.success(), "{}", stderr(&job));
    // Each redraw goes home first; the items line of each, in order.
    let redraws: Vec<&str> = text.split("\x1b[H").filter(|r| !r.is_empty()).collect();
    let done: Vec<u64> = redraws
        .iter()
        .filter_map(|r| {
            let line = r.lines().find(|l| l.starts_with("items: "))?;
            line["items: ".len()..].split('/').next()?.parse().ok()
        })
        .collect();
    assert_eq!(done.len(), redraws.len(), "{text:?}");
    assert!(done.len() >= 2, "{text:?}");
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    assert!(done[0] < 3, "{done:?}");
    assert_eq!(done.last(), Some(&3), "{done:?}");
    let last = redraws.last().unwrap();
    assert!(last.starts_with(&format!("job {id} completed")), "{last:?}");
}

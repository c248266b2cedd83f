//! A slow MapReduce job to watch while it runs (`tests/run/live.rs`, `tests/ui`): three
//! items, one agent at a time, each a Claude call replaying the `tool` transcript slowly, so
//! a page or `prodigy status` sees it mid-call; item 2 fails into the DLQ unless the file
//! `pass` exists in the scratch directory.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::time::{Duration, Instant};

use crate::scratch::{Scratch, root};

/// A job of three items, one agent at a time; each item's Claude call replays the `tool`
/// transcript slowly, so it is seen mid-call; item 2 fails into the DLQ.
pub(crate) fn slow_job(scratch: &Scratch) -> std::process::Child {
    std::fs::write(
        scratch.project().join("job.yml"),
        format!("name: slow\nmode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 1\n  agent_template:\n    - claude: \"/work on ${{item}}\"\n    - shell: \"test ${{item}} -ne 2 || test -e {}\"\n", scratch.dir.path().join("pass").display()),
    )
    .unwrap();
    scratch.commit();
    let replay = root().join("tests/fixtures/claude/replay");
    scratch
        .command(&["run", "--no-worktree", "job.yml"], &[])
        .env("PRODIGY_CLAUDE_COMMAND", replay)
        .env("IS_SANDBOX", "1")
        .env("CLAUDE_REPLAY", "tool")
        .env("CLAUDE_REPLAY_DELAY", "0.4")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The job's id, once its checkpoint exists.
pub(crate) fn job_id(scratch: &Scratch) -> String {
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let out = scratch.run(&["ls", "--ids"], &[]);
        let ids = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(id) = ids.lines().next() {
            return id.to_owned();
        }
        assert!(Instant::now() < deadline, "no job started");
        std::thread::sleep(Duration::from_millis(100));
    }
}

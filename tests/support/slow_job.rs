//! A slow MapReduce job to watch while it runs (`tests/run/live.rs`, `tests/ui`): three
//! items, one agent at a time, each a Claude call replaying the `tool` transcript slowly, so
//! a page or `prodigy status` sees it mid-call; item 2 fails into the DLQ unless the file
//! `pass` exists in the scratch directory. Its output is watched as it comes (`watch.rs`).

#![allow(dead_code, reason = "each test binary uses part of this module")]

use crate::scratch::{Scratch, root};
use crate::watch::Watched;

/// A job of three items, one agent at a time; each item's Claude call replays the `tool`
/// transcript slowly, so it is seen mid-call; item 2 fails into the DLQ.
pub(crate) fn slow_job(scratch: &Scratch) -> Watched {
    std::fs::write(
        scratch.project().join("job.yml"),
        format!("name: slow\nmode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 1\n  agent_template:\n    - claude: \"/work on ${{item}}\"\n    - shell: \"test ${{item}} -ne 2 || test -e {}\"\n", scratch.dir.path().join("pass").display()),
    )
    .unwrap();
    scratch.commit();
    let replay = root().join("tests/fixtures/claude/replay");
    let child = scratch
        .command(&["run", "--no-worktree", "job.yml"], &[])
        .env("PRODIGY_CLAUDE_COMMAND", replay)
        .env("IS_SANDBOX", "1")
        .env("CLAUDE_REPLAY", "tool")
        .env("CLAUDE_REPLAY_DELAY", "0.4")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    Watched::new(child)
}

/// The job's id, from the line that says it started, once `prodigy ls` lists it (its
/// checkpoint is written): looked for again each time something under the home changes.
pub(crate) fn job_id(scratch: &Scratch, job: &mut Watched) -> String {
    let line = job.wait_for(" started");
    let re = regex::Regex::new(r"job (mapreduce-[0-9a-z-]+) started").unwrap();
    let id = re
        .captures(&line)
        .unwrap_or_else(|| panic!("no job id in: {line}"))[1]
        .to_owned();
    crate::watch::until_changed_under(&scratch.home(), "the job's checkpoint", || {
        let out = scratch.run(&["ls", "--ids"], &[]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == id)
    });
    id
}

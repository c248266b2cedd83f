//! `prodigy items` on a workflow whose `setup` writes the map input: it says so, and
//! `--run-setup` runs setup in a throwaway worktree (removed afterwards, also after a
//! failure or Ctrl-C), its output on stderr and the items on stdout.

use super::Scratch;
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A job whose setup runs SETUP (a shell command) to write `.items.jsonl`.
fn scratch_with_setup(setup: &str) -> Scratch {
    let scratch = Scratch::new();
    let workflow = format!(
        "name: setup-writes\nmode: mapreduce\nsetup:\n  - shell: {setup:?}\nmap:\n  input: .items.jsonl\n  filter: \"n > 1\"\n  agent_template:\n    - shell: \"echo ${{item.n}}\"\n"
    );
    std::fs::write(scratch.project().join("wf.yml"), workflow).unwrap();
    std::fs::create_dir(scratch.dir.path().join("tmp")).unwrap();
    scratch.commit();
    scratch
}

/// The temporary directory the throwaway worktree goes under: the scratch's own.
fn tmp(scratch: &Scratch) -> String {
    scratch.dir.path().join("tmp").display().to_string()
}

/// No worktree but the project's is left, and nothing under the scratch's temporary
/// directory.
fn assert_thrown_away(scratch: &Scratch) {
    let worktrees = scratch.git(&["worktree", "list", "--porcelain"]);
    assert_eq!(
        worktrees
            .lines()
            .filter(|l| l.starts_with("worktree "))
            .count(),
        1,
        "{worktrees}"
    );
    let left: Vec<_> = std::fs::read_dir(scratch.dir.path().join("tmp"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

const WRITES: &str =
    "echo making items; printf '{\"n\":1}\\n{\"n\":2}\\n{\"n\":3}\\n' > .items.jsonl";

#[test]
fn items_says_setup_writes_the_input_and_runs_it_with_run_setup() {
    let scratch = scratch_with_setup(WRITES);
    let plain = scratch.run(&["items", "wf.yml"], &[]);
    assert_eq!(plain.status.code(), Some(2));
    assert!(
        stderr(&plain).contains(
            "`.items.jsonl` does not exist yet; `setup` writes it: run it with `--run-setup` or pass `--input FILE`"
        ),
        "{}",
        stderr(&plain)
    );

    let tmp = tmp(&scratch);
    let run = scratch.run(&["items", "--run-setup", "wf.yml"], &[("TMPDIR", &tmp)]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(stdout(&run), "{\"n\":2}\n{\"n\":3}\n");
    assert!(stderr(&run).contains("making items"), "{}", stderr(&run));
    assert_thrown_away(&scratch);
    // Setup ran elsewhere: the project has no input file, and no run was recorded.
    assert!(!scratch.project().join(".items.jsonl").exists());
    let recorded: Vec<_> = std::fs::read_dir(scratch.home()).unwrap().collect();
    assert!(recorded.is_empty(), "{recorded:?}");
}

#[test]
fn a_failed_setup_leaves_no_throwaway_worktree() {
    let scratch = scratch_with_setup("echo broken >&2; exit 3");
    let tmp = tmp(&scratch);
    let run = scratch.run(&["items", "--run-setup", "wf.yml"], &[("TMPDIR", &tmp)]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    assert_eq!(stdout(&run), "");
    assert!(stderr(&run).contains("broken"), "{}", stderr(&run));
    assert_thrown_away(&scratch);
}

#[test]
fn ctrl_c_during_setup_leaves_no_throwaway_worktree() {
    let mark = tempfile::tempdir().unwrap();
    let started = mark.path().join("started");
    let scratch = scratch_with_setup(&format!("touch {}; sleep 30", started.display()));
    let tmp = tmp(&scratch);
    let child = scratch
        .command(&["items", "--run-setup", "wf.yml"], &[("TMPDIR", &tmp)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = super::interrupt_when(child, nix::sys::signal::Signal::SIGINT, |_| {
        super::watch::until_changed(mark.path(), "setup", || started.exists());
    });
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert_thrown_away(&scratch);
}

/// The workflow's `worktree:` prepares the throwaway worktree as it does a run's: the copied
/// `.env` and what `worktree.setup` made are there when `setup` runs.
#[test]
fn run_setup_prepares_the_throwaway_worktree_as_the_workflow_says() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join(".env"), "N=7\n").unwrap();
    let workflow = "name: prepared\nmode: mapreduce\nworktree:\n  copy: [.env]\n  setup:\n    - shell: \"echo 8 > made.txt\"\nsetup:\n  - shell: \". ./.env && printf '{\\\"n\\\":%s}\\\\n{\\\"n\\\":%s}\\\\n' \\\"$N\\\" \\\"$(cat made.txt)\\\" > .items.jsonl\"\nmap:\n  input: .items.jsonl\n  agent_template:\n    - shell: \"echo ${item.n}\"\n";
    std::fs::write(scratch.project().join("wf.yml"), workflow).unwrap();
    std::fs::create_dir(scratch.dir.path().join("tmp")).unwrap();
    scratch.git(&["add", "wf.yml"]);
    scratch.git(&["commit", "-q", "-m", "wf"]);
    let tmp = tmp(&scratch);
    let run = scratch.run(&["items", "--run-setup", "wf.yml"], &[("TMPDIR", &tmp)]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(stdout(&run), "{\"n\":7}\n{\"n\":8}\n");
    assert_thrown_away(&scratch);
}

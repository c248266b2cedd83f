//! `worktree:` end to end (docs/language.md §11): untracked files copied and directories
//! linked into the session's and every agent's worktree and never committed, `setup` run
//! once per worktree, a failing `setup`, and the agents' sparse checkout.

use std::os::unix::fs::PermissionsExt as _;

use super::mapreduce::only_job;
use super::{Scratch, collect_files, shown, stderr};

/// Writes a workflow into the project and commits it (and nothing untracked the test made).
fn workflow(scratch: &Scratch, name: &str, text: &str) -> String {
    let path = scratch.project().join(name);
    std::fs::write(&path, text).unwrap();
    scratch.git(&["add", name]);
    scratch.git(&["commit", "-q", "-m", name]);
    path.display().to_string()
}

/// A scratch project whose files (path, text) are committed.
fn committed(files: &[(&str, &str)]) -> Scratch {
    let scratch = Scratch::new();
    let project = scratch.project();
    for (path, text) in files {
        std::fs::create_dir_all(project.join(path).parent().unwrap()).unwrap();
        std::fs::write(project.join(path), text).unwrap();
    }
    scratch.commit();
    scratch
}

fn files_at(scratch: &Scratch, rev: &str) -> Vec<String> {
    scratch
        .git(&["ls-tree", "-r", "--name-only", rev])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The events of the run of the given type.
fn events_of(scratch: &Scratch, event_type: &str) -> Vec<serde_json::Value> {
    scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == event_type)
        .collect()
}

const SECRET: &str = "hunter2-not-for-logs";

/// A project with an untracked `.env` that no `.gitignore` names (so only prodigy's exclude
/// keeps it out of `git add -A`), an untracked executable script and a dependency cache.
fn project() -> Scratch {
    let scratch = Scratch::new();
    let project = scratch.project();
    std::fs::write(project.join(".env"), format!("TOKEN={SECRET}\n")).unwrap();
    std::fs::write(project.join("tool.sh"), "#!/bin/sh\necho tool\n").unwrap();
    std::fs::set_permissions(
        project.join("tool.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::create_dir_all(project.join("deps/pkg")).unwrap();
    std::fs::write(project.join("deps/pkg/lib.txt"), "lib\n").unwrap();
    scratch
}

#[test]
fn copies_and_links_reach_every_worktree_setup_runs_once_per_worktree_and_nothing_is_committed() {
    let scratch = project();
    let count = scratch.dir.path().join("setup-count");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nworktree:\n  copy: [.env, \"*.sh\"]\n  link: [deps]\n  setup:\n    - shell: \"echo \\\"$PWD\\\" >> {count} && grep -q TOKEN .env\"\nsetup:\n  - shell: \"test -x tool.sh && test -f deps/pkg/lib.txt && git add -A && git commit -q --allow-empty -m setup\"\nmap:\n  input: \"seq 1 8\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"./tool.sh && cat deps/pkg/lib.txt && grep -q TOKEN .env && echo $ITEM > f-$ITEM.txt && git add -A && git commit -q -m \\\"item $ITEM\\\"\"\n      commit_required: true\n",
            count = count.display()
        ),
    );
    let output = scratch.run(&["run", "-v", &file], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("8 succeeded, 0 failed"), "{text}");
    // Agents have the copies and links too: they are no leftovers of setup to warn about.
    assert!(!text.contains("warning: setup left"), "{text}");
    let job = only_job(&scratch);
    // Every agent's work came back, and no copy or link with it.
    let on_session = files_at(&scratch, &format!("prodigy-{job}"));
    for n in 1..=8 {
        assert!(on_session.contains(&format!("f-{n}.txt")), "{on_session:?}");
    }
    for never in [".env", "tool.sh", "deps", "deps/pkg/lib.txt"] {
        assert!(
            !on_session.iter().any(|f| f == never),
            "`{never}` was committed: {on_session:?}"
        );
    }
    // `setup` ran once in the session worktree and once in each agent worktree made, not
    // once per item: the pool reuses at most `max_parallel` worktrees here.
    let setups: Vec<String> = std::fs::read_to_string(&count)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let mut distinct = setups.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        setups.len(),
        "twice in one worktree: {setups:?}"
    );
    assert!(
        (2..=3).contains(&setups.len()),
        "the session and at most 2 agent worktrees: {setups:?}"
    );
    let prepared = events_of(&scratch, "worktree_prepared");
    assert_eq!(
        prepared.len(),
        1 + 8,
        "the session, then each item: {prepared:?}"
    );
    let with_setup = prepared.iter().filter(|e| e["setup"] == true).count();
    assert_eq!(with_setup, setups.len());
    assert_eq!(
        prepared[0]["copied"],
        serde_json::json!([".env", "tool.sh"])
    );
    assert_eq!(prepared[0]["linked"], serde_json::json!(["deps"]));
    // The copy's contents are nowhere in what prodigy wrote or said, only in the worktrees.
    assert!(!text.contains(SECRET), "{text}");
    let mut files = Vec::new();
    collect_files(&scratch.home(), &mut files);
    let worktrees = scratch.home().join("worktrees");
    for f in files.iter().filter(|f| !f.starts_with(&worktrees)) {
        let bytes = std::fs::read(f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(SECRET),
            "{} holds the secret",
            f.display()
        );
    }
    // The user's checkout keeps its files, untouched.
    assert_eq!(
        std::fs::read_to_string(scratch.project().join(".env")).unwrap(),
        format!("TOKEN={SECRET}\n")
    );
    assert!(scratch.project().join("deps/pkg/lib.txt").is_file());
}

/// What `setup` installs in a `keep` directory stays for the next item of the slot, which
/// runs no `setup` again; what an item leaves elsewhere does not.
#[test]
fn a_slot_keeps_its_setup_in_the_kept_directories_and_nothing_else() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join(".gitignore"), "deps/\nscratch/\n").unwrap();
    scratch.git(&["add", ".gitignore"]);
    scratch.git(&["commit", "-q", "-m", "ignore"]);
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nworktree:\n  setup:\n    - shell: \"mkdir -p deps && touch deps/installed\"\n  keep: [deps]\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"test -f deps/installed && test ! -e scratch && mkdir scratch && touch scratch/left\"\n",
    );
    let output = scratch.run(&["run", "-v", &file], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("3 succeeded, 0 failed"), "{text}");
    let prepared = events_of(&scratch, "worktree_prepared");
    let with_setup = prepared.iter().filter(|e| e["setup"] == true).count();
    assert_eq!(with_setup, 2, "the session and the one slot: {prepared:?}");
}

#[test]
fn a_failing_setup_stops_the_run_before_its_first_step_naming_the_step() {
    let scratch = project();
    let file = workflow(
        &scratch,
        "run.yml",
        "worktree:\n  copy: [.env]\n  setup:\n    - shell: \"true\"\n    - shell: \"exit 3\"\ncommands:\n  - shell: \"touch ran\"\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("`worktree.setup` step 2 of 2 (`exit 3`) failed"),
        "{text}"
    );
    assert!(text.contains("the run does not start"), "{text}");
    let session = std::fs::read_dir(scratch.home().join("worktrees").join(scratch.repo()))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    assert!(!session.join("ran").exists(), "no step ran");
}

#[test]
fn an_agent_whose_setup_fails_fails_its_item_naming_the_step() {
    let scratch = project();
    let count = scratch.dir.path().join("count");
    // The first run (the session worktree's) succeeds, every later one (agents') fails.
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nworktree:\n  setup:\n    - shell: \"echo x >> {count} && test $(wc -l < {count}) -eq 1\"\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"true\"\n",
            count = count.display()
        ),
    );
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert!(text.contains("0 succeeded, 2 failed"), "{text}");
    let job = only_job(&scratch);
    let output = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let items: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let history = &items[0]["failure_history"][0];
    assert_eq!(history["error_type"], "WorktreeError", "{items}");
    assert!(
        history
            .to_string()
            .contains("`worktree.setup` step 1 of 1 (`echo x >>"),
        "{items}"
    );
}

#[test]
fn sparse_agents_see_only_their_cone_and_the_merged_tree_keeps_the_rest() {
    let scratch = committed(&[
        ("app/a.txt", "a\n"),
        ("lib/b.txt", "b\n"),
        ("top.txt", "t\n"),
    ]);
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nworktree:\n  sparse: [app]\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"test ! -e lib/b.txt && test -f top.txt && echo $ITEM > app/n-$ITEM.txt && git add -A && git commit -q -m \\\"item $ITEM\\\"\"\n      commit_required: true\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("3 succeeded, 0 failed"), "{text}");
    let job = only_job(&scratch);
    let session = format!("prodigy-{job}");
    let files = files_at(&scratch, &session);
    for f in [
        "app/n-1.txt",
        "app/n-2.txt",
        "app/n-3.txt",
        "lib/b.txt",
        "top.txt",
    ] {
        assert!(files.iter().any(|x| x == f), "{f} missing: {files:?}");
    }
    let lib = scratch.git(&["show", &format!("{session}:lib/b.txt")]);
    assert_eq!(lib, "b\n", "outside the cone, unchanged");
    // The session worktree is whole.
    assert!(scratch.worktree(&job).join("lib/b.txt").is_file());
}

/// The spare worktrees `worktree.persist` keeps, by their `a.txt`'s inode (a tracked file: a
/// new checkout writes it anew, a reused worktree keeps it).
fn spares(scratch: &Scratch) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let dir = scratch.home().join("worktrees").join(scratch.repo());
    let mut found: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("spare-")
        })
        .map(|p| std::fs::metadata(p.join("a.txt")).unwrap().ino())
        .collect();
    found.sort_unstable();
    found
}

/// `worktree.persist`: a job keeps its worktrees (the session's and its agents') as
/// spares, and the next job's worktrees are those spares, not new checkouts; each is
/// cleaned of what the last job left (but `keep`) and prepared afresh (its `setup` runs
/// again); `prodigy worktree clean` removes them.
#[test]
fn a_persisting_job_takes_the_worktrees_the_last_one_kept() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join(".gitignore"), "deps/\nscratch/\n").unwrap();
    std::fs::write(scratch.project().join("a.txt"), "a\n").unwrap();
    scratch.git(&["add", ".gitignore", "a.txt"]);
    scratch.git(&["commit", "-q", "-m", "base"]);
    let count = scratch.dir.path().join("setup-count");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nworktree:\n  persist: true\n  keep: [deps]\n  setup:\n    - shell: \"echo x >> {count} && mkdir -p deps && touch deps/installed\"\nmap:\n  input: \"seq 1 4\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"test ! -e scratch && mkdir scratch && touch scratch/left && echo $ITEM > f-$ITEM-$RUN.txt && git add f-$ITEM-$RUN.txt && git commit -q -m $ITEM\"\n      commit_required: true\n",
            count = count.display()
        ),
    );
    let setups = || std::fs::read_to_string(&count).unwrap().lines().count();
    let first = scratch.run(&["run", "-y", &file], &[("RUN", "1")]);
    let text = shown(&first);
    assert!(first.status.success(), "{text}");
    assert!(text.contains("4 succeeded, 0 failed"), "{text}");
    assert!(text.contains("kept 2 worktrees in "), "{text}");
    assert!(text.contains("kept 1 worktree in "), "{text}");
    assert!(
        text.contains("its worktree is cleaned for the next job"),
        "{text}"
    );
    assert!(text.contains("`prodigy worktree clean` removes"), "{text}");
    let kept = spares(&scratch);
    assert_eq!(kept.len(), 3, "the session's and two slots");
    assert_eq!(setups(), 3);

    let second = scratch.run(&["run", "-y", &file], &[("RUN", "2")]);
    let text = shown(&second);
    assert!(second.status.success(), "{text}");
    assert!(text.contains("4 succeeded, 0 failed"), "{text}");
    assert_eq!(
        spares(&scratch),
        kept,
        "the same three worktrees, no new checkout"
    );
    assert_eq!(setups(), 6, "each prepared afresh for the second job");
    // Both jobs' work is on `main`, and the worktrees hold no branch.
    let tree = files_at(&scratch, "main");
    for run in 1..=2 {
        for item in 1..=4 {
            assert!(tree.contains(&format!("f-{item}-{run}.txt")), "{tree:?}");
        }
    }
    assert_eq!(
        scratch.git(&["branch", "--format=%(refname:short)"]).trim(),
        "main"
    );

    let listed = shown(&scratch.run(&["worktree", "ls"], &[]));
    assert_eq!(
        listed.matches("a spare for the next job").count(),
        3,
        "{listed}"
    );
    let clean = scratch.run(&["worktree", "clean", "-y"], &[]);
    assert!(clean.status.success(), "{}", shown(&clean));
    assert!(spares(&scratch).is_empty());
    assert_eq!(scratch.git(&["worktree", "list"]).lines().count(), 1);
}

/// `worktree.persist` beside `sparse` (W002 in `check`): a sparse agent worktree is never
/// kept, since the next job's agents may need the whole tree; the session worktree, whole,
/// is kept and taken by the next job, whose agents get sparse checkouts of their own.
#[test]
fn a_persisting_job_with_sparse_agents_keeps_only_its_session_worktree() {
    let scratch = committed(&[("a.txt", "a\n"), ("app/a.txt", "a\n"), ("lib/b.txt", "b\n")]);
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nworktree:\n  persist: true\n  sparse: [app]\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"test ! -e lib/b.txt && echo $ITEM > app/n-$ITEM-$RUN.txt && git add -A && git commit -q -m \\\"item $ITEM\\\"\"\n      commit_required: true\n",
    );
    for run in ["1", "2"] {
        let output = scratch.run(&["run", "-y", &file], &[("RUN", run)]);
        let text = shown(&output);
        assert!(output.status.success(), "{text}");
        assert!(text.contains("3 succeeded, 0 failed"), "{text}");
        assert!(!text.contains("kept 2 worktrees"), "{text}");
        assert_eq!(spares(&scratch).len(), 1, "run {run}: the session's only");
    }
    let tree = files_at(&scratch, "main");
    for run in 1..=2 {
        for item in 1..=3 {
            let f = format!("app/n-{item}-{run}.txt");
            assert!(tree.contains(&f), "{f} missing: {tree:?}");
        }
    }
    assert!(tree.contains(&"lib/b.txt".to_owned()), "{tree:?}");
}

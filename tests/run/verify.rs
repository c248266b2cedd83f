//! The verified merge queue end to end (`merge.verify`, `merge.batch`, `merge.redispatch`,
//! `merge.protect`; docs/mapreduce.md, "Verified integration"), on a small repository whose
//! test suite (`sh test.sh`) runs every `tests/*.sh`: changes green alone and red together,
//! textual conflicts, and an agent that weakens the test runner. Each test checks what a
//! user would: the original test suite passes at every first-parent commit of the merged
//! work, and what was refused went back to its agent or to the DLQ, saying why.

use super::mapreduce::only_job;
use super::{Scratch, stderr};

/// The project: `greet` says "hello NAME", and its test says so.
fn greeting_project(scratch: &Scratch) {
    let project = scratch.project();
    std::fs::create_dir_all(project.join("tests")).unwrap();
    std::fs::write(project.join("greet.sh"), "greet() { echo \"hello $1\"; }\n").unwrap();
    std::fs::write(project.join("test.sh"), TEST_RUNNER).unwrap();
    std::fs::write(
        project.join("tests/base.sh"),
        ". ./greet.sh\n[ \"$(greet x)\" = \"hello x\" ]\n",
    )
    .unwrap();
    scratch.commit();
}

/// The test suite: every `tests/*.sh`, in the checkout's root.
const TEST_RUNNER: &str =
    "for t in tests/*.sh; do sh \"$t\" || { echo \"FAILED: $t\"; exit 1; }; done\necho ok\n";

/// The scripted agents, outside the repository: `NAME.sh REASON ATTEMPT` applies item
/// NAME's change, or, given why its work came back, its fix. Each notes what it was told
/// in `told`.
fn agents(scratch: &Scratch) -> std::path::PathBuf {
    let dir = scratch.dir.path().join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    let told = dir.join("told");
    let scripts = [
        // Changes `greet` to say "hi", and its own test with it; sent back, every test.
        (
            "a",
            "sed -i 's/hello/hi/' greet.sh tests/base.sh\nif [ \"$1\" = verify_failed ]; then sed -i 's/hello/hi/g' tests/*.sh; fi\n",
        ),
        // Adds a caller that expects what `greet` says when it starts; sent back, what it
        // says now.
        (
            "b",
            "want='hello b'\nif [ \"$1\" = verify_failed ]; then want=$(. ./greet.sh; greet b); fi\nprintf '. ./greet.sh\\n[ \"$(greet b)\" = \"%s\" ]\\n' \"$want\" > tests/b.sh\n",
        ),
        // Adds a feature, and makes the test runner pass whatever happens; sent back, only
        // the feature.
        (
            "c",
            "echo feature > c.txt\nif [ \"$1\" != protected ]; then echo 'exit 0' > test.sh; fi\n",
        ),
        // Two agents that write the same line of `shared.txt`; sent back, one adds its
        // line to what landed.
        (
            "d",
            "if [ \"$1\" = conflict ]; then echo d >> shared.txt; else echo d > shared.txt; fi\n",
        ),
        (
            "e",
            "if [ \"$1\" = conflict ]; then echo e >> shared.txt; else echo e > shared.txt; fi\n",
        ),
        // Skips a Python test; sent back, adds one instead.
        (
            "skippy",
            "if [ \"$1\" = integrity ]; then printf 'def test_more():\\n    assert 1\\n' >> tests/test_api.py; else printf '@pytest.mark.skip\\n' >> tests/test_api.py; fi\n",
        ),
        // Deletes a Rust test file; sent back, adds a line of code.
        (
            "delrs",
            "if [ \"$1\" = integrity ]; then echo '// more' >> src/lib.rs; else git rm -q tests/smoke.rs; fi\n",
        ),
        // Removes an assertion; sent back, leaves it.
        (
            "noassert",
            "if [ \"$1\" = integrity ]; then echo '# noted' >> tests/test_api.py; else sed -i '/assert total/d' tests/test_api.py; fi\n",
        ),
        // Adds a JavaScript test: honest.
        (
            "honestjs",
            "printf \"it('adds', () => {\\n  expect(add(1, 2)).toBe(3);\\n});\\n\" >> src/app.test.js\n",
        ),
        // Breaks the tests, whatever it is told.
        // Commits a red state, then its fix: only its last commit is verified.
        (
            "twostep",
            "printf '[ 1 = 2 ]\\n' > tests/two.sh\ngit add -A && git commit -qm 'twostep: red'\nprintf '[ 1 = 1 ]\\n' > tests/two.sh\n",
        ),
        ("bad", "printf '[ 1 = 2 ]\\n' > tests/bad.sh\n"),
    ];
    for (name, body) in scripts {
        let text = format!(
            "echo \"{name} ${{1:-first}} ${{2:-0}}\" >> {told}\n{body}",
            told = told.display()
        );
        std::fs::write(dir.join(format!("{name}.sh")), text).unwrap();
    }
    for good in 1..=4 {
        std::fs::write(
            dir.join(format!("g{good}.sh")),
            format!(
                "echo \"g{good} ${{1:-first}} ${{2:-0}}\" >> {told}\nsleep 0.5\nprintf '. ./greet.sh\\n[ -n \"$(greet {good})\" ]\\n' > tests/g{good}.sh\n",
                told = told.display()
            ),
        )
        .unwrap();
    }
    dir
}

/// A job over ITEMS (agent names) whose agents run their script, then commit; MERGE is the
/// rest of the `merge:` mapping.
fn job(scratch: &Scratch, items: &[&str], parallel: usize, merge: &str) -> String {
    let agents = agents(scratch);
    let lines = items.join("\\\\n");
    let text = format!(
        "mode: mapreduce\nmap:\n  input: \"printf '{lines}\\\\n'\"\n  max_parallel: {parallel}\n  agent_template:\n    - shell: \"sh {agents}/${{item}}.sh ${{verify.reason|shell}} ${{verify.attempt}} && git add -A && git commit -qm \\\"item ${{item}}\\\"\"\nmerge:\n  verify:\n    - shell: \"sh test.sh\"\n{merge}",
        agents = agents.display()
    );
    let path = scratch.dir.path().join("job.yml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// What the agents were told, a line per run: `NAME REASON ATTEMPT`.
fn told(scratch: &Scratch) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string(scratch.dir.path().join("agents/told"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Every first-parent commit of the work the run merged into `main` (the session branch,
/// the merge back's second parent) down to where it started, each checked out on its own
/// with the original test runner: none is red.
fn assert_every_state_green(scratch: &Scratch, start: &str) {
    let merged = scratch.git(&["rev-parse", "main^2"]);
    let range = format!("{start}..{}", merged.trim());
    let commits = scratch.git(&["rev-list", "--first-parent", &range]);
    assert!(!commits.trim().is_empty(), "nothing was merged");
    for commit in commits.lines() {
        let dir = tempfile::tempdir().unwrap();
        let archive = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "git -C {project} archive {commit} | tar -x -C {dir}",
                project = scratch.project().display(),
                dir = dir.path().display()
            ))
            .status()
            .unwrap();
        assert!(archive.success());
        std::fs::write(dir.path().join("test.sh"), TEST_RUNNER).unwrap();
        let test = std::process::Command::new("sh")
            .arg("test.sh")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            test.status.success(),
            "{commit} is red: {}",
            String::from_utf8_lossy(&test.stdout)
        );
    }
}

/// Each of ITEMS' work (its agent's `item NAME` commit) is in the merged work once.
fn assert_landed_once(scratch: &Scratch, start: &str, items: &[&str], context: &str) {
    let range = format!("{start}..main^2");
    let commits = scratch.git(&["log", "--format=%s", &range]);
    for item in items {
        let subject = format!("item {item}");
        let landed = commits.lines().filter(|l| *l == subject).count();
        assert_eq!(landed, 1, "{context}: {item} landed once: {commits}");
    }
}

/// A job of `g1` and `g2`, one agent at a time, killed by the fault hook HOOK at its first
/// count, then resumed: both items succeed, the first recorded from the merge journal,
/// each run once, no state red. Returns the scratch and what the resumed run printed.
fn killed_at_first_then_resumed(hook: &str) -> (Scratch, String) {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let file = job(&scratch, &["g1", "g2"], 1, "");
    let output = scratch.run(&["run", "-y", &file], &[(hook, "1")]);
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let job = only_job(&scratch);
    let output = scratch.run(&["resume-job", "-y", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 succeeded, 0 failed"), "{text}");
    assert!(
        text.contains("item_0: its work was merged before the job stopped"),
        "{text}"
    );
    assert_every_state_green(&scratch, start.trim());
    assert_eq!(
        told(&scratch),
        ["g1 first 0", "g2 first 0"],
        "each item ran once"
    );
    (scratch, text)
}

fn events_named(scratch: &Scratch, name: &str) -> Vec<serde_json::Value> {
    scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == name)
        .collect()
}

/// Two changes green alone and red together: the second to reach the queue fails
/// verification on top of the first and goes back to its agent with the failing output;
/// its fix lands. The agent that made the test runner pass everything is refused before
/// verification and sent back; without that change its work lands. No state of the merged
/// work is red.
#[test]
fn a_red_pair_and_a_weakened_runner_go_back_to_their_agents_and_the_branch_stays_green() {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let file = job(
        &scratch,
        &["a", "b", "c"],
        3,
        "  redispatch: 1\n  protect: [test.sh]\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("3 succeeded, 0 failed"), "{text}");
    assert!(
        text.contains("the merge queue refused its work (protected)"),
        "{text}"
    );
    assert_every_state_green(&scratch, start.trim());
    let told = told(&scratch);
    assert!(told.contains(&"c protected 1".to_owned()), "{told:?}");
    let sent_back: Vec<&String> = told
        .iter()
        .filter(|l| l.contains("verify_failed 1"))
        .collect();
    assert_eq!(sent_back.len(), 1, "one of the pair goes back: {told:?}");
    // Both halves of the pair, and c's feature, are in `main`; its runner is not weakened.
    let project = scratch.project();
    assert!(project.join("tests/b.sh").is_file() && project.join("c.txt").is_file());
    assert!(
        std::fs::read_to_string(project.join("greet.sh"))
            .unwrap()
            .contains("hi")
    );
    assert_eq!(
        std::fs::read_to_string(project.join("test.sh")).unwrap(),
        TEST_RUNNER
    );
    let refused = events_named(&scratch, "merge_refused");
    let reasons: Vec<&str> = refused
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons.contains(&"protected") && reasons.contains(&"verify_failed"),
        "{reasons:?}"
    );
    assert_eq!(events_named(&scratch, "item_redispatched").len(), 2);
    let failed: Vec<_> = events_named(&scratch, "verify_finished")
        .into_iter()
        .filter(|e| e["passed"] == false)
        .collect();
    let output = failed[0]["output"].as_str().unwrap();
    assert!(output.contains("FAILED: tests/"), "{output}");
    // `status` shows the queue's counts and the last failed verification.
    let job = only_job(&scratch);
    let status = scratch.run(&["status", &job, "--json"], &[]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let queue = &status["queue"];
    assert_eq!(queue["landed"], 3, "{queue}");
    assert_eq!(queue["redispatched"], 2, "{queue}");
    assert_eq!(queue["queued"], 0, "{queue}");
    let last = queue["last_failure"]["output"].as_str().unwrap_or_default();
    assert!(last.contains("FAILED: tests/"), "{queue}");
    let shown = scratch.run(&["status", &job], &[]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("verify: idle, 0 queued, 3 landed, 2 re-dispatched"),
        "{shown}"
    );
    // `graph --status` counts the queue's verifications, failures and re-dispatches.
    let graph = scratch.run(&["graph", "--status", &job, "--format", "mermaid"], &[]);
    let graph = String::from_utf8_lossy(&graph.stdout).into_owned();
    let queue_node = graph
        .lines()
        .find(|l| l.contains("merge queue: verified one at a time; protects test.sh"))
        .unwrap_or_default();
    let verifications = events_named(&scratch, "verify_started").len();
    assert!(
        queue_node.contains(&format!("ran {verifications}"))
            && queue_node.contains("retried 2 times"),
        "{graph}"
    );
    // The scratch worktree goes with the job.
    let worktrees = scratch.git(&["worktree", "list"]);
    assert!(!worktrees.contains("agent-verify"), "{worktrees}");
}

/// An agent whose first commit is red and whose last fixes it: its work lands as a merge
/// commit, never by a fast-forward that would make the red commit a state of the merged
/// work.
#[test]
fn an_agents_red_intermediate_commit_never_becomes_a_state_of_the_merged_work() {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let file = job(&scratch, &["twostep"], 1, "");
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 succeeded, 0 failed"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    assert!(scratch.project().join("tests/two.sh").is_file());
}

/// Without `redispatch`, the work that fails verification goes to the DLQ as `VerifyFailed`,
/// with the failing output; the rest lands, green.
#[test]
fn work_that_fails_verification_goes_to_the_dlq_with_the_output() {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let file = job(&scratch, &["bad", "b"], 2, "");
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 succeeded, 1 failed"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    let job = only_job(&scratch);
    let shown = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let items: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let entry = &items[0];
    assert_eq!(
        entry["failure_history"][0]["error_type"], "VerifyFailed",
        "{entry}"
    );
    let logs = entry["worktree_artifacts"]["error_logs"].as_str().unwrap();
    assert!(logs.contains("FAILED: tests/bad.sh"), "{logs}");
    assert!(!scratch.project().join("tests/bad.sh").exists());
}

/// A textual conflict goes back to its agent with the conflicted file and both sides'
/// hunks; its agent adds its line to what landed.
#[test]
fn a_conflict_goes_back_to_its_agent_with_both_sides() {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    scratch.commit();
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let file = job(&scratch, &["d", "e"], 2, "  redispatch: 2\n");
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 succeeded, 0 failed"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    let shared = std::fs::read_to_string(scratch.project().join("shared.txt")).unwrap();
    let mut lines: Vec<&str> = shared.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["d", "e"], "{shared}");
    let told = told(&scratch);
    assert_eq!(
        told.iter().filter(|l| l.ends_with("conflict 1")).count(),
        1,
        "{told:?}"
    );
    let refused = events_named(&scratch, "merge_refused");
    assert_eq!(refused[0]["reason"], "conflict");
    assert_eq!(refused[0]["paths"][0], "shared.txt");
}

/// A job of five items at `batch: 4`: `b`'s candidate is verified first, and its
/// verification waits until the other four (one of them breaking the tests), which start
/// only then, have all queued behind it; they are verified as one batch, which fails and is
/// bisected. Nothing here hangs on timing, however busy the machine.
fn batch_job() -> (Scratch, String) {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    let first = scratch.dir.path().join("first-verification");
    let agents = agents(&scratch);
    for (name, body) in [
        (
            "w1",
            "printf '. ./greet.sh\\n[ -n \"$(greet 1)\" ]\\n' > tests/w1.sh",
        ),
        (
            "w2",
            "printf '. ./greet.sh\\n[ -n \"$(greet 2)\" ]\\n' > tests/w2.sh",
        ),
        (
            "w3",
            "printf '. ./greet.sh\\n[ -n \"$(greet 3)\" ]\\n' > tests/w3.sh",
        ),
        ("wbad", "printf '[ 1 = 2 ]\\n' > tests/bad.sh"),
    ] {
        let wait = format!(
            "until [ -e {first} ]; do sleep 0.05; done\n",
            first = first.display()
        );
        std::fs::write(agents.join(format!("{name}.sh")), format!("{wait}{body}\n")).unwrap();
    }
    let file = job(
        &scratch,
        &["b", "w1", "w2", "wbad", "w3"],
        5,
        "  batch: 4\n",
    );
    // The first verification lets the others start, and waits until all five are queued.
    let events = scratch.home().join("events");
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "    - shell: \"sh test.sh\"\n",
        &format!(
            "    - shell: \"[ -e {first} ] || {{ touch {first}; n=0; until [ $(cat {events}/*/*/*.jsonl | grep -c merge_queued) -ge 5 ] || [ $n -ge 600 ]; do n=$((n + 1)); sleep 0.1; done; }}\"\n    - shell: \"sh test.sh\"\n",
            first = first.display(),
            events = events.display()
        ),
    );
    std::fs::write(&file, text).unwrap();
    (scratch, file)
}

/// `kill -9` in the middle of a bisection, right after its first half passed and was
/// journalled (the second verified candidate): `resume-job` lands that half without
/// verifying it again, settles the rest, and no state is red.
#[test]
fn a_kill_in_the_middle_of_a_bisection_loses_nothing() {
    let (scratch, file) = batch_job();
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let output = scratch.run(
        &["run", "-y", &file],
        &[("PRODIGY_FAULT_KILL_AFTER_VERIFIED", "2")],
    );
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let bisecting = events_named(&scratch, "verify_started")
        .iter()
        .any(|e| e["bisecting"] == true);
    assert!(bisecting, "the kill came during the bisection");
    let job = only_job(&scratch);
    let output = scratch.run(&["resume-job", "-y", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("4 succeeded, 1 failed"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    assert_landed_once(
        &scratch,
        start.trim(),
        &["b", "w1", "w2", "w3"],
        "bisection",
    );
    assert_eq!(events_named(&scratch, "verified_landed").len(), 1);
}

/// `merge.batch`: candidates that queue while a verification runs are verified together;
/// a batch that fails is bisected, the failing candidate found, and the others land.
#[test]
fn a_failed_batch_is_bisected_and_the_good_candidates_land() {
    let (scratch, file) = batch_job();
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("4 succeeded, 1 failed"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    let started = events_named(&scratch, "verify_started");
    let widest = started
        .iter()
        .map(|e| e["item_ids"].as_array().map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    assert!(widest > 1, "no batch formed: {started:?}");
    assert!(
        started.iter().any(|e| e["bisecting"] == true),
        "the failed batch is bisected: {started:?}"
    );
    // Every verification is counted, and none is wasted on a stack known to fail.
    assert!(started.len() <= 6, "{} verifications", started.len());
}

/// `kill -9` of the coordinator while a verification runs (the verify step kills its
/// parent, once), then `resume-job`: the candidate that was being verified never reached
/// the merged work, its item runs again and is verified again, nothing is lost or landed
/// twice, and no state is red.
#[test]
fn a_kill_during_a_verification_runs_it_again_on_resume() {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let killed = scratch.dir.path().join("killed-once");
    let file = job(&scratch, &["a", "b", "g1"], 3, "  redispatch: 1\n");
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "    - shell: \"sh test.sh\"\n",
        &format!(
            "    - shell: \"[ -e {killed} ] || {{ touch {killed}; kill -9 $PPID; sleep 5; }}\"\n    - shell: \"sh test.sh\"\n",
            killed = killed.display()
        ),
    );
    std::fs::write(&file, text).unwrap();
    let output = scratch.run(&["run", "-y", &file], &[]);
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let job = only_job(&scratch);
    // Nothing unverified reached the merged work.
    let started = events_named(&scratch, "verify_started");
    assert_eq!(started.len(), 1, "{started:?}");
    let output = scratch.run(&["resume-job", "-y", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("3 succeeded, 0 failed"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    // Each item's work is in once: one test file each, `greet` changed once.
    let project = scratch.project();
    assert!(project.join("tests/b.sh").is_file() && project.join("tests/g1.sh").is_file());
    let greet = std::fs::read_to_string(project.join("greet.sh")).unwrap();
    assert_eq!(
        greet,
        "greet() { echo \"hi $1\"; }\n",
        "{}",
        scratch.git(&["log", "--graph", "--format=%h [%p] %s", "--all"])
    );

    assert_landed_once(&scratch, start.trim(), &["a", "b", "g1"], "after a kill");
}

/// `kill -9` right after a verified candidate landed, before its item's outcome is written
/// (`PRODIGY_FAULT_KILL_AFTER_MERGES`): `resume-job` records the item as succeeded from the
/// merge journal, without running or verifying it again.
#[test]
fn a_kill_after_a_verified_landing_is_recorded_on_resume() {
    killed_at_first_then_resumed("PRODIGY_FAULT_KILL_AFTER_MERGES");
}

/// `merge.on_conflict` is still tried first: the resolver settles the conflict in the
/// agent's worktree, the resolved work queues again and is verified, and nothing goes back
/// to its agent.
#[test]
fn a_conflict_resolver_is_tried_before_the_item_goes_back() {
    let scratch = Scratch::new();
    greeting_project(&scratch);
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    scratch.commit();
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let file = job(
        &scratch,
        &["d", "e"],
        2,
        "  redispatch: 1\n  on_conflict:\n    - shell: \"printf 'd\\\\ne\\\\n' > shared.txt && git add shared.txt && git commit -q --no-edit\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 succeeded, 0 failed"), "{text}");
    assert!(text.contains("running `merge.on_conflict`"), "{text}");
    assert_every_state_green(&scratch, start.trim());
    assert_eq!(events_named(&scratch, "item_redispatched").len(), 0);
    let shared = std::fs::read_to_string(scratch.project().join("shared.txt")).unwrap();
    assert_eq!(shared, "d\ne\n");
    // The resolved work was verified like any other.
    let verified = events_named(&scratch, "verify_finished");
    assert_eq!(verified.len(), 2, "{verified:?}");
}

/// `kill -9` after a candidate passed and was journalled as verified, before the
/// integration ref moved to it (`PRODIGY_FAULT_KILL_AFTER_VERIFIED`): `resume-job` lands it
/// without verifying the same state again, and its item is recorded from the merge journal
/// without running again.
#[test]
fn a_kill_between_verifying_and_landing_lands_on_resume_without_verifying_again() {
    let (scratch, _) = killed_at_first_then_resumed("PRODIGY_FAULT_KILL_AFTER_VERIFIED");
    let verified = events_named(&scratch, "verify_started");
    assert_eq!(verified.len(), 2, "g1 once, g2 once: {verified:?}");
    assert_eq!(events_named(&scratch, "verified_landed").len(), 1);
}

/// The red pair and the weakened runner again, killed at each landing and each verified
/// candidate in turn (a re-dispatch may be under way), then resumed: every item lands once,
/// the test runner is untouched, and no state is red.
#[test]
fn kills_at_each_landing_of_a_job_with_redispatches_lose_nothing() {
    for (hook, at) in [
        ("PRODIGY_FAULT_KILL_AFTER_MERGES", "1"),
        ("PRODIGY_FAULT_KILL_AFTER_MERGES", "2"),
        ("PRODIGY_FAULT_KILL_AFTER_VERIFIED", "2"),
        ("PRODIGY_FAULT_KILL_AFTER_VERIFIED", "3"),
    ] {
        let scratch = Scratch::new();
        greeting_project(&scratch);
        let start = scratch.git(&["rev-parse", "HEAD"]);
        let file = job(
            &scratch,
            &["a", "b", "c"],
            3,
            "  redispatch: 2\n  protect: [test.sh]\n",
        );
        let output = scratch.run(&["run", "-y", &file], &[(hook, at)]);
        assert_eq!(
            output.status.code(),
            None,
            "{hook}={at}: {}",
            stderr(&output)
        );
        let job = only_job(&scratch);
        let output = scratch.run(&["resume-job", "-y", &job], &[]);
        let text = stderr(&output);
        assert!(output.status.success(), "{hook}={at}: {text}");
        assert!(
            text.contains("3 succeeded, 0 failed"),
            "{hook}={at}: {text}"
        );
        assert_every_state_green(&scratch, start.trim());
        let project = scratch.project();
        assert_eq!(
            std::fs::read_to_string(project.join("test.sh")).unwrap(),
            TEST_RUNNER
        );
        assert!(project.join("tests/b.sh").is_file() && project.join("c.txt").is_file());
        assert_landed_once(
            &scratch,
            start.trim(),
            &["a", "b", "c"],
            &format!("{hook}={at}"),
        );
    }
}

/// `merge.integrity: fail`: the agents that skip a test, delete a test file or remove an
/// assertion are refused with the findings and sent back (`${verify.reason}` is
/// `integrity`); the honest one passes; every test file is whole at the end.
#[test]
fn work_that_weakens_the_tests_is_refused_and_sent_back_with_the_findings() {
    let scratch = Scratch::new();
    let project = scratch.project();
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::create_dir_all(project.join("tests")).unwrap();
    std::fs::write(
        project.join("tests/test_api.py"),
        "def test_total():\n    assert total == 3\n",
    )
    .unwrap();
    std::fs::write(project.join("tests/smoke.rs"), "#[test]\nfn smoke() {}\n").unwrap();
    std::fs::write(project.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    std::fs::write(project.join("src/app.test.js"), "// tests\n").unwrap();
    greeting_project(&scratch);
    let file = job(
        &scratch,
        &["skippy", "delrs", "noassert", "honestjs"],
        2,
        "  integrity: fail\n  redispatch: 1\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("4 succeeded, 0 failed"), "{text}");
    let told = told(&scratch);
    for gaming in ["skippy", "delrs", "noassert"] {
        assert!(
            told.contains(&format!("{gaming} integrity 1")),
            "{gaming} was sent back: {told:?}"
        );
    }
    assert!(
        !told.iter().any(|l| l.starts_with("honestjs integrity")),
        "{told:?}"
    );
    let checked = events_named(&scratch, "integrity_checked");
    let first_verdicts: Vec<(String, String)> = checked
        .iter()
        .map(|e| {
            (
                e["item_id"].as_str().unwrap().to_owned(),
                e["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        first_verdicts.contains(&("item_3".to_owned(), "pass".to_owned())),
        "{checked:?}"
    );
    let fails = checked.iter().filter(|e| e["verdict"] == "fail").count();
    assert_eq!(fails, 3, "{checked:?}");
    let findings: Vec<String> = checked
        .iter()
        .flat_map(|e| e["findings"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    for expected in [
        "fail: a skip marker added: `@pytest.mark.skip` (tests/test_api.py:",
        "fail: a test file deleted (tests/smoke.rs)",
        "fail: 1 assertion(s) removed (tests/test_api.py:2)",
    ] {
        assert!(
            findings.iter().any(|f| f.starts_with(expected)),
            "{expected}: {findings:?}"
        );
    }
    assert!(project.join("tests/smoke.rs").is_file());
    let api = std::fs::read_to_string(project.join("tests/test_api.py")).unwrap();
    assert!(
        api.contains("assert total == 3") && !api.contains("skip"),
        "{api}"
    );
}

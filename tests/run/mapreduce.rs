//! MapReduce jobs end to end: the documentation's MapReduce examples, the shell-only
//! MapReduce workflows of the upstream corpus, a kill -9 followed by `resume-job`, the
//! dead letter queue commands and the event log.

use super::watch::{Watched, output_of};
use super::{Output, Scratch, corpus, report, root, shown, snapshot, stderr, survivors};

/// The items every documentation example reads from `items.json`.
const ITEMS: &str = r#"[{"id": 1, "path": "src/a.rs", "output": "a"}, {"id": 2, "path": "src/b.rs", "output": "b"}, {"id": 3, "path": "src/c.rs", "output": "c"}, {"id": 4, "path": "src/d.rs", "output": "d"}, {"id": 5, "path": "src/e.rs", "output": "e"}, {"id": 6, "path": "src/f.rs", "output": "f"}]"#;

/// How a MapReduce example of the documentation is exercised: the stubs that fail, and
/// the exit code its text implies. Agents run one at a time so that the snapshots are
/// stable; the examples' `max_parallel` changes how fast, not what happens.
struct Case {
    name: &'static str,
    fail: &'static str,
    exit: i32,
    /// A command that prints this instead of the stub's echo.
    prints: Option<(&'static str, &'static str)>,
    /// Items of its own, for an example whose pipeline would drop the common ones.
    items: Option<fn() -> String>,
}

const fn case(name: &'static str, fail: &'static str, exit: i32) -> Case {
    Case {
        name,
        fail,
        exit,
        prints: None,
        items: None,
    }
}

/// The first of the common items alone.
fn one_item() -> String {
    r#"[{"id": 1, "path": "src/a.rs", "output": "a"}]"#.to_owned()
}

/// Fourteen items with scores and priorities: twelve score 5 or more, and two of those are
/// left after `offset: 10`.
fn scored_items() -> String {
    let items: Vec<String> = (1..=14)
        .map(|id| {
            format!(
                r#"{{"id": {id}, "path": "src/m{id}.rs", "score": {}, "priority": {}}}"#,
                if id <= 12 { 5 + id % 4 } else { 1 },
                id % 3
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

const SEED_CASES: &[Case] = &[
    case("seed-000-backoff-exponential", "", 0),
    case("seed-000-backoff-fibonacci", "", 0),
    case("seed-000-backoff-fixed", "", 0),
    case("seed-000-backoff-linear", "", 0),
    // The health check fails: three failures open the breaker, the other items are
    // rejected as `CircuitOpen`, and every item is in the DLQ.
    case("seed-000-circuit-breaker-example", "curl", 0),
    case("seed-000-circuit-breaker", "", 0),
    case("seed-000-defense-in-depth", "", 0),
    case("seed-000-dlq-on-item-failure", "", 0),
    case("seed-000-error-policy-basic", "", 0),
    case("seed-000-error-policy-retry-backoff", "", 0),
    case("seed-000-mapreduce-with-dlq", "", 0),
    case("seed-000-reduce-error-metrics", "", 0),
    // The API is down for the first call: the command-level handler reports it, but only
    // handled the failure, so the item fails and the workflow-level `retry_config` runs it
    // again after a jittered 2 s, and then it succeeds. One item, so that no other item
    // races the retry.
    Case {
        items: Some(one_item),
        ..case("seed-000-resilient-api-integration", "curl:1", 0)
    },
    // `process` fails once (not a network error, so no command-level retry): one item in
    // the DLQ.
    case("seed-001-both-systems-together", "process:1", 0),
    case("seed-001-error-policy-dlq-max-failures", "", 0),
    case("seed-001-example2-workflow-level-only", "process:1", 0),
    case("seed-001-example3-both-systems", "", 0),
    case("seed-001-work-item-scope", "step2.sh:1", 0),
    case("seed-001-workflow-error-policy", "", 0),
    // Its pipeline keeps items scoring 5 or more, sorted by priority, after the first 10.
    Case {
        items: Some(scored_items),
        ..case("seed-002-complete-structure", "", 0)
    },
    case("seed-002-convenience-fields", "", 0),
    // The analysis prints the JSON that `format: json` expects.
    Case {
        prints: Some(("analyze-codebase.sh", r#"{"files": 12, "issues": 3}"#)),
        ..case("seed-002-setup-full-config", "", 0)
    },
    case("seed-002-setup-simple-array", "", 0),
    case("seed-004-resilient-mapreduce-fibonacci", "", 0),
    // `slurm:` changes nothing when the agents run here (`--executor local`, the default).
    case("slurm-options", "", 0),
    // Not a seed: a Claude budget far above what the stub's calls cost changes nothing.
    case("claude-budget", "", 0),
    // Not a seed: nothing of the checkout to copy or link (each says so in a note), `npm ci`
    // once in the session's and once in the agents' one worktree (`--max-parallel 1`).
    case("worktree-prep", "", 0),
];

fn write_items(scratch: &Scratch, workflow: &str, items: Option<fn() -> String>) {
    let items = items.map_or_else(|| ITEMS.to_owned(), |f| f());
    // Examples with `json_path: "$.items[*]"` read an object.
    let text = if workflow.contains("$.items[*]") {
        format!("{{\"items\": {items}}}")
    } else {
        items
    };
    std::fs::write(scratch.project().join("items.json"), text).unwrap();
    scratch.commit();
}

#[test]
fn seed_mapreduce_workflows_run_as_documented() {
    let mut seen: Vec<String> = std::fs::read_dir(root().join("workflows/ok"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .filter(|p| !super::is_standard(&std::fs::read_to_string(p).unwrap()))
        .map(|p| p.file_stem().unwrap().to_string_lossy().to_string())
        .collect();
    seen.sort();
    let mut listed: Vec<String> = SEED_CASES.iter().map(|c| c.name.to_owned()).collect();
    listed.sort();
    assert_eq!(seen, listed, "every MapReduce seed example needs a case");
    let runs: Vec<(&Case, String, Output)> = std::thread::scope(|scope| {
        let handles: Vec<_> = SEED_CASES
            .iter()
            .map(|c| {
                scope.spawn(move || {
                    let scratch = Scratch::new();
                    let file = root().join(format!("workflows/ok/{}.yml", c.name));
                    write_items(&scratch, &std::fs::read_to_string(&file).unwrap(), c.items);
                    if let Some((name, text)) = c.prints {
                        let path = scratch.dir.path().join("bin").join(name);
                        std::fs::remove_file(&path).unwrap();
                        std::fs::write(&path, format!("#!/bin/sh\necho '{text}'\n")).unwrap();
                        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
                        std::fs::set_permissions(&path, mode).unwrap();
                    }
                    let output = scratch.run(
                        &["run", "-v", "--max-parallel", "1", file.to_str().unwrap()],
                        &[("STUB_FAIL", c.fail)],
                    );
                    (c, report(&scratch, &output), output)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (c, report, output) in runs {
        snapshot("run/seeds", c.name, &report);
        super::check_exit(c.name, &output, &c.exit.to_string());
    }
}

/// The job id on the last line that names `resume-job`, or the `dlq` hint.
fn job_id(output: &Output) -> String {
    let text = stderr(output);
    let re = regex::Regex::new(r"mapreduce-[0-9]+-[0-9a-f]+").unwrap();
    re.find_iter(&text)
        .last()
        .unwrap_or_else(|| panic!("no job id in:\n{text}"))
        .as_str()
        .to_owned()
}

#[test]
fn corpus_test_mapreduce_runs() {
    let Some(file) = corpus("corpus_test_mapreduce_runs", "workflows/test-mapreduce.yml") else {
        return;
    };
    let scratch = Scratch::new();
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    for id in 1..=3 {
        assert!(text.contains(&format!("Processing item {id}")), "{text}");
    }
    assert!(text.contains("Processed 3 items"), "{text}");
}

#[test]
fn corpus_mapreduce_context_reads_the_file_setup_wrote() {
    let Some(file) = corpus(
        "corpus_mapreduce_context_reads_the_file_setup_wrote",
        "workflows/test-mapreduce-context.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Processing item1 in directory:"), "{text}");
    assert!(text.contains("Processing item2 in directory:"), "{text}");
    assert!(text.contains("Processed 2 out of 2 items"), "{text}");
    // Setup wrote it in the job's worktree, which is kept because it was not committed.
    let job = only_job(&scratch);
    assert!(scratch.worktree(&job).join("test-items.json").is_file());
    assert!(!scratch.project().join("test-items.json").exists());
}

#[test]
fn corpus_command_input_maps_over_found_files() {
    let Some(file) = corpus(
        "corpus_command_input_maps_over_found_files",
        "examples/mapreduce-command-input.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.project().join("src")).unwrap();
    std::fs::write(scratch.project().join("src/a.rs"), "fn a() {}\n").unwrap();
    std::fs::write(scratch.project().join("src/b.rs"), "fn b() {}\nfn c() {}\n").unwrap();
    scratch.commit();
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Lines in ./src/a.rs: 1"), "{text}");
    assert!(text.contains("Lines in ./src/b.rs: 2"), "{text}");
    assert!(text.contains("Analysis complete"), "{text}");
}

/// The id of the one job the scratch home holds.
pub(super) fn only_job(scratch: &Scratch) -> String {
    let jobs = scratch.state().join("mapreduce/jobs");
    let mut ids: Vec<String> = std::fs::read_dir(jobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids.pop().unwrap()
}

/// The outcome lines the job recorded, by item.
pub(super) fn outcomes(scratch: &Scratch, job: &str) -> Vec<(String, String)> {
    let path = scratch
        .state()
        .join("mapreduce/jobs")
        .join(job)
        .join("results.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["item_id"].as_str().unwrap().to_owned(),
                v["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_killed_job_resumes_and_runs_every_item_exactly_once() {
    let scratch = Scratch::new();
    let runs = scratch.dir.path().join("runs.log");
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        format!(
            "name: kill-and-resume\nmode: mapreduce\nmap:\n  input: \"seq 1 12\"\n  max_parallel: 3\n  agent_template:\n    - shell: \": {log}; echo start $ITEM >> {log}; sleep 0.3; echo end $ITEM >> {log}\"\nreduce:\n  - shell: \"echo reduce ${{map.successful}} >> {log}\"\n",
            log = runs.display()
        ),
    )
    .unwrap();
    let child = scratch.spawn(&["run", file.to_str().unwrap()]);
    // Kill -9 once some items finished and others are running.
    let output = super::interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
        super::watch::until_changed(scratch.dir.path(), "four items", || {
            std::fs::read_to_string(&runs).is_ok_and(|t| t.matches("end").count() >= 4)
        });
    });
    assert_eq!(output.status.code(), None, "killed by a signal");
    // The run's guard ends the agents' shells once prodigy is gone (`tests/run/reap.rs`);
    // wait until they are gone before reading what started.
    let left = survivors(&format!("sh -c : {}", runs.display()));
    assert!(left.is_empty(), "agents still running: {left:?}");
    let job = only_job(&scratch);
    // Following the log of a job that was killed ends, and says how to go on.
    let followed = output_of(scratch.spawn(&["events", &job, "--follow"]));
    assert!(followed.status.success());
    assert!(
        stderr(&followed).contains("is not running"),
        "{}",
        stderr(&followed)
    );
    let before = outcomes(&scratch, &job);
    let log = std::fs::read_to_string(&runs).unwrap();
    // Started but without a recorded outcome: these, and only these, run again.
    let in_flight: Vec<String> = (1..=12)
        .filter(|n| {
            log.contains(&format!("start {n}\n"))
                && !before
                    .iter()
                    .any(|(id, _)| id == &format!("item_{}", n - 1))
        })
        .map(|n| n.to_string())
        .collect();
    let output = scratch.run(&["resume-job", &job], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let after = outcomes(&scratch, &job);
    let mut ids: Vec<&String> = after.iter().map(|(id, _)| id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 12, "every item has an outcome");
    assert_eq!(after.len(), 12, "each outcome is recorded once: {after:?}");
    assert!(after.iter().all(|(_, s)| s == "succeeded"));
    let log = std::fs::read_to_string(&runs).unwrap();
    for n in 1..=12 {
        let starts = log.matches(&format!("start {n}\n")).count();
        let expected = if in_flight.contains(&n.to_string()) {
            2
        } else {
            1
        };
        assert_eq!(starts, expected, "item {n} ran {starts} times:\n{log}");
    }
    assert_eq!(log.matches("reduce").count(), 1, "{log}");
    assert!(log.contains("reduce 12"), "{log}");
    // A completed job has nothing left to resume.
    let output = scratch.run(&["resume-job", &job], &[]);
    assert!(output.status.success());
    assert!(stderr(&output).contains("already completed"));
}

#[test]
fn corpus_mapreduce_resume_after_interrupt() {
    let Some(corpus_file) = corpus(
        "corpus_mapreduce_resume_after_interrupt",
        "workflows/tests/test-mapreduce-resume.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    // The workflow writes its input to a fixed path in /tmp; point it into the scratch.
    let input = scratch.dir.path().join("resume-test-items.json");
    // Agents write their files in their own worktrees; the first to have written its file
    // also touches `written` in the scratch directory, which the test waits for.
    let written = scratch.dir.path().join("written");
    let show = "        cat output-${item.name}.txt\n";
    let text = std::fs::read_to_string(corpus_file)
        .unwrap()
        .replace("/tmp/resume-test-items.json", input.to_str().unwrap())
        .replacen(
            show,
            &format!("{show}        touch {}\n", written.display()),
            1,
        );
    let copy = scratch.dir.path().join("test-mapreduce-resume.yml");
    std::fs::write(&copy, text).unwrap();
    let child = scratch.spawn(&["run", copy.to_str().unwrap()]);
    let output = super::interrupt_when(child, nix::sys::signal::Signal::SIGINT, |_| {
        super::watch::until_changed(scratch.dir.path(), "an item's file", || written.exists());
    });
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    let last = stderr(&output);
    assert!(last.contains("prodigy resume-job"), "{last}");
    let job = job_id(&output);
    let output = scratch.run(&["resume-job", "-v", &job], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("SUCCESS: All 5 items were processed"),
        "{text}"
    );
    assert!(text.contains("Total: 150"), "{text}");
    assert!(!input.exists(), "the reduce phase cleans up");
    // The job resumed in its own worktree, where every agent's commit now is.
    let worktree = scratch.worktree(&job);
    for name in ["one", "two", "three", "four", "five"] {
        assert!(worktree.join(format!("output-item-{name}.txt")).is_file());
    }
    assert!(
        text.contains(&format!("or with `git merge --no-ff prodigy-{job}`")),
        "{text}"
    );
}

#[test]
fn dlq_retry_after_a_fix_drains_the_queue() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    let flag = scratch.dir.path().join("fixed");
    std::fs::write(
        &file,
        format!(
            "name: retry-me\nmode: mapreduce\nmap:\n  input: \"seq 1 6\"\n  agent_template:\n    - shell: \"test $((ITEM % 2)) = 1 || test -e {} || {{ echo broken $ITEM >&2; exit 5; }}\"\n",
            flag.display()
        ),
    )
    .unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stderr(&output);
    let last = text.lines().last().unwrap();
    assert!(
        last.contains("3 items are in the dead letter queue"),
        "{text}"
    );
    let job = job_id(&output);
    let strict = scratch.run(&["run", "--strict", file.to_str().unwrap()], &[]);
    assert_eq!(strict.status.code(), Some(3), "{}", stderr(&strict));
    // `dlq show` without an item shows them all; `dlq clear` empties the queue.
    let second = job_id(&strict);
    let shown = scratch.run(&["dlq", "show", &second], &[]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    for id in ["item_1:", "item_3:", "item_5:"] {
        assert!(shown.contains(id), "{shown}");
    }
    assert!(shown.contains("broken 4"), "{shown}");
    let cleared = scratch.run(&["dlq", "clear", "-y", &second], &[]);
    assert!(
        stderr(&cleared).contains("removed 3 items"),
        "{}",
        stderr(&cleared)
    );
    let after = scratch.run(&["dlq", "list", &second], &[]);
    assert!(String::from_utf8_lossy(&after.stdout).contains("is empty"));

    let listing = scratch.run(&["dlq", "list", &job], &[]);
    let table = String::from_utf8_lossy(&listing.stdout).into_owned();
    for id in ["item_1", "item_3", "item_5"] {
        assert!(table.contains(id), "{table}");
    }
    let show = scratch.run(&["dlq", "show", &job, "item_1", "--format", "json"], &[]);
    let item: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(item["item_data"], "2");
    assert_eq!(item["failure_count"], 1);
    assert_eq!(
        item["failure_history"][0]["error_type"]["CommandFailed"]["exit_code"],
        5
    );
    assert!(
        item["failure_history"][0]["error_message"]
            .as_str()
            .unwrap()
            .contains("broken 2")
    );
    let dry = scratch.run(&["dlq", "retry", &job, "--dry-run"], &[]);
    assert!(String::from_utf8_lossy(&dry.stdout).contains("3 items would be retried"));

    // Still broken: every item stays, with a second failure recorded.
    let again = scratch.run(&["dlq", "retry", &job], &[]);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    let show = scratch.run(&["dlq", "show", &job, "item_3", "--format", "json"], &[]);
    let item: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(item["failure_count"], 2);

    // Fixed: the queue drains.
    std::fs::write(&flag, "").unwrap();
    let fixed = scratch.run(&["dlq", "retry", &job, "--max-parallel", "2"], &[]);
    assert!(fixed.status.success(), "{}", stderr(&fixed));
    assert!(stderr(&fixed).contains("3 succeeded"), "{}", stderr(&fixed));
    let emptied = scratch.run(&["dlq", "list", &job], &[]);
    assert!(String::from_utf8_lossy(&emptied.stdout).contains("is empty"));
    let stats = scratch.run(&["dlq", "stats", &job, "--format", "json"], &[]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["items"], 0);
}

#[test]
fn agent_timeouts_leave_no_processes_behind() {
    let scratch = Scratch::new();
    let marker = format!("sleep 32.{}", std::process::id());
    let file = scratch.project().join("slow.yml");
    std::fs::write(
        &file,
        format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_timeout_secs: 1\n  agent_template:\n    - shell: \"{marker} & {marker} & wait\"\n"
        ),
    )
    .unwrap();
    let output = scratch.run(&["run", "--grace", "1", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 Timeout"), "{text}");
    let left = survivors(&marker);
    assert!(left.is_empty(), "orphans: {left:?}");
}

#[test]
fn events_print_and_filter_the_log() {
    let scratch = Scratch::new();
    let file = root().join("workflows/run/mapreduce-breaker.yml");
    let output = scratch.run(&["run", "--max-parallel", "1", file.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = job_id(&output);
    let all = scratch.run(&["events", &job], &[]);
    let text = String::from_utf8_lossy(&all.stdout).into_owned();
    assert!(text.contains("job_started"), "{text}");
    assert!(text.contains("job_finished"), "{text}");
    let circuit = scratch.run(
        &["events", "ls", "--job-id", &job, "--type", "circuit"],
        &[],
    );
    let text = String::from_utf8_lossy(&circuit.stdout).into_owned();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("CircuitOpen"), "{text}");
    // `follow` on a finished job prints it and stops.
    let follow = scratch.run(&["events", "follow", "--job-id", &job, "--json"], &[]);
    assert!(follow.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&follow.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        String::from_utf8_lossy(&all.stdout).lines().count()
    );
    assert_eq!(lines.last().unwrap()["event_type"], "job_finished");
    let missing = scratch.run(&["events", "no-such-job"], &[]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_job_is_locked_while_it_runs() {
    let scratch = Scratch::new();
    let file = scratch.project().join("slow.yml");
    std::fs::write(
        &file,
        "mode: mapreduce\nmap:\n  input: \"seq 1 1\"\n  agent_template:\n    - shell: \"echo agent-running; sleep 30\"\n",
    )
    .unwrap();
    let mut run = Watched::new(scratch.spawn(&["run", "-v", file.to_str().unwrap()]));
    // The agent says it runs (`-v` shows its output as it comes).
    run.wait_for("[item_0] agent-running");
    let job = only_job(&scratch);
    let second = scratch.run(&["resume-job", &job], &[]);
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("already running"),
        "{}",
        stderr(&second)
    );
    // The running job owns its dead letter queue too.
    let clear = scratch.run(&["dlq", "clear", &job], &[]);
    assert_eq!(clear.status.code(), Some(2), "{}", stderr(&clear));
    assert!(
        stderr(&clear).contains("clear its queue once it has finished"),
        "{}",
        stderr(&clear)
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = run.finish();
    assert_eq!(output.status.code(), Some(143), "{}", stderr(&output));
}

/// The job checkpoint of JOB.
fn checkpoint(scratch: &Scratch, job: &str) -> serde_json::Value {
    let path = scratch
        .state()
        .join("mapreduce/jobs")
        .join(job)
        .join("checkpoint.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_stopped_job_and_a_failed_reduce_resume_where_they_stopped() {
    let scratch = Scratch::new();
    let dir = scratch.dir.path();
    let log = dir.join("log");
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        format!(
            "name: resume-phases\nmode: mapreduce\nmap:\n  input: \"seq 1 6\"\n  agent_template:\n    - shell: \"echo item $ITEM >> {log}; test $ITEM != 3 || test -e {fixed}\"\nerror_policy:\n  max_failures: 1\nreduce:\n  - shell: \"echo reduce one >> {log}\"\n  - shell: \"test -e {reduce_fixed}\"\n  - shell: \"echo reduce three ${{map.successful}} >> {log}\"\n",
            log = log.display(),
            fixed = dir.join("fixed").display(),
            reduce_fixed = dir.join("reduce-fixed").display(),
        ),
    )
    .unwrap();
    // Item 3 fails: `max_failures: 1` stops the job with items 4 to 6 pending.
    let output = scratch.run(&["run", "--max-parallel", "1", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let job = job_id(&output);
    let state = checkpoint(&scratch, &job);
    assert_eq!(state["status"], "stopped");
    assert_eq!(state["phase"], "map");
    assert_eq!(
        state["items_remaining"],
        serde_json::json!(["item_3", "item_4", "item_5"])
    );
    assert!(!std::fs::read_to_string(&log).unwrap().contains("reduce"));

    // Resumed once the cause is fixed (a stopped job resumes only with `--force`): the
    // pending items run (item 3 stays in the DLQ); reduce stops at its step 2.
    std::fs::write(dir.join("fixed"), "").unwrap();
    let output = scratch.run(&["resume-job", "--force", "--max-parallel", "2", &job], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("reduce failed"),
        "{}",
        stderr(&output)
    );
    let state = checkpoint(&scratch, &job);
    assert_eq!(state["phase"], "reduce");
    assert_eq!(state["reduce_next_step"], 1);
    assert_eq!(state["successful_items"], 5);
    assert_eq!(state["failed_items"], 1);

    // Resumed again: reduce goes on from its step 2; step 1 does not run twice.
    std::fs::write(dir.join("reduce-fixed"), "").unwrap();
    let output = scratch.run(&["resume-job", &job], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = std::fs::read_to_string(&log).unwrap();
    for n in 1..=6 {
        let runs = text.matches(&format!("item {n}\n")).count();
        assert_eq!(runs, 1, "item {n} ran {runs} times:\n{text}");
    }
    assert_eq!(text.matches("reduce one").count(), 1, "{text}");
    assert_eq!(text.matches("reduce three 5").count(), 1, "{text}");
    assert_eq!(checkpoint(&scratch, &job)["status"], "completed");
}

#[test]
fn cancel_running_stops_the_running_agents_when_the_policy_stops_the_job() {
    let scratch = Scratch::new();
    let marker = format!("sleep 33.{}", std::process::id());
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"if [ $ITEM = 1 ]; then sleep 0.5; exit 1; fi; {marker}\"\nerror_policy:\n  max_failures: 1\n"
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let output = scratch.run(
        &[
            "run",
            "--cancel-running",
            "--grace",
            "1",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the sleeping agent was cancelled, not waited for"
    );
    let job = job_id(&output);
    let state = checkpoint(&scratch, &job);
    assert_eq!(state["status"], "stopped");
    assert_eq!(state["items_remaining"], serde_json::json!(["item_1"]));
    let left = survivors(&marker);
    assert!(left.is_empty(), "orphans: {left:?}");
}

#[test]
fn every_attempt_retry_config_ran_is_in_the_dlq_history() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        "mode: mapreduce\nsecrets:\n  TOKEN: \"${env:DEPLOY_TOKEN}\"\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"test $ITEM = 1 || { echo broken $ITEM $TOKEN >&2; exit 4; }\"\nerror_policy:\n  retry_config:\n    max_attempts: 3\n    backoff:\n      fixed:\n        delay: 0s\n",
    )
    .unwrap();
    let output = scratch.run(
        &["run", "--no-worktree", file.to_str().unwrap()],
        &[("DEPLOY_TOKEN", "s3cr3t-value-42")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let job = only_job(&scratch);
    let shown = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    // Every attempt's message is masked, not only the last one's.
    let raw = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(!raw.contains("s3cr3t-value-42"), "{raw}");
    let items: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(items.as_array().unwrap().len(), 1, "{items}");
    let entry = &items[0];
    assert_eq!(entry["item_id"], "item_1");
    assert_eq!(entry["failure_count"], 3, "{entry}");
    let history = entry["failure_history"].as_array().unwrap();
    let numbers: Vec<u64> = history
        .iter()
        .map(|f| f["attempt_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [1, 2, 3]);
    assert!(
        history
            .iter()
            .all(|f| f["error_message"].as_str().unwrap().contains("broken 2"))
    );
}

#[test]
fn a_custom_item_handler_runs_under_the_agent_timeout() {
    let scratch = Scratch::new();
    let marker = format!("sleep 33.{}", std::process::id());
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 1\"\n  agent_timeout_secs: 1\n  agent_template:\n    - shell: \"exit 3\"\nerror_policy:\n  on_item_failure: \"custom:slow_fix\"\nhandlers:\n  slow_fix:\n    - shell: \"{marker}\"\n"
        ),
    )
    .unwrap();
    let output = scratch.run(
        &[
            "run",
            "--grace",
            "1",
            "--no-worktree",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    // The handler was stopped at the agent's timeout, so the item went to the DLQ.
    let finished: Vec<_> = scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == "item_handler_finished")
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(finished[0]["success"], false);
    assert!(
        text.contains("1 item is in the dead letter queue"),
        "{text}"
    );
    assert!(survivors(&marker).is_empty());
}

#[test]
fn setup_captures_read_their_own_step_and_fall_back_to_the_default() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    // Step 0's `on_success` handler prints something else; step 1 does not run.
    std::fs::write(
        &file,
        "mode: mapreduce\nsetup:\n  commands:\n    - shell: \"echo mine\"\n      on_success:\n        shell: \"echo from-the-handler\"\n    - shell: \"echo never\"\n      when: \"false\"\n  capture_outputs:\n    own: 0\n    later:\n      command_index: 1\n      default: \"none\"\nmap:\n  input: \"seq 1 1\"\n  agent_template:\n    - shell: \"echo own=${own|shell} later=${later|shell}\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", "-v", "--no-worktree", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("own=mine later=none"), "{text}");
}

#[test]
fn ids_that_look_like_paths_name_no_job() {
    let scratch = Scratch::new();
    std::fs::create_dir_all(scratch.state().join("mapreduce/jobs")).unwrap();
    for id in ["..", "../project", "/tmp"] {
        for args in [
            &["dlq", "list", id][..],
            &["events", id],
            &["resume-job", id],
            &["resume", id],
        ] {
            let output = scratch.run(args, &[]);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{args:?}: {}",
                stderr(&output)
            );
            assert!(
                stderr(&output).contains("no "),
                "{args:?}: {}",
                stderr(&output)
            );
        }
    }
}

/// `distinct` kept items without its field as one, in silence: the run says how many lacked
/// it, and the `input_loaded` event counts them.
#[test]
fn distinct_says_how_many_items_lacked_the_field() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("items.json"),
        r#"[{"id": 1, "owner": "ann"}, {"id": 2}, {"id": 3, "owner": null}, {"id": 4}, {"id": 5, "owner": "ann"}, {"id": 6, "owner": "bob"}]"#,
    )
    .unwrap();
    std::fs::write(
        scratch.project().join("wf.yml"),
        "name: owners\nmode: mapreduce\nmap:\n  input: items.json\n  distinct: item.owner\n  max_parallel: 1\n  agent_template:\n    - shell: \"echo ${item.id}\"\n",
    )
    .unwrap();
    scratch.commit();
    let output = scratch.run(&["run", "wf.yml"], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(
            "warning: `distinct: item.owner`: 3 items have no `owner` and were kept as one"
        ),
        "{text}"
    );
    assert!(text.contains("3 succeeded"), "{text}");
    let loaded = scratch
        .events()
        .into_iter()
        .find(|e| e["event_type"] == "input_loaded")
        .unwrap();
    assert_eq!(loaded["distinct_missing"], 3, "{loaded}");
}

/// A `PRODIGY_HOME` removed while a job ran ended in "completed: 0 succeeded of 40" and
/// exit 0: the job sees its state directory vanish, starts no new agents and fails saying so.
#[test]
fn a_job_whose_state_directory_vanishes_fails_saying_so() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("wf.yml"),
        "name: vanishing\nmode: mapreduce\nmap:\n  input: \"seq 1 40\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"sleep 0.2\"\n",
    )
    .unwrap();
    scratch.commit();
    let mut run = Watched::new(scratch.spawn(&["run", "--no-worktree", "wf.yml"]));
    // Said once the items are saved and the agents start.
    run.wait_for("map: 40 of 40 items to run");
    let jobs = scratch.state().join("mapreduce/jobs");
    let items = std::fs::read_dir(&jobs)
        .unwrap()
        .find_map(|d| Some(d.ok()?.path().join("items.json")))
        .unwrap();
    assert!(items.exists());
    // Moved away in one step (a recursive removal races with the job's writes): for the job,
    // its `PRODIGY_HOME` is gone.
    std::fs::rename(scratch.home(), scratch.dir.path().join("home-removed")).unwrap();
    let output = run.finish();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("was removed while the job ran"), "{text}");
    assert!(!text.contains("completed"), "{text}");
    // There is nothing left to resume from.
    assert!(
        text.contains("the job cannot be resumed, run the workflow again")
            && !text.contains("resume-job"),
        "{text}"
    );
    // No new agents started once it was seen: far fewer than 40 items ran.
    assert!(!text.contains("40/40 done"), "{text}");
}

/// A Slurm task runs `prodigy agent` on the job's checkpoint: a workflow edited since the
/// job started (and not accepted with `resume-job --force`) is refused, never run.
#[test]
fn an_agent_refuses_a_workflow_edited_since_its_job_started() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n",
    )
    .unwrap();
    scratch.commit();
    let out = scratch.run(&["run", "--no-worktree", "job.yml"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = only_job(&scratch);
    let home = scratch.home().display().to_string();
    let result = scratch.dir.path().join("result.json").display().to_string();
    let agent = |scratch: &Scratch| {
        scratch.run(
            &[
                "agent", "--home", &home, "--job", &job, "--item", "0", "--result", &result,
            ],
            &[],
        )
    };
    let out = agent(&scratch);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::write(&file, "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"echo edited\"\n").unwrap();
    let out = agent(&scratch);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("changed since job"), "{text}");
}

/// `PRODIGY_SBATCH_ARGS` that cannot be split is refused before anything starts, not
/// dropped.
#[test]
fn unsplittable_sbatch_args_are_refused() {
    let scratch = Scratch::new();
    // Stand-ins for the Slurm tools: the check only needs them on PATH.
    for tool in ["sbatch", "squeue", "scancel", "scontrol"] {
        std::os::unix::fs::symlink("/bin/true", scratch.dir.path().join("bin").join(tool)).unwrap();
    }
    std::fs::write(
        scratch.project().join("job.yml"),
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n",
    )
    .unwrap();
    scratch.commit();
    let out = scratch.run(
        &["run", "--no-worktree", "--executor", "slurm", "job.yml"],
        &[("PRODIGY_SBATCH_ARGS", "--comment 'unclosed")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("PRODIGY_SBATCH_ARGS"), "{text}");
    assert!(!scratch.home().join("state").exists(), "nothing was made");
}

#[test]
fn dlq_list_shows_each_item_and_the_pattern_points_to_dlq_stats() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        scratch.project().join("items.json"),
        r#"[{"n": 1, "path": "src/lib.rs"}, {"name": "alpha", "size": 3}, {"id": "a-very-long-identifier-that-goes-on-and-on-past-any-column"}]"#,
    )
    .unwrap();
    std::fs::write(
        &file,
        "name: show-items\nmode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"echo no >&2; exit 4\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    let job = job_id(&output);
    assert!(
        text.contains(&format!(
            "pattern: CommandFailed ×3: Review error logs for more details: `prodigy dlq stats {job}` shows which items failed and why"
        )),
        "{text}"
    );
    let listing = scratch.run(&["dlq", "list", &job], &[]);
    let table = String::from_utf8_lossy(&listing.stdout).into_owned();
    assert!(table.starts_with("ITEM    WHAT"), "{table}");
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(row("item_0").contains(" src/lib.rs "), "{table}");
    assert!(row("item_1").contains(" alpha "), "{table}");
    assert!(
        row("item_2").contains(" a-very-long-identifier-that-goes-on-and… "),
        "{table}"
    );
}

/// A number no 64-bit value holds reaches the agent with the digits it was written with,
/// in `${item.id}` and in `${item_json}`, and the run says it passes it as text.
#[test]
fn an_items_number_beyond_64_bits_reaches_the_agent_as_written() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("items.json"),
        r#"[{"id": 123456789012345678901, "n": 1.50}]"#,
    )
    .unwrap();
    let seen = scratch.dir.path().join("seen.txt");
    std::fs::write(
        scratch.project().join("wf.yml"),
        format!(
            "name: big\nmode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"printf '%s %s\\\\n' ${{item.id}} '${{item_json}}' >> {}\"\n",
            seen.display()
        ),
    )
    .unwrap();
    scratch.commit();
    let output = scratch.run(&["run", "wf.yml"], &[]);
    assert!(output.status.success(), "{}", shown(&output));
    assert!(
        stderr(&output).contains("note: the map input's number `123456789012345678901` is beyond what a 64-bit number holds: items carry it as the string it was written as"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        std::fs::read_to_string(seen).unwrap(),
        "123456789012345678901 {\"id\":\"123456789012345678901\",\"n\":1.5}\n"
    );
}

//! MapReduce jobs end to end: the documentation's MapReduce examples, the shell-only
//! MapReduce workflows of the upstream corpus, a kill -9 followed by `resume-job`, the
//! dead letter queue commands and the event log.

use super::{Output, Scratch, corpus, report, root, snapshot, stderr, survivors};

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
}

const fn case(name: &'static str, fail: &'static str, exit: i32) -> Case {
    Case {
        name,
        fail,
        exit,
        prints: None,
    }
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
    // The API is down for the first two calls: the command-level handler reports it and,
    // as an `on_failure` without `fail_workflow` does, lets those agents go on.
    case("seed-000-resilient-api-integration", "curl:2", 0),
    // `process` fails once (not a network error, so no command-level retry): one item in
    // the DLQ.
    case("seed-001-both-systems-together", "process:1", 0),
    case("seed-001-error-policy-dlq-max-failures", "", 0),
    case("seed-001-example2-workflow-level-only", "process:1", 0),
    case("seed-001-example3-both-systems", "", 0),
    case("seed-001-work-item-scope", "step2.sh:1", 0),
    case("seed-001-workflow-error-policy", "", 0),
    case("seed-002-complete-structure", "", 0),
    case("seed-002-convenience-fields", "", 0),
    // The analysis prints the JSON that `format: json` expects.
    Case {
        prints: Some(("analyze-codebase.sh", r#"{"files": 12, "issues": 3}"#)),
        ..case("seed-002-setup-full-config", "", 0)
    },
    case("seed-002-setup-simple-array", "", 0),
    case("seed-004-resilient-mapreduce-fibonacci", "", 0),
];

fn write_items(scratch: &Scratch, workflow: &str) {
    // Examples with `json_path: "$.items[*]"` read an object.
    let text = if workflow.contains("$.items[*]") {
        format!("{{\"items\": {ITEMS}}}")
    } else {
        ITEMS.to_owned()
    };
    std::fs::write(scratch.project().join("items.json"), text).unwrap();
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
                    write_items(&scratch, &std::fs::read_to_string(&file).unwrap());
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
    let scratch = Scratch::new();
    let file = corpus("workflows/test-mapreduce.yml");
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    for id in 1..=3 {
        assert!(text.contains(&format!("Processing item {id}")), "{text}");
    }
    assert!(text.contains("Processed 3 items"), "{text}");
}

#[test]
fn corpus_mapreduce_context_reads_the_file_setup_wrote() {
    let scratch = Scratch::new();
    let file = corpus("workflows/test-mapreduce-context.yml");
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Processing item1 in directory:"), "{text}");
    assert!(text.contains("Processing item2 in directory:"), "{text}");
    assert!(text.contains("Processed 2 out of 2 items"), "{text}");
    assert!(scratch.project().join("test-items.json").is_file());
}

#[test]
fn corpus_command_input_maps_over_found_files() {
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.project().join("src")).unwrap();
    std::fs::write(scratch.project().join("src/a.rs"), "fn a() {}\n").unwrap();
    std::fs::write(scratch.project().join("src/b.rs"), "fn b() {}\nfn c() {}\n").unwrap();
    let file = corpus("examples/mapreduce-command-input.yml");
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Lines in ./src/a.rs: 1"), "{text}");
    assert!(text.contains("Lines in ./src/b.rs: 2"), "{text}");
    assert!(text.contains("Analysis complete"), "{text}");
}

/// The outcome lines the job recorded, by item.
fn outcomes(scratch: &Scratch, job: &str) -> Vec<(String, String)> {
    let path = scratch
        .home()
        .join("state/project/mapreduce/jobs")
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
            "name: kill-and-resume\nmode: mapreduce\nmap:\n  input: \"seq 1 12\"\n  max_parallel: 3\n  agent_template:\n    - shell: \"echo start $ITEM >> {log}; sleep 0.3; echo end $ITEM >> {log}\"\nreduce:\n  - shell: \"echo reduce ${{map.successful}} >> {log}\"\n",
            log = runs.display()
        ),
    )
    .unwrap();
    let child = scratch.spawn(&["run", file.to_str().unwrap()]);
    // Kill -9 once some items finished and others are running.
    let output = super::interrupt_when(child, nix::sys::signal::Signal::SIGKILL, || {
        std::fs::read_to_string(&runs).is_ok_and(|t| t.matches("end").count() >= 4)
    });
    assert_eq!(output.status.code(), None, "killed by a signal");
    // The agents' shells outlive a SIGKILL of prodigy (each runs in its own process group);
    // let them finish writing before reading what started.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let jobs = scratch.home().join("state/project/mapreduce/jobs");
    let job = std::fs::read_dir(&jobs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
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
    let scratch = Scratch::new();
    // The workflow writes its input to a fixed path in /tmp; point it into the scratch.
    let input = scratch.dir.path().join("resume-test-items.json");
    let text = std::fs::read_to_string(corpus("workflows/tests/test-mapreduce-resume.yml"))
        .unwrap()
        .replace("/tmp/resume-test-items.json", input.to_str().unwrap());
    let copy = scratch.dir.path().join("test-mapreduce-resume.yml");
    std::fs::write(&copy, text).unwrap();
    let child = scratch.spawn(&["run", copy.to_str().unwrap()]);
    let project = scratch.project();
    let output = super::interrupt_when(child, nix::sys::signal::Signal::SIGINT, || {
        project.join("output-item-one.txt").is_file()
            || project.join("output-item-two.txt").is_file()
    });
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    let last = stderr(&output);
    assert!(last.contains("prodigy resume-job"), "{last}");
    let job = job_id(&output);
    let output = scratch.run(&["resume-job", "-v", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("SUCCESS: All 5 items were processed"),
        "{text}"
    );
    assert!(text.contains("Total: 150"), "{text}");
    assert!(!input.exists(), "the reduce phase cleans up");
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
    for line in String::from_utf8_lossy(&follow.stdout).lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    let missing = scratch.run(&["events", "no-such-job"], &[]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_job_is_locked_while_it_runs() {
    let scratch = Scratch::new();
    let file = scratch.project().join("slow.yml");
    let started = scratch.dir.path().join("started");
    std::fs::write(
        &file,
        format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 1\"\n  agent_template:\n    - shell: \"touch {}; sleep 5\"\n",
            started.display()
        ),
    )
    .unwrap();
    let child = scratch.spawn(&["run", file.to_str().unwrap()]);
    let jobs = scratch.home().join("state/project/mapreduce/jobs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let job = std::fs::read_dir(&jobs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    let second = scratch.run(&["resume-job", &job], &[]);
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("already running"),
        "{}",
        stderr(&second)
    );
    let output = super::interrupt_when(child, nix::sys::signal::Signal::SIGTERM, || true);
    assert_eq!(output.status.code(), Some(143), "{}", stderr(&output));
}

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

//! Failed state writes (a full disk under `$PRODIGY_HOME`): the job stops, says which file
//! could not be written and why, keeps its checkpoint consistent with its results, and
//! `resume-job` finishes it once writes work again, running again only what has no
//! recorded outcome. Faults come from the test hook `PRODIGY_FAULT_STATE_WRITES`
//! (CONTRIBUTING.md), and from a real small tmpfs where one can be mounted.

use std::collections::BTreeMap;
use std::path::Path;

use super::mapreduce::only_job;
use super::{Scratch, stderr};

const FAULT: &str = "PRODIGY_FAULT_STATE_WRITES";

/// A map job over `seq 1 N` whose agents append their item to RUNS (outside the home) and
/// print BYTES bytes, so that their outcomes take room.
fn map_job(scratch: &Scratch, items: usize, parallel: usize, bytes: usize, fail: &str) -> String {
    let runs = scratch.dir.path().join("runs.log");
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        format!(
            "name: full-disk\nmode: mapreduce\nmap:\n  input: \"seq 1 {items}\"\n  max_parallel: {parallel}\n  agent_template:\n    - shell: \"echo $ITEM >> {log}; head -c {bytes} /dev/zero | tr '\\\\0' x; {fail}\"\nreduce:\n  - shell: \"echo reduce ${{map.successful}} >> {log}\"\n",
            log = runs.display(),
        ),
    )
    .unwrap();
    file.to_string_lossy().into_owned()
}

/// How many times each item's agent ran, and the reduce lines.
fn runs(scratch: &Scratch) -> (BTreeMap<usize, usize>, Vec<String>) {
    let text = std::fs::read_to_string(scratch.dir.path().join("runs.log")).unwrap_or_default();
    let mut counts = BTreeMap::new();
    let mut reduce = Vec::new();
    for line in text.lines() {
        match line.parse::<usize>() {
            Ok(n) => *counts.entry(n).or_insert(0) += 1,
            Err(_) => reduce.push(line.to_owned()),
        }
    }
    (counts, reduce)
}

fn job_dir(scratch: &Scratch, job: &str) -> std::path::PathBuf {
    scratch.state().join("mapreduce/jobs").join(job)
}

/// The items `results.jsonl` holds an outcome for (1-based, as the agents saw them); every
/// line must be a whole record.
fn recorded(scratch: &Scratch, job: &str) -> Vec<usize> {
    let text = std::fs::read_to_string(job_dir(scratch, job).join("results.jsonl")).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "a torn last line");
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("garbage line {l:?}: {e}"));
            usize::try_from(v["index"].as_u64().unwrap()).unwrap() + 1
        })
        .collect()
}

fn checkpoint(scratch: &Scratch, job: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(job_dir(scratch, job).join("checkpoint.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The checkpoint claims no outcome that `results.jsonl` lacks, and counts the rest as
/// remaining.
fn assert_consistent(scratch: &Scratch, job: &str, total: usize) -> Vec<usize> {
    let cp = checkpoint(scratch, job);
    let durable = recorded(scratch, job);
    assert_ne!(cp["status"], "completed", "{cp}");
    let processed = usize::try_from(cp["items_processed"].as_u64().unwrap()).unwrap();
    assert!(
        processed <= durable.len(),
        "the checkpoint counts {processed} outcomes, results.jsonl holds {}",
        durable.len()
    );
    let remaining = cp["items_remaining"].as_array().unwrap();
    assert_eq!(processed + remaining.len(), total, "{cp}");
    for n in (1..=total).filter(|n| !durable.contains(n)) {
        let id = serde_json::json!(format!("item_{}", n - 1));
        assert!(
            remaining.contains(&id),
            "{id} has no outcome yet is not remaining"
        );
    }
    durable
}

/// After the first run: resuming with working writes completes every item exactly once;
/// an item whose outcome was recorded never ran again.
fn assert_resume_completes(scratch: &Scratch, job: &str, total: usize, durable: &[usize]) {
    let (before, _) = runs(scratch);
    let output = scratch.run(&["resume-job", job], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let after = recorded(scratch, job);
    let mut items = after.clone();
    items.sort_unstable();
    assert_eq!(
        items,
        (1..=total).collect::<Vec<_>>(),
        "one outcome per item"
    );
    let (counts, reduce) = runs(scratch);
    for n in 1..=total {
        let ran = counts.get(&n).copied().unwrap_or(0);
        let first = before.get(&n).copied().unwrap_or(0);
        if durable.contains(&n) {
            assert_eq!(ran, 1, "item {n} had an outcome and ran again");
        } else {
            assert_eq!(ran, first + 1, "item {n} without an outcome runs once more");
        }
    }
    assert_eq!(reduce.len(), 1, "{reduce:?}");
    let cp = checkpoint(scratch, job);
    assert_eq!(cp["status"], "completed", "{cp}");
    assert_eq!(cp["items_processed"], total, "{cp}");
}

#[test]
fn a_results_write_that_fails_stops_the_job_and_resume_runs_the_rest_once() {
    let scratch = Scratch::new();
    let file = map_job(&scratch, 20, 2, 10, "true");
    // Six outcomes are written, then `results.jsonl` is full.
    let output = scratch.run(
        &["run", "--strict", &file],
        &[(FAULT, "file=results.jsonl,after=6")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(!text.contains("✓"), "{text}");
    assert!(
        text.contains("results.jsonl`: No space left on device"),
        "the message names the file and the OS error: {text}"
    );
    let job = only_job(&scratch);
    let durable = assert_consistent(&scratch, &job, 20);
    assert_eq!(durable.len(), 6, "{durable:?}");
    let (counts, reduce) = runs(&scratch);
    assert!(reduce.is_empty(), "reduce ran: {reduce:?}");
    // The failure stopped the job: no agent started after it (two were running).
    assert!(counts.len() <= 8, "agents kept starting: {counts:?}");
    assert_resume_completes(&scratch, &job, 20, &durable);
}

#[test]
fn a_torn_results_write_is_cut_off_and_never_read_as_an_outcome() {
    let scratch = Scratch::new();
    let file = map_job(&scratch, 12, 1, 100, "true");
    // Room for about three and a half outcomes: the fourth is torn.
    let output = scratch.run(&["run", &file], &[(FAULT, "file=results.jsonl,bytes=700")]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("No space left on device"), "{text}");
    let job = only_job(&scratch);
    let durable = assert_consistent(&scratch, &job, 12);
    assert!(!durable.is_empty() && durable.len() < 12, "{durable:?}");
    // A torn line a crash left behind is cut off too when the job resumes.
    let results = job_dir(&scratch, &job).join("results.jsonl");
    let mut torn = std::fs::read_to_string(&results).unwrap();
    torn.push_str("{\"item_id\":\"item_11\",\"index\":11,\"sta");
    std::fs::write(&results, torn).unwrap();
    assert_resume_completes(&scratch, &job, 12, &durable);
}

#[test]
fn a_dlq_write_that_fails_stops_the_job_and_resume_puts_the_entry_back() {
    let scratch = Scratch::new();
    // Item 3 fails and goes to the DLQ, whose entry cannot be written.
    let file = map_job(&scratch, 6, 1, 1, "test $ITEM -ne 3");
    let output = scratch.run(&["run", &file], &[(FAULT, "file=item_2.json")]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("item_2.json`: No space left on device"),
        "{text}"
    );
    let job = only_job(&scratch);
    let cp = checkpoint(&scratch, &job);
    // Its outcome is recorded, but the checkpoint keeps it remaining until the DLQ has it.
    assert!(
        cp["items_remaining"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("item_2")),
        "{cp}"
    );
    let durable = assert_consistent(&scratch, &job, 6);
    assert!(durable.contains(&3), "{durable:?}");
    assert_resume_completes(&scratch, &job, 6, &durable);
    let dlq = scratch.run(&["dlq", "list", &job], &[]);
    let listed = format!("{}{}", String::from_utf8_lossy(&dlq.stdout), stderr(&dlq));
    assert!(listed.contains("item_2"), "{listed}");
}

#[test]
fn an_event_log_that_cannot_be_written_stops_the_job() {
    let scratch = Scratch::new();
    let file = map_job(&scratch, 10, 1, 1, "true");
    let output = scratch.run(&["run", &file], &[(FAULT, "file=events-,after=12")]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        regex::Regex::new(r"events-[0-9TZ-]+\.jsonl`: No space left on device")
            .unwrap()
            .is_match(&text),
        "{text}"
    );
    let job = only_job(&scratch);
    let durable = assert_consistent(&scratch, &job, 10);
    assert!(durable.len() < 10, "{durable:?}");
    assert_resume_completes(&scratch, &job, 10, &durable);
}

#[test]
fn an_items_file_that_cannot_be_written_stops_the_job_before_any_agent() {
    let scratch = Scratch::new();
    let file = map_job(&scratch, 5, 1, 1, "true");
    let output = scratch.run(&["run", &file], &[(FAULT, "file=items.json")]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("items.json`: No space left on device"),
        "{text}"
    );
    assert!(runs(&scratch).0.is_empty(), "agents ran");
    let job = only_job(&scratch);
    let output = scratch.run(&["resume-job", &job], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(recorded(&scratch, &job).len(), 5);
}

#[test]
fn a_checkpoint_write_that_fails_stops_a_standard_run() {
    let scratch = Scratch::new();
    let runs = scratch.dir.path().join("runs.log");
    let file = scratch.project().join("steps.yml");
    let steps: Vec<String> = (1..=40)
        .map(|n| format!("  - shell: \"echo {n} >> {}\"\n", runs.display()))
        .collect();
    let steps = steps.concat();
    std::fs::write(&file, format!("name: steps\ncommands:\n{steps}")).unwrap();
    // The checkpoint after step 1 is written (`checkpoint.json`); the next one (appended
    // to `checkpoint.journal`) is not.
    let output = scratch.run(
        &["run", file.to_str().unwrap()],
        &[(FAULT, "file=checkpoint.j,after=1")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(!text.contains("✓"), "{text}");
    assert!(
        text.contains("checkpoint.json`: No space left on device"),
        "{text}"
    );
    let ran = std::fs::read_to_string(&runs).unwrap();
    // Checkpoints are synced behind the steps, at most 16 of them behind.
    assert!(ran.lines().count() <= 19, "steps went on: {ran}");
    let session = regex::Regex::new(r"prodigy resume -y (session-\S+)")
        .unwrap()
        .captures(&text)
        .unwrap_or_else(|| panic!("no resume hint: {text}"))[1]
        .to_owned();
    let output = scratch.run(&["resume", &session], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let ran = std::fs::read_to_string(&runs).unwrap();
    // Step 1's checkpoint landed: it does not run again; the rest run to the end.
    assert_eq!(ran.lines().filter(|l| *l == "1").count(), 1, "{ran}");
    assert_eq!(ran.lines().last(), Some("40"), "{ran}");
}

/// A tmpfs of SIZE mounted at DIR, unmounted when dropped; `None` (said on stderr) when
/// this machine cannot mount one (not root, or no permission in a container).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        let why = match out {
            Ok(out) if out.status.success() => return Some(Tmpfs(dir.to_owned())),
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            Err(e) => format!("`mount`: {e}"),
        };
        super::external::skip_line(
            "a_real_full_disk_stops_the_job_and_resume_finishes_it_once_there_is_room",
            &format!("cannot mount a tmpfs here ({why})"),
        );
        None
    }

    fn resize(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_real_full_disk_stops_the_job_and_resume_finishes_it_once_there_is_room() {
    let scratch = Scratch::new();
    let Some(disk) = Tmpfs::mount(&scratch.home(), "256k") else {
        return;
    };
    let file = map_job(&scratch, 200, 4, 2000, "true");
    let output = scratch.run(&["run", "--strict", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(!text.contains("✓"), "{text}");
    assert!(text.contains("No space left on device"), "{text}");
    let job = only_job(&scratch);
    let durable = assert_consistent(&scratch, &job, 200);
    assert!(durable.len() < 200, "{}", durable.len());
    disk.resize("16m");
    assert_resume_completes(&scratch, &job, 200, &durable);
}

/// The event file of JOB (there is one: the job ran once).
fn event_file(scratch: &Scratch, job: &str) -> std::path::PathBuf {
    let dir = scratch.home().join("events").join(scratch.repo()).join(job);
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[test]
fn damaged_event_lines_are_counted_and_located_and_fail_under_strict() {
    let scratch = Scratch::new();
    let file = map_job(&scratch, 3, 1, 1, "true");
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = only_job(&scratch);
    let path = event_file(&scratch, &job);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let total = lines.len();
    // Line 3 torn by a crash (the next write went on after it), line 6 with a NUL in it.
    let torn = lines[2].len() / 2;
    lines[2].truncate(torn);
    lines[5].insert(5, '\0');
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let shown = scratch.run(&["events", &job, "--json"], &[]);
    let said = stderr(&shown);
    assert!(shown.status.success(), "{said}");
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).lines().count(),
        total - 2
    );
    let place = |n: usize| format!("{}:{n}", path.display());
    assert!(said.contains("skipped 2 damaged lines"), "{said}");
    assert!(
        said.contains(&format!("{}, {}", place(3), place(6))),
        "{said}"
    );
    let strict = scratch.run(&["events", &job, "--strict"], &[]);
    assert_eq!(strict.status.code(), Some(1), "{}", stderr(&strict));
    assert!(stderr(&strict).contains(&place(3)), "{}", stderr(&strict));
}

#[test]
fn a_damaged_dlq_index_is_rebuilt_from_the_item_files_and_resume_goes_on() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        "name: dlq-index\nmode: mapreduce\nmap:\n  input: \"seq 1 4\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"test $ITEM -ne 2\"\nerror_policy:\n  max_failures: 1\n",
    )
    .unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let job = only_job(&scratch);
    let dir = scratch
        .home()
        .join("dlq")
        .join(scratch.repo())
        .join(&job)
        .join("mapreduce/dlq")
        .join(&job);
    let index = dir.join("index.json");
    assert!(index.is_file(), "{}", index.display());
    // A torn write: the index ends in the middle of a string.
    std::fs::write(&index, "{\"job_id\": \"x\", \"item_i").unwrap();
    let resumed = scratch.run(&["resume-job", "--force", &job], &[]);
    let said = stderr(&resumed);
    assert_eq!(resumed.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "the dead letter queue's index `{}` was damaged; it was rebuilt from the 1 item files",
            index.display()
        )),
        "{said}"
    );
    assert!(!said.contains("make room"), "{said}");
    assert!(dir.join("index.json.damaged").is_file());
    let rebuilt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    assert_eq!(
        rebuilt["item_ids"],
        serde_json::json!(["item_1"]),
        "{rebuilt}"
    );
}

/// A session whose `checkpoint.json` was torn: `resume` says the file is damaged and where,
/// not that it could not be read.
#[test]
fn a_damaged_session_checkpoint_is_named_as_damaged() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(&file, "- shell: \"echo one\"\n- shell: \"exit 3\"\n").unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let id = super::resume_id(&output);
    let checkpoint = scratch
        .state()
        .join("sessions")
        .join(&id)
        .join("checkpoint.json");
    assert!(checkpoint.is_file(), "{}", checkpoint.display());
    std::fs::write(&checkpoint, "{\"version\": 1, \"session_i").unwrap();
    let resumed = scratch.run(&["resume", &id], &[]);
    let said = stderr(&resumed);
    assert_eq!(resumed.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!(
            "error: the session checkpoint `{}` is damaged: ",
            checkpoint.display()
        )),
        "{said}"
    );
}

//! `prodigy logs`: the logs runs keep under `$PRODIGY_HOME/logs/{repo}/{id}/` (docs/running.md,
//! "Logs"): every step's output and how it ended, each Claude call's raw stream, and the
//! whole output of a command that outgrew `PRODIGY_OUTPUT_LIMIT`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prodigy_runtime::claude::Stream;
use prodigy_runtime::layout::Layout;
use prodigy_runtime::logs::{StepFiles, owner_steps, run_steps, step_number};

use crate::{err, exit_code, out};

/// `prodigy logs`.
#[derive(clap::Args)]
pub(crate) struct LogsArgs {
    /// The session or MapReduce job whose logs to list; without it, the runs that have logs,
    /// newest first.
    #[arg(value_name = "ID")]
    id: Option<String>,
    /// Only the logs of this item (`item_3`), or `steps` for the steps outside a map phase.
    #[arg(long, value_name = "ITEM")]
    item: Option<String>,
    /// Print the output of step N as the list numbers it (of `--item`, else of the steps
    /// outside a map phase).
    #[arg(long, value_name = "N", conflicts_with_all = ["show", "raw"])]
    step: Option<u32>,
    /// Print each call as people read it (Claude's text, tool calls, API retries, and how
    /// it ended), instead of the list.
    #[arg(long, conflicts_with = "raw")]
    show: bool,
    /// Print each log as stored (Claude's `stream-json` lines).
    #[arg(long)]
    raw: bool,
    #[command(flatten)]
    pub(crate) quiet: crate::Quiet,
}

/// `prodigy logs`: the runs with logs, a run's steps and logs, or one step's output.
pub(crate) fn logs(args: &LogsArgs) -> u8 {
    let root = Layout::logs_root(&Layout::home());
    let Some(id) = &args.id else {
        return list_runs(&root);
    };
    let dir = std::fs::read_dir(&root)
        .ok()
        .filter(|_| prodigy_runtime::layout::is_id(id))
        .and_then(|repos| {
            repos
                .filter_map(Result::ok)
                .map(|repo| repo.path().join(id))
                .find(|p| p.is_dir())
        });
    let Some(dir) = dir else {
        err(&format!(
            "error: no logs for `{id}` under {}; `prodigy logs` lists the runs that have some\n",
            root.display()
        ));
        return exit_code::USAGE;
    };
    if let Some(number) = args.step {
        let owner = args.item.as_deref().unwrap_or("steps");
        return show_step(&dir, id, owner, number);
    }
    let mut files = Vec::new();
    let mut steps = String::new();
    // One item's steps are found without reading every other's.
    let mut owners = match &args.item {
        Some(item) => std::collections::BTreeMap::from([(item.clone(), owner_steps(&dir, item))]),
        None => run_steps(&dir),
    };
    // An owner with logs and no step (a Claude call of a step still running).
    for owner in sorted_entries(&dir).iter().filter(|o| o.is_dir()) {
        if let Some(name) = owner.file_name() {
            owners
                .entry(name.to_string_lossy().into_owned())
                .or_default();
        }
    }
    // Items in their order (`item_2` before `item_10`), then the run's own steps.
    let mut owners: Vec<_> = owners.into_iter().collect();
    owners.sort_by_key(|(owner, _)| owner_order(owner));
    for (owner, owner_steps) in &owners {
        if args.item.as_ref().is_some_and(|item| item != owner) {
            continue;
        }
        if !args.show && !args.raw {
            steps.push_str(&list_steps(owner, owner_steps));
        }
        files.extend(
            sorted_entries(&dir.join(owner))
                .into_iter()
                .filter(|f| f.is_file() && !is_step_file(f)),
        );
    }
    out(&prodigy_runtime::progress::visible(&steps));
    if files.is_empty() && steps.is_empty() {
        err(&format!(
            "error: no logs for `{id}`{}\n",
            args.item
                .as_ref()
                .map_or_else(String::new, |i| format!(" and item `{i}`"))
        ));
        return exit_code::USAGE;
    }
    for file in &files {
        print_log(args, &dir, file);
    }
    exit_code::OK
}

/// Prints the log FILE of the run's DIR as ARGS ask: as stored (`--raw`), whole
/// (`--show`), or one line saying what it is.
fn print_log(args: &LogsArgs, dir: &Path, file: &Path) {
    let name = file.strip_prefix(dir).unwrap_or(file).display().to_string();
    // Line by line: the whole output of a command may be far larger than memory.
    let lines = std::fs::File::open(file)
        .map(std::io::BufReader::new)
        .into_iter()
        .flat_map(std::io::BufRead::lines)
        .map_while(Result::ok);
    let mut text = String::new();
    if args.raw {
        for line in lines {
            text.push_str(&line);
            text.push('\n');
            if text.len() > 1 << 20 {
                out(&std::mem::take(&mut text));
            }
        }
        out(&text);
        return;
    }
    if is_claude_log(file) {
        let mut stream = Stream::default();
        let mut notes = Vec::new();
        for line in lines {
            notes.extend(stream.feed(&line));
        }
        let summary = summary(&stream);
        if args.show {
            let _ = writeln!(text, "== {name}");
            for note in &notes {
                for line in note.line().lines() {
                    let _ = writeln!(text, "  │ {line}");
                }
            }
            let _ = writeln!(text, "  {summary}");
        } else {
            let _ = writeln!(text, "{name}  {summary}  {}", file.display());
        }
    } else if args.show {
        let _ = writeln!(text, "== {name}");
        for line in lines {
            text.push_str(&line);
            text.push('\n');
            if text.len() > 1 << 20 {
                out(&prodigy_runtime::progress::visible(&std::mem::take(
                    &mut text,
                )));
            }
        }
    } else {
        let size = std::fs::metadata(file).map_or(0, |m| m.len());
        let _ = writeln!(
            text,
            "{name}  command output, {size} bytes  {}",
            file.display()
        );
    }
    out(&prodigy_runtime::progress::visible(&text));
}

/// How a call ended, in a few words: `ok, 3 turns, $0.0123` or `failed (overloaded): …`.
fn summary(stream: &Stream) -> String {
    // A call that ended without a `result` is priced from its stream, an estimate (`~`).
    let (cost, _, estimated) = stream.cost();
    let turns = stream.num_turns();
    let counts = format!(
        "{turns} turn{}, {}${cost:.4}",
        if turns == 1 { "" } else { "s" },
        if estimated { "~" } else { "" }
    );
    // The exit code is not in the log: a `result` without `is_error` is taken as a success;
    // a call prodigy ended (a timeout, a stall) says so in its last line.
    let verdict = match stream.ended_by_prodigy {
        Some(end) => stream.verdict_after(end),
        None => stream.verdict(Some(0)),
    };
    match verdict {
        verdict if verdict.kind.is_none() => format!("ok, {counts}"),
        verdict => {
            let kind = verdict
                .kind
                .map_or("unknown", prodigy_runtime::claude::ErrorKind::name);
            let first = verdict.message.lines().next().unwrap_or("");
            let message = if stream.ended_by_prodigy.is_some() {
                first
            } else if stream.result.is_none() {
                "no result (still running, or the call was ended)"
            } else {
                first
            };
            format!("failed ({kind}), {counts}: {message}")
        }
    }
}

/// The STEPS of OWNER, one line each: `steps/step 3  [reduce 2] LABEL  succeeded in 0.012s,
/// 14 bytes of output`.
fn list_steps(name: &str, steps: &std::collections::BTreeMap<u32, StepFiles>) -> String {
    let mut text = String::new();
    for (number, (record, output)) in steps {
        let size = std::fs::metadata(output).map_or(0, |m| m.len());
        let output = if size == 0 {
            "no output".to_owned()
        } else {
            format!("{size} bytes of output")
        };
        let line = match record {
            Some(r) => {
                let place = match (r.phase.as_deref(), r.index) {
                    (Some("steps"), Some(index)) => format!("[{}] ", index + 1),
                    (Some("notify"), _) => "[notify] ".to_owned(),
                    (Some(phase), Some(index)) => format!("[{phase} {}] ", index + 1),
                    _ => String::new(),
                };
                // One line per step, whatever its label holds.
                format!(
                    "{place}{}  {} in {:.3}s, {output}",
                    r.step.replace('\n', " "),
                    r.outcome,
                    r.duration_secs
                )
            }
            None => format!("(running, or its run was stopped)  {output}"),
        };
        let _ = writeln!(text, "{name}/step {number}  {line}");
    }
    text
}

/// `prodigy logs ID --step N`: the output step N of OWNER kept (the list says which it is).
fn show_step(dir: &Path, id: &str, owner: &str, number: u32) -> u8 {
    let Some((_, output)) = owner_steps(dir, owner).remove(&number) else {
        err(&format!(
            "error: `{id}` has no step {number} in `{owner}`; `prodigy logs {id}` lists its steps\n"
        ));
        return exit_code::USAGE;
    };
    let Ok(file) = std::fs::File::open(&output) else {
        crate::note(&format!("step {number} of `{owner}` printed nothing\n"));
        return exit_code::OK;
    };
    // Line by line: a step keeps up to `PRODIGY_OUTPUT_LIMIT` per command it ran.
    let mut text = String::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(file)).map_while(Result::ok) {
        text.push_str(&line);
        text.push('\n');
        if text.len() > 1 << 20 {
            out(&prodigy_runtime::progress::visible(&std::mem::take(
                &mut text,
            )));
        }
    }
    out(&prodigy_runtime::progress::visible(&text));
    exit_code::OK
}

fn is_step_file(file: &Path) -> bool {
    file.file_name()
        .is_some_and(|n| step_number(&n.to_string_lossy()).is_some())
}

fn is_claude_log(file: &Path) -> bool {
    file.extension().is_some_and(|e| e == "jsonl")
}

/// Where OWNER's logs come in a listing: map items by their number, then anything else
/// by name (`steps`, the run's own).
fn owner_order(owner: &str) -> (u8, u64, String) {
    match owner.strip_prefix("item_").and_then(|n| n.parse().ok()) {
        Some(n) => (0, n, String::new()),
        None => (1, 0, owner.to_owned()),
    }
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
}

/// Every run with logs, newest first: its id, how many logs, and where.
fn list_runs(root: &Path) -> u8 {
    let mut runs: Vec<(std::time::SystemTime, String, usize, usize, PathBuf)> = Vec::new();
    for repo in sorted_entries(root) {
        for run in sorted_entries(&repo) {
            let steps: usize = run_steps(&run)
                .values()
                .map(std::collections::BTreeMap::len)
                .sum();
            let count = sorted_entries(&run)
                .iter()
                .filter(|owner| owner.is_dir())
                .flat_map(|owner| sorted_entries(owner))
                .filter(|file| !is_step_file(file))
                .count();
            let modified = std::fs::metadata(&run)
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            let id = run
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            runs.push((modified, id, count, steps, run));
        }
    }
    if runs.is_empty() {
        crate::note(&format!("no logs under {}\n", root.display()));
        return exit_code::OK;
    }
    runs.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut text = String::new();
    for (_, id, count, steps, dir) in runs {
        let _ = writeln!(
            text,
            "{id}  {}, {}  {}",
            prodigy_runtime::progress::count(count as u64, "log"),
            prodigy_runtime::progress::count(steps as u64, "step"),
            dir.display()
        );
    }
    out(&text);
    exit_code::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call whose stream ended before its `result` shows the cost its usage is estimated at.
    #[test]
    fn a_call_without_a_result_shows_an_estimated_cost() {
        let mut stream = Stream::default();
        stream.feed(
            r#"{"type":"system","subtype":"init","session_id":"s","model":"claude-sonnet-4-5"}"#,
        );
        stream.feed(r#"{"type":"assistant","message":{"id":"m","content":[],"usage":{"input_tokens":1000,"output_tokens":100}}}"#);
        let line = summary(&stream);
        assert!(line.contains("1 turn, ~$0.0045: no result"), "{line}");
    }

    /// A call prodigy stopped says how, as its events do: its log's last line is prodigy's.
    #[test]
    fn a_call_prodigy_stopped_says_stalled_or_timed_out_as_the_events_do() {
        for (end, kind) in [
            (prodigy_runtime::claude::End::Stalled, "failed (stalled)"),
            (prodigy_runtime::claude::End::TimedOut, "failed (timeout)"),
        ] {
            let mut stream = Stream::default();
            stream.feed(r#"{"type":"system","subtype":"init","session_id":"s","model":"claude-sonnet-4-5"}"#);
            stream.feed(r#"{"type":"assistant","message":{"id":"m","content":[],"usage":{"input_tokens":1000,"output_tokens":100}}}"#);
            stream.feed(&end.log_line().unwrap());
            let line = summary(&stream);
            assert!(line.starts_with(kind), "{line}");
        }
    }
}

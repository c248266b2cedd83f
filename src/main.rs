//! `prodigy`: the command-line interface.
//!
//! Parses arguments, wires the library crates together and maps outcomes to exit codes.
//! Logic that a library could test lives in the library crates.

/// Map inputs are one JSON value per item, allocation-heavy; mimalloc makes that cheap.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod exit_code;
mod jobs;
mod lsp;
mod output;
mod run;
mod worktrees;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use prodigy_compiler::diagnostics::{Code, Diagnostic, Severity};
use prodigy_compiler::source::SourceFile;

/// Prodigy compiles YAML workflows of shell and Claude Code steps and runs them reliably.
#[derive(Parser)]
#[command(name = "prodigy", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check workflow files and report every problem with its exact place.
    ///
    /// Exit status: 0 when no file has errors, 1 when one has (or has warnings under
    /// `--deny warnings`), 2 for usage errors and unreadable files.
    Check(CheckArgs),
    /// Draw every path a run can take: steps, handlers, retries, the map fan-out, the breaker
    /// and the dead letter queue.
    ///
    /// `prodigy graph workflow.yml | dot -Tsvg > plan.svg` renders it with Graphviz;
    /// `--format mermaid` prints a flowchart for GitHub. The output is the same on every run.
    Graph(GraphArgs),
    /// Print the items a `MapReduce` workflow's map phase will process, one JSON value per line.
    ///
    /// Runs the input pipeline of SPEC §7 on the input file: `json_path`, `filter`, `sort_by`,
    /// `distinct`, `offset`, `max_items`. The workflow must check without errors. Stage counts
    /// go to stderr.
    Items(ItemsArgs),
    /// Run the language server on stdin/stdout, for editors: diagnostics as you type, key
    /// documentation on hover, completion of keys and variables.
    Lsp,
    /// Print the JSON Schema (draft 2020-12) of the workflow format, for editors such as
    /// yaml-language-server (see the README).
    Schema,
    /// Run a workflow: compile it, then run its steps, recording events and a checkpoint
    /// after every step under `$PRODIGY_HOME` (default `~/.prodigy`).
    ///
    /// A MapReduce workflow runs as a job: setup, one agent per item (`max_parallel` at a
    /// time) under the error policy and circuit breaker, failed items in the dead letter
    /// queue, then reduce; its state goes under `state/{repo}/mapreduce/jobs/{job_id}/`.
    ///
    /// In a git repository the run works in its own worktree on branch `prodigy-{id}` (each
    /// map agent in another, their commits merged back one at a time), and a successful run
    /// is merged back into the branch it started from, through the `merge:` steps if any,
    /// after asking on a terminal (`-y` does not ask; without a terminal nothing is merged
    /// and the last lines say how). `--no-worktree` runs in place.
    ///
    /// Exit status: 0 when the workflow succeeds (a job whose failed items went to the DLQ
    /// too, unless `--strict`: then 3), 1 when it has errors, a step fails it or the error
    /// policy stops the job, 2 for usage problems, 130/143 when interrupted by
    /// SIGINT/SIGTERM (the last line says how to resume).
    Run(run::RunArgs),
    /// Continue a standard workflow's session after its last completed step.
    Resume(run::ResumeArgs),
    /// Continue a MapReduce job after a crash, a signal or a stop: items that were running
    /// go back to pending, finished items keep their results, failed items stay in the dead
    /// letter queue, and the job goes on in the phase it was in.
    ///
    /// Exit status as for `run`.
    ResumeJob(run::ResumeJobArgs),
    /// Inspect and retry the dead letter queue of a MapReduce job: the items that failed,
    /// with every failed attempt.
    #[command(subcommand)]
    Dlq(jobs::DlqCommand),
    /// Print the event log of a job or session (`prodigy events JOB_ID`), or follow it as it
    /// grows (`--follow`).
    Events(jobs::EventsArgs),
    /// List or remove the git worktrees runs left behind (after a failure, a declined merge,
    /// uncommitted changes, or a merge conflict parked in the dead letter queue).
    #[command(subcommand)]
    Worktree(worktrees::WorktreeCommand),
    /// Explain a diagnostic code, e.g. `prodigy explain V001`.
    Explain {
        /// The code, such as `V001` (case-insensitive). Without it, list every code.
        code: Option<String>,
    },
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Workflow files (`.yml`, `.yaml`; JSON is YAML too).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Output format: `human` (miette reports), `json` (`{"version": 1, "diagnostics": [...]}`,
    /// the stable contract for editors and CI, described in the README), `sarif` (SARIF
    /// 2.1.0, for GitHub code scanning) or `github` (workflow-command annotations).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Treat warnings as errors.
    #[arg(long, value_enum, value_name = "WHAT")]
    deny: Vec<Deny>,
    /// Print the compiled plan as JSON (the runtime's input) instead of diagnostics, when the
    /// file has no errors.
    #[arg(long, value_enum, value_name = "WHAT")]
    emit: Option<Emit>,
    /// Print each retry policy's delay schedule and worst-case total time, as a table.
    #[arg(long)]
    explain_retries: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    Plan,
}

#[derive(clap::Args)]
struct GraphArgs {
    /// A workflow file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// `dot` (Graphviz), `mermaid` (GitHub's flowchart syntax) or `json`.
    #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
    format: GraphFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum GraphFormat {
    Dot,
    Mermaid,
    Json,
}

#[derive(clap::Args)]
struct ItemsArgs {
    /// A `MapReduce` workflow.
    #[arg(value_name = "WORKFLOW")]
    workflow: PathBuf,
    /// The input JSON file, instead of the workflow's `map.input` (needed when that is a
    /// command, which `items` does not run).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Human,
    Json,
    Sarif,
    Github,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Deny {
    Warnings,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Check(args) => check(&args),
        Command::Graph(args) => graph(&args),
        Command::Items(args) => items(&args),
        Command::Lsp => lsp::run(),
        Command::Run(args) => run::run(&args),
        Command::Resume(args) => run::resume(&args),
        Command::ResumeJob(args) => run::resume_job(&args),
        Command::Dlq(command) => jobs::dlq(&command),
        Command::Events(args) => jobs::events(&args),
        Command::Worktree(command) => worktrees::worktree(&command),
        Command::Schema => {
            let schema = prodigy_compiler::schema::schema();
            out(&format!(
                "{}\n",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            ));
            exit_code::OK
        }
        Command::Explain { code } => explain(code.as_deref()),
    };
    ExitCode::from(code)
}

/// Writes to stdout, ignoring a closed pipe (as `prodigy check ... | head` expects).
pub(crate) fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

pub(crate) fn err(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

fn check(args: &CheckArgs) -> u8 {
    let deny_warnings = args.deny.contains(&Deny::Warnings);
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let (mut errors, mut warnings, mut unreadable) = (0, 0, false);
    let mut json = Vec::new();
    let mut sarif = Vec::new();
    // `check` learns about the project directory (the current one) through these.
    let file_exists = |p: &str| std::path::Path::new(p).is_file();
    #[expect(
        clippy::disallowed_methods,
        reason = "the command line reads the project's files for `check`"
    )]
    let read_file = |p: &str| std::fs::read_to_string(p).ok();
    let surroundings = prodigy_compiler::Surroundings {
        file_exists: &file_exists,
        read_file: &read_file,
    };
    for path in &args.files {
        let file = match SourceFile::load(path) {
            Ok(file) => file,
            Err(e) => {
                err(&format!("error: {e}\n"));
                unreadable = true;
                continue;
            }
        };
        let mut checked = prodigy_compiler::check_in(&file, &surroundings);
        if deny_warnings {
            for d in &mut checked.diagnostics {
                d.severity = Severity::Error;
            }
        }
        errors += checked.diagnostics.iter().filter(|d| d.is_error()).count();
        warnings += checked.diagnostics.iter().filter(|d| !d.is_error()).count();
        // Under `--deny warnings` a warning is an error too: then the problems are shown,
        // not the plan.
        let clean = !checked.diagnostics.iter().any(Diagnostic::is_error);
        if let (Some(Emit::Plan), Some(plan), true) = (args.emit, &checked.plan, clean) {
            match serde_json::to_string_pretty(plan) {
                Ok(text) => out(&format!("{text}\n")),
                Err(e) => err(&format!("error: cannot write the plan: {e}\n")),
            }
            continue;
        }
        if args.explain_retries
            && let Some(plan) = &checked.plan
        {
            out(&output::retry_table(&file, plan));
        }
        match args.format {
            Format::Human => out(&output::human(&file, &checked.diagnostics, color)),
            Format::Json => json.extend(output::to_json(&file, &checked.diagnostics)),
            Format::Github => out(&output::github(&file, &checked.diagnostics)),
            Format::Sarif => sarif.push((file, checked.diagnostics)),
        }
    }
    match args.format {
        Format::Human | Format::Github => {
            err(&format!(
                "{}\n",
                output::summary(errors, warnings, args.files.len())
            ));
        }
        Format::Sarif => match serde_json::to_string_pretty(&output::sarif(&sarif)) {
            Ok(text) => out(&format!("{text}\n")),
            Err(e) => {
                err(&format!("error: cannot write SARIF: {e}\n"));
                return exit_code::USAGE;
            }
        },
        Format::Json => {
            let report = output::JsonReport {
                version: output::JSON_VERSION,
                diagnostics: json,
            };
            match serde_json::to_string_pretty(&report) {
                Ok(text) => out(&format!("{text}\n")),
                Err(e) => {
                    err(&format!("error: cannot write JSON: {e}\n"));
                    return exit_code::USAGE;
                }
            }
        }
    }
    if unreadable {
        exit_code::USAGE
    } else if errors > 0 {
        exit_code::PROBLEMS
    } else {
        exit_code::OK
    }
}

fn explain(code: Option<&str>) -> u8 {
    let Some(text) = code else {
        for code in Code::ALL {
            out(&format!("{code}  {}\n", code.summary()));
        }
        return exit_code::OK;
    };
    if let Some(code) = Code::parse(text) {
        out(code.explanation());
        exit_code::OK
    } else {
        err(&format!(
            "error: unknown code `{text}`; run `prodigy explain` to list every code\n"
        ));
        exit_code::USAGE
    }
}

fn items(args: &ItemsArgs) -> u8 {
    let (_, checked) = match load_checked(&args.workflow) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let Some(map) = checked.plan.as_ref().and_then(|p| p.map.as_ref()) else {
        err("error: the workflow has no `map` phase\n");
        return exit_code::USAGE;
    };
    let input_path = match &args.input {
        Some(path) => path.clone(),
        // Relative to the project, the directory prodigy runs in, as for `check` and `run`.
        None if map.input.parsed.is_literal() => PathBuf::from(&map.input.value),
        None => {
            err(&format!(
                "error: `map.input` is `{}`, which needs variables or a command; pass the input with `--input FILE`\n",
                map.input.value
            ));
            return exit_code::USAGE;
        }
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "the command line reads the input file the user names"
    )]
    let read = std::fs::read_to_string(&input_path);
    let text = match read {
        Ok(text) => text,
        Err(e) => {
            err(&format!(
                "error: cannot read `{}`: {e}\n",
                input_path.display()
            ));
            return exit_code::USAGE;
        }
    };
    let kind = prodigy_grammar::pipeline::InputKind::of_file(&input_path.to_string_lossy());
    let input = match prodigy_grammar::pipeline::parse_input(&text, kind) {
        Ok(value) => value,
        Err(e) => {
            err(&format!("error: `{}`: {e}\n", input_path.display()));
            return exit_code::USAGE;
        }
    };
    let pipeline = map.pipeline();
    let (items, counts) = pipeline.apply(input);
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for item in &items {
        if serde_json::to_writer(&mut stdout, item).is_err() || stdout.write_all(b"\n").is_err() {
            return exit_code::OK;
        }
    }
    let _ = stdout.flush();
    // Only the stages the workflow has.
    err(&format!(
        "items: {}, {} kept\n",
        prodigy_runtime::progress::stage_counts(&pipeline, &counts),
        counts.kept
    ));
    exit_code::OK
}

/// Loads and checks a workflow for a command that needs it without errors (`run`, `graph`,
/// `items`): the problems go to stderr, so that stdout holds only the command's output.
pub(crate) fn load_checked(
    path: &std::path::Path,
) -> Result<(SourceFile, prodigy_compiler::Checked), u8> {
    let file = SourceFile::load(path).map_err(|e| {
        err(&format!("error: {e}\n"));
        exit_code::USAGE
    })?;
    let checked = prodigy_compiler::check(&file);
    if checked.has_errors() {
        err(&output::human(&file, &checked.diagnostics, false));
        err("error: the workflow has errors; fix them first (see above)\n");
        return Err(exit_code::PROBLEMS);
    }
    Ok((file, checked))
}

fn graph(args: &GraphArgs) -> u8 {
    let (file, checked) = match load_checked(&args.file) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let (Some(plan), Some(graph)) = (&checked.plan, &checked.graph) else {
        err("error: internal error: a workflow without errors has no plan\n");
        return exit_code::PROBLEMS;
    };
    let text = match args.format {
        GraphFormat::Dot => prodigy_compiler::emit::dot(graph, plan),
        GraphFormat::Mermaid => prodigy_compiler::emit::mermaid(graph, plan),
        GraphFormat::Json => {
            let value = prodigy_compiler::emit::json(graph, plan, &file);
            serde_json::to_string_pretty(&value)
                .map(|t| t + "\n")
                .unwrap_or_default()
        }
    };
    out(&text);
    exit_code::OK
}

//! `prodigy`: the command-line interface.
//!
//! Parses arguments, wires the library crates together and maps outcomes to exit codes.
//! Logic that a library could test lives in the library crates.

/// Map inputs are one JSON value per item, allocation-heavy; mimalloc makes that cheap.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod agent;
mod check;
mod exit_code;
mod graph_status;
mod items;
mod jobs;
mod logs;
mod lsp;
mod noshare;
mod output;
mod report;
mod run;
mod runs;
mod shellcheck;
mod status;
mod ui;
mod worktrees;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};
use prodigy_compiler::diagnostics::Code;
use prodigy_compiler::source::{LoadDiagnostic as _, SourceFile};

/// Prodigy compiles YAML workflows of shell and Claude Code steps and runs them reliably.
#[derive(Parser)]
#[command(name = "prodigy", version, about, long_about = None)]
struct Cli {
    /// When to colour the output: `auto` (on a terminal, unless `NO_COLOR` is set and not
    /// empty, or `TERM` is `dumb`), `always` or `never`.
    #[arg(long, value_enum, global = true, default_value_t = Color::Auto, value_name = "WHEN")]
    color: Color,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Color {
    Auto,
    Always,
    Never,
}

/// `--color`, as `Color as u8`.
static COLOR: AtomicU8 = AtomicU8::new(Color::Auto as u8);
/// `-q/--quiet`: only the outcome line and errors.
static QUIET: AtomicBool = AtomicBool::new(false);
/// `-v` (1: step output; 2: also commands and timings).
static VERBOSE: AtomicU8 = AtomicU8::new(0);

/// Whether to colour output for a stream that is (or is not) a terminal.
pub(crate) fn color(terminal: bool) -> bool {
    wants_color(
        COLOR.load(Ordering::Relaxed),
        terminal,
        std::env::var_os("NO_COLOR").as_deref(),
        std::env::var_os("TERM").as_deref(),
    )
}

/// `--color` CHOICE (`Color as u8`) for a stream that is (or is not) a terminal, given the
/// `NO_COLOR` and `TERM` variables: no-color.org counts only a `NO_COLOR` that is not empty,
/// and a dumb terminal gets no colour.
fn wants_color(
    choice: u8,
    terminal: bool,
    no_color: Option<&std::ffi::OsStr>,
    term: Option<&std::ffi::OsStr>,
) -> bool {
    match choice {
        c if c == Color::Always as u8 => true,
        c if c == Color::Never as u8 => false,
        _ => {
            terminal
                && no_color.is_none_or(std::ffi::OsStr::is_empty)
                && term.is_none_or(|t| t != "dumb")
        }
    }
}

/// `-q/--quiet` of the commands that print results (`graph`, `items`, `ls`, `dlq`, `events`,
/// `logs`, `worktree`): their informational lines on stderr are dropped, never the results.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub(crate) struct Quiet {
    /// Print only the results and errors: no informational lines on stderr.
    #[arg(short, long)]
    pub(crate) quiet: bool,
}

/// Sets `-v` and `-q/--quiet` for the command that runs.
pub(crate) fn set_verbosity(verbose: u8, quiet: bool) {
    VERBOSE.store(verbose, Ordering::Relaxed);
    QUIET.store(quiet, Ordering::Relaxed);
}

/// How many `-v`.
pub(crate) fn verbose() -> u8 {
    VERBOSE.load(Ordering::Relaxed)
}

/// Whether `-q/--quiet` is on.
pub(crate) fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Prints a progress or information line to stderr, unless `-q/--quiet`; errors and the
/// final outcome line use [`err`].
pub(crate) fn note(text: &str) {
    if !quiet() {
        err(text);
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check workflow files and report every problem with its exact place.
    ///
    /// Exit status: 0 when no file has errors, 1 when one has (or has warnings under
    /// `--deny warnings`), 2 for usage errors and unreadable files.
    ///
    /// Complete workflows to copy are in `workflows/examples/` of Prodigy's repository.
    Check(check::CheckArgs),
    /// Draw every path a run can take: steps, handlers, retries, the map fan-out, the breaker
    /// and the dead letter queue.
    ///
    /// `prodigy graph workflow.yml | dot -Tsvg > plan.svg` renders it with Graphviz;
    /// `--format mermaid` prints a flowchart for GitHub. The output is the same on every run.
    Graph(GraphArgs),
    /// Print the items a `MapReduce` workflow's map phase will process, one JSON value per line.
    ///
    /// Runs the input pipeline of docs/language.md §7 on the input (a file, or the output of
    /// the input command): `json_path`, `filter`, `sort_by`, `distinct`, `offset`, `max_items`. The workflow must check without errors. Stage counts
    /// go to stderr. `--run-setup` runs the workflow's `setup` first, in a throwaway git
    /// worktree removed afterwards, with its output on stderr.
    Items(ItemsArgs),
    /// Run the language server on stdin/stdout, for editors: diagnostics as you type, key
    /// documentation on hover, completion of keys and variables.
    Lsp,
    /// Print the JSON Schema (draft 2020-12) of the workflow format, for editors such as
    /// yaml-language-server (docs/linting.md), or the field reference as Markdown.
    Schema {
        /// Print the field reference (`docs/reference.md`) as Markdown instead.
        #[arg(long)]
        markdown: bool,
    },
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
    ///
    /// Complete workflows to copy are in `workflows/examples/` of Prodigy's repository.
    Run(run::RunArgs),
    /// Continue a standard workflow's session after its last completed step.
    Resume(run::ResumeArgs),
    /// Continue a MapReduce job after a crash, a signal or a stop: items that were running
    /// go back to pending, finished items keep their results, failed items stay in the dead
    /// letter queue, and the job goes on in the phase it was in.
    ///
    /// Exit status as for `run`.
    ResumeJob(run::ResumeJobArgs),
    /// List the runs and jobs of this repository (every repository's with `--all`), newest
    /// first, with their state (running, crashed, completed, failed, stopped, interrupted),
    /// a job's item counts, and the ids that `resume`, `resume-job`, `dlq`, `events` and
    /// `logs` take.
    #[command(visible_alias = "runs")]
    Ls(runs::LsArgs),
    /// Show how a run or job stands now: its running agents and what each does (step,
    /// Claude's current tool call and turn), counts, a usage-limit pause and the Claude
    /// spend; `--watch` refreshes it in place, `--json` is for scripts.
    Status(status::StatusArgs),
    /// Serve a web dashboard of the runs and jobs under `$PRODIGY_HOME` on 127.0.0.1: each
    /// run's plan with live states, its items, running agents and Claude calls, updated as
    /// the files grow. It prints its URL with an access token; read-only unless
    /// `--allow-actions`.
    Ui(ui::UiArgs),
    /// Inspect and retry the dead letter queue of a MapReduce job: the items that failed,
    /// with every failed attempt.
    #[command(subcommand)]
    Dlq(jobs::DlqCommand),
    /// Print the event log of a job or session (`prodigy events JOB_ID`), or follow it as it
    /// grows (`--follow`).
    Events(jobs::EventsArgs),
    /// List and show the logs of a run: every step's output and how it ended (`prodigy logs
    /// ID --step N`, `--item item_3 --step N`), each Claude call's raw stream, and the whole
    /// output of a command that outgrew `PRODIGY_OUTPUT_LIMIT` (`prodigy logs ID --item
    /// item_3 --show`).
    Logs(logs::LogsArgs),
    /// List or remove the git worktrees runs left behind (after a failure, a declined merge,
    /// uncommitted changes, or a merge conflict parked in the dead letter queue).
    #[command(subcommand)]
    Worktree(worktrees::WorktreeCommand),
    /// Explain a diagnostic code, e.g. `prodigy explain V001`.
    Explain {
        /// The code, such as `V001` (case-insensitive). Without it, list every code.
        code: Option<String>,
    },
    /// Print a completion script for a shell: `prodigy completions bash >
    /// ~/.local/share/bash-completion/completions/prodigy`.
    Completions {
        /// `bash`, `zsh`, `fish`, `elvish` or `powershell`.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), with every subcommand: `prodigy man | man -l -`.
    Man,
    /// Run one map item inside a Slurm task (what `--executor slurm` submits).
    #[command(hide = true)]
    Agent(agent::AgentArgs),
    /// Guard a run's processes: end them once the run's process is gone (what `run`,
    /// `resume`, `resume-job` and `dlq retry` start beside themselves).
    #[command(hide = true)]
    Guard(GuardArgs),
}

/// `prodigy guard`: started by a run, reading its standard input (a pipe from the run) to
/// its end. Not for people.
#[derive(clap::Args)]
struct GuardArgs {
    /// The mark of the run's processes (`PRODIGY_OWNER`).
    #[arg(long)]
    owner: String,
    /// Milliseconds between SIGTERM and SIGKILL.
    #[arg(long)]
    grace_ms: u64,
}

/// The command line, with the exit status table after the long help.
/// The command line as completions offer it: without prodigy's own hidden subcommands
/// (`agent`, `guard`), which the completion generators would list.
fn completed_command() -> clap::Command {
    let full = cli_command();
    let mut shown = clap::Command::new("prodigy")
        .args(full.get_arguments().cloned())
        .subcommand_required(full.is_subcommand_required_set());
    for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        shown = shown.subcommand(sub.clone());
    }
    shown
}

fn cli_command() -> clap::Command {
    Cli::command().after_long_help(exit_code::help())
}

#[derive(clap::Args)]
struct GraphArgs {
    /// A workflow file (with `--status`: the one the run ran, unless named).
    #[arg(value_name = "FILE", required_unless_present = "status")]
    file: Option<PathBuf>,
    /// Draw the state of run or job ID on the plan (as `prodigy ls` names it): each node
    /// coloured by how far the run got, with its counts; a running run as far as it got.
    #[arg(long, value_name = "ID")]
    status: Option<String>,
    /// `dot` (Graphviz), `mermaid` (GitHub's flowchart syntax) or `json`.
    #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
    format: GraphFormat,
    #[command(flatten)]
    quiet: Quiet,
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
    /// The input file, instead of the workflow's `map.input` (needed when that holds
    /// variables; a command there is run, in the current directory, as `run` runs it).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Run the workflow's `setup` first, in a throwaway git worktree of the project (removed
    /// afterwards), and read the input it writes there; setup's output goes to stderr.
    #[arg(long, conflicts_with = "input")]
    run_setup: bool,
    #[command(flatten)]
    quiet: Quiet,
}

fn main() -> ExitCode {
    let cli = parse_cli();
    COLOR.store(cli.color as u8, Ordering::Relaxed);
    ExitCode::from(dispatch(cli.command))
}

/// The command line, parsed; clap's own help and errors are coloured as `--color` says.
fn parse_cli() -> Cli {
    // `--color` also colours clap's own help and errors, so it is read before parsing.
    let choice = color_argument(std::env::args_os().skip(1));
    let mut command = cli_command();
    if let Some(choice) = choice {
        command = command.color(match choice {
            Color::Always => clap::ColorChoice::Always,
            Color::Never => clap::ColorChoice::Never,
            Color::Auto => clap::ColorChoice::Auto,
        });
    }
    match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    }
}

/// Runs COMMAND, with the verbosity its arguments ask for: the process's exit code.
fn dispatch(command: Command) -> u8 {
    match command {
        Command::Check(args) => check::check(&args),
        Command::Graph(args) => {
            set_verbosity(0, args.quiet.quiet);
            graph(&args)
        }
        Command::Items(args) => {
            set_verbosity(0, args.quiet.quiet);
            items(&args)
        }
        Command::Lsp => lsp::run(),
        Command::Agent(args) => agent::agent(&args),
        Command::Guard(args) => {
            prodigy_runtime::reap::guard(
                std::io::stdin().lock(),
                &args.owner,
                std::time::Duration::from_millis(args.grace_ms),
            );
            exit_code::OK
        }
        Command::Run(args) => {
            set_verbosity(args.shown.verbose, args.shown.quiet);
            run::run(&args)
        }
        Command::Resume(args) => {
            set_verbosity(args.shown.verbose, args.shown.quiet);
            run::resume(&args)
        }
        Command::ResumeJob(args) => {
            set_verbosity(args.shown.verbose, args.shown.quiet);
            run::resume_job(&args)
        }
        Command::Dlq(command) => {
            match &command {
                jobs::DlqCommand::Retry(args) => {
                    set_verbosity(args.shown.verbose, args.shown.quiet);
                }
                jobs::DlqCommand::List { quiet, .. }
                | jobs::DlqCommand::Show { quiet, .. }
                | jobs::DlqCommand::Clear { quiet, .. }
                | jobs::DlqCommand::Stats { quiet, .. } => set_verbosity(0, quiet.quiet),
            }
            jobs::dlq(&command)
        }
        Command::Events(args) => {
            set_verbosity(0, args.quiet.quiet);
            jobs::events(&args)
        }
        Command::Logs(args) => {
            set_verbosity(0, args.quiet.quiet);
            logs::logs(&args)
        }
        Command::Status(args) => {
            set_verbosity(0, args.quiet.quiet);
            status::status(&args)
        }
        Command::Ui(args) => {
            set_verbosity(0, args.quiet.quiet);
            ui::ui(&args)
        }
        Command::Ls(args) => {
            set_verbosity(0, args.quiet.quiet);
            runs::ls(&args)
        }
        Command::Worktree(command) => {
            let (worktrees::WorktreeCommand::Ls { quiet, .. }
            | worktrees::WorktreeCommand::Clean { quiet, .. }) = &command;
            set_verbosity(0, quiet.quiet);
            worktrees::worktree(&command)
        }
        Command::Schema { markdown } => schema(markdown),
        Command::Explain { code } => explain(code.as_deref()),
        Command::Completions { shell } => completions(shell),
        Command::Man => man(),
    }
}

/// `prodigy schema`: the JSON Schema of the workflow format, or with `--markdown` its
/// reference page.
fn schema(markdown: bool) -> u8 {
    if markdown {
        out(&prodigy_compiler::schema::markdown());
        return exit_code::OK;
    }
    let schema = prodigy_compiler::schema::schema();
    out(&format!(
        "{}\n",
        serde_json::to_string_pretty(&schema).unwrap_or_default()
    ));
    exit_code::OK
}

/// `prodigy completions`: the completion script for SHELL.
fn completions(shell: clap_complete::Shell) -> u8 {
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut completed_command(), "prodigy", &mut text);
    let text = String::from_utf8_lossy(&text);
    if shell == clap_complete::Shell::Bash {
        out(&bash_completion(&text, &bash_words(&cli_command())));
    } else {
        out(&text);
    }
    exit_code::OK
}

/// `prodigy man`: the manual page.
fn man() -> u8 {
    match man_page() {
        Ok(text) => {
            out(&text);
            exit_code::OK
        }
        Err(e) => {
            err(&format!("error: cannot render the manual page: {e}\n"));
            exit_code::USAGE
        }
    }
}

/// The value of `--color` among the arguments, if given and valid.
fn color_argument(args: impl Iterator<Item = std::ffi::OsString>) -> Option<Color> {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let mut value = None;
    for (i, arg) in args.iter().enumerate() {
        if arg == "--" {
            break;
        }
        if let Some(v) = arg.strip_prefix("--color=") {
            value = Some(v.to_owned());
        } else if arg == "--color" {
            value = args.get(i + 1).cloned();
        }
    }
    value.and_then(|v| Color::from_str(&v, true).ok())
}

/// How the first positional argument of a subcommand completes in bash.
enum Words {
    /// File names (a workflow, a directory).
    Files,
    /// The ids `prodigy ls --all` knows that start with this prefix.
    Ids(&'static str),
}

/// The bash completion of each subcommand whose first positional is a path or an id, by the
/// name `clap_complete`'s bash script gives its block.
fn bash_words(command: &clap::Command) -> Vec<(String, Words)> {
    let mut words: Vec<(String, Words)> = command
        .get_subcommands()
        .filter(|sub| {
            sub.get_positionals().any(|arg| {
                matches!(
                    arg.get_value_hint(),
                    clap::ValueHint::AnyPath | clap::ValueHint::FilePath | clap::ValueHint::DirPath
                )
            })
        })
        .map(|sub| (format!("prodigy__subcmd__{}", sub.get_name()), Words::Files))
        .collect();
    let ids = [
        ("resume", "session-"),
        ("resume__subcmd__job", "mapreduce-"),
        ("events", ""),
        ("logs", ""),
        ("dlq__subcmd__show", "mapreduce-"),
        ("dlq__subcmd__list", "mapreduce-"),
        ("dlq__subcmd__retry", "mapreduce-"),
        ("dlq__subcmd__stats", "mapreduce-"),
        ("dlq__subcmd__clear", "mapreduce-"),
    ];
    words.extend(
        ids.into_iter()
            .map(|(block, prefix)| (format!("prodigy__subcmd__{block}"), Words::Ids(prefix))),
    );
    words
}

/// `clap_complete`'s bash SCRIPT with the subcommands of WORDS completing files or ids, not
/// options, at a word that does not start with `-` (it offered only options right after a
/// subcommand, so `prodigy check <TAB>` listed no file).
fn bash_completion(script: &str, words: &[(String, Words)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(script.len());
    let mut inside = None;
    for line in script.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(case) = trimmed.strip_suffix(')')
            && !case.contains(' ')
            && !case.contains(',')
            && case.starts_with("prodigy")
        {
            inside = words
                .iter()
                .find(|(block, _)| block == case)
                .map(|(_, w)| w);
        }
        let Some(words) = inside else {
            out.push_str(line);
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        if trimmed.starts_with("if [[ ${cur} == -* || ${COMP_CWORD} -eq ") {
            let _ = writeln!(out, "{indent}if [[ ${{cur}} == -* ]] ; then");
        } else if trimmed == r#"COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )"#
            && !out.trim_end().ends_with("then")
        {
            match words {
                Words::Files => {
                    let _ = write!(out, r#"{indent}COMPREPLY=( $(compgen -f -- "${{cur}}") )"#);
                }
                Words::Ids(prefix) => {
                    let _ = write!(
                        out,
                        r#"{indent}COMPREPLY=( $(compgen -W "$(prodigy ls --all -n 0 --ids 2>/dev/null | grep -e '^{prefix}')" -- "${{cur}}") )"#
                    );
                }
            }
            out.push('\n');
        } else {
            out.push_str(line);
        }
    }
    out
}

/// One manual page: `prodigy`, then a section per subcommand (nested ones too) with its
/// synopsis, description and options.
fn man_page() -> std::io::Result<String> {
    fn sections(command: &clap::Command, path: &str, out: &mut Vec<u8>) -> std::io::Result<()> {
        // The hidden subcommands (`agent`, `guard`) are prodigy's own, not the user's.
        for sub in command
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
        {
            let name = format!("{path} {}", sub.get_name());
            let sub = sub.clone().bin_name(name.clone());
            let man = clap_mangen::Man::new(sub.clone());
            let mut part = Vec::new();
            man.render_synopsis_section(&mut part)?;
            man.render_description_section(&mut part)?;
            man.render_options_section(&mut part)?;
            writeln!(out, ".SH \"{}\"", name.to_uppercase())?;
            // The subcommand's own sections become subsections of its section.
            for line in String::from_utf8_lossy(&part).lines() {
                match line.strip_prefix(".SH ") {
                    Some(title) => writeln!(out, ".SS {title}")?,
                    None => writeln!(out, "{line}")?,
                }
            }
            sections(&sub, &name, out)?;
        }
        Ok(())
    }
    let mut command = cli_command();
    command.build();
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    sections(&command, "prodigy", &mut page)?;
    Ok(ascii_roff(&String::from_utf8_lossy(&page)))
}

/// TEXT with every character outside ASCII written as groff's `\[uXXXX]` escape, so that
/// `man` and `groff -ww` read the page the same in any locale.
fn ascii_roff(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\[u{:04X}]", u32::from(c)));
        }
    }
    out
}

/// Writes to stdout, ignoring a closed pipe (as `prodigy check ... | head` expects).
pub(crate) fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Writes to stderr what may hold a command's output (errors, outcome lines): its control
/// characters are shown, not sent to the terminal (`prodigy_runtime::progress::visible`),
/// and its outcome marks are coloured when `--color` says so (`report::marked`).
pub(crate) fn err(text: &str) {
    err_styled(&report::marked(&prodigy_runtime::progress::visible(text)));
}

/// Says the error E on stderr: `error: MESSAGE`, then `  help: HELP` when E has one, so
/// that what a typed error advises reaches the user.
pub(crate) fn err_diagnostic<E: miette::Diagnostic + ?Sized>(e: &E) {
    err(&error_text(e));
}

/// The text [`err_diagnostic`] writes.
fn error_text<E: miette::Diagnostic + ?Sized>(e: &E) -> String {
    match e.help() {
        Some(help) => format!("error: {e}\n  help: {help}\n"),
        None => format!("error: {e}\n"),
    }
}

/// Writes prodigy's own styled text (coloured diagnostics) to stderr as it is.
pub(crate) fn err_styled(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
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
    let (file, checked) = match load_checked(&args.workflow) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let Some(plan) = checked.plan else {
        err("error: internal error: a workflow without errors has no plan\n");
        return exit_code::PROBLEMS;
    };
    let Some(map) = plan.map.as_ref() else {
        err("error: the workflow has no `map` phase\n");
        return exit_code::USAGE;
    };
    let has_setup = plan.setup.as_ref().is_some_and(|s| !s.steps.is_empty());
    if args.run_setup {
        if !has_setup {
            err(
                "error: the workflow has no `setup` to run; `prodigy items` without `--run-setup` reads its input\n",
            );
            return exit_code::USAGE;
        }
        let pipeline = map.pipeline();
        let workflow = PathBuf::from(&file.name);
        return match items::run_setup(&workflow, &file.text, plan.clone()) {
            Ok(items) => print_items(&items, None, &pipeline),
            Err(code) => code,
        };
    }
    let input = match &args.input {
        Some(path) => read_input_file(path),
        // Relative to the project, the directory prodigy runs in, as for `check` and `run`.
        None if map.input.parsed.is_literal() => {
            if let Some(missing) = written_by_setup(&plan, &map.input.value) {
                err(&format!("error: {missing}\n"));
                return exit_code::USAGE;
            }
            read_input(&map.input.value)
        }
        None => {
            let setup = if has_setup {
                ", or run `setup` first with `--run-setup`"
            } else {
                ""
            };
            err(&format!(
                "error: `map.input` is `{}`, which needs variables; pass the input with `--input FILE`{setup}\n",
                map.input.value
            ));
            return exit_code::USAGE;
        }
    };
    let input = match input {
        Ok(input) => input,
        Err(code) => return code,
    };
    let pipeline = map.pipeline();
    let (items, counts) = pipeline.apply(input);
    print_items(&items, Some(&counts), &pipeline)
}

/// Prints ITEMS on stdout, one JSON value a line, and COUNTS (the stages the workflow has)
/// on stderr.
fn print_items(
    items: &[serde_json::Value],
    counts: Option<&prodigy_grammar::pipeline::StageCounts>,
    pipeline: &prodigy_grammar::pipeline::Pipeline,
) -> u8 {
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for item in items {
        if serde_json::to_writer(&mut stdout, item).is_err() || stdout.write_all(b"\n").is_err() {
            return exit_code::OK;
        }
    }
    let _ = stdout.flush();
    if let Some(counts) = counts {
        note(&format!(
            "items: {}, {} kept\n",
            prodigy_runtime::progress::stage_counts(pipeline, counts),
            counts.kept
        ));
    }
    exit_code::OK
}

/// Why the map input file INPUT cannot be read yet, when it does not exist and PLAN has a
/// `setup` that can write it: what to do instead.
fn written_by_setup(plan: &prodigy_compiler::plan::Plan, input: &str) -> Option<String> {
    let name = input.trim();
    let steps = &plan.setup.as_ref()?.steps;
    if steps.is_empty()
        || PathBuf::from(name).exists()
        || !prodigy_runtime::input::names_a_file(input)
    {
        return None;
    }
    let bare = name.trim_start_matches("./");
    let mentioned = steps.iter().filter_map(|id| plan.step(*id)).any(|step| {
        let text = match &step.command {
            prodigy_compiler::plan::PlanCommand::Shell(t)
            | prodigy_compiler::plan::PlanCommand::Claude(t) => t.value.as_str(),
            prodigy_compiler::plan::PlanCommand::WriteFile(w) => w.path.value.as_str(),
            prodigy_compiler::plan::PlanCommand::Foreach { .. } => "",
        };
        text.contains(bare)
    });
    let writes = if mentioned {
        "`setup` writes it"
    } else {
        "`setup` may write it"
    };
    Some(format!(
        "`{name}` does not exist yet; {writes}: run it with `--run-setup` or pass `--input FILE`"
    ))
}

/// The map input INPUT as `run` reads it: the file at that path in the project when there
/// is one (or when INPUT names a file: one word ending in `.json`, `.jsonl` or `.txt`),
/// else the standard output of INPUT run as a shell command in the project.
fn read_input(input: &str) -> Result<serde_json::Value, u8> {
    let path = PathBuf::from(input.trim());
    if path.exists() || prodigy_runtime::input::names_a_file(input) {
        return read_input_file(&path);
    }
    let dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let (_cancel, mut cancelled) = tokio::sync::watch::channel(false);
    let text = crate::run::block_on(prodigy_runtime::input::run_command(
        input,
        &dir,
        Vec::new(),
        prodigy_runtime::runner::DEFAULT_GRACE,
        &mut cancelled,
    ))?;
    let text = text.map_err(|e| {
        crate::err_diagnostic(&e);
        exit_code::USAGE
    })?;
    note(&format!(
        "items: the output of the map input command `{}` (run in {}, without the workflow's `env` and `setup`)\n",
        input.trim(),
        dir.display()
    ));
    prodigy_grammar::pipeline::parse_input(&text, prodigy_grammar::pipeline::InputKind::Text)
        .map(say_numbers_as_text)
        .map_err(|e| {
            err(&format!("error: the map input `{}`: {e}\n", input.trim()));
            exit_code::USAGE
        })
}

/// INPUT's document, after saying (as `run` does) which of its numbers are passed as text.
fn say_numbers_as_text(input: prodigy_grammar::pipeline::Input) -> serde_json::Value {
    if let Some(first) = input.numbers_as_text.first() {
        use prodigy_runtime::events::Reporter as _;
        report::Terminal::for_flags().message(
            &prodigy_runtime::message::Message::NumbersAsText {
                count: input.numbers_as_text.len(),
                first: first.clone(),
            },
            None,
        );
    }
    input.document
}

/// The map input file PATH, read as `run` reads it: a regular file within the map input
/// bound, never a device or a FIFO.
fn read_input_file(path: &std::path::Path) -> Result<serde_json::Value, u8> {
    let text = prodigy_runtime::input::read_file(path, prodigy_runtime::input::MAX_INPUT_SIZE)
        .map_err(|e| {
            crate::err_diagnostic(&e);
            exit_code::USAGE
        })?;
    let kind = prodigy_grammar::pipeline::InputKind::of_file(&path.to_string_lossy());
    prodigy_grammar::pipeline::parse_input(&text, kind)
        .map(say_numbers_as_text)
        .map_err(|e| {
            err(&format!("error: `{}`: {e}\n", path.display()));
            exit_code::USAGE
        })
}

/// Loads and checks a workflow for a command that needs it without errors (`run`, `graph`,
/// `items`): the problems go to stderr, so that stdout holds only the command's output.
pub(crate) fn load_checked(
    path: &std::path::Path,
) -> Result<(SourceFile, prodigy_compiler::Checked), u8> {
    let color = color(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let file = match SourceFile::load(path) {
        Ok(file) => file,
        Err(e) if e.is_unreadable() => {
            crate::err_diagnostic(&e);
            return Err(exit_code::USAGE);
        }
        Err(e) => {
            // Not UTF-8: shown like any problem of the file, at its first bad byte.
            let file = SourceFile::new(path.display().to_string(), e.valid_prefix().to_owned());
            err_styled(&output::human(&file, &[e.diagnostic()], color));
            err("error: the workflow has errors; fix them first (see above)\n");
            return Err(exit_code::PROBLEMS);
        }
    };
    let checked = prodigy_compiler::check(&file);
    if checked.has_errors() {
        err_styled(&output::human(&file, &checked.diagnostics, color));
        err("error: the workflow has errors; fix them first (see above)\n");
        return Err(exit_code::PROBLEMS);
    }
    Ok((file, checked))
}

fn graph(args: &GraphArgs) -> u8 {
    let found = match &args.status {
        Some(id) => match graph_status::find(&prodigy_runtime::layout::Layout::home(), id) {
            Ok(found) => Some(found),
            Err(why) => {
                err(&format!("error: {why}\n"));
                return exit_code::USAGE;
            }
        },
        None => None,
    };
    let Some(path) = args
        .file
        .clone()
        .or_else(|| found.as_ref().map(|f| f.workflow.clone()))
    else {
        err("error: name a workflow file, or a run with `--status ID`\n");
        return exit_code::USAGE;
    };
    let (file, checked) = match load_checked(&path) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let (Some(plan), Some(graph)) = (&checked.plan, &checked.graph) else {
        err("error: internal error: a workflow without errors has no plan\n");
        return exit_code::PROBLEMS;
    };
    let status = found.as_ref().map(|found| {
        if prodigy_runtime::store::hash(&file.text) != found.workflow_hash {
            err(&format!(
                "warning: `{}` changed since `{}` started: the plan drawn may differ from the one it ran\n",
                path.display(),
                args.status.as_deref().unwrap_or_default()
            ));
        }
        graph_status::status(graph, &found.events)
    });
    let text = match args.format {
        GraphFormat::Dot => prodigy_compiler::emit::dot_status(graph, plan, status.as_ref()),
        GraphFormat::Mermaid => {
            prodigy_compiler::emit::mermaid_status(graph, plan, status.as_ref())
        }
        GraphFormat::Json => {
            let value = prodigy_compiler::emit::json_status(graph, plan, &file, status.as_ref());
            serde_json::to_string_pretty(&value)
                .map(|t| t + "\n")
                .unwrap_or_default()
        }
    };
    out(&text);
    exit_code::OK
}

#[cfg(test)]
mod tests {
    /// A typed error's help is said under it; one without help is its message alone.
    #[test]
    fn an_error_says_its_help() {
        let full = prodigy_runtime::backend::TaskFileError {
            path: std::path::PathBuf::from("/state/item_1.job"),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        let text = super::error_text(&full);
        assert!(
            text.starts_with("error: cannot write `/state/item_1.job`: "),
            "{text}"
        );
        assert!(
            text.ends_with("\n  help: check the free space and permissions there\n"),
            "{text}"
        );
        let bare = prodigy_runtime::runner::StartError::Claude(
            prodigy_runtime::claude::preflight::ClaudeUnusable::ClaudeAsRoot,
        );
        assert_eq!(super::error_text(&bare).lines().count(), 1);
    }

    use super::{Color, wants_color};
    use std::ffi::OsStr;

    #[test]
    fn colour_follows_no_color_org_and_a_dumb_terminal() {
        let auto = Color::Auto as u8;
        let set = Some(OsStr::new("1"));
        let empty = Some(OsStr::new(""));
        let xterm = Some(OsStr::new("xterm-256color"));
        let dumb = Some(OsStr::new("dumb"));
        assert!(wants_color(auto, true, None, xterm));
        assert!(!wants_color(auto, false, None, xterm));
        assert!(!wants_color(auto, true, set, xterm));
        // An empty NO_COLOR does not disable colour.
        assert!(wants_color(auto, true, empty, xterm));
        assert!(!wants_color(auto, true, None, dumb));
        assert!(wants_color(auto, true, None, None));
        // `--color always` and `never` are what the user said.
        assert!(wants_color(Color::Always as u8, false, set, dumb));
        assert!(!wants_color(Color::Never as u8, true, None, xterm));
    }
}

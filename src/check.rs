//! `prodigy check`: files, directories and standard input; every output format; `--fix`.

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Read as _};
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use prodigy_compiler::diagnostics::{Diagnostic, Severity};
use prodigy_compiler::source::{LoadDiagnostic as _, LoadError, MAX_FILE_SIZE, SourceFile};

use crate::shellcheck::ShellCheck;
use crate::{err, exit_code, out, output};

#[derive(clap::Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "clap flags, each independent of the others"
)]
pub(crate) struct CheckArgs {
    /// Workflow files (`.yml`, `.yaml`; JSON is YAML too) and directories. A directory is
    /// searched for workflows (YAML files that look like workflows, honouring `.gitignore`);
    /// without any, the current directory is.
    #[arg(value_name = "PATH", conflicts_with = "stdin_filename")]
    paths: Vec<PathBuf>,
    /// Read the workflow from standard input and report it under NAME (for editors and
    /// pre-commit). With `--fix`, print the fixed text on standard output.
    #[arg(long, value_name = "NAME")]
    stdin_filename: Option<PathBuf>,
    /// Output format: `human` (miette reports), `json` (`{"version": 1, "diagnostics": [...]}`,
    /// the stable contract for editors and CI, described in docs/linting.md), `sarif` (SARIF
    /// 2.1.0, for GitHub code scanning) or `github` (workflow-command annotations).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Treat warnings as errors.
    #[arg(long, value_enum, value_name = "WHAT")]
    deny: Vec<Deny>,
    /// Apply the fixes the checker is sure of (did-you-mean renames, deprecated forms, `|shell`
    /// for unquoted splices), in place, keeping comments and formatting; then report what
    /// remains.
    #[arg(long)]
    fix: bool,
    /// With `--fix`: print the changes as a unified diff instead of writing them.
    #[arg(long, requires = "fix")]
    dry_run: bool,
    /// Do not run ShellCheck on `shell:` commands (it runs when `shellcheck` is on `PATH`).
    #[arg(long)]
    no_shellcheck: bool,
    /// Skip the named files that do not look like workflows, as a directory search does (for
    /// pre-commit, which passes every YAML file).
    #[arg(long)]
    only_workflows: bool,
    /// Print the compiled plan as JSON (the runtime's input) instead of diagnostics, when the
    /// file has no errors.
    #[arg(long, value_enum, value_name = "WHAT")]
    emit: Option<Emit>,
    /// Print each retry policy's delay schedule and worst-case total time, as a table.
    #[arg(long)]
    explain_retries: bool,
    /// Print only the problems: no summary line when there are none.
    #[arg(short, long)]
    quiet: bool,
    /// Print each Claude step's worst-case cost (`max_budget_usd` × its runs), as a table.
    #[arg(long)]
    explain_costs: bool,
    /// A variable the run will be given, `NAME=VALUE` (repeatable), as for `run`: no W005
    /// for it.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    params: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Emit {
    Plan,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Human,
    Json,
    Sarif,
    Github,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Deny {
    Warnings,
}

/// One file to check: a path, or standard input under a name.
enum Input {
    Path {
        path: PathBuf,
        /// Found by searching a directory: skipped unless it looks like a workflow.
        searched: bool,
    },
    Stdin(PathBuf),
}

/// What checking one file gave.
struct Outcome {
    /// The file on disk (not for standard input), where `--fix` writes.
    path: Option<PathBuf>,
    file: SourceFile,
    checked: Option<prodigy_compiler::Checked>,
    diagnostics: Vec<Diagnostic>,
    /// The file could not be read at all.
    unreadable: bool,
    /// Not a workflow (a searched file, or `--only-workflows`): not reported.
    skipped: bool,
    /// `--fix`: what it did.
    fixed: Option<Fixed>,
}

/// What `--fix` did to one file.
struct Fixed {
    before: String,
    after: String,
    applied: usize,
    /// Fixes not applied (overlapping, or they would have added errors).
    left: usize,
}

/// The files to check, in a stable order.
fn inputs(args: &CheckArgs) -> Result<Vec<Input>, String> {
    if let Some(name) = &args.stdin_filename {
        return Ok(vec![Input::Stdin(name.clone())]);
    }
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.paths.clone()
    };
    let mut inputs = Vec::new();
    for path in paths {
        if path.is_dir() {
            inputs.extend(search(&path)?.into_iter().map(|path| Input::Path {
                path,
                searched: true,
            }));
        } else {
            inputs.push(Input::Path {
                path,
                searched: args.only_workflows,
            });
        }
    }
    Ok(inputs)
}

/// Every `*.yml`/`*.yaml` file under `dir`, honouring `.gitignore` (and `.ignore`), hidden
/// directories such as `.prodigy/` included, `.git` excluded; sorted.
fn search(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    let walk = ignore::WalkBuilder::new(dir)
        .hidden(false)
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    for entry in walk {
        let entry = entry.map_err(|e| format!("cannot search {}: {e}", dir.display()))?;
        let path = entry.path();
        if entry.file_type().is_some_and(|t| t.is_file())
            && path.extension().is_some_and(|e| e == "yml" || e == "yaml")
        {
            // `./x.yml` reads better as `x.yml`.
            found.push(path.strip_prefix("./").unwrap_or(path).to_path_buf());
        }
    }
    found.sort();
    Ok(found)
}

/// Reads standard input, at most [`MAX_FILE_SIZE`] bytes.
fn read_stdin(name: &Path) -> Result<SourceFile, LoadError> {
    let shown = name.display().to_string();
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| LoadError::Io {
            path: shown.clone(),
            source,
        })?;
    if bytes.len() as u64 > MAX_FILE_SIZE {
        return Err(LoadError::TooLarge {
            path: shown,
            limit: MAX_FILE_SIZE,
        });
    }
    SourceFile::from_bytes(shown, bytes)
}

/// The `.claude` directories Claude Code reads commands and skills from, for a workflow in
/// DIR: DIR's and each parent's up to the repository's root (the first with `.git`), then
/// the user's `~/.claude`.
pub(crate) fn claude_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let start = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut dirs = Vec::new();
    for ancestor in start.ancestors() {
        dirs.push(ancestor.join(".claude"));
        if ancestor.join(".git").exists() {
            break;
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        dirs.push(std::path::PathBuf::from(home).join(".claude"));
    }
    dirs
}

/// The slash-command lookup of [`prodigy_compiler::Surroundings`] for a workflow in DIR.
pub(crate) fn slash_commands(
    dir: &Path,
) -> impl Fn(&str) -> prodigy_compiler::claude::CommandLookup {
    let dirs = claude_dirs(dir);
    move |name: &str| {
        prodigy_compiler::claude::find_command(name, &dirs, &|p| p.is_file(), &|p| p.is_dir())
    }
}

/// The directory a file's relative paths (env files, map inputs) start from: the current one,
/// as for `run`.
fn surroundings_check(
    file: &SourceFile,
    shellcheck: Option<&ShellCheck>,
) -> prodigy_compiler::Checked {
    let file_exists = |p: &str| Path::new(p).is_file();
    let read_file = |p: &str| prodigy_compiler::source::read_text(Path::new(p));
    let dir = Path::new(&file.name)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let slash_command = slash_commands(dir);
    let tracked = |p: &str| git_tracks(Path::new("."), p);
    let surroundings = prodigy_compiler::Surroundings {
        file_exists: &file_exists,
        read_file: &read_file,
        tracked: &tracked,
        slash_command: &slash_command,
    };
    match shellcheck {
        Some(sc) => {
            let lint = |scripts: &[prodigy_compiler::shell::Script]| match sc.lint(scripts) {
                Ok(found) => found,
                Err(why) => {
                    err(&format!(
                        "warning: ShellCheck did not check {}: {why}\n",
                        file.name
                    ));
                    Vec::new()
                }
            };
            prodigy_compiler::check_linted(file, &surroundings, &lint)
        }
        None => prodigy_compiler::check_in(file, &surroundings),
    }
}

/// Checks (and with `--fix`, fixes) one input.
fn check_one(input: &Input, args: &CheckArgs, shellcheck: Option<&ShellCheck>) -> Outcome {
    let (loaded, searched) = match input {
        Input::Path { path, searched } => (SourceFile::load(path), *searched),
        Input::Stdin(name) => (read_stdin(name), false),
    };
    let name = match input {
        Input::Path { path, .. } => path.display().to_string(),
        Input::Stdin(name) => name.display().to_string(),
    };
    let mut file = match loaded {
        Ok(file) => file,
        Err(e) => {
            // Even when it may not be a workflow, a file that cannot be read is reported, so
            // nothing goes unchecked silently.
            return Outcome {
                path: None,
                file: SourceFile::new(name, e.valid_prefix().to_owned()),
                checked: None,
                diagnostics: vec![e.diagnostic()],
                unreadable: e.is_unreadable(),
                skipped: false,
                fixed: None,
            };
        }
    };
    if searched && !prodigy_compiler::detect::looks_like_workflow(&file) {
        return Outcome {
            path: None,
            file,
            checked: None,
            diagnostics: Vec::new(),
            unreadable: false,
            skipped: true,
            fixed: None,
        };
    }
    let mut fixed = None;
    if args.fix {
        // Fix rounds without ShellCheck (its findings carry no fixes), then one full check.
        let result =
            prodigy_compiler::fix::fix_all(&file, |f| surroundings_check(f, None).diagnostics);
        let before = file.text.to_string();
        if result.applied > 0 {
            file = SourceFile::new(file.name.clone(), result.text.clone());
        }
        fixed = Some(Fixed {
            before,
            after: result.text,
            applied: result.applied,
            left: result.refused,
        });
    }
    let mut checked = surroundings_check(&file, shellcheck);
    // A variable `--param` supplies is defined.
    checked.diagnostics.retain(|d| {
        prodigy_compiler::scope::maybe_undefined_name(d).is_none_or(|name| {
            !args
                .params
                .iter()
                .any(|p| p.split_once('=').is_some_and(|(k, _)| k == name))
        })
    });
    if args.deny.contains(&Deny::Warnings) {
        for d in &mut checked.diagnostics {
            d.severity = Severity::Error;
        }
    }
    Outcome {
        path: match input {
            Input::Path { path, .. } => Some(path.clone()),
            Input::Stdin(_) => None,
        },
        diagnostics: checked.diagnostics.clone(),
        checked: Some(checked),
        file,
        unreadable: false,
        skipped: false,
        fixed,
    }
}

/// Checks every input, in parallel, keeping their order.
fn check_all(inputs: &[Input], args: &CheckArgs, shellcheck: Option<&ShellCheck>) -> Vec<Outcome> {
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(inputs.len())
        .max(1);
    if workers == 1 {
        return inputs
            .iter()
            .map(|i| check_one(i, args, shellcheck))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, Outcome)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(input) = inputs.get(i) else { break };
                        done.push((i, check_one(input, args, shellcheck)));
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            // A worker that panicked must not make its files vanish from the report.
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, o)| o).collect()
}

/// Writes `text` to `path` in place: a temporary file beside it with the same permissions,
/// renamed over it, so that an interrupted write never leaves half a workflow.
fn write_in_place(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let permissions = std::fs::metadata(path)?.permissions();
    let mut temp = tempfile::Builder::new()
        .prefix(".prodigy-fix-")
        .tempfile_in(dir)?;
    temp.write_all(text.as_bytes())?;
    temp.as_file().sync_all()?;
    temp.as_file().set_permissions(permissions)?;
    temp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A unified diff of a file's fix: a relative NAME under git's `a/` and `b/` (for
/// `git apply` and `patch -p1`), an absolute one as it is (as `diff -u` prints it), never
/// `a//tmp/...`.
fn diff(name: &str, before: &str, after: &str) -> String {
    let (old, new) = if Path::new(name).is_absolute() {
        (name.to_owned(), name.to_owned())
    } else {
        (format!("a/{name}"), format!("b/{name}"))
    };
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&old, &new)
        .to_string()
}

pub(crate) fn check(args: &CheckArgs) -> u8 {
    let color = crate::color(std::io::stdout().is_terminal());
    if let Err(code) = crate::run::parse_params(&args.params) {
        return code;
    }
    let inputs = match inputs(args) {
        Ok(inputs) => inputs,
        Err(e) => {
            err(&format!("error: {e}\n"));
            return exit_code::USAGE;
        }
    };
    let shellcheck = if args.no_shellcheck {
        None
    } else {
        ShellCheck::find().map(ShellCheck::cached_on_disk)
    };
    let outcomes = check_all(&inputs, args, shellcheck.as_ref());
    let stdin_fix = args.fix && args.stdin_filename.is_some();
    let report = Report {
        args,
        color,
        stdin_fix,
        // Standard output holds the fixed text or the diff: the report goes to standard error.
        to_stderr: stdin_fix || (args.fix && args.dry_run),
    };
    let mut totals = Totals::default();
    for o in outcomes.iter().filter(|o| !o.skipped) {
        if let Err(code) = report.outcome(o, &mut totals) {
            return code;
        }
    }
    let (unreadable, errors) = (totals.unreadable, totals.errors);
    if let Err(code) = report.totals(totals) {
        return code;
    }
    if unreadable {
        exit_code::USAGE
    } else if errors > 0 {
        exit_code::PROBLEMS
    } else {
        exit_code::OK
    }
}

/// What `check` found in all the files, for its summary line and exit code, and the
/// diagnostics the JSON and SARIF reports gather.
#[derive(Default)]
struct Totals {
    errors: usize,
    warnings: usize,
    fixable: usize,
    /// A file could not be read at all.
    unreadable: bool,
    checked_files: usize,
    /// `--fix`: fixes applied, files fixed, fixes refused.
    applied: usize,
    fixed_files: usize,
    refused: usize,
    json: Vec<output::JsonDiagnostic>,
    sarif: Vec<(SourceFile, Vec<Diagnostic>)>,
}

/// How `check` reports: its arguments, and where the report goes.
struct Report<'a> {
    args: &'a CheckArgs,
    color: bool,
    /// `--fix` of standard input: the fixed text (or its diff) goes to standard output.
    stdin_fix: bool,
    /// With the fixed text or a diff on standard output, the report goes to standard error.
    to_stderr: bool,
}

impl Report<'_> {
    /// Says TEXT where the report goes.
    fn say(&self, text: &str) {
        if self.to_stderr {
            err(text);
        } else {
            out(text);
        }
    }

    /// Counts and reports the outcome O of one file: its fix, then its plan or tables
    /// when asked, and its diagnostics. `Err`: the exit code when a fix cannot be written.
    fn outcome(&self, o: &Outcome, totals: &mut Totals) -> Result<(), u8> {
        let args = self.args;
        totals.checked_files += 1;
        totals.unreadable |= o.unreadable;
        totals.errors += o.diagnostics.iter().filter(|d| d.is_error()).count();
        totals.warnings += o.diagnostics.iter().filter(|d| !d.is_error()).count();
        totals.fixable += o.diagnostics.iter().filter(|d| d.fix.is_some()).count();
        if let Some(f) = &o.fixed {
            totals.applied += f.applied;
            totals.refused += f.left;
            if f.applied > 0 {
                totals.fixed_files += 1;
            }
            self.fix(o, f)?;
        }
        if o.unreadable && args.format == Format::Human {
            err(&format!("error: {}\n", o.diagnostics[0].message));
            return Ok(());
        }
        // Under `--deny warnings` a warning is an error too: then the problems are shown,
        // not the plan.
        let clean = !o.diagnostics.iter().any(Diagnostic::is_error);
        if let (Some(Emit::Plan), Some(plan), true) = (
            args.emit,
            o.checked.as_ref().and_then(|c| c.plan.as_ref()),
            clean,
        ) {
            match serde_json::to_string_pretty(plan) {
                Ok(text) => out(&format!("{text}\n")),
                Err(e) => err(&format!("error: cannot write the plan: {e}\n")),
            }
            return Ok(());
        }
        if args.explain_retries
            && let Some(plan) = o.checked.as_ref().and_then(|c| c.plan.as_ref())
        {
            out(&output::retry_table(&o.file, plan));
        }
        if args.explain_costs
            && let Some(plan) = o.checked.as_ref().and_then(|c| c.plan.as_ref())
        {
            out(&output::cost_table(&o.file, plan));
        }
        match args.format {
            Format::Human => self.say(&output::human(
                &o.file,
                &o.diagnostics,
                self.color && !self.to_stderr,
            )),
            Format::Json => totals.json.extend(output::to_json(&o.file, &o.diagnostics)),
            Format::Github => self.say(&output::github(&o.file, &o.diagnostics)),
            Format::Sarif => totals.sarif.push((o.file.clone(), o.diagnostics.clone())),
        }
        Ok(())
    }

    /// What `--fix` did to O's file F: the fixed text (or its diff) on standard output for
    /// standard input; else the file written in place (or, with `--dry-run`, its diff).
    fn fix(&self, o: &Outcome, f: &Fixed) -> Result<(), u8> {
        let args = self.args;
        if self.stdin_fix {
            // Editors read the fixed text back from stdout.
            if args.dry_run {
                out(&diff(&o.file.name, &f.before, &f.after));
            } else {
                out(&f.after);
            }
        } else if f.applied > 0 {
            if args.dry_run {
                out(&diff(&o.file.name, &f.before, &f.after));
            } else if let Some(path) = &o.path
                && let Err(e) = write_in_place(path, &f.after)
            {
                err(&format!("error: cannot write {}: {e}\n", o.file.name));
                return Err(exit_code::USAGE);
            }
        }
        Ok(())
    }

    /// The end of the report: the summary line (with what `--fix` did), or the whole JSON
    /// or SARIF report. `Err`: the exit code when it cannot be written.
    fn totals(&self, totals: Totals) -> Result<(), u8> {
        let args = self.args;
        let Totals {
            errors,
            warnings,
            fixable,
            checked_files,
            applied,
            fixed_files,
            refused,
            json,
            sarif,
            ..
        } = totals;
        match args.format {
            Format::Human | Format::Github => {
                let mut line = output::summary(errors, warnings, checked_files);
                if args.fix {
                    line.push_str(&fix_summary(applied, fixed_files, refused, args.dry_run));
                } else if fixable > 0 {
                    let _ = write!(line, " ({fixable} fixable with `prodigy check --fix`)");
                }
                if !(args.quiet && errors + warnings == 0 && applied == 0) {
                    err(&format!("{line}\n"));
                }
            }
            Format::Sarif => match serde_json::to_string_pretty(&output::sarif(&sarif)) {
                Ok(text) => self.say(&format!("{text}\n")),
                Err(e) => {
                    err(&format!("error: cannot write SARIF: {e}\n"));
                    return Err(exit_code::USAGE);
                }
            },
            Format::Json => {
                let report = output::JsonReport {
                    version: output::JSON_VERSION,
                    diagnostics: json,
                };
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => self.say(&format!("{text}\n")),
                    Err(e) => {
                        err(&format!("error: cannot write JSON: {e}\n"));
                        return Err(exit_code::USAGE);
                    }
                }
                if args.fix {
                    err(&format!(
                        "{}\n",
                        fix_summary(applied, fixed_files, refused, args.dry_run)
                            .trim_start_matches("; ")
                    ));
                }
            }
        }
        Ok(())
    }
}

/// "; fixed 3 problems in 2 files, 1 fix left".
fn fix_summary(applied: usize, files: usize, refused: usize, dry_run: bool) -> String {
    let plural = |n: usize, word: &str| {
        if n == 1 {
            format!("{n} {word}")
        } else {
            format!("{n} {word}s")
        }
    };
    let verb = if dry_run { "would fix" } else { "fixed" };
    let mut text = format!(
        "; {verb} {} in {}",
        plural(applied, "problem"),
        plural(files, "file")
    );
    if refused > 0 {
        let _ = write!(
            text,
            ", {} not applied (overlapping, or they would add errors)",
            plural(refused, "fix")
        );
    }
    text
}

/// Whether git tracks the file PATH (relative to DIR); `false` outside a repository or
/// without git.
pub(crate) fn git_tracks(dir: &Path, path: &str) -> bool {
    std::process::Command::new("git")
        .args(["ls-files", "--error-unmatch", "--", path])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

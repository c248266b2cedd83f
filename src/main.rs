//! `prodigy`: the command-line interface.
//!
//! Parses arguments, wires the library crates together and maps outcomes to exit codes.
//! Logic that a library could test lives in the library crates.

mod exit_code;
mod output;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use prodigy_compiler::diagnostics::{Code, Severity};
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
    /// Output format: `human` (miette reports) or `json` (`{"version": 1, "diagnostics": [...]}`,
    /// the stable contract for editors and CI, described in the README).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Treat warnings as errors.
    #[arg(long, value_enum, value_name = "WHAT")]
    deny: Vec<Deny>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Human,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Deny {
    Warnings,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Check(args) => check(&args),
        Command::Explain { code } => explain(code.as_deref()),
    };
    ExitCode::from(code)
}

/// Writes to stdout, ignoring a closed pipe (as `prodigy check ... | head` expects).
fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn err(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

fn check(args: &CheckArgs) -> u8 {
    let deny_warnings = args.deny.contains(&Deny::Warnings);
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let (mut errors, mut warnings, mut unreadable) = (0, 0, false);
    let mut json = Vec::new();
    for path in &args.files {
        let file = match SourceFile::load(path) {
            Ok(file) => file,
            Err(e) => {
                err(&format!("error: {e}\n"));
                unreadable = true;
                continue;
            }
        };
        let file_exists = |path: &str| std::path::Path::new(path).is_file();
        let surroundings = prodigy_compiler::Surroundings {
            file_exists: &file_exists,
        };
        let mut checked = prodigy_compiler::check_in(&file, &surroundings);
        if deny_warnings {
            for d in &mut checked.diagnostics {
                d.severity = Severity::Error;
            }
        }
        errors += checked.diagnostics.iter().filter(|d| d.is_error()).count();
        warnings += checked.diagnostics.iter().filter(|d| !d.is_error()).count();
        match args.format {
            Format::Human => out(&output::human(&file, &checked.diagnostics, color)),
            Format::Json => json.extend(output::to_json(&file, &checked.diagnostics)),
        }
    }
    match args.format {
        Format::Human => err(&format!(
            "{}\n",
            output::summary(errors, warnings, args.files.len())
        )),
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

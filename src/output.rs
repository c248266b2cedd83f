//! Rendering diagnostics for people (miette) and for tools (JSON).

use prodigy_compiler::diagnostics::{Diagnostic, Label, Severity, render_human};
use prodigy_compiler::source::{SourceFile, Span};
use serde::Serialize;

/// Version of the JSON output contract; bump only on breaking changes.
pub(crate) const JSON_VERSION: u32 = 1;

/// The `--format json` document.
#[derive(Serialize)]
pub(crate) struct JsonReport {
    /// Contract version.
    pub(crate) version: u32,
    /// Every diagnostic of every file, in file order then position.
    pub(crate) diagnostics: Vec<JsonDiagnostic>,
}

/// One diagnostic in the JSON contract.
#[derive(Serialize)]
pub(crate) struct JsonDiagnostic {
    file: String,
    code: &'static str,
    severity: Severity,
    message: String,
    help: Option<String>,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    labels: Vec<JsonLabel>,
}

#[derive(Serialize)]
struct JsonLabel {
    text: String,
    primary: bool,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
}

fn positions(file: &SourceFile, span: Span) -> (usize, usize, usize, usize) {
    let start = file.line_col(span.start);
    let end = file.line_col(span.end);
    (start.line, start.column, end.line, end.column)
}

/// Converts a file's diagnostics to the JSON contract.
pub(crate) fn to_json(file: &SourceFile, diagnostics: &[Diagnostic]) -> Vec<JsonDiagnostic> {
    diagnostics
        .iter()
        .map(|d| {
            let primary_span = d.primary.as_ref().map(|l| l.span).unwrap_or_default();
            let (line, column, end_line, end_column) = positions(file, primary_span);
            let label = |l: &Label, primary: bool| {
                let (line, column, end_line, end_column) = positions(file, l.span);
                JsonLabel {
                    text: l.text.clone(),
                    primary,
                    line,
                    column,
                    end_line,
                    end_column,
                }
            };
            let labels = d
                .primary
                .iter()
                .map(|l| label(l, true))
                .chain(d.labels.iter().map(|l| label(l, false)))
                .collect();
            JsonDiagnostic {
                file: file.name.clone(),
                code: d.code.as_str(),
                severity: d.severity,
                message: d.message.clone(),
                help: d.help.clone(),
                line,
                column,
                end_line,
                end_column,
                labels,
            }
        })
        .collect()
}

/// Renders a file's diagnostics as `check` prints them.
pub(crate) fn human(file: &SourceFile, diagnostics: &[Diagnostic], color: bool) -> String {
    render_human(file, diagnostics, 100, color)
}

/// "2 errors and 1 warning".
pub(crate) fn summary(errors: usize, warnings: usize, files: usize) -> String {
    let plural = |n: usize, word: &str| {
        if n == 1 {
            format!("{n} {word}")
        } else {
            format!("{n} {word}s")
        }
    };
    let files = plural(files, "file");
    match (errors, warnings) {
        (0, 0) => format!("checked {files}: no problems found"),
        (e, 0) => format!("checked {files}: {}", plural(e, "error")),
        (0, w) => format!("checked {files}: {}", plural(w, "warning")),
        (e, w) => format!(
            "checked {files}: {} and {}",
            plural(e, "error"),
            plural(w, "warning")
        ),
    }
}

//! Rendering diagnostics for people (miette) and for tools (JSON).

use prodigy_compiler::diagnostics::{Diagnostic, Label, Severity, render_human};
use prodigy_compiler::source::{SourceFile, Span};
use serde::Serialize;
use std::fmt::Write as _;

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
    /// The sure fix, or `null`.
    fix: Option<JsonFix>,
}

/// A fix in the JSON contract: what it does and its edits, each a range to replace.
#[derive(Serialize)]
struct JsonFix {
    description: String,
    edits: Vec<JsonEdit>,
}

#[derive(Serialize)]
struct JsonEdit {
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    /// Byte offsets, for tools that edit bytes.
    start_byte: u32,
    end_byte: u32,
    replacement: String,
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
            let fix = d.fix.as_ref().map(|f| JsonFix {
                description: f.description.clone(),
                edits: f
                    .edits
                    .iter()
                    .map(|e| {
                        let (line, column, end_line, end_column) = positions(file, e.span);
                        JsonEdit {
                            line,
                            column,
                            end_line,
                            end_column,
                            start_byte: e.span.start,
                            end_byte: e.span.end,
                            replacement: e.replacement.clone(),
                        }
                    })
                    .collect(),
            });
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
                fix,
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

/// The `--explain-retries` table: every retry policy with its schedule and worst case.
pub(crate) fn retry_table(file: &SourceFile, plan: &prodigy_compiler::plan::Plan) -> String {
    use prodigy_compiler::emit::duration;
    let mut rows: Vec<[String; 6]> = Vec::new();
    for step in &plan.steps {
        let at = file.line_col(step.origin.start);
        let place = format!("{}:{}", at.line, at.column);
        if let (Some(retry), Some(cost)) = (&step.retry, step.retry_cost()) {
            let worst = match cost.runs {
                Some(runs) => format!(
                    "{} ({} delays + {} runs)",
                    duration(cost.worst()),
                    duration(cost.delays),
                    duration(runs)
                ),
                None => format!("{} of delays + the runs", duration(cost.delays)),
            };
            let schedule = if retry.policy.delays.is_empty() {
                "none".to_owned()
            } else {
                retry
                    .policy
                    .delays
                    .iter()
                    .map(|d| duration(*d))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            rows.push([
                place.clone(),
                step.label.clone(),
                "retry_config".into(),
                retry.config.attempts.to_string(),
                schedule,
                worst,
            ]);
        }
        if let Some(f) = &step.on_failure
            && f.max_attempts > 1
        {
            rows.push([
                place,
                step.label.clone(),
                "on_failure".into(),
                f.max_attempts.to_string(),
                "immediately, after the handler".into(),
                "the runs and handlers".into(),
            ]);
        }
    }
    if let Some(retry) = plan
        .error_policy
        .as_ref()
        .and_then(|p| p.retry_config.as_ref())
    {
        let at = file.line_col(retry.span.start);
        rows.push([
            format!("{}:{}", at.line, at.column),
            "map items".into(),
            "error_policy".into(),
            retry.max_attempts.to_string(),
            "per item, with the policy's backoff".into(),
            "—".into(),
        ]);
    }
    if rows.is_empty() {
        return format!("{}: no retry policies\n", file.name);
    }
    let header = [
        "where",
        "step",
        "policy",
        "runs",
        "delays before each retry",
        "worst case",
    ];
    let mut text = format!("{}\n", file.name);
    text.push_str(&table(&header, &rows));
    text
}

/// The `--explain-costs` table: each Claude step's worst case, its `max_budget_usd` times its
/// runs (`retry_config` attempts × `on_failure` `max_attempts`; per item, times the item's
/// runs, in a map agent), and the workflow's `max_cost_usd` (docs/language.md, "Claude
/// budgets").
pub(crate) fn cost_table(file: &SourceFile, plan: &prodigy_compiler::plan::Plan) -> String {
    use prodigy_compiler::plan::{PlanCommand, StepId};
    use prodigy_runtime::claude::budget::usd;
    // The steps an agent runs, nested ones included: their cost is per item.
    let mut per_item = std::collections::BTreeSet::new();
    let mut todo: Vec<StepId> = plan
        .map
        .as_ref()
        .map(|m| m.steps.clone())
        .unwrap_or_default();
    while let Some(id) = todo.pop() {
        if per_item.insert(id)
            && let Some(step) = plan.step(id)
        {
            todo.extend(step.children());
        }
    }
    let item_runs = if plan.map.is_some() {
        plan.job_policy.max_attempts.max(1)
    } else {
        1
    };
    let mut rows: Vec<[String; 5]> = Vec::new();
    // The worst case of the steps that run once (not per item), while every one has a cap.
    let mut once: Option<f64> = Some(0.0);
    for step in &plan.steps {
        if !matches!(step.command, PlanCommand::Claude(_)) {
            continue;
        }
        let at = file.line_col(step.origin.start);
        let attempts = step.retry.as_ref().map_or(1, |r| r.config.attempts.max(1));
        let handler_runs = step
            .on_failure
            .as_ref()
            .map_or(1, |f| f.max_attempts.max(1));
        let agent = per_item.contains(&step.id);
        let runs = u64::from(attempts)
            * u64::from(handler_runs)
            * if agent { u64::from(item_runs) } else { 1 };
        let budget = step.claude.as_ref().and_then(|c| c.max_budget_usd);
        let worst = if let Some(b) = budget {
            let total = b * prodigy_runtime::claude::budget::amount(runs);
            if !agent {
                once = once.map(|o| o + total);
            }
            format!("{}{}", usd(total), if agent { " per item" } else { "" })
        } else {
            if !agent {
                once = None;
            }
            "no `max_budget_usd`: no cap".to_owned()
        };
        rows.push([
            format!("{}:{}", at.line, at.column),
            step.label.clone(),
            budget.map_or_else(|| "—".to_owned(), usd),
            runs.to_string(),
            worst,
        ]);
    }
    if rows.is_empty() {
        return format!("{}: no Claude steps\n", file.name);
    }
    let header = ["where", "step", "max_budget_usd", "runs", "worst case"];
    let mut text = format!("{}\n", file.name);
    text.push_str(&table(&header, &rows));
    let per_item_note = if per_item.is_empty() {
        ""
    } else {
        " outside the map agents"
    };
    match once {
        Some(total) => {
            let _ = writeln!(text, "worst case{per_item_note}: {}", usd(total));
        }
        None => {
            let _ = writeln!(
                text,
                "worst case{per_item_note}: no cap (a step has no `max_budget_usd`)"
            );
        }
    }
    if let Some(limit) = plan.claude_budget.and_then(|b| b.max_cost_usd) {
        let _ = writeln!(text, "`max_cost_usd` caps the whole run at {}", usd(limit));
    }
    text
}

/// The SARIF 2.1.0 log of a `check` run: one run, every code as a rule, one result per
/// diagnostic, for GitHub code scanning and other SARIF consumers.
pub(crate) fn sarif(files: &[(SourceFile, Vec<Diagnostic>)]) -> serde_json::Value {
    use prodigy_compiler::diagnostics::Code;
    let rules: Vec<serde_json::Value> = Code::ALL
        .iter()
        .map(|code| {
            serde_json::json!({
                "id": code.as_str(),
                "name": code.summary(),
                "shortDescription": {"text": code.summary()},
                "fullDescription": {"text": code.explanation().lines().skip(2).take_while(|l| !l.starts_with("## ")).collect::<Vec<_>>().join(" ").trim()},
                "help": {"text": code.explanation(), "markdown": code.explanation()},
                "defaultConfiguration": {"level": level(code.default_severity())},
            })
        })
        .collect();
    let region = |file: &SourceFile, span: Span| {
        let (line, column, end_line, end_column) = positions(file, span);
        serde_json::json!({"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column})
    };
    let location = |file: &SourceFile, span: Span| serde_json::json!({"physicalLocation": {"artifactLocation": {"uri": uri(&file.name)}, "region": region(file, span)}});
    let mut results = Vec::new();
    for (file, diagnostics) in files {
        for d in diagnostics {
            let mut text = d.message.clone();
            if let Some(help) = &d.help {
                text.push_str(". ");
                text.push_str(help);
            }
            let mut result = serde_json::json!({
                "ruleId": d.code.as_str(),
                "ruleIndex": Code::ALL.iter().position(|c| *c == d.code),
                "level": level(d.severity),
                "message": {"text": text},
                "locations": [location(file, d.primary.as_ref().map(|l| l.span).unwrap_or_default())],
            });
            if let (Some(fix), Some(map)) = (&d.fix, result.as_object_mut()) {
                let replacements: Vec<serde_json::Value> = fix
                    .edits
                    .iter()
                    .map(|e| {
                        serde_json::json!({
                            "deletedRegion": region(file, e.span),
                            "insertedContent": {"text": e.replacement},
                        })
                    })
                    .collect();
                map.insert(
                    "fixes".into(),
                    serde_json::json!([{
                        "description": {"text": fix.description},
                        "artifactChanges": [{
                            "artifactLocation": {"uri": uri(&file.name)},
                            "replacements": replacements,
                        }],
                    }]),
                );
            }
            if !d.labels.is_empty()
                && let Some(map) = result.as_object_mut()
            {
                let related: Vec<serde_json::Value> = d
                    .labels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let mut loc = location(file, l.span);
                        if let Some(m) = loc.as_object_mut() {
                            m.insert("id".into(), i.into());
                            m.insert("message".into(), serde_json::json!({"text": l.text}));
                        }
                        loc
                    })
                    .collect();
                map.insert("relatedLocations".into(), related.into());
            }
            results.push(result);
        }
    }
    serde_json::json!({
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "prodigy", "version": env!("CARGO_PKG_VERSION"), "rules": rules}},
            // Columns count characters (Unicode scalar values), as `--format json` does;
            // SARIF's default would be UTF-16 code units.
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    })
}

fn level(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

/// A path as a SARIF URI reference (RFC 3986): forward slashes, and every byte but the
/// unreserved characters and `/` percent-encoded (`my file#1.yml` is `my%20file%231.yml`).
fn uri(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.replace('\\', "/").bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// GitHub Actions workflow commands: `::error file=…,line=…::message`, one per diagnostic.
pub(crate) fn github(file: &SourceFile, diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for d in diagnostics {
        let (line, column, end_line, end_column) =
            positions(file, d.primary.as_ref().map(|l| l.span).unwrap_or_default());
        let command = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut message = d.message.clone();
        if let Some(help) = &d.help {
            message.push_str(": ");
            message.push_str(help);
        }
        let _ = writeln!(
            out,
            "::{command} file={},line={line},col={column},endLine={end_line},endColumn={end_column},title={}::{}",
            escape_property(&file.name),
            escape_property(&format!("{} {}", d.code, d.code.summary())),
            escape_data(&message),
        );
    }
    out
}

fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

/// HEADER and ROWS as columns padded to their widest cell, two spaces apart, a line each
/// (`check --explain-retries`, `--explain-costs`, `prodigy ls`).
pub(crate) fn table<R: AsRef<[String]>>(header: &[&str], rows: &[R]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(&mut header.iter().copied());
    for row in rows {
        text.push_str(&line(&mut row.as_ref().iter().map(String::as_str)));
    }
    text
}

//! What a command's output becomes: `capture`, `capture_output`, `shell.*` and `claude.*`,
//! and the output shown at `-v`.

use crate::message::Message;
use prodigy_plan::CaptureFormat;
use prodigy_plan::{PlanCommand, PlanStep};
use serde_json::{Value, json};

use crate::exec::{self, Output};
use crate::runner::{Runner, fields};
use crate::vars::Vars;

/// Why a command's output did not become its capture's value (`capture`, a setup's
/// `capture_outputs`).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum CaptureError {
    /// A `number` capture of text that is not one.
    #[error("capture `{name}`: `{text}` is not a number")]
    NotNumber {
        /// The capture.
        name: String,
        /// The text, trimmed.
        text: String,
    },
    /// A `json` capture of output that `PRODIGY_OUTPUT_LIMIT` cut.
    #[error(
        "capture `{name}`: the output was cut to its last part (PRODIGY_OUTPUT_LIMIT), and a `json` capture needs it whole; raise PRODIGY_OUTPUT_LIMIT or write the JSON to a file"
    )]
    Truncated {
        /// The capture.
        name: String,
    },
    /// A `json` capture of text that is not JSON.
    #[error("capture `{name}`: not JSON ({source})")]
    NotJson {
        /// The capture.
        name: String,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// A setup capture whose step ran no command, with no `default`.
    #[error("capture `{name}`: setup step {index} produced no output, and there is no `default`")]
    NoOutput {
        /// The capture.
        name: String,
        /// The setup step (`command_index`).
        index: usize,
    },
    /// A setup capture whose `pattern` or `json_path` found nothing, with no `default`.
    #[error(
        "capture `{name}`: `pattern` or `json_path` found nothing in the output of setup step {index}, and there is no `default`"
    )]
    NothingFound {
        /// The capture.
        name: String,
        /// The setup step (`command_index`).
        index: u64,
    },
}

impl Runner {
    /// For a reporter that shows output (or the run's result, when STEP gives it): what a
    /// command wrote (standard output unless it was shown as it arrived), and how it ended.
    pub(crate) fn show_output(&self, step: &PlanStep, out: &Output) {
        if let Some(shown_as) = self.output_shown_as(step) {
            let stdout = if out.streamed {
                ""
            } else {
                out.stdout.as_str()
            };
            for line in stdout.lines().chain(out.stderr.lines()) {
                self.say(shown_as(line.to_owned()));
            }
        }
        if self.shows_output() {
            {
                let how = match (out.code, out.timed_out) {
                    (_, true) => "timed out".to_owned(),
                    (Some(code), false) => format!("exited {code}"),
                    // It never ran: why ("could not start `PROGRAM`: REASON"), not a signal.
                    (None, false) if out.spawn_error => {
                        format!(
                            "did not run ({})",
                            out.stderr.lines().next().unwrap_or("").trim()
                        )
                    }
                    (None, false) if out.cancelled => "was interrupted".to_owned(),
                    (None, false) => "ended by a signal".to_owned(),
                };
                self.say(Message::Exited {
                    label: step.label.clone(),
                    how,
                    duration: out.duration,
                });
            }
        }
    }

    /// Typed `capture` and legacy `capture_output` of the last run.
    pub(crate) fn capture(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        out: &Output,
    ) -> Result<(), CaptureError> {
        let trim = |s: &str| s.strip_suffix('\n').unwrap_or(s).to_owned();
        if let Some(capture) = &step.capture {
            let streams = capture.streams;
            let text = match (streams.stdout, streams.stderr) {
                (true, true) => format!("{}{}", out.stdout, out.stderr),
                (false, true) => out.stderr.clone(),
                (true, false) => out.stdout.clone(),
                // Neither stream: the value is empty; the other fields still describe the run.
                (false, false) => String::new(),
            };
            let text = trim(&text);
            let name = &capture.name.value;
            let value = typed_value(capture.format, name, &text, out.exit().success())?;
            let mut meta = serde_json::Map::new();
            if streams.exit_code {
                meta.insert("exit_code".into(), json!(out.code.unwrap_or(-1)));
            }
            if streams.success {
                meta.insert("success".into(), json!(out.exit().success()));
            }
            if streams.duration {
                meta.insert("duration".into(), json!(out.duration.as_secs_f64()));
            }
            meta.insert("stderr".into(), Value::String(trim(&out.stderr)));
            self.record(&crate::events::Event::VariableCaptured {
                step: step.label.clone(),
                name: name.clone(),
                format: capture.format,
            });
            vars.set(name.clone(), value);
            vars.meta.insert(name.clone(), Value::Object(meta));
        }
        // `capture_output: true` on a shell step names `${shell.output}`, which every
        // command already sets (both streams); any other name stores stdout.
        if let Some(name) = step
            .capture_output
            .as_ref()
            .filter(|n| *n != "shell.output")
        {
            match name.split_once('.') {
                Some((root, field)) => {
                    vars.merge(root, fields(json!({ field: trim(&out.stdout) })));
                }
                None => vars.set(name.clone(), Value::String(trim(&out.stdout))),
            }
        }
        Ok(())
    }
}

/// TEXT as a capture of FORMAT (docs/language.md §5); a value that does not fit fails with a message
/// naming the capture. A `boolean` that is neither `true` nor `false` is the command's
/// success.
pub(crate) fn typed_value(
    format: CaptureFormat,
    name: &str,
    text: &str,
    success: bool,
) -> Result<Value, CaptureError> {
    Ok(match format {
        CaptureFormat::String => Value::String(text.to_owned()),
        CaptureFormat::Number => {
            let t = text.trim();
            t.parse::<i64>()
                .map(Value::from)
                .ok()
                .or_else(|| {
                    t.parse::<f64>()
                        .ok()
                        .and_then(serde_json::Number::from_f64)
                        .map(Value::Number)
                })
                .ok_or_else(|| CaptureError::NotNumber {
                    name: name.to_owned(),
                    text: t.to_owned(),
                })?
        }
        CaptureFormat::Json if text.starts_with(exec::TRUNCATED) => {
            return Err(CaptureError::Truncated {
                name: name.to_owned(),
            });
        }
        CaptureFormat::Json => {
            serde_json::from_str(text).map_err(|source| CaptureError::NotJson {
                name: name.to_owned(),
                source,
            })?
        }
        CaptureFormat::Lines => {
            Value::Array(text.lines().map(|l| Value::String(l.to_owned())).collect())
        }
        CaptureFormat::Boolean => match text.trim() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::Bool(success),
        },
    })
}

/// The last N lines of a text.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `claude.*` after the Claude command that ended as OUT: its result, and what the CLI
/// reported about the call; `error_kind` and `error` are empty when it succeeded.
pub(crate) fn set_claude_vars(vars: &mut Vars, out: &Output) {
    let trimmed = |s: &str| s.strip_suffix('\n').unwrap_or(s).to_owned();
    let exit_code = out.code.unwrap_or(-1);
    match &out.claude {
        Some(call) => vars.set(
            "claude",
            json!({
                "output": trimmed(&out.stdout),
                "stderr": trimmed(&out.stderr),
                "exit_code": exit_code,
                "session_id": call.session_id.clone().unwrap_or_default(),
                "cost_usd": call.cost_usd,
                "num_turns": call.num_turns,
                "log": call.log.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                "error_kind": call.verdict.kind.map_or("", crate::claude::ErrorKind::name),
                "error": if call.verdict.kind.is_some() { trimmed(&call.verdict.message) } else { String::new() },
            }),
        ),
        None => vars.set(
            "claude",
            json!({"output": trimmed(&out.stdout), "stderr": trimmed(&out.stderr), "exit_code": exit_code, "session_id": "", "cost_usd": 0, "num_turns": 0, "log": "", "error_kind": "", "error": ""}),
        ),
    }
}

/// Before a `claude` step's first attempt: `claude.*` as the last Claude call left it, or
/// every field empty when none was made, so that its prompt may read them.
pub(crate) fn claude_vars_or_empty(vars: &mut Vars) {
    if !vars.values.contains_key("claude") {
        vars.set(
            "claude",
            json!({"output": "", "stderr": "", "exit_code": "", "session_id": "", "cost_usd": "", "num_turns": "", "log": "", "error_kind": "", "error": ""}),
        );
    }
}

/// `shell.*` after every command, shell or Claude, and `claude.*` after a Claude command, for
/// handlers and the next step: `${shell.output}` is stdout and stderr interleaved as the
/// command wrote them, `${shell.stdout}` and `${shell.stderr}` each stream alone.
pub(crate) fn set_last_command(vars: &mut Vars, step: &PlanStep, out: &Output) {
    let trimmed = |s: &str| s.strip_suffix('\n').unwrap_or(s).to_owned();
    let exit_code = out.code.unwrap_or(-1);
    vars.set(
        "shell",
        json!({"output": trimmed(&out.combined()), "stdout": trimmed(&out.stdout), "stderr": trimmed(&out.stderr), "exit_code": exit_code}),
    );
    if out.claude.is_some() || matches!(step.command, PlanCommand::Claude(_)) {
        set_claude_vars(vars, out);
    }
    vars.last_output = Some(trimmed(&out.stdout));
    vars.commands.insert(
        step.id.0,
        crate::vars::CommandOutput {
            stdout: trimmed(&out.stdout),
            stderr: trimmed(&out.stderr),
            success: out.success(),
        },
    );
}

//! Claude Code as an executor: the argument list of one call, the CLI's `stream-json` events
//! as they arrive, and the verdict on the call (docs/claude.md).
//!
//! The CLI is run as `claude -p --output-format stream-json --verbose
//! --dangerously-skip-permissions [settings]`, with the prompt on its standard input: an
//! argument would show the prompt, and any secret in it, to every local user in
//! `/proc/PID/cmdline` for as long as the call runs. Its standard output is one JSON event
//! per line: `system/init`, `assistant` and `user` messages (text, tool calls, tool results),
//! `system/api_retry` while the CLI retries the API itself, and a final `result`. Unknown
//! event types and fields are ignored, so a newer CLI does not break a run.
//!
//! A call succeeds only when the CLI exits 0, a `result` event arrived, its `is_error` is
//! false, and it is not an unknown slash command (`Unknown command: …` with no turn taken).
//! Everything else is a failure with an [`ErrorKind`].

pub mod budget;
pub mod governor;
pub mod kinds;
pub mod limit;
pub mod preflight;
pub mod pricing;
pub mod spend;

pub use kinds::{Call, ErrorKind, Note, Tokens, Totals, Verdict};
use prodigy_plan::ClaudeSettings;
use serde::Deserialize;
use serde_json::Value;

/// `PRODIGY_CLAUDE_COMMAND` could not be split into words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`PRODIGY_CLAUDE_COMMAND` is not a valid command line (`{0}`): an opening quote has no closing quote"
)]
pub struct BadCommand(pub String);

/// The program and leading arguments: `PRODIGY_CLAUDE_COMMAND` split with shell quoting
/// rules, or `claude`.
pub fn program(override_command: Option<&str>) -> Result<(String, Vec<String>), BadCommand> {
    let words = match override_command.map(str::trim).filter(|c| !c.is_empty()) {
        Some(line) => shlex::split(line).ok_or_else(|| BadCommand(line.to_owned()))?,
        None => Vec::new(),
    };
    Ok(match words.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => ("claude".to_owned(), Vec::new()),
    })
}

/// The variable in which the CLI reads how many times it retries a failed API request
/// itself (ten by default).
pub const RETRIES_ENV: &str = "CLAUDE_CODE_MAX_RETRIES";

/// The CLI's own retry budget when the user sets none: the run's rate governor sees every
/// call and waits for all of them (docs/language.md §2, "Claude rate limits"), while each
/// CLI retrying on its own for minutes keeps asking an API that refuses it, and holds its
/// slot meanwhile. Two retries still ride out a single refused or dropped request.
pub const RETRIES: u32 = 2;

/// What to add to the environment ENV of a CLI prodigy starts: [`RETRIES_ENV`] set to
/// [`RETRIES`], unless ENV already sets it (the step's or the workflow's `env`) or the CLI
/// inherits prodigy's environment (INHERITS) and that sets it (INHERITED).
pub fn retry_budget(
    env: &[(String, String)],
    inherits: bool,
    inherited: Option<&std::ffi::OsStr>,
) -> Option<(String, String)> {
    let set = env.iter().any(|(name, _)| name == RETRIES_ENV) || (inherits && inherited.is_some());
    (!set).then(|| (RETRIES_ENV.to_owned(), RETRIES.to_string()))
}

/// The whole argument list of a call: the program and its leading arguments, then
/// `-p --output-format stream-json --verbose`, the permission mode and the settings. The
/// prompt is not among them: the caller writes it to the CLI's standard input, which `-p`
/// reads when no prompt argument is given, so that no secret of the prompt is ever in a
/// process's argv. SETTINGS are the plan's, as resolved for the call (none: the CLI's
/// defaults); an empty list adds no option.
pub fn invocation(
    override_command: Option<&str>,
    settings: Option<&ClaudeSettings>,
) -> Result<(String, Vec<String>), BadCommand> {
    let (program, mut args) = program(override_command)?;
    let none = ClaudeSettings::default();
    let settings = settings.unwrap_or(&none);
    args.extend(
        ["-p", "--output-format", "stream-json", "--verbose"]
            .iter()
            .map(|s| (*s).to_owned()),
    );
    match &settings.permission_mode {
        Some(mode) => args.extend(["--permission-mode".to_owned(), mode.clone()]),
        None => args.push("--dangerously-skip-permissions".to_owned()),
    }
    let mut option = |name: &str, value: String| {
        args.push(name.to_owned());
        args.push(value);
    };
    if let Some(model) = &settings.model {
        option("--model", model.clone());
    }
    if let Some(turns) = settings.max_turns {
        option("--max-turns", turns.to_string());
    }
    if let Some(tools) = settings.allowed_tools.as_ref().filter(|t| !t.is_empty()) {
        option("--allowedTools", tools.join(","));
    }
    if let Some(tools) = settings.disallowed_tools.as_ref().filter(|t| !t.is_empty()) {
        option("--disallowedTools", tools.join(","));
    }
    if let Some(prompt) = &settings.append_system_prompt {
        option("--append-system-prompt", prompt.clone());
    }
    if let Some(budget) = settings.max_budget_usd {
        option("--max-budget-usd", budget.to_string());
    }
    if let Some(model) = &settings.fallback_model {
        option("--fallback-model", model.clone());
    }
    for config in settings.mcp_config.iter().flatten() {
        option("--mcp-config", config.clone());
    }
    for dir in settings.add_dirs.iter().flatten() {
        option("--add-dir", dir.clone());
    }
    Ok((program, args))
}

/// A retried call that goes on with the failed attempt's session (`claude: {on_retry:
/// continue}`, docs/language.md §2): its edits are still in the worktree, and the new call
/// resumes its conversation told why it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Continuation {
    /// The failed attempt's session.
    pub session_id: String,
    /// Why it failed: the call's error kind, or `unknown` when a check after it failed.
    pub kind: ErrorKind,
    /// What it said: the call's error message, or why the check failed.
    pub message: String,
    /// The call runs in a fresh checkout of the merged work, not where the failed attempt
    /// left its edits: the verified merge queue sent the item back (`merge.redispatch`).
    pub sent_back: bool,
}

impl Continuation {
    /// ARGS of a call resume the failed session: `--resume ID` after the settings.
    pub fn resume(&self, args: &mut Vec<String>) {
        args.push("--resume".to_owned());
        args.push(self.session_id.clone());
    }

    /// The prompt of the continued call: why the previous attempt failed, then PROMPT.
    pub fn prompt(&self, prompt: &str) -> String {
        let message = self.message.trim();
        let message = if message.is_empty() {
            "no message"
        } else {
            message
        };
        if self.sent_back {
            return format!(
                "Your earlier work on this task in this session was not merged: {message}\n\
                 The working directory now holds the current merged work, without your \
                 earlier changes: do the task again on it, so that this does not happen \
                 again.\n\n{prompt}"
            );
        }
        format!(
            "The previous attempt at this task failed ({kind}: {message}). Its work in this \
             session and in the working directory is kept: continue from where it stopped, \
             and finish the task.\n\n{prompt}",
            kind = self.kind.name()
        )
    }
}

/// The `result` event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Final {
    /// `success`, `error_max_turns`, `error_max_budget_usd`, `error_during_execution`, ….
    pub subtype: String,
    /// Whether the CLI counts the call as failed.
    pub is_error: bool,
    /// The HTTP status of the API error that ended the call.
    pub api_error_status: Option<u16>,
    /// Turns taken.
    pub num_turns: u32,
    /// The final text (or the CLI's error message).
    pub result: Option<String>,
    /// What the call cost.
    pub cost_usd: f64,
    /// Tokens used.
    pub tokens: Tokens,
    /// `errors`, when the CLI lists them.
    pub errors: Vec<String>,
}

/// An event's type, read without building the rest of it.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// What the events of one call said so far.
#[derive(Clone, Debug, Default)]
pub struct Stream {
    /// The session id.
    pub session_id: Option<String>,
    /// The model of the session.
    pub model: Option<String>,
    /// Assistant messages seen: the turns so far, while the call runs.
    pub turns: u32,
    /// Tool calls seen.
    pub tool_calls: u32,
    /// API retries the CLI made.
    pub api_retries: u32,
    /// Assistant messages the API answered (not the CLI's own `<synthetic>` message that
    /// reports an API error): each shows that the API serves requests again.
    pub api_answers: u32,
    /// The id of the last message counted in `api_answers`: the CLI sends a message once
    /// per block of its content, and one answer is one answer.
    last_answer: Option<String>,
    /// The last `system/api_retry` event's error and status.
    last_retry: Option<(String, Option<u16>)>,
    /// `assistant.error` of the last assistant message that had one.
    assistant_error: Option<String>,
    /// The `result` event, once it arrived.
    pub result: Option<Final>,
    /// Lines that were not JSON.
    pub garbage: u32,
    /// The last `rate_limit_event`'s `rate_limit_info` (a subscription's usage limit).
    pub rate_limit: Option<crate::claude::limit::RateLimitInfo>,
    /// The last line began an event that does not parse: the stream was cut inside it.
    cut: bool,
    /// What the assistant messages used, for a call that ends without a `result`: the
    /// messages before the last, and the last one as far as it streamed (the CLI repeats a
    /// message's usage on each event of its content).
    usage: (Tokens, Option<Streamed>),
    /// The model the assistant messages name.
    assistant_model: Option<String>,
    /// How prodigy ended the call, when it stopped the CLI itself: the last line of the
    /// call's log says so ([`End::log_line`]), so that `prodigy logs` gives the verdict the
    /// events gave.
    pub ended_by_prodigy: Option<End>,
}

/// One assistant message as far as the stream showed it: its id, the usage its events
/// reported, and the bytes of content they carried.
#[derive(Clone, Debug, Default)]
struct Streamed {
    id: Option<String>,
    reported: Tokens,
    bytes: u64,
}

/// Bytes of streamed content counted as one output token, rounded up.
///
/// Each `assistant` event carries the usage of the API's `message_start`, whose
/// `output_tokens` is 1 or so whatever the message goes on to say: the output a message
/// cost is only in the `result`. Without one, it is estimated from what the message
/// streamed (text, thinking, tool input as JSON): Claude's tokenizer averages about 3.5
/// characters a token on English prose, so one token per 3 bytes errs high there, as an
/// estimate that feeds the budget should (docs/claude.md).
pub const BYTES_PER_TOKEN: u64 = 3;

impl Streamed {
    /// Its tokens: as reported, the output at least what its content takes.
    fn tokens(&self) -> Tokens {
        Tokens {
            output: self
                .reported
                .output
                .max(self.bytes.div_ceil(BYTES_PER_TOKEN)),
            ..self.reported
        }
    }
}

/// The bytes of output a content block of an `assistant` event carries: its text, its
/// thinking (redacted thinking's data), a tool call's input as JSON.
fn content_bytes(block: &Value) -> u64 {
    let len = |key: &str| block.get(key).and_then(Value::as_str).map_or(0, str::len);
    let bytes = match block.get("type").and_then(Value::as_str) {
        Some("text") => len("text"),
        Some("thinking") => len("thinking"),
        Some("redacted_thinking") => len("data"),
        Some("tool_use" | "server_tool_use") => {
            len("name") + block.get("input").map_or(0, |i| i.to_string().len())
        }
        _ => 0,
    };
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// The string at KEY of V.
fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

impl Final {
    /// The `result` event EVENT.
    fn of(event: &Value) -> Self {
        let num_turns = event
            .get("num_turns")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        Final {
            subtype: text(event, "subtype").unwrap_or_default(),
            is_error: event
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            api_error_status: event
                .get("api_error_status")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok()),
            num_turns,
            result: text(event, "result"),
            cost_usd: event
                .get("total_cost_usd")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            tokens: Tokens::of(event.get("usage")),
            errors: event
                .get("errors")
                .and_then(Value::as_array)
                .map(|e| {
                    e.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl Stream {
    /// Reads one line of the stream and returns what to show of it.
    pub fn feed(&mut self, line: &str) -> Vec<Note> {
        let line = line.trim();
        if line.is_empty() {
            return Vec::new();
        }
        // Only the event's type first, skipping the rest without building it: `user`
        // events (tool results) are most of a long stream and say nothing the verdict needs.
        let Ok(head) = serde_json::from_str::<Head<'_>>(line) else {
            self.garbage += 1;
            // An event that starts but does not parse: the stream was cut inside it.
            self.cut = line.starts_with('{');
            return Vec::new();
        };
        self.cut = false;
        if !matches!(
            head.kind.as_deref(),
            Some("system" | "assistant" | "result" | "rate_limit_event" | PRODIGY_END)
        ) {
            return Vec::new();
        }
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            self.garbage += 1;
            return Vec::new();
        };
        let mut notes = Vec::new();
        match (
            event.get("type").and_then(Value::as_str),
            event.get("subtype").and_then(Value::as_str),
        ) {
            (Some("system"), Some("init")) => {
                self.session_id = text(&event, "session_id");
                self.model = text(&event, "model");
                if let Some(session_id) = self.session_id.clone() {
                    notes.push(Note::Started {
                        session_id,
                        model: self.model.clone(),
                    });
                }
            }
            (Some(PRODIGY_END), _) => {
                self.ended_by_prodigy = match event.get("ended").and_then(Value::as_str) {
                    Some("timeout") => Some(End::TimedOut),
                    Some("stalled") => Some(End::Stalled),
                    _ => None,
                };
            }
            (Some("system"), Some("api_retry")) => notes.push(self.api_retry(&event)),
            (Some("assistant"), _) => self.assistant(&event, &mut notes),
            (Some("rate_limit_event"), _) => {
                if let Some(info) = crate::claude::limit::RateLimitInfo::of(&event) {
                    self.rate_limit = Some(info);
                }
            }
            (Some("result"), _) => {
                self.result = Some(Final::of(&event));
                if self.session_id.is_none() {
                    self.session_id = text(&event, "session_id");
                }
            }
            _ => {}
        }
        notes
    }

    /// A `system/api_retry` event: counted and kept as the last retry; its note shows the
    /// error, or the HTTP status when the error is unknown.
    fn api_retry(&mut self, event: &Value) -> Note {
        self.api_retries += 1;
        let status = event
            .get("error_status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok());
        let error = text(event, "error").unwrap_or_else(|| "unknown".to_owned());
        self.last_retry = Some((error.clone(), status));
        let shown = match (error.as_str(), status) {
            ("unknown", Some(status)) => status.to_string(),
            ("unknown", None) => "no response".to_owned(),
            _ => error,
        };
        let number = |key: &str| event.get(key).and_then(Value::as_f64).unwrap_or(0.0);
        Note::ApiRetry {
            attempt: event.get("attempt").and_then(Value::as_u64).unwrap_or(0),
            max: event
                .get("max_retries")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            error: shown,
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a delay in milliseconds, clamped to be positive"
            )]
            delay_ms: number("retry_delay_ms").max(0.0) as u64,
        }
    }

    /// An `assistant` event: a turn, its usage and error, and a note for each text and
    /// tool call in its content.
    fn assistant(&mut self, event: &Value, notes: &mut Vec<Note>) {
        self.turns += 1;
        self.note_usage(event);
        let synthetic =
            event.pointer("/message/model").and_then(Value::as_str) == Some("<synthetic>");
        let id = event.pointer("/message/id").and_then(Value::as_str);
        match text(event, "error") {
            Some(error) => self.assistant_error = Some(error),
            None if synthetic => {}
            None if id.is_some() && id == self.last_answer.as_deref() => {}
            None => {
                self.api_answers += 1;
                self.last_answer = id.map(str::to_owned);
            }
        }
        let content = event
            .pointer("/message/content")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for block in content {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    if let Some(t) = text(block, "text").filter(|t| !t.trim().is_empty()) {
                        notes.push(Note::Text(t));
                    }
                }
                Some("tool_use") => {
                    self.tool_calls += 1;
                    notes.push(Note::Tool {
                        name: text(block, "name").unwrap_or_else(|| "tool".to_owned()),
                        detail: tool_detail(block.get("input")),
                    });
                }
                _ => {}
            }
        }
    }

    /// Turns taken: the `result`'s count once it arrived, else the assistant messages seen.
    pub fn num_turns(&self) -> u32 {
        self.result.as_ref().map_or(self.turns, |r| r.num_turns)
    }

    /// The verdict on the call, from its events and how the CLI ended (`code`: its exit
    /// code, `None` when a signal, a timeout or a cancellation ended it).
    pub fn verdict(&self, code: Option<i32>) -> Verdict {
        let Some(result) = &self.result else {
            let no_event = self.session_id.is_none() && self.turns == 0 && !self.cut;
            let why = match code {
                // A program that prints plain text (a stand-in written without the protocol).
                Some(_) if no_event && self.garbage > 0 => format!(
                    "the Claude CLI printed no stream-json event ({} line{} of other text): \
                     a program named by `PRODIGY_CLAUDE_COMMAND` must print \
                     `--output-format stream-json` events, one JSON object a line, ending \
                     with a `result` event (docs/claude.md, \"A stand-in for the Claude CLI\")",
                    self.garbage,
                    if self.garbage == 1 { "" } else { "s" }
                ),
                Some(0) => "the Claude CLI exited without a `result` event".to_owned(),
                Some(code) => {
                    format!("the Claude CLI exited with code {code} without a `result` event")
                }
                None => "the Claude CLI was ended before its `result` event".to_owned(),
            };
            let kind = self.missing_result_kind().unwrap_or(ErrorKind::Unknown);
            return Verdict {
                kind: Some(kind),
                message: why,
            };
        };
        let message = result
            .result
            .clone()
            .filter(|m| !m.trim().is_empty())
            .or_else(|| (!result.errors.is_empty()).then(|| result.errors.join("; ")))
            .unwrap_or_default();
        if result.num_turns == 0 && message.starts_with("Unknown command:") {
            return Verdict {
                kind: Some(ErrorKind::InvalidRequest),
                message,
            };
        }
        if !result.is_error && result.subtype == "success" && code == Some(0) {
            return Verdict {
                kind: None,
                message,
            };
        }
        let kind = match result.subtype.as_str() {
            "error_max_turns" => Some(ErrorKind::MaxTurns),
            "error_max_budget_usd" | "error_max_budget" => Some(ErrorKind::MaxBudget),
            _ => None,
        }
        .or_else(|| classify_status(result.api_error_status))
        .or_else(|| network_message(&message).then_some(ErrorKind::Network))
        .or_else(|| self.assistant_error.as_deref().and_then(classify_error))
        .or_else(|| {
            message
                .to_lowercase()
                .contains("not logged in")
                .then_some(ErrorKind::Authentication)
        })
        .unwrap_or(ErrorKind::Unknown);
        let message = if message.is_empty() {
            match code {
                Some(code) => format!("the Claude CLI failed (exit code {code})"),
                None => "the Claude CLI was ended by a signal".to_owned(),
            }
        } else {
            message
        };
        Verdict {
            kind: Some(kind),
            message,
        }
    }
}

impl Stream {
    /// Counts the usage an `assistant` event reports and the content it carries, once per
    /// message: its usage is the last event's, its content the sum of its events'.
    fn note_usage(&mut self, event: &Value) {
        if let Some(model) = event.pointer("/message/model").and_then(Value::as_str) {
            self.assistant_model = Some(model.to_owned());
        }
        let id = event
            .pointer("/message/id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let usage = event.pointer("/message/usage").map(|u| Tokens::of(Some(u)));
        let bytes = event
            .pointer("/message/content")
            .and_then(Value::as_array)
            .map_or(0, |blocks| {
                blocks
                    .iter()
                    .map(content_bytes)
                    .fold(0, u64::saturating_add)
            });
        if usage.is_none() && bytes == 0 {
            return;
        }
        let (done, last) = &mut self.usage;
        match last {
            Some(message) if id.is_some() && message.id == id => {
                if let Some(usage) = usage {
                    message.reported = usage;
                }
                message.bytes = message.bytes.saturating_add(bytes);
            }
            _ => {
                if let Some(finished) = last.take() {
                    done.add(finished.tokens());
                }
                *last = Some(Streamed {
                    id,
                    reported: usage.unwrap_or_default(),
                    bytes,
                });
            }
        }
    }

    /// The tokens the assistant messages used so far: the input as reported, the output
    /// at least what their streamed content takes ([`BYTES_PER_TOKEN`]).
    pub fn streamed_tokens(&self) -> Tokens {
        let (mut tokens, last) = self.usage.clone();
        if let Some(last) = last {
            tokens.add(last.tokens());
        }
        tokens
    }

    /// What the call cost and the tokens it used: the `result`'s figures, else an estimate
    /// from the usage the stream reported ([`crate::claude::pricing`]), marked as such (`true`).
    pub fn cost(&self) -> (f64, Tokens, bool) {
        if let Some(result) = &self.result {
            return (
                crate::claude::pricing::usd(result.cost_usd),
                result.tokens,
                false,
            );
        }
        let tokens = self.streamed_tokens();
        if tokens.total() == 0 {
            return (0.0, tokens, false);
        }
        let model = self.assistant_model.as_deref().or(self.model.as_deref());
        (
            crate::claude::pricing::estimate(model, &tokens),
            tokens,
            true,
        )
    }
}

/// How the CLI's process ended, as far as the verdict cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it, or a cancellation (the run stopping).
    Killed,
    /// The step's `timeout` ended it.
    TimedOut,
    /// Its `stall_timeout` ended it.
    Stalled,
}

/// The `type` of the line prodigy adds at the end of a Claude call's log when it stopped the
/// CLI itself ([`End::log_line`]); the CLI never writes it.
const PRODIGY_END: &str = "prodigy_end";

impl End {
    /// The line a call's log ends with when prodigy ended it (a timeout, a stall), which
    /// [`Stream::feed`] reads back: `None` when the CLI ended by itself or was killed.
    pub fn log_line(self) -> Option<String> {
        let ended = match self {
            End::TimedOut => "timeout",
            End::Stalled => "stalled",
            End::Exited(_) | End::Killed => return None,
        };
        Some(format!(r#"{{"type":"{PRODIGY_END}","ended":"{ended}"}}"#))
    }

    /// The exit code, when it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            End::Exited(code) => Some(code),
            End::Killed | End::TimedOut | End::Stalled => None,
        }
    }
}

impl Stream {
    /// The verdict on the call once it ended as END: a timeout or a stall is its own kind,
    /// whatever the stream said before; anything else is [`Stream::verdict`].
    pub fn verdict_after(&self, end: End) -> Verdict {
        let (kind, message) = match end {
            End::TimedOut => (
                ErrorKind::Timeout,
                "the Claude CLI was stopped by the step's `timeout`",
            ),
            End::Stalled => (
                ErrorKind::Stalled,
                "the Claude CLI reported no event for `stall_timeout` and was stopped",
            ),
            End::Exited(_) | End::Killed => return self.verdict(end.code()),
        };
        Verdict {
            kind: Some(kind),
            message: message.to_owned(),
        }
    }

    /// Why the stream ended without a `result`, when it says: the error of the API retry
    /// the CLI was making (one without an HTTP status could not reach the API), or a last
    /// line cut short.
    fn missing_result_kind(&self) -> Option<ErrorKind> {
        if let Some((error, status)) = &self.last_retry {
            return classify_status(*status)
                .or(classify_error(error))
                .or(status.is_none().then_some(ErrorKind::Network));
        }
        self.assistant_error
            .as_deref()
            .and_then(classify_error)
            .or(self.cut.then_some(ErrorKind::Network))
    }
}

impl Stream {
    /// The call, once the CLI ended with CODE.
    pub fn finish(self, end: End, log: Option<std::path::PathBuf>) -> Call {
        let verdict = self.verdict_after(end);
        let num_turns = self.num_turns();
        let (cost_usd, tokens, cost_estimated) = self.cost();
        Call {
            verdict,
            session_id: self.session_id,
            num_turns,
            cost_usd,
            cost_estimated,
            tokens,
            tool_calls: self.tool_calls,
            api_retries: self.api_retries,
            api_answers: self.api_answers,
            log,
            usage_limit: None,
            cancelled: false,
        }
    }
}

impl Stream {
    /// The usage limit the call ended at, once the CLI ended with CODE (`None`: a signal, a
    /// timeout or a cancellation ended it, and the call was not refused); WALL is the wall
    /// clock in seconds since the epoch.
    pub fn usage_limit(&self, code: Option<i32>, wall: u64) -> Option<limit::UsageLimit> {
        let verdict = self.verdict(code);
        verdict.kind?;
        code?;
        limit::usage_limit(
            self.rate_limit.as_ref(),
            self.result.as_ref().and_then(|r| r.api_error_status),
            &verdict.message,
            wall,
        )
    }
}

/// Why the Claude program did not say its version ([`ask_version`]).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum VersionError {
    /// It could not be started.
    #[error("{0}")]
    Spawn(#[source] std::io::Error),
    /// It could not be waited for.
    #[error("{0}")]
    Wait(#[source] std::io::Error),
    /// It did not answer in time (it is killed).
    #[error("no answer within 20 s")]
    NoAnswer,
    /// It exited non-zero; DETAIL is the last line of its standard error.
    #[error("exit code {code}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Exited {
        /// The exit code.
        code: i32,
        /// The last line it printed on standard error, or nothing.
        detail: String,
    },
    /// It was ended by a signal.
    #[error("ended by a signal")]
    Signal,
}

/// Asks PROGRAM (with its LEADING arguments) for its version: `--version`, answered within
/// 20 seconds with exit code 0. It runs before the run's runtime starts, so it waits on the
/// wall clock.
#[expect(
    clippy::disallowed_methods,
    reason = "a blocking preflight check, before any paused clock exists"
)]
pub fn ask_version(program: &str, leading: &[String]) -> Result<String, VersionError> {
    use std::io::Read as _;
    let mut child = std::process::Command::new(program)
        .args(leading)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(VersionError::Spawn)?;
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < std::time::Duration::from_secs(20) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(VersionError::NoAnswer);
            }
            Err(e) => return Err(VersionError::Wait(e)),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        let _ = pipe.read_to_string(&mut out);
    }
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut err);
    }
    if status.success() {
        Ok(out.trim().to_owned())
    } else {
        let detail = err.trim().lines().last().unwrap_or("").to_owned();
        Err(match status.code() {
            Some(code) => VersionError::Exited { code, detail },
            None => VersionError::Signal,
        })
    }
}

static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Remembers the CLI's version (`claude --version`, asked once per run).
pub fn remember_version(version: &str) {
    let _ = VERSION.set(version.trim().to_owned());
}

/// The CLI's version, once asked.
pub fn version() -> Option<&'static str> {
    VERSION.get().map(String::as_str)
}

fn classify_status(status: Option<u16>) -> Option<ErrorKind> {
    Some(match status? {
        401 | 403 => ErrorKind::Authentication,
        402 => ErrorKind::Billing,
        429 => ErrorKind::RateLimit,
        529 => ErrorKind::Overloaded,
        500..=599 => ErrorKind::ServerError,
        400 | 404 | 413 | 422 => ErrorKind::InvalidRequest,
        _ => return None,
    })
}

/// `assistant.error` (and `api_retry.error`) as the CLI names it.
fn classify_error(error: &str) -> Option<ErrorKind> {
    Some(match error {
        "authentication_failed" | "authentication_error" | "permission_error" => {
            ErrorKind::Authentication
        }
        "billing_error" => ErrorKind::Billing,
        "rate_limit" | "rate_limit_error" => ErrorKind::RateLimit,
        "overloaded" | "overloaded_error" => ErrorKind::Overloaded,
        "server_error" | "api_error" => ErrorKind::ServerError,
        "invalid_request" | "invalid_request_error" | "not_found_error" => {
            ErrorKind::InvalidRequest
        }
        _ => return None,
    })
}

/// Whether the CLI's message says the API could not be reached.
fn network_message(message: &str) -> bool {
    let lower = message.to_lowercase();
    [
        "unable to connect",
        "connection refused",
        "connectionrefused",
        "econnrefused",
        "econnreset",
        "enotfound",
        "fetch failed",
        "network error",
        "socket hang up",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// The argument of a tool call worth a line: its command, file, pattern or URL, on one line
/// and at most 100 characters.
fn tool_detail(input: Option<&Value>) -> String {
    let Some(input) = input else {
        return String::new();
    };
    let text = [
        "command",
        "file_path",
        "path",
        "pattern",
        "url",
        "description",
    ]
    .iter()
    .find_map(|key| input.get(*key).and_then(Value::as_str))
    .unwrap_or("");
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() > 100 {
        let cut: String = line.chars().take(99).collect();
        format!("{cut}…")
    } else if text.lines().nth(1).is_some() {
        format!("{line} …")
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(lines: &[&str]) -> (Stream, Vec<Note>) {
        let mut s = Stream::default();
        let notes = lines.iter().flat_map(|l| s.feed(l)).collect();
        (s, notes)
    }

    const INIT: &str =
        r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m-1","tools":[]}"#;

    #[test]
    fn a_quoted_command_line_keeps_its_words_and_the_prompt_is_no_argument() {
        let (program, args) =
            invocation(Some(r#"claude --append-system-prompt "be terse""#), None).unwrap();
        assert_eq!(program, "claude");
        assert_eq!(
            args,
            [
                "--append-system-prompt",
                "be terse",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions",
            ]
        );
        assert_eq!(
            invocation(Some(r#"claude "oops"#), None),
            Err(BadCommand(r#"claude "oops"#.to_owned()))
        );
    }

    #[test]
    fn a_continued_retry_resumes_the_failed_session_and_says_why() {
        let (_, mut args) = invocation(None, None).unwrap();
        let fresh = args.clone();
        let continued = Continuation {
            session_id: "sess-1".to_owned(),
            kind: ErrorKind::MaxTurns,
            message: "Reached maximum number of turns (3)".to_owned(),
            sent_back: false,
        };
        continued.resume(&mut args);
        assert!(!fresh.contains(&"--resume".to_owned()));
        assert_eq!(args[..fresh.len()], fresh[..]);
        assert_eq!(args[fresh.len()..], ["--resume", "sess-1"]);
        let prompt = continued.prompt("/fix the build");
        assert!(prompt.contains("max_turns: Reached maximum number of turns (3)"));
        assert!(prompt.contains("previous attempt"));
        assert!(prompt.ends_with("\n\n/fix the build"));
    }

    #[test]
    fn settings_become_options_and_a_permission_mode_replaces_skipping() {
        let settings = ClaudeSettings {
            model: Some("sonnet".into()),
            max_turns: Some(3),
            allowed_tools: Some(vec!["Bash(git *)".into(), "Edit".into()]),
            disallowed_tools: Some(Vec::new()),
            permission_mode: Some("acceptEdits".into()),
            max_budget_usd: Some(0.5),
            add_dirs: Some(vec!["../lib".into()]),
            ..ClaudeSettings::default()
        };
        let (_, args) = invocation(None, Some(&settings)).unwrap();
        let joined = args.join(" ");
        assert!(
            joined.contains("--permission-mode acceptEdits --model sonnet --max-turns 3 --allowedTools Bash(git *),Edit --max-budget-usd 0.5 --add-dir ../lib"),
            "{joined}"
        );
        assert!(!joined.contains("--dangerously-skip-permissions"));
        // An empty list (one that clears the workflow's) adds no option.
        assert!(!joined.contains("--disallowedTools"), "{joined}");
    }

    #[test]
    fn a_clean_result_succeeds_with_the_final_text() {
        let (s, notes) = stream(&[
            INIT,
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Looking."},{"type":"tool_use","name":"Bash","input":{"command":"cargo test\nmore"}}]}}"#,
            r#"{"type":"user","message":{"content":[{"type":"tool_result","content":"ok"}]}}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Done."}]},"brand_new_field":1}"#,
            r#"{"type":"something_new"}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Done.","total_cost_usd":0.25,"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":3}}"#,
        ]);
        assert_eq!(
            notes.iter().map(Note::line).collect::<Vec<_>>(),
            [
                "claude session s-1 (m-1)",
                "Looking.",
                "→ Bash: cargo test …",
                "Done."
            ]
        );
        assert_eq!(
            s.verdict(Some(0)),
            Verdict {
                kind: None,
                message: "Done.".into()
            }
        );
        let r = s.result.unwrap();
        assert_eq!(
            (r.num_turns, r.cost_usd, r.tokens.input, r.tokens.cache_read),
            (2, 0.25, 10, 3)
        );
        assert_eq!(s.tool_calls, 1);
    }

    #[test]
    fn an_unknown_slash_command_is_a_failure_though_the_cli_exits_0() {
        let (s, _) = stream(&[
            INIT,
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":0,"result":"Unknown command: /nosuch"}"#,
        ]);
        let v = s.verdict(Some(0));
        assert_eq!(v.kind, Some(ErrorKind::InvalidRequest));
        assert_eq!(v.message, "Unknown command: /nosuch");
    }

    #[test]
    fn a_missing_result_is_a_failure_even_after_exit_0() {
        let (s, _) = stream(&[INIT, "not json at all"]);
        assert_eq!(s.garbage, 1);
        assert_eq!(s.verdict(Some(0)).kind, Some(ErrorKind::Unknown));
        assert!(
            s.verdict(None)
                .message
                .contains("ended before its `result`")
        );
    }

    #[test]
    fn each_failure_gets_its_kind() {
        let result = |extra: &str| {
            format!(
                r#"{{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":"boom"{extra}}}"#
            )
        };
        let cases: [(&[&str], ErrorKind); 11] = [
            (&[&result(r#","api_error_status":402"#)], ErrorKind::Billing),
            (
                &[&result(r#","api_error_status":400"#)],
                ErrorKind::InvalidRequest,
            ),
            (
                &[
                    r#"{"type":"result","subtype":"error_max_budget_usd","is_error":true,"num_turns":4}"#,
                ],
                ErrorKind::MaxBudget,
            ),
            (
                &[&result(r#","api_error_status":401"#)],
                ErrorKind::Authentication,
            ),
            (
                &[&result(r#","api_error_status":429"#)],
                ErrorKind::RateLimit,
            ),
            (
                &[&result(r#","api_error_status":529"#)],
                ErrorKind::Overloaded,
            ),
            (
                &[&result(r#","api_error_status":503"#)],
                ErrorKind::ServerError,
            ),
            (
                &[
                    r#"{"type":"assistant","error":"authentication_failed","message":{"content":[]}}"#,
                    r#"{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":"Not logged in · Please run /login"}"#,
                ],
                ErrorKind::Authentication,
            ),
            (
                &[
                    r#"{"type":"assistant","error":"server_error","message":{"content":[]}}"#,
                    r#"{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":"API Error: Unable to connect to API (ConnectionRefused)"}"#,
                ],
                ErrorKind::Network,
            ),
            (
                &[
                    r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"errors":["Reached maximum number of turns (2)"]}"#,
                ],
                ErrorKind::MaxTurns,
            ),
            (&[&result("")], ErrorKind::Unknown),
        ];
        for (lines, kind) in cases {
            let (s, _) = stream(lines);
            assert_eq!(s.verdict(Some(1)).kind, Some(kind), "{lines:?}");
        }
        let (s, _) = stream(&[
            r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"errors":["Reached maximum number of turns (2)"]}"#,
        ]);
        assert_eq!(
            s.verdict(Some(1)).message,
            "Reached maximum number of turns (2)"
        );
    }

    #[test]
    fn the_cli_gets_a_small_retry_budget_unless_the_user_set_one() {
        let budget = Some((RETRIES_ENV.to_owned(), "2".to_owned()));
        assert_eq!(retry_budget(&[], true, None), budget);
        let own = [(RETRIES_ENV.to_owned(), "7".to_owned())];
        assert_eq!(retry_budget(&own, true, None), None);
        let inherited = std::ffi::OsStr::new("0");
        assert_eq!(retry_budget(&[], true, Some(inherited)), None);
        // `clear_env`: prodigy's environment does not reach the CLI.
        assert_eq!(retry_budget(&[], false, Some(inherited)), budget);
    }

    #[test]
    fn only_the_apis_own_answers_count_as_answers() {
        let (ok, _) = stream(&[
            r#"{"type":"assistant","message":{"model":"claude-opus-4-8","content":[{"type":"text","text":"Hi"}]}}"#,
        ]);
        assert_eq!(ok.api_answers, 1);
        // One answer of two blocks, sent as two messages with its id, then another.
        let (tool, _) = stream(&[
            r#"{"type":"assistant","message":{"id":"m1","model":"m","content":[{"type":"text","text":"Running."}]}}"#,
            r#"{"type":"assistant","message":{"id":"m1","model":"m","content":[{"type":"tool_use","name":"Bash","input":{}}]}}"#,
            r#"{"type":"assistant","message":{"id":"m2","model":"m","content":[{"type":"text","text":"Done."}]}}"#,
        ]);
        assert_eq!(tool.api_answers, 2);
        let (refused, _) = stream(&[
            r#"{"type":"assistant","message":{"model":"<synthetic>","content":[{"type":"text","text":"API Error: 429"}]},"error":"rate_limit"}"#,
            r#"{"type":"assistant","message":{"model":"<synthetic>","content":[]}}"#,
        ]);
        assert_eq!((refused.api_answers, refused.turns), (0, 2));
    }

    #[test]
    fn an_api_retry_is_a_line_and_names_the_error() {
        let (s, notes) = stream(&[
            r#"{"type":"system","subtype":"api_retry","attempt":3,"max_retries":10,"retry_delay_ms":8123.4,"error_status":529,"error":"overloaded"}"#,
        ]);
        assert_eq!(notes[0].line(), "API retry 3/10: overloaded, next in 8s");
        assert_eq!(s.api_retries, 1);
        // Killed while retrying: the kind is the retried error's.
        assert_eq!(s.verdict(None).kind, Some(ErrorKind::Overloaded));
    }

    #[test]
    fn a_timeout_a_stall_and_a_cut_stream_have_kinds_of_their_own() {
        let (s, _) = stream(&[INIT]);
        assert_eq!(
            s.verdict_after(End::TimedOut).kind,
            Some(ErrorKind::Timeout)
        );
        assert_eq!(s.verdict_after(End::Stalled).kind, Some(ErrorKind::Stalled));
        assert_eq!(s.verdict_after(End::Killed).kind, Some(ErrorKind::Unknown));
        // A timeout wins over what the stream said so far.
        let (s, _) = stream(&[
            r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":500,"error_status":529,"error":"overloaded"}"#,
        ]);
        assert_eq!(
            s.verdict_after(End::TimedOut).kind,
            Some(ErrorKind::Timeout)
        );
        // Retrying a request that got no answer at all: the API cannot be reached.
        let (s, _) = stream(&[
            INIT,
            r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":500,"error_status":null,"error":"unknown"}"#,
        ]);
        assert_eq!(
            s.verdict_after(End::Exited(1)).kind,
            Some(ErrorKind::Network)
        );
        // An event cut in the middle, then nothing: the stream was cut.
        let (s, _) = stream(&[INIT, r#"{"type":"assistant","message":{"con"#]);
        assert_eq!(
            s.verdict_after(End::Exited(1)).kind,
            Some(ErrorKind::Network)
        );
        assert_eq!(s.verdict_after(End::Killed).kind, Some(ErrorKind::Network));
    }

    #[test]
    fn a_call_the_run_cancelled_is_counted_but_not_as_failed() {
        let mut call = Stream::default().finish(End::Killed, None);
        assert!(call.verdict.kind.is_some());
        let mut totals = Totals::default();
        totals.add(&call);
        assert_eq!((totals.calls, totals.failed), (1, 1));
        call.cancelled = true;
        let mut totals = Totals::default();
        totals.add(&call);
        assert_eq!((totals.calls, totals.failed), (1, 0));
    }

    #[test]
    fn a_call_without_a_result_is_priced_from_its_stream_and_says_so() {
        let message = |id: &str, output: u64| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"{id}","model":"claude-sonnet-4-5","content":[],"usage":{{"input_tokens":1000,"output_tokens":{output},"cache_read_input_tokens":2000}}}}}}"#
            )
        };
        // Two events of message m1 (its usage repeated, then final), one of m2.
        let (s, _) = stream(&[
            INIT,
            &message("m1", 10),
            &message("m1", 100),
            &message("m2", 50),
        ]);
        let call = s.finish(End::Stalled, None);
        assert!(call.cost_estimated);
        assert_eq!(
            (
                call.tokens.input,
                call.tokens.output,
                call.tokens.cache_read
            ),
            (2000, 150, 4000)
        );
        // 2000 × $3 + 150 × $15 + 4000 × $0.30, a million tokens each.
        assert_eq!(call.cost_usd.to_string(), "0.00945");
        let mut totals = Totals::default();
        totals.add(&call);
        assert_eq!(totals.estimated, 1);
        assert!(
            totals.line().ends_with("$0.0095 (1 estimated)"),
            "{}",
            totals.line()
        );
        // With a `result`, its figures stand, as decimals.
        let (s, _) = stream(&[
            &message("m1", 10),
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"ok","total_cost_usd":0.008100000000000001}"#,
        ]);
        let call = s.finish(End::Exited(0), None);
        assert!(!call.cost_estimated);
        assert_eq!(call.cost_usd.to_string(), "0.0081");
    }

    /// The CLI's `assistant` events carry the usage of `message_start` (`output_tokens: 1`)
    /// however long the message: a call cut before its `result` is priced from what it
    /// streamed instead, every event of a message counted, thinking and tool input too.
    #[test]
    fn a_call_cut_before_its_result_is_priced_from_what_it_streamed() {
        let event = |id: &str, block: &Value| {
            serde_json::json!({
                "type": "assistant",
                "message": {
                    "id": id, "type": "message", "role": "assistant",
                    "model": "claude-opus-4-8", "content": [block],
                    "stop_reason": null,
                    "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 3000, "output_tokens": 1}
                }
            })
            .to_string()
        };
        let text = "The cause is in the parser. ".repeat(150);
        assert_eq!(text.len(), 4200);
        let thinking = "x".repeat(300);
        let (s, _) = stream(&[
            INIT,
            &event(
                "msg_1",
                &serde_json::json!({"type": "thinking", "thinking": thinking, "signature": "sig"}),
            ),
            &event("msg_1", &serde_json::json!({"type": "text", "text": text})),
            &event(
                "msg_1",
                &serde_json::json!({"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                    "input": {"command": "cargo test"}}),
            ),
            r#"{"type":"user","message":{"content":[{"type":"tool_result","content":"ok"}]}}"#,
            &event(
                "msg_2",
                &serde_json::json!({"type": "text", "text": "Fixed."}),
            ),
        ]);
        let tokens = s.streamed_tokens();
        // msg_1: 300 + 4200 + `Bash` and `{"command":"cargo test"}` (4 + 24) bytes, a
        // token per 3 bytes rounded up; msg_2's 6 bytes are 2 tokens.
        assert_eq!(tokens.output, 1510 + 2);
        // Input and cache as reported, once per message.
        assert_eq!((tokens.input, tokens.cache_read), (24, 6000));
        let (cost, _, estimated) = s.cost();
        assert!(estimated);
        // Opus: 24 × $5 + 1512 × $25 + 6000 × $0.50, a million tokens each; the usage the
        // events reported alone (2 output tokens) would say $0.00317.
        assert_eq!(cost.to_string(), "0.04092");
        // A message's repeated usage is its last event's, its content the sum of its
        // events': an event whose usage grew does not count the earlier ones again.
        let (s, _) = stream(&[
            &event("m", &serde_json::json!({"type": "text", "text": "abcdef"})),
            &event("m", &serde_json::json!({"type": "text", "text": "ghi"})),
        ]);
        assert_eq!(s.streamed_tokens().output, 3);
    }

    #[test]
    fn only_transient_kinds_are_retried_by_default() {
        assert!(!ErrorKind::Authentication.retried_by_default());
        assert!(!ErrorKind::Billing.retried_by_default());
        assert!(!ErrorKind::InvalidRequest.retried_by_default());
        assert!(ErrorKind::Overloaded.retried_by_default());
        assert_eq!(
            serde_json::to_string(&ErrorKind::RateLimit).unwrap(),
            "\"rate_limit\""
        );
    }
}

//! What a Claude call is, once it ended: why it failed ([`ErrorKind`]), its verdict, the
//! tokens and cost of one call ([`Call`]) and of many ([`Totals`]), and what its stream said
//! worth showing ([`Note`]). Plain data of the state layer (ARCHITECTURE.md, "Layers"): the
//! job's files, its events and the DLQ hold them, so they name nothing above that layer.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a Claude call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The API refused the credentials (401, 403, not logged in).
    Authentication,
    /// The account cannot pay for the call (402, credit balance).
    Billing,
    /// Too many requests (429).
    RateLimit,
    /// The API is overloaded (529).
    Overloaded,
    /// Any other server error (5xx).
    ServerError,
    /// The API could not be reached, or the stream was cut before its `result`.
    Network,
    /// The step's `timeout` ended the call.
    Timeout,
    /// The call's `stall_timeout` ended it: its CLI reported no event for that long.
    Stalled,
    /// The call used up `max_turns`.
    MaxTurns,
    /// The call used up `max_budget_usd`.
    MaxBudget,
    /// The request was refused as malformed (400, 404, 413), or the prompt named an unknown
    /// slash command.
    InvalidRequest,
    /// Anything else: a crash, a kill by someone else, no `result` event and no clue why.
    Unknown,
}

impl ErrorKind {
    /// The kind's name in events, `${error.kind}` and the DLQ.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Authentication => "authentication",
            ErrorKind::Billing => "billing",
            ErrorKind::RateLimit => "rate_limit",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::ServerError => "server_error",
            ErrorKind::Network => "network",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Stalled => "stalled",
            ErrorKind::MaxTurns => "max_turns",
            ErrorKind::MaxBudget => "max_budget",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Unknown => "unknown",
        }
    }

    /// Whether `retry_config` retries this kind without being told to: authentication,
    /// billing and invalid-request failures do not go away by trying again, so they are
    /// retried only when `retry_on` names them.
    pub fn retried_by_default(self) -> bool {
        match self {
            ErrorKind::Authentication | ErrorKind::Billing | ErrorKind::InvalidRequest => false,
            ErrorKind::RateLimit
            | ErrorKind::Overloaded
            | ErrorKind::ServerError
            | ErrorKind::Network
            | ErrorKind::Timeout
            | ErrorKind::Stalled
            | ErrorKind::MaxTurns
            | ErrorKind::MaxBudget
            | ErrorKind::Unknown => true,
        }
    }

    /// What the user can do about it, for the failure line.
    pub fn advice(self) -> Option<&'static str> {
        match self {
            ErrorKind::Authentication => Some(
                "log in with `claude /login`, or set `ANTHROPIC_API_KEY`; as root, the CLI also needs `IS_SANDBOX=1`",
            ),
            ErrorKind::Billing => Some("add credit to the account, or use another API key"),
            ErrorKind::InvalidRequest => Some(
                "the request was refused as it stands: check the prompt's slash command, the model and the step's Claude settings",
            ),
            ErrorKind::MaxTurns => Some("raise the step's `max_turns`, or split the task"),
            ErrorKind::MaxBudget => Some("raise the step's `max_budget_usd`, or split the task"),
            ErrorKind::RateLimit | ErrorKind::Overloaded | ErrorKind::ServerError => Some(
                "usually temporary: `retry_config` with `retry_on: [overloaded, rate_limit, server_error]` retries it",
            ),
            ErrorKind::Network => Some("check the network and `ANTHROPIC_BASE_URL`"),
            ErrorKind::Timeout => Some("raise the step's `timeout`, or split the task"),
            ErrorKind::Stalled => Some(
                "the CLI went silent (often a hung API connection): `retry_config` retries it; raise `stall_timeout` if the work is slow but alive",
            ),
            ErrorKind::Unknown => None,
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Tokens a call used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation: u64,
}

impl Tokens {
    pub(crate) fn of(usage: Option<&Value>) -> Self {
        let n = |key: &str| {
            usage
                .and_then(|u| u.get(key))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Tokens {
            input: n("input_tokens"),
            output: n("output_tokens"),
            cache_read: n("cache_read_input_tokens"),
            cache_creation: n("cache_creation_input_tokens"),
        }
    }

    /// Adds OTHER.
    /// Adds OTHER (counts read from the CLI saturate rather than overflow).
    pub fn add(&mut self, other: Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_creation = self.cache_creation.saturating_add(other.cache_creation);
    }

    /// Every token, of every kind.
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_creation)
    }
}

/// Something worth showing as it happens.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// The session started.
    Started {
        /// Its id.
        session_id: String,
        /// The model.
        model: Option<String>,
    },
    /// Claude said something.
    Text(String),
    /// Claude called a tool.
    Tool {
        /// The tool.
        name: String,
        /// Its most telling argument (a command, a file), shortened.
        detail: String,
    },
    /// The CLI retries the API.
    ApiRetry {
        /// This retry.
        attempt: u64,
        /// Of how many.
        max: u64,
        /// The error's kind as the CLI names it, or its HTTP status.
        error: String,
        /// Before the next try.
        delay_ms: u64,
    },
}

impl Note {
    /// The note as one line for people.
    pub fn line(&self) -> String {
        match self {
            Note::Started { session_id, model } => match model {
                Some(model) => format!("claude session {session_id} ({model})"),
                None => format!("claude session {session_id}"),
            },
            Note::Text(text) => text.trim_end().to_owned(),
            Note::Tool { name, detail } if detail.is_empty() => format!("→ {name}"),
            Note::Tool { name, detail } => format!("→ {name}: {detail}"),
            Note::ApiRetry {
                attempt,
                max,
                error,
                delay_ms,
            } => format!(
                "API retry {attempt}/{max}: {error}, next in {}",
                humantime::format_duration(std::time::Duration::from_millis(
                    // Whole seconds past a second, milliseconds below.
                    if *delay_ms >= 1000 {
                        delay_ms / 1000 * 1000
                    } else {
                        *delay_ms
                    }
                ))
            ),
        }
    }
}

/// A finished call, as the runner reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// How it ended.
    pub verdict: Verdict,
    /// Its session.
    pub session_id: Option<String>,
    /// Turns taken.
    pub num_turns: u32,
    /// What it cost.
    pub cost_usd: f64,
    /// The cost is an estimate from the tokens the stream reported: the call ended
    /// without the `result` event that states it.
    pub cost_estimated: bool,
    /// Tokens used.
    pub tokens: Tokens,
    /// Tool calls made.
    pub tool_calls: u32,
    /// API retries the CLI made.
    pub api_retries: u32,
    /// Assistant messages the API answered.
    pub api_answers: u32,
    /// Its raw stream, on disk.
    pub log: Option<std::path::PathBuf>,
    /// The account's usage limit, when the call ended at it (set by the runner, which
    /// knows the wall clock).
    pub usage_limit: Option<crate::claude::limit::UsageLimit>,
    /// The run was stopping (Ctrl-C, the job stopping) and ended the call: it did not fail
    /// (set by the runner).
    pub cancelled: bool,
}

/// What several calls cost, for the end of a run, a job and an item.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Calls made.
    pub calls: u32,
    /// Of which failed.
    pub failed: u32,
    /// Turns taken.
    pub turns: u64,
    /// What they cost.
    pub cost_usd: f64,
    /// Of which calls whose cost is an estimate ([`Call::cost_estimated`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub estimated: u32,
    /// Tokens used.
    pub tokens: Tokens,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's `skip_serializing_if` passes the field by reference"
)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Totals {
    /// The totals of one call: FAILED or not, its TURNS, its cost (an ESTIMATED one or
    /// not) and TOKENS, as a call or its `claude_finished` event gives them.
    pub fn one_call(
        failed: bool,
        turns: u32,
        cost_usd: f64,
        estimated: bool,
        tokens: Tokens,
    ) -> Self {
        Totals {
            calls: 1,
            failed: u32::from(failed),
            turns: u64::from(turns),
            cost_usd,
            estimated: u32::from(estimated),
            tokens,
        }
    }

    /// Counts CALL.
    pub fn add(&mut self, call: &Call) {
        self.merge(&Totals::one_call(
            // A usage limit pauses the run, and a cancelled call is made again on resume:
            // neither failed.
            call.verdict.kind.is_some() && call.usage_limit.is_none() && !call.cancelled,
            call.num_turns,
            call.cost_usd,
            call.cost_estimated,
            call.tokens,
        ));
    }

    /// Adds OTHER (counts saturate rather than overflow).
    pub fn merge(&mut self, other: &Totals) {
        self.calls = self.calls.saturating_add(other.calls);
        self.failed = self.failed.saturating_add(other.failed);
        self.turns = self.turns.saturating_add(other.turns);
        self.cost_usd = usd(self.cost_usd + other.cost_usd);
        self.estimated = self.estimated.saturating_add(other.estimated);
        self.tokens.add(other.tokens);
    }

    /// One line for people: `3 Claude calls (1 failed), 12 turns, 45100 tokens, $0.0387`,
    /// and `(1 estimated)` after the cost when it holds estimates.
    pub fn line(&self) -> String {
        let failed = if self.failed > 0 {
            format!(" ({} failed)", self.failed)
        } else {
            String::new()
        };
        let estimated = if self.estimated > 0 {
            format!(" ({} estimated)", self.estimated)
        } else {
            String::new()
        };
        format!(
            "{}{failed}, {}, {} tokens, ${:.4}{estimated}",
            crate::text::count(self.calls, "Claude call"),
            crate::text::count(self.turns, "turn"),
            self.tokens.total(),
            self.cost_usd
        )
    }
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `None` for a success, else why it failed.
    pub kind: Option<ErrorKind>,
    /// The final text of a success; Claude's own message of a failure.
    pub message: String,
}

/// An amount in US dollars rounded to a hundred-millionth, so that it is written as the
/// decimal it stands for (`0.0081`, not the float noise `0.008100000000000001` that sums
/// and the CLI's own figures carry).
pub fn usd(amount: f64) -> f64 {
    if amount.is_finite() {
        (amount * 1e8).round() / 1e8
    } else {
        0.0
    }
}

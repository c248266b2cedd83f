//! A Claude call's settings: a `claude` step's own, and the workflow's defaults.

use super::{Key, PERMISSION_MODES, Shape, TEXTS_TY, Ty, key, required};

const CLAUDE_MODEL: Key = key(
    "model",
    Ty::Text,
    "Model of the call, such as `sonnet`, `opus` or a full model name (`--model`).",
);
const CLAUDE_MAX_TURNS: Key = key(
    "max_turns",
    Ty::Int { min: 1 },
    "Most agentic turns the call may take before it fails with `max_turns` (`--max-turns`).",
);
const CLAUDE_ALLOWED_TOOLS: Key = key(
    "allowed_tools",
    TEXTS_TY,
    "Tools the call may use without asking, such as `Read` or `Bash(git:*)` (`--allowedTools`).",
);
const CLAUDE_DISALLOWED_TOOLS: Key = key(
    "disallowed_tools",
    TEXTS_TY,
    "Tools the call may not use (`--disallowedTools`).",
);
const CLAUDE_APPEND_SYSTEM_PROMPT: Key = key(
    "append_system_prompt",
    Ty::Text,
    "Text appended to the system prompt (`--append-system-prompt`).",
);
const CLAUDE_PERMISSION_MODE: Key = key(
    "permission_mode",
    Ty::Enum(PERMISSION_MODES),
    "Permission mode of the call (`--permission-mode`), in place of skipping every permission check.",
);
const CLAUDE_MAX_BUDGET_USD: Key = key(
    "max_budget_usd",
    Ty::Number {
        min: 0.0,
        max: f64::MAX,
    },
    "Most the call may spend, in US dollars, above zero (`--max-budget-usd`).",
);
const CLAUDE_FALLBACK_MODEL: Key = key(
    "fallback_model",
    Ty::Text,
    "Model used when the main one is overloaded (`--fallback-model`).",
);
const CLAUDE_MCP_CONFIG: Key = key(
    "mcp_config",
    TEXTS_TY,
    "MCP server configurations: JSON files or strings, one or a list (`--mcp-config`).",
);
const CLAUDE_ADD_DIRS: Key = key(
    "add_dirs",
    TEXTS_TY,
    "More directories the call may read and edit, one or a list (`--add-dir`).",
);

const CLAUDE_MAX_COST_USD: Key = key(
    "max_cost_usd",
    Ty::Number {
        min: 0.0,
        max: f64::MAX,
    },
    "Most the whole run or job may spend on Claude calls, in US dollars, across resumes; no new call starts once it would be passed (`--max-cost-usd`).",
);
/// What `on_budget` may say.
const ON_BUDGET: &[&str] = &["finish", "stop"];
const CLAUDE_ON_BUDGET: Key = key(
    "on_budget",
    Ty::Enum(ON_BUDGET),
    "When `max_cost_usd` is reached: `finish` lets the running calls finish (the default), `stop` stops them (their items stay pending).",
);

/// The help for KEY written in a `claude` step when only the workflow's `claude:` defaults
/// take it: the budget is for the whole run, not one call.
pub(crate) fn workflow_only_help(key: &str) -> Option<String> {
    [CLAUDE_MAX_COST_USD.name, CLAUDE_ON_BUDGET.name]
        .contains(&key)
        .then(|| {
            format!(
                "`{key}` is for the whole run: set it in the workflow's top-level `claude:`; `max_budget_usd` caps one call"
            )
        })
}

const CLAUDE_STALL_TIMEOUT: Key = key(
    "stall_timeout",
    Ty::Duration,
    "Ends the call, as error kind `stalled`, when its CLI reports no event for this long (not a CLI option).",
);

const CLAUDE_ON_RETRY: Key = key(
    "on_retry",
    Ty::Enum(&["fresh", "continue"]),
    "A retried call: `fresh` starts a new session (the default), `continue` resumes the failed attempt's session (`--resume`), told why it failed, with its edits kept.",
);

/// A `claude` command with its settings.
pub static CLAUDE_STEP: Shape = Shape {
    name: "claude_call",
    doc: "A Claude command with the settings of its call; a field left out is the workflow's `claude:` default.",
    keys: &[
        required(
            "prompt",
            Ty::Template,
            "The prompt or slash command, such as `/fix ${item}`.",
        ),
        CLAUDE_MODEL,
        CLAUDE_MAX_TURNS,
        CLAUDE_ALLOWED_TOOLS,
        CLAUDE_DISALLOWED_TOOLS,
        CLAUDE_APPEND_SYSTEM_PROMPT,
        CLAUDE_PERMISSION_MODE,
        CLAUDE_MAX_BUDGET_USD,
        CLAUDE_FALLBACK_MODEL,
        CLAUDE_MCP_CONFIG,
        CLAUDE_ADD_DIRS,
        CLAUDE_STALL_TIMEOUT,
        CLAUDE_ON_RETRY,
    ],
};

/// The workflow's `claude:` defaults.
pub static CLAUDE_DEFAULTS: Shape = Shape {
    name: "claude_defaults",
    doc: "Settings of every Claude call of the workflow, unless a step sets its own.",
    keys: &[
        CLAUDE_MODEL,
        CLAUDE_MAX_TURNS,
        CLAUDE_ALLOWED_TOOLS,
        CLAUDE_DISALLOWED_TOOLS,
        CLAUDE_APPEND_SYSTEM_PROMPT,
        CLAUDE_PERMISSION_MODE,
        CLAUDE_MAX_BUDGET_USD,
        CLAUDE_FALLBACK_MODEL,
        CLAUDE_MCP_CONFIG,
        CLAUDE_ADD_DIRS,
        CLAUDE_MAX_COST_USD,
        CLAUDE_ON_BUDGET,
        CLAUDE_USAGE_LIMIT,
        CLAUDE_MAX_WAIT,
        CLAUDE_PATIENCE,
        CLAUDE_STALL_TIMEOUT,
        CLAUDE_ON_RETRY,
    ],
};

/// `usage_limit` and `max_wait`: what the run does when the account hits its usage limit;
/// run-wide, so only in the workflow's defaults.
const CLAUDE_USAGE_LIMIT: Key = key(
    "usage_limit",
    Ty::Enum(&["wait", "stop"]),
    "At the account's usage limit: `wait` (pause every Claude call until it resets, the default) or `stop` (checkpoint and exit, saying when to resume).",
);
const CLAUDE_MAX_WAIT: Key = key(
    "max_wait",
    Ty::Duration,
    "Longest pause for a usage limit (default `6h`); a later reset checkpoints and stops the run.",
);
const CLAUDE_PATIENCE: Key = key(
    "patience",
    Ty::Duration,
    "How long a call refused as rate limited or overloaded (429, 529) is made again, spaced by the run's shared back-off, before its failure counts against the step's attempts (default `0`: not at all).",
);

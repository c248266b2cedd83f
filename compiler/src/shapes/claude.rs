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
    ],
};

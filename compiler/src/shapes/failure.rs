//! `on_failure` in its mapping forms, and `retry_config` with its backoffs and matchers.

use super::{
    BACKOFF_KINDS, BACKOFF_TY, CLAUDE_TY, HANDLER_COMMANDS_TY, MATCHER_TY, RETRY_MATCHERS, Shape,
    Ty, deprecated, key, required,
};

/// `on_failure` as a mapping with `commands`.
pub static ON_FAILURE_DETAILED: Shape = Shape {
    name: "on_failure_detailed",
    doc: "An `on_failure` handler with a list of `commands`.",
    keys: &[
        key(
            "commands",
            HANDLER_COMMANDS_TY,
            "Handler commands run in order: strings (a leading `/` means Claude, else shell) or steps.",
        ),
        key(
            "strategy",
            Ty::Enum(&["recovery", "fallback", "cleanup", "custom"]),
            "Kind of handler, recorded in events: `recovery` (default), `fallback`, `cleanup` or `custom`; only a `fallback` that succeeds marks the step recovered (its output stands in for the command's); otherwise the step stays failed unless a later run of the command succeeds.",
        ),
        key("timeout", Ty::Duration, "Time limit for the handler."),
        key(
            "handler_failure_fatal",
            Ty::Bool,
            "A failing handler fails the workflow (default false).",
        ),
        key(
            "fail_workflow",
            Ty::Bool,
            "Fail the workflow when the command still fails after its last attempt (default false).",
        ),
        key(
            "capture",
            Ty::OneOf(&[Ty::Text, Ty::List(&Ty::Text), Ty::Map(&Ty::Text)]),
            "Variables that store the handler's combined output: a name, a list of names, or a mapping whose keys are the names.",
        ),
        key(
            "max_attempts",
            Ty::Int { min: 1 },
            "Runs of the command, counting the first; the handler runs after each failed run (default 1).",
        ),
        key(
            "max_retries",
            Ty::Int { min: 1 },
            "Alias of `max_attempts`.",
        ),
        key(
            "commit_required",
            Ty::Bool,
            "The handler must create a git commit (default false).",
        ),
    ],
};

/// `on_failure` as a mapping without `commands`.
pub static ON_FAILURE_ADVANCED: Shape = Shape {
    name: "on_failure_advanced",
    doc: "An `on_failure` handler of one `shell` command, one `claude` command, or both.",
    keys: &[
        key(
            "shell",
            Ty::Template,
            "Shell command run on failure, before `claude` when both are given.",
        ),
        key(
            "claude",
            CLAUDE_TY,
            "Claude command run on failure, or `{prompt, model, ...}` with the call's settings.",
        ),
        key(
            "fail_workflow",
            Ty::Bool,
            "Fail the workflow when the command still fails after its last attempt (default false).",
        ),
        key(
            "max_attempts",
            Ty::Int { min: 1 },
            "Runs of the command, counting the first; the handler runs after each failed run (default 1).",
        ),
        key(
            "max_retries",
            Ty::Int { min: 1 },
            "Alias of `max_attempts`.",
        ),
        key(
            "commit_required",
            Ty::Bool,
            "The handler must create a git commit (default false).",
        ),
        key("timeout", Ty::Duration, "Time limit for the handler."),
        deprecated(
            "retry_original",
            Ty::Bool,
            "Deprecated: `true` means `max_attempts` of at least 2.",
        ),
        key(
            "strategy",
            Ty::Enum(&["recovery", "fallback", "cleanup", "custom"]),
            "Kind of handler, recorded in events: `recovery` (default), `fallback`, `cleanup` or `custom`; only a `fallback` that succeeds marks the step recovered (its output stands in for the command's); otherwise the step stays failed unless a later run of the command succeeds.",
        ),
        key(
            "handler_failure_fatal",
            Ty::Bool,
            "A failing handler fails the workflow (default false).",
        ),
        key(
            "capture",
            Ty::OneOf(&[Ty::Text, Ty::List(&Ty::Text), Ty::Map(&Ty::Text)]),
            "Variables that store the handler's combined output: a name, a list of names, or a mapping whose keys are the names.",
        ),
    ],
};

/// A step's `retry_config`.
pub static RETRY_CONFIG: Shape = Shape {
    name: "retry_config",
    doc: "Retries of a failed command, with a delay between attempts.",
    keys: &[
        key(
            "attempts",
            Ty::Int { min: 1 },
            "Runs of the command, counting the first (default 3).",
        ),
        key("max_attempts", Ty::Int { min: 1 }, "Alias of `attempts`."),
        key(
            "backoff",
            BACKOFF_TY,
            "How the delay grows: `fixed`, `linear`, `exponential` (default, base 2), `fibonacci` or `custom`, with optional parameters.",
        ),
        key(
            "initial_delay",
            Ty::Delay,
            "Delay before the first retry (default 1s).",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay between attempts (default 30s).",
        ),
        key(
            "jitter",
            Ty::Bool,
            "Vary each delay at random by up to `jitter_factor` either way (default false).",
        ),
        key(
            "jitter_factor",
            Ty::Number { min: 0.0, max: 1.0 },
            "Fraction of the delay, from 0 to 1, by which `jitter` varies it (default 0.3).",
        ),
        key(
            "retry_on",
            Ty::OneOf(&[
                Ty::Enum(RETRY_MATCHERS),
                Ty::Object(&RETRY_ON_PATTERN),
                Ty::List(&MATCHER_TY),
            ]),
            "Retry only failures that match `network`, `timeout`, `server_error`, `rate_limit`, `overloaded`, `auth`, `stalled` or `{pattern: REGEX}`, or one of a list of them (default: every failure but a Claude call's authentication, billing or invalid request).",
        ),
        key(
            "retry_budget",
            Ty::Delay,
            "Total time for all attempts and delays; a retry that would cross it is not started.",
        ),
        key(
            "on_failure",
            Ty::OneOf(&[
                Ty::Enum(&["stop", "continue"]),
                Ty::Object(&RETRY_EXHAUSTED),
            ]),
            "What happens after the last failed attempt: `stop` (default), `continue`, or `{fallback: {command}}`.",
        ),
    ],
};

/// The parameters of the `fixed` backoff.
pub static BACKOFF_FIXED: Shape = Shape {
    name: "backoff_fixed",
    doc: "The parameters of the `fixed` backoff: the same delay before every retry.",
    keys: &[
        key(
            "delay",
            Ty::Delay,
            "Delay before every retry (default: `initial_delay`).",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay; set it here or beside `backoff`, not both.",
        ),
    ],
};

/// The parameters of the `linear` backoff.
pub static BACKOFF_LINEAR: Shape = Shape {
    name: "backoff_linear",
    doc: "The parameters of the `linear` backoff: a delay that grows by `increment` each retry.",
    keys: &[
        key(
            "initial",
            Ty::Delay,
            "Delay before the first retry (default: `initial_delay`).",
        ),
        key(
            "increment",
            Ty::Delay,
            "Added to the delay for each further retry (default: the first delay).",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay; set it here or beside `backoff`, not both.",
        ),
    ],
};

/// The parameters of the `exponential` backoff.
pub static BACKOFF_EXPONENTIAL: Shape = Shape {
    name: "backoff_exponential",
    doc: "The parameters of the `exponential` backoff: a delay multiplied by `base` each retry.",
    keys: &[
        key(
            "initial",
            Ty::Delay,
            "Delay before the first retry (default: `initial_delay`).",
        ),
        key(
            "base",
            Ty::Number {
                min: 1.0,
                max: f64::MAX,
            },
            "Factor by which each delay grows, at least 1 (default 2).",
        ),
        key(
            "multiplier",
            Ty::Number {
                min: 1.0,
                max: f64::MAX,
            },
            "Alias of `base`.",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay; set it here or beside `backoff`, not both.",
        ),
    ],
};

/// The parameters of the `fibonacci` backoff.
pub static BACKOFF_FIBONACCI: Shape = Shape {
    name: "backoff_fibonacci",
    doc: "The parameters of the `fibonacci` backoff: retry n waits `initial · fib(n)`.",
    keys: &[
        key(
            "initial",
            Ty::Delay,
            "Unit of the delays, the first delay (default: `initial_delay`).",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay; set it here or beside `backoff`, not both.",
        ),
    ],
};

/// The parameters of the `custom` backoff.
pub static BACKOFF_CUSTOM: Shape = Shape {
    name: "backoff_custom",
    doc: "The parameters of the `custom` backoff: the delays, one by one.",
    keys: &[
        key(
            "delays",
            Ty::List(&Ty::Delay),
            "Delay before each retry in turn; past the end of the list, `max_delay`.",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay; set it here or beside `backoff`, not both.",
        ),
    ],
};

/// A backoff written as `{NAME: {parameters}}` (for the schema; lowering reads the one key).
pub static BACKOFF_BY_NAME: Shape = Shape {
    name: "backoff_by_name",
    doc: "A backoff written as `{NAME: {parameters}}`, with exactly one key.",
    keys: &[
        key(
            "fixed",
            Ty::Object(&BACKOFF_FIXED),
            "The same delay before every retry.",
        ),
        key(
            "linear",
            Ty::Object(&BACKOFF_LINEAR),
            "A delay that grows by `increment` each retry.",
        ),
        key(
            "exponential",
            Ty::Object(&BACKOFF_EXPONENTIAL),
            "A delay multiplied by `base` each retry.",
        ),
        key(
            "fibonacci",
            Ty::Object(&BACKOFF_FIBONACCI),
            "Delays that follow the Fibonacci sequence.",
        ),
        key(
            "custom",
            Ty::Object(&BACKOFF_CUSTOM),
            "Delays listed one by one.",
        ),
    ],
};

/// A backoff written as `{type: NAME, parameters...}` (for the schema; lowering checks the
/// parameters against the shape of `type`).
pub static BACKOFF_TYPED: Shape = Shape {
    name: "backoff_typed",
    doc: "A backoff written as `{type: NAME, parameters...}`; each strategy takes only its own parameters.",
    keys: &[
        key(
            "type",
            Ty::Enum(BACKOFF_KINDS),
            "Strategy: `fixed`, `linear`, `exponential`, `fibonacci` or `custom`.",
        ),
        key(
            "initial",
            Ty::Delay,
            "Delay before the first retry (`linear`, `exponential`, `fibonacci`; default: `initial_delay`).",
        ),
        key(
            "increment",
            Ty::Delay,
            "Added to the delay for each further retry (`linear`; default: the first delay).",
        ),
        key(
            "base",
            Ty::Number {
                min: 1.0,
                max: f64::MAX,
            },
            "Factor by which each delay grows, at least 1 (`exponential`; default 2).",
        ),
        key(
            "multiplier",
            Ty::Number {
                min: 1.0,
                max: f64::MAX,
            },
            "Alias of `base` (`exponential`).",
        ),
        key(
            "delay",
            Ty::Delay,
            "Delay before every retry (`fixed`; default: `initial_delay`).",
        ),
        key(
            "delays",
            Ty::List(&Ty::Delay),
            "Delay before each retry in turn; past the end of the list, `max_delay` (`custom`).",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay; set it here or beside `backoff`, not both.",
        ),
    ],
};

/// A `retry_on` matcher written as `{pattern: REGEX}`.
pub static RETRY_ON_PATTERN: Shape = Shape {
    name: "retry_on_pattern",
    doc: "A `retry_on` matcher given as a regular expression.",
    keys: &[key(
        "pattern",
        Ty::Text,
        "Regular expression searched for in the failed command's stderr and stdout.",
    )],
};

/// The `{command}` of a `fallback`.
pub static FALLBACK: Shape = Shape {
    name: "fallback",
    doc: "The command of a `fallback`.",
    keys: &[required(
        "command",
        Ty::Template,
        "Command run after the last failed attempt; its result is the step's result.",
    )],
};

/// `retry_config.on_failure` as `{fallback: ...}`.
pub static RETRY_EXHAUSTED: Shape = Shape {
    name: "retry_exhausted",
    doc: "A `retry_config.on_failure` that runs a fallback command.",
    keys: &[required(
        "fallback",
        Ty::OneOf(&[Ty::Template, Ty::Object(&FALLBACK)]),
        "Command run after the last failed attempt, as a string or `{command}`; its result is the step's result.",
    )],
};

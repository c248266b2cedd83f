//! The MapReduce phases, `merge`, and the error policy.

use super::{
    BACKOFF_TY, CAPTURE_FORMATS, ERROR_COLLECTION_TY, ITEM_FAILURE_TY, PHASE_COMMANDS, Shape, Ty,
    key, required,
};

/// `setup` as a mapping.
pub static SETUP: Shape = Shape {
    name: "setup",
    doc: "The setup phase of a MapReduce workflow, with its time limit and captured outputs.",
    keys: &[
        key(
            "commands",
            Ty::Steps,
            "Steps run once before the map phase.",
        ),
        key(
            "timeout",
            Ty::Duration,
            "Time limit for the whole setup phase.",
        ),
        key(
            "capture_outputs",
            Ty::Map(&Ty::OneOf(&[
                Ty::Int { min: 0 },
                Ty::Object(&CAPTURE_OUTPUT),
            ])),
            "Variables for map, reduce and merge, from setup commands' output: `NAME: INDEX` or `NAME: {command_index, ...}`.",
        ),
    ],
};

/// One `capture_outputs` entry written as a mapping.
pub static CAPTURE_OUTPUT: Shape = Shape {
    name: "capture_output",
    doc: "One variable captured from a setup command's output.",
    keys: &[
        required(
            "command_index",
            Ty::Int { min: 0 },
            "Index, from 0, of the setup command whose output is captured.",
        ),
        key(
            "format",
            Ty::Enum(CAPTURE_FORMATS),
            "Type of the value: `string` (default), `number`, `json`, `lines` or `boolean`.",
        ),
        key(
            "source",
            Ty::Enum(&["stdout", "stderr", "both", "combined"]),
            "Output read: `stdout` (default), `stderr`, `both` or `combined`.",
        ),
        key(
            "pattern",
            Ty::Text,
            "Regular expression; its first capture group, or else the whole match, is the value.",
        ),
        key(
            "json_path",
            Ty::Text,
            "Path into the output read as JSON, such as `a.b[0]`.",
        ),
        key(
            "max_size",
            Ty::Int { min: 1 },
            "Most bytes kept, cut at a line boundary (default 1048576).",
        ),
        key(
            "default",
            Ty::Text,
            "Value used when `pattern` or `json_path` finds nothing.",
        ),
        key(
            "multiline",
            Ty::Enum(&["preserve", "join", "first_line", "last_line", "array"]),
            "How a multi-line output is kept: `preserve` (default), `join`, `first_line`, `last_line` or `array`.",
        ),
    ],
};

/// The `map` phase.
pub static MAP: Shape = Shape {
    name: "map",
    doc: "The map phase of a MapReduce workflow: the items, and the steps each item runs.",
    keys: &[
        required(
            "input",
            Ty::Template,
            "JSON file with the items, or a command whose output lists them.",
        ),
        key(
            "json_path",
            Ty::Text,
            "JSON path that selects the items in the input, such as `$.items[*]`.",
        ),
        key(
            "filter",
            Ty::Expression,
            "Condition an item must meet to be processed.",
        ),
        key(
            "sort_by",
            Ty::Text,
            "Sort keys, such as `priority DESC, name`.",
        ),
        key("max_items", Ty::Int { min: 0 }, "Most items to process."),
        key(
            "offset",
            Ty::Int { min: 0 },
            "Items to skip, after sorting and `distinct`.",
        ),
        key(
            "distinct",
            Ty::Text,
            "Path, such as `item.file`: only the first item with each value is kept.",
        ),
        key(
            "max_parallel",
            Ty::OneOf(&[Ty::Int { min: 1 }, Ty::Template]),
            "Agents run at once: a number or a `${VAR}` template (default 10).",
        ),
        key(
            "agent_timeout_secs",
            Ty::Duration,
            "Time limit for each agent.",
        ),
        key(
            "timeout_config",
            Ty::Object(&TIMEOUT_CONFIG),
            "Detailed time limits for agents and commands.",
        ),
        required(
            "agent_template",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&PHASE_COMMANDS)]),
            "Steps each item runs, as one agent, with `${item}` set.",
        ),
    ],
};

/// `map.timeout_config`.
pub static TIMEOUT_CONFIG: Shape = Shape {
    name: "timeout_config",
    doc: "Time limits of map agents.",
    keys: &[
        key(
            "agent_timeout_secs",
            Ty::Duration,
            "Time limit for each agent; takes the place of `map.agent_timeout_secs`.",
        ),
        key(
            "command_timeouts",
            Ty::Map(&Ty::Duration),
            "Time limits by command name.",
        ),
        key(
            "timeout_policy",
            Ty::OneOf(&[
                Ty::Enum(&["PerAgent", "PerCommand", "Hybrid"]),
                Ty::Enum(&["per_agent", "per_command", "hybrid"]),
            ]),
            "What the limits apply to: `PerAgent` (default), `PerCommand` or `Hybrid`.",
        ),
        key(
            "cleanup_grace_period_secs",
            Ty::Duration,
            "Time a timed-out agent gets to clean up (default 30s).",
        ),
        key(
            "timeout_action",
            Ty::OneOf(&[
                Ty::Enum(&["Dlq", "Skip", "Fail", "GracefulTerminate"]),
                Ty::Enum(&["dlq", "skip", "fail", "graceful_terminate"]),
            ]),
            "What happens to a timed-out item: `Dlq` (default), `Skip`, `Fail` or `GracefulTerminate`.",
        ),
        key(
            "enable_monitoring",
            Ty::Bool,
            "Watch agents' run times (default true).",
        ),
    ],
};

/// `merge` as a mapping.
pub static MERGE: Shape = Shape {
    name: "merge",
    doc: "The merge phase, with its time limit.",
    keys: &[
        key(
            "commands",
            Ty::Steps,
            "Steps run when the session worktree is merged back, with `${merge.*}` set.",
        ),
        key(
            "timeout",
            Ty::Duration,
            "Time limit for the whole merge phase.",
        ),
        key(
            "on_conflict",
            Ty::Steps,
            "Steps that resolve a merge that conflicts (a map agent's work, or the session merged back without `commands`), run in a worktree holding the conflicted merge with `${merge.*}` and `${merge.conflicted_files}` set; without them a conflict goes to the DLQ (or fails the merge back).",
        ),
        key(
            "verify",
            Ty::Steps,
            "Steps that test each candidate of the map agents' merge queue (the merged work with one or more agents' commits on top), run in a scratch worktree holding it with `${merge.*}` set; the merged work moves only to a candidate they pass.",
        ),
        key(
            "batch",
            Ty::Int { min: 1 },
            "How many queued candidates `verify` tests at once, stacked in queue order; a failed batch is bisected to find the failing ones (default 1).",
        ),
        key(
            "redispatch",
            Ty::Int { min: 0 },
            "How many times an agent whose work failed `verify`, conflicted, touched a protected path or weakened the tests (`integrity: fail`) runs its item again on the current merged work, with `${verify.output}`, `${verify.reason}` and `${verify.attempt}` (default 0: the item goes to the DLQ).",
        ),
        key(
            "protect",
            Ty::List(&Ty::Text),
            "Globs of paths no map agent may change (a test runner, CI configuration, lockfiles); an agent's work that touches one is refused before verification.",
        ),
        key(
            "integrity",
            Ty::Enum(&["off", "warn", "fail"]),
            "The test-integrity verdict of each agent's work (tests deleted, skipped or with assertions removed, expected output rewritten, CI changed): `warn` records it (the default), `fail` refuses work whose verdict is `fail` (and sends it back with `merge.redispatch`), `off` skips it.",
        ),
    ],
};

/// `error_policy`.
pub static ERROR_POLICY: Shape = Shape {
    name: "error_policy",
    doc: "What a MapReduce job does when map items fail.",
    keys: &[
        key(
            "on_item_failure",
            ITEM_FAILURE_TY,
            "What happens to a failed item: `dlq` (default), `retry`, `skip`, `stop` or `custom:HANDLER`.",
        ),
        key(
            "continue_on_failure",
            Ty::Bool,
            "Whether the map phase goes on after an item fails (default true).",
        ),
        key(
            "max_failures",
            Ty::Int { min: 1 },
            "Number of failed items at which the job stops.",
        ),
        key(
            "failure_threshold",
            Ty::Number { min: 0.0, max: 1.0 },
            "Failure rate, from 0 to 1, above which the job stops once 10 items have finished.",
        ),
        key(
            "error_collection",
            ERROR_COLLECTION_TY,
            "How item errors are reported: `aggregate` (default), `immediate`, `batched:N` or `{batched: {size: N}}`.",
        ),
        key(
            "circuit_breaker",
            Ty::Object(&CIRCUIT_BREAKER),
            "Stops starting agents after repeated failures, and probes before closing again.",
        ),
        key(
            "retry_config",
            Ty::Object(&POLICY_RETRY),
            "Runs a failed item again before `on_item_failure` decides its fate (`dlq`, the default, or `retry`, `skip`, `stop`, `custom:NAME`): with `max_attempts: 3` an item runs up to three times, then goes to the DLQ.",
        ),
    ],
};

/// `{size}` of the `batched` error collection.
pub static BATCHED: Shape = Shape {
    name: "batched",
    doc: "The parameters of `batched` error collection.",
    keys: &[required(
        "size",
        Ty::Int { min: 1 },
        "Errors per report, at least 1.",
    )],
};

/// `error_policy.circuit_breaker`.
pub static CIRCUIT_BREAKER: Shape = Shape {
    name: "circuit_breaker",
    doc: "A circuit breaker over map agents: open after repeated failures, probing before it closes.",
    keys: &[
        key(
            "failure_threshold",
            Ty::Int { min: 1 },
            "Consecutive failures that open the breaker (default 5).",
        ),
        key(
            "success_threshold",
            Ty::Int { min: 1 },
            "Successful probes that close it again (default 3).",
        ),
        key(
            "timeout",
            Ty::Delay,
            "Time the breaker stays open before probing (default 30s).",
        ),
        key(
            "half_open_requests",
            Ty::Int { min: 1 },
            "Probe agents admitted while it is half-open (default 3).",
        ),
    ],
};

/// `error_policy.retry_config`.
pub static POLICY_RETRY: Shape = Shape {
    name: "policy_retry",
    doc: "Retries of failed map items.",
    keys: &[
        key(
            "max_attempts",
            Ty::Int { min: 1 },
            "Runs of an item, counting the first (default 3).",
        ),
        key(
            "backoff",
            BACKOFF_TY,
            "How the delay grows: `fixed`, `linear`, `exponential` (default, base 2), `fibonacci` or `custom`, with optional parameters.",
        ),
        key(
            "max_delay",
            Ty::Delay,
            "Longest delay between attempts (default: none).",
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
    ],
};

/// `on_item_failure` written as `{custom: NAME}` (for the schema; lowering reads the one key).
pub static ITEM_FAILURE_CUSTOM: Shape = Shape {
    name: "item_failure_custom",
    doc: "An `on_item_failure` that runs a named handler, written as `{custom: NAME}`.",
    keys: &[key(
        "custom",
        Ty::Text,
        "Name of the handler under `handlers` to run for each failed item.",
    )],
};

/// `error_collection` written as `{batched: ...}` (for the schema; lowering reads the one key).
pub static ERROR_COLLECTION_BATCHED: Shape = Shape {
    name: "error_collection_batched",
    doc: "An `error_collection` that reports errors in batches, written as `{batched: ...}`.",
    keys: &[key(
        "batched",
        Ty::OneOf(&[Ty::Int { min: 1 }, Ty::Object(&BATCHED)]),
        "Errors per report: a number, or `{size: N}`.",
    )],
};

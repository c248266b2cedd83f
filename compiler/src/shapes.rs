//! The shapes of the workflow format: every mapping's keys, with a type and a line of
//! documentation each.
//!
//! One table serves three readers: lowering checks keys against it (an unknown key is
//! V001), `prodigy schema` turns it into a JSON Schema, and `prodigy lsp` shows its
//! documentation on hover and offers its keys on completion.
//! Lowering still decides what each value means; these tables say what may be written.

/// The type of a value, as precise as a JSON Schema can say it.
#[derive(Debug)]
pub enum Ty {
    /// A string; numbers and booleans are accepted as their text.
    Text,
    /// A string in the `${...}` template language.
    Template,
    /// A string in the filter / `when` language.
    Expression,
    /// `true` or `false`.
    Bool,
    /// A whole number of at least `min`.
    Int {
        /// The smallest value.
        min: i64,
    },
    /// A number in `min..=max`.
    Number {
        /// The smallest value.
        min: f64,
        /// The largest value.
        max: f64,
    },
    /// A duration: `30s`, `1m 30s`, `500ms`, a number of seconds, or `{secs, nanos}`.
    Duration,
    /// A delay, read the humantime way: `500ms`, `30s`, `1m 30s`, `0` or `{secs, nanos}`;
    /// a bare number other than 0 has no unit and is an error.
    Delay,
    /// One of these words.
    Enum(&'static [&'static str]),
    /// A list of values of one type.
    List(&'static Ty),
    /// A mapping with the keys of a shape.
    Object(&'static Shape),
    /// A mapping from any key to values of one type.
    Map(&'static Ty),
    /// One of several forms.
    OneOf(&'static [Ty]),
    /// One step.
    Step,
    /// A list of steps.
    Steps,
    /// Anything (kept as JSON).
    Any,
}

/// A key of a mapping.
#[derive(Debug)]
pub struct Key {
    /// The key as written.
    pub name: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
    /// What its value may be.
    pub ty: Ty,
}

/// A kind of mapping.
#[derive(Debug)]
pub struct Shape {
    /// A short name, used for schema definitions (`step`, `retry_config`).
    pub name: &'static str,
    /// What the mapping is, in one line.
    pub doc: &'static str,
    /// Its keys.
    pub keys: &'static [Key],
}

impl Shape {
    /// The key names, for lowering's unknown-key check.
    pub fn names(&self) -> Vec<&'static str> {
        self.keys.iter().map(|k| k.name).collect()
    }

    /// The key with a name.
    pub fn key(&self, name: &str) -> Option<&'static Key> {
        self.keys.iter().find(|k| k.name == name)
    }
}

/// A key, in the tables below.
const fn key(name: &'static str, ty: Ty, doc: &'static str) -> Key {
    Key { name, doc, ty }
}

// Forms shared by several keys.

/// A string or a list of strings.
const TEXTS_TY: Ty = Ty::OneOf(&[Ty::Text, Ty::List(&Ty::Text)]);
/// A template or a list of templates.
const TEMPLATES_TY: Ty = Ty::OneOf(&[Ty::Template, Ty::List(&Ty::Template)]);
/// One step or a list of steps (`on_success`, `on_exit_code` targets).
const STEP_OR_STEPS_TY: Ty = Ty::OneOf(&[Ty::Step, Ty::Steps]);
/// A handler command: a string (a leading `/` means Claude, else shell) or a step.
const HANDLER_COMMAND_TY: Ty = Ty::OneOf(&[Ty::Template, Ty::Step]);
/// A list of handler commands.
const HANDLER_COMMANDS_TY: Ty = Ty::List(&HANDLER_COMMAND_TY);
/// An `env` value: a scalar template, or the dynamic, conditional and masked forms.
const ENV_VALUE_TY: Ty = Ty::OneOf(&[
    Ty::Template,
    Ty::Object(&ENV_DYNAMIC),
    Ty::Object(&ENV_CONDITIONAL),
    Ty::Object(&ENV_MASKED),
]);
/// `on_failure` in its five written forms.
const ON_FAILURE_TY: Ty = Ty::OneOf(&[
    Ty::Bool,
    Ty::Template,
    Ty::List(&HANDLER_COMMAND_TY),
    Ty::Object(&ON_FAILURE_ADVANCED),
    Ty::Object(&ON_FAILURE_DETAILED),
]);
/// The backoff strategies, by name.
/// The backoff strategies by name.
pub(crate) const BACKOFF_KINDS: &[&str] =
    &["fixed", "linear", "exponential", "fibonacci", "custom"];
/// A backoff: a name, `{NAME: {parameters}}` or `{type: NAME, parameters...}`.
const BACKOFF_TY: Ty = Ty::OneOf(&[
    Ty::Enum(BACKOFF_KINDS),
    Ty::Object(&BACKOFF_BY_NAME),
    Ty::Object(&BACKOFF_TYPED),
]);
/// A `claude` command: the prompt, or `{prompt, model, ...}`.
const CLAUDE_TY: Ty = Ty::OneOf(&[Ty::Template, Ty::Object(&CLAUDE_STEP)]);
/// The permission modes of the Claude Code CLI.
const PERMISSION_MODES: &[&str] = crate::ast::PERMISSION_MODES;
/// The named `retry_on` matchers.
const RETRY_MATCHERS: &[&str] = &[
    "network",
    "timeout",
    "server_error",
    "rate_limit",
    "overloaded",
    "auth",
];
/// One `retry_on` matcher.
const MATCHER_TY: Ty = Ty::OneOf(&[Ty::Enum(RETRY_MATCHERS), Ty::Object(&RETRY_ON_PATTERN)]);
/// The capture formats.
const CAPTURE_FORMATS: &[&str] = &["string", "number", "json", "lines", "boolean"];
/// `parallel` of `foreach`: a number, or `true` for 10.
const PARALLEL_TY: Ty = Ty::OneOf(&[Ty::Bool, Ty::Int { min: 1 }]);
/// `on_item_failure`: a word, `custom:NAME`, or `{custom: NAME}`.
const ITEM_FAILURE_TY: Ty = Ty::OneOf(&[
    Ty::Enum(&["dlq", "retry", "skip", "stop"]),
    Ty::Text,
    Ty::Object(&ITEM_FAILURE_CUSTOM),
]);
/// `error_collection`: a word, `batched:N`, or `{batched: N | {size: N}}`.
const ERROR_COLLECTION_TY: Ty = Ty::OneOf(&[
    Ty::Enum(&["aggregate", "immediate"]),
    Ty::Text,
    Ty::Object(&ERROR_COLLECTION_BATCHED),
]);

// The workflow.

/// A workflow written as a mapping.
pub static WORKFLOW: Shape = Shape {
    name: "workflow",
    doc: "A workflow: its steps, or for `mode: mapreduce` its setup, map and reduce phases.",
    keys: &[
        key(
            "name",
            Ty::Text,
            "Name of the workflow, shown in logs, events and the graph.",
        ),
        key(
            "description",
            Ty::Text,
            "What the workflow does, for its readers.",
        ),
        key(
            "mode",
            Ty::Enum(&["standard", "mapreduce"]),
            "Kind of workflow: `standard` (default) runs `commands`; `mapreduce` runs `setup`, `map` and `reduce`.",
        ),
        key(
            "commands",
            Ty::Steps,
            "Steps of a standard workflow, run in order.",
        ),
        key("steps", Ty::Steps, "Alias of `commands`."),
        key(
            "env",
            Ty::Map(&ENV_VALUE_TY),
            "Environment variables of every step: strings, numbers or booleans (templates), or masked, dynamic or conditional values.",
        ),
        key(
            "secrets",
            Ty::Map(&Ty::OneOf(&[Ty::Text, Ty::Object(&SECRET_PROVIDER)])),
            "Secrets by name: the process variable to read (`NAME` or `${env:NAME}`) or `{provider, key}`; their values are masked as `***`.",
        ),
        key(
            "env_files",
            TEMPLATES_TY,
            "Files of `KEY=VALUE` lines, loaded before `env`: a path or a list of paths.",
        ),
        key(
            "claude",
            Ty::Object(&CLAUDE_DEFAULTS),
            "Defaults of every Claude call (`model`, `max_turns`, ...); a step's own settings override them field by field.",
        ),
        key(
            "profiles",
            Ty::Map(&Ty::Map(&Ty::Template)),
            "Named sets of environment variables (with an optional `description`), chosen with `prodigy run --profile NAME`.",
        ),
        key(
            "handlers",
            Ty::Map(&Ty::Steps),
            "Named lists of steps; `on_item_failure: custom:NAME` runs one for each failed map item.",
        ),
        key(
            "merge",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&MERGE)]),
            "Steps run when the session worktree is merged back: a list, or `{commands, timeout}`.",
        ),
        key(
            "error_policy",
            Ty::Object(&ERROR_POLICY),
            "What a MapReduce job does when map items fail.",
        ),
        key(
            "setup",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&SETUP)]),
            "Steps run once before the map phase (MapReduce only): a list, or `{commands, timeout, capture_outputs}`.",
        ),
        key(
            "map",
            Ty::Object(&MAP),
            "The map phase (MapReduce only): the input items and the steps each item runs.",
        ),
        key(
            "reduce",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&PHASE_COMMANDS)]),
            "Steps run once after the map phase (MapReduce only), with `${map.*}` set.",
        ),
        key(
            "on_item_failure",
            ITEM_FAILURE_TY,
            "What happens to a failed map item: `dlq` (default), `retry`, `skip`, `stop` or `custom:HANDLER`; shorthand for `error_policy.on_item_failure`.",
        ),
        key(
            "continue_on_failure",
            Ty::Bool,
            "Whether the map phase goes on after an item fails (default true); shorthand for `error_policy.continue_on_failure`.",
        ),
        key(
            "max_failures",
            Ty::Int { min: 1 },
            "Number of failed items at which the job stops; shorthand for `error_policy.max_failures`.",
        ),
        key(
            "failure_threshold",
            Ty::Number { min: 0.0, max: 1.0 },
            "Failure rate, from 0 to 1, above which the job stops once 10 items have finished; shorthand for `error_policy.failure_threshold`.",
        ),
        key(
            "error_collection",
            ERROR_COLLECTION_TY,
            "How item errors are reported: `aggregate` (default), `immediate`, `batched:N` or `{batched: {size: N}}`; shorthand for `error_policy.error_collection`.",
        ),
        key(
            "slurm",
            Ty::Object(&SLURM),
            "The `sbatch` options of the map agents when they run on Slurm (`prodigy run --executor slurm`).",
        ),
    ],
};

/// `slurm`.
pub static SLURM: Shape = Shape {
    name: "slurm",
    doc: "The `sbatch` options of the map agents under `--executor slurm`.",
    keys: &[
        key(
            "partition",
            Ty::Text,
            "The Slurm partition the agents run in (`--partition`).",
        ),
        key(
            "account",
            Ty::Text,
            "The Slurm account charged for the agents (`--account`).",
        ),
        key(
            "time",
            Ty::Text,
            "Slurm's time limit for each agent's task (`--time`): `MIN`, `H:MIN:SEC` or `D-H:MIN:SEC`.",
        ),
        key(
            "cpus_per_task",
            Ty::Int { min: 1 },
            "CPUs for each agent's task (`--cpus-per-task`).",
        ),
        key(
            "mem",
            Ty::Text,
            "Memory for each agent's task (`--mem`): megabytes, or a number with `K`, `M`, `G` or `T`.",
        ),
        key(
            "sbatch_args",
            Ty::List(&Ty::Text),
            "More `sbatch` options, passed as they are (`[\"--qos=long\", \"--constraint=avx2\"]`).",
        ),
    ],
};

// Steps (`lower/step.rs`).

/// A step.
pub static STEP: Shape = Shape {
    name: "step_mapping",
    doc: "A step: exactly one command (`shell`, `claude`, `write_file`, `foreach` or the deprecated `test`) and how it runs.",
    keys: &[
        key(
            "shell",
            Ty::Template,
            "Shell command, run with `sh -c` in its own process group.",
        ),
        key(
            "claude",
            CLAUDE_TY,
            "Claude command, such as `/fix ${item}`, run with the Claude Code CLI; or `{prompt, model, max_turns, ...}` with the call's settings.",
        ),
        key(
            "write_file",
            Ty::Object(&WRITE_FILE),
            "Writes a file: `path`, `content`, `format`, `mode`, `create_dirs`.",
        ),
        key(
            "foreach",
            Ty::OneOf(&[Ty::Template, Ty::List(&Ty::Template), Ty::Object(&FOREACH)]),
            "Runs `do` for each item: a command whose non-blank output lines are the items, a list of items, or the nested form.",
        ),
        key(
            "test",
            Ty::Object(&TEST),
            "Deprecated: a shell `command` with an `on_failure` handler; write `shell:` with `on_failure:` instead.",
        ),
        key("command", Ty::Template, "Deprecated spelling of `claude`."),
        key(
            "analyze",
            Ty::Any,
            "Removed in Prodigy 0.3: run an analysis tool with `shell:` instead.",
        ),
        key(
            "goal_seek",
            Ty::Any,
            "Removed: use `validate:` with `on_incomplete:`, which loop until a threshold is met.",
        ),
        key(
            "id",
            Ty::Text,
            "Unique name of the step; its `outputs` are read as `${ID.NAME}`.",
        ),
        key(
            "name",
            Ty::Text,
            "Display name of the step; on a step without a command, the legacy form that runs the Claude command `/NAME`.",
        ),
        key(
            "description",
            Ty::Text,
            "What the step does, shown by `graph` and in logs.",
        ),
        key(
            "timeout",
            Ty::Duration,
            "Time limit for the command, after which its process group is killed.",
        ),
        key(
            "working_dir",
            Ty::Template,
            "Directory the command runs in.",
        ),
        key(
            "env",
            Ty::Map(&ENV_VALUE_TY),
            "Environment variables of this step only, over the workflow's.",
        ),
        key(
            "clear_env",
            Ty::Bool,
            "Start from an empty environment plus the step's `env` and `PATH` (default false).",
        ),
        key(
            "temporary",
            Ty::Bool,
            "Accepted for compatibility: a step's `env` never outlives the step, so `false` has no effect.",
        ),
        key(
            "when",
            Ty::Expression,
            "Condition; when it is false the step is skipped.",
        ),
        key(
            "capture",
            Ty::Text,
            "Variable that stores the output as `${NAME}`, with `${NAME.exit_code}`, `${NAME.success}`, `${NAME.stderr}` and `${NAME.duration}`.",
        ),
        key(
            "capture_format",
            Ty::Enum(CAPTURE_FORMATS),
            "How `capture` reads the output: `string` (default), `number`, `json`, `lines` or `boolean`.",
        ),
        key(
            "capture_streams",
            Ty::OneOf(&[
                Ty::Enum(&["stdout", "stderr", "both"]),
                Ty::Object(&CAPTURE_STREAMS),
            ]),
            "What `capture` records: `stdout` (default), `stderr`, `both`, or a mapping of parts to booleans.",
        ),
        key(
            "capture_output",
            Ty::OneOf(&[Ty::Bool, Ty::Text]),
            "Legacy capture: `true` stores stdout as `${shell.output}` or `${claude.output}`, a string stores it under that name.",
        ),
        key(
            "output_file",
            Ty::Template,
            "File that also receives the command's stdout.",
        ),
        key("output", Ty::Template, "Alias of `output_file`."),
        key(
            "on_success",
            STEP_OR_STEPS_TY,
            "Step or steps run after the command succeeds.",
        ),
        key(
            "on_failure",
            ON_FAILURE_TY,
            "What a failure does: `true` ignores it, `false` fails the workflow; a command, a list of commands or a mapping is a handler.",
        ),
        key(
            "on_exit_code",
            Ty::Map(&STEP_OR_STEPS_TY),
            "Step or steps run for an exit code, keyed by the code (0 to 255).",
        ),
        key(
            "retry_config",
            Ty::Object(&RETRY_CONFIG),
            "Retries of the failed command, with a delay between attempts.",
        ),
        key(
            "retry",
            Ty::Object(&RETRY_CONFIG),
            "Alias of `retry_config`.",
        ),
        key(
            "commit_required",
            Ty::Bool,
            "The command must create a git commit, else the step fails (default false).",
        ),
        key(
            "auto_commit",
            Ty::Bool,
            "Commit the changes the step leaves behind (default false).",
        ),
        key(
            "commit_config",
            Ty::Object(&COMMIT_CONFIG),
            "How `auto_commit` writes its commits.",
        ),
        key(
            "validate",
            Ty::OneOf(&[HANDLER_COMMANDS_TY, Ty::Object(&VALIDATE)]),
            "Checks that the step's work is complete, with `on_incomplete` steps that complete it: a list of commands or a mapping.",
        ),
        key(
            "step_validate",
            Ty::OneOf(&[
                Ty::Template,
                Ty::List(&Ty::Template),
                Ty::Object(&STEP_VALIDATE),
            ]),
            "Checks run after the command succeeds, failing the step when they fail: a command, a list of commands or a mapping.",
        ),
        key(
            "skip_validation",
            Ty::Bool,
            "Skip `step_validate` (default false).",
        ),
        key(
            "validation_timeout",
            Ty::Duration,
            "Time limit for `step_validate`.",
        ),
        key(
            "ignore_validation_failure",
            Ty::Bool,
            "A failed `step_validate` does not fail the step (default false).",
        ),
        key(
            "outputs",
            Ty::Map(&Ty::Object(&OUTPUT)),
            "Named file globs; after the step, `${ID.NAME}` lists the files its commits touched that match (needs `id`).",
        ),
        key(
            "allow_failure",
            Ty::Bool,
            "Same as `on_failure: true` when true (default false).",
        ),
        key(
            "continue_on_error",
            Ty::Bool,
            "Same as `on_failure: true` when true; in a handler's command list, go on to the next command after this one fails.",
        ),
        key(
            "max_attempts",
            Ty::Int { min: 1 },
            "Runs of the command when it has an `on_failure` handler, counting the first (default 1); same as `on_failure.max_attempts`.",
        ),
        key(
            "fail_workflow",
            Ty::Bool,
            "Whether a failure the `on_failure` handler leaves fails the workflow (default false); `false` on a step without a handler goes on after a failure.",
        ),
        key(
            "args",
            TEXTS_TY,
            "Arguments appended to the command of the legacy `name:` form.",
        ),
        key(
            "options",
            Ty::Map(&Ty::Any),
            "Options appended to the command of the legacy `name:` form as `--NAME VALUE` (`true` adds `--NAME`, `false` or empty nothing).",
        ),
        key(
            "metadata",
            Ty::Object(&METADATA),
            "Legacy settings, mapped onto the step's `on_failure`, `retry_config`, `timeout`, `env` and `commit_required`.",
        ),
        key(
            "analysis",
            Ty::Any,
            "Has no effect: analysis caching was removed in Prodigy 0.3.",
        ),
        key(
            "do",
            Ty::Steps,
            "Steps run for each item of a `foreach` written beside its items.",
        ),
        key(
            "parallel",
            PARALLEL_TY,
            "Items of a `foreach` run at once: a number, or `true` for 10 (default 1).",
        ),
        key(
            "max_items",
            Ty::Int { min: 1 },
            "Most items a `foreach` runs.",
        ),
    ],
};

/// The deprecated `{commands: [...]}` form of `reduce` and `agent_template` (`phase_steps`).
pub static PHASE_COMMANDS: Shape = Shape {
    name: "phase_commands",
    doc: "The deprecated `{commands: [...]}` form of a phase's steps.",
    keys: &[key(
        "commands",
        Ty::Steps,
        "Steps of the phase; deprecated, list them directly under the phase.",
    )],
};

/// The deprecated `test:` command.
pub static TEST: Shape = Shape {
    name: "test",
    doc: "The deprecated `test` command: a shell command with a failure handler.",
    keys: &[
        key("command", Ty::Template, "Shell command to run."),
        key(
            "on_failure",
            ON_FAILURE_TY,
            "Handler run after each failed attempt; its `max_attempts` defaults to 3 here.",
        ),
    ],
};

/// A step's legacy `metadata` block.
pub static METADATA: Shape = Shape {
    name: "metadata",
    doc: "Legacy step settings, each mapped onto the step's own field.",
    keys: &[
        key(
            "continue_on_error",
            Ty::Bool,
            "Same as `on_failure: true` when true.",
        ),
        key(
            "retries",
            Ty::Int { min: 0 },
            "Retries after the first run: `retry_config.attempts` becomes retries + 1.",
        ),
        key("timeout", Ty::Duration, "Same as the step's `timeout`."),
        key(
            "env",
            Ty::Map(&ENV_VALUE_TY),
            "Added to the step's `env`; a variable set in both is an error.",
        ),
        key(
            "commit_required",
            Ty::Bool,
            "Same as the step's `commit_required: true` when true.",
        ),
        key(
            "analysis",
            Ty::Any,
            "Has no effect: analysis caching was removed in Prodigy 0.3.",
        ),
    ],
};

/// `capture_streams` as a mapping.
pub static CAPTURE_STREAMS: Shape = Shape {
    name: "capture_streams",
    doc: "Which parts of the command's result `capture` records.",
    keys: &[
        key(
            "stdout",
            Ty::Bool,
            "Store stdout as `${NAME}` (default true).",
        ),
        key(
            "stderr",
            Ty::Bool,
            "Store stderr as `${NAME.stderr}` (default false).",
        ),
        key(
            "exit_code",
            Ty::Bool,
            "Store the exit code as `${NAME.exit_code}` (default true).",
        ),
        key(
            "success",
            Ty::Bool,
            "Store whether the command succeeded as `${NAME.success}` (default true).",
        ),
        key(
            "duration",
            Ty::Bool,
            "Store the run time in seconds as `${NAME.duration}` (default true).",
        ),
    ],
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
        key(
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
            "Retry only failures that match `network`, `timeout`, `server_error`, `rate_limit`, `overloaded`, `auth` or `{pattern: REGEX}`, or one of a list of them (default: every failure but a Claude call's authentication, billing or invalid request).",
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
    keys: &[key(
        "command",
        Ty::Template,
        "Command run after the last failed attempt; its result is the step's result.",
    )],
};

/// `retry_config.on_failure` as `{fallback: ...}`.
pub static RETRY_EXHAUSTED: Shape = Shape {
    name: "retry_exhausted",
    doc: "A `retry_config.on_failure` that runs a fallback command.",
    keys: &[key(
        "fallback",
        Ty::OneOf(&[Ty::Template, Ty::Object(&FALLBACK)]),
        "Command run after the last failed attempt, as a string or `{command}`; its result is the step's result.",
    )],
};

/// A step's `commit_config`.
pub static COMMIT_CONFIG: Shape = Shape {
    name: "commit_config",
    doc: "How `auto_commit` writes its commits.",
    keys: &[
        key("message_template", Ty::Template, "Commit message."),
        key(
            "message_pattern",
            Ty::Text,
            "Regular expression that commit messages must match.",
        ),
        key("sign", Ty::Bool, "Sign the commits (default false)."),
        key("author", Ty::Template, "Commit author, as `Name <email>`."),
        key(
            "include_files",
            TEXTS_TY,
            "Globs of the files to commit (default: every changed file).",
        ),
        key("exclude_files", TEXTS_TY, "Globs of files never to commit."),
        key(
            "squash",
            Ty::Bool,
            "Squash the step's commits into one (default false).",
        ),
    ],
};

/// `validate` as a mapping.
pub static VALIDATE: Shape = Shape {
    name: "validate",
    doc: "A check that a step's work is complete, with the steps that complete it.",
    keys: &[
        key(
            "shell",
            Ty::Template,
            "Shell command that checks the work and prints a JSON validation result, or writes it to `result_file`.",
        ),
        key(
            "claude",
            CLAUDE_TY,
            "Claude command that checks the work and prints a JSON validation result, or writes it to `result_file`; or `{prompt, model, ...}`.",
        ),
        key("command", Ty::Template, "Deprecated spelling of `shell`."),
        key(
            "commands",
            HANDLER_COMMANDS_TY,
            "Check commands run in order: strings (a leading `/` means Claude, else shell) or steps.",
        ),
        key(
            "result_file",
            Ty::Template,
            "File the check writes its JSON result to (default: the command's stdout).",
        ),
        key(
            "threshold",
            Ty::Number {
                min: 0.0,
                max: 100.0,
            },
            "Completion percentage, from 0 to 100, at which the work is complete (default 100).",
        ),
        key("timeout", Ty::Duration, "Time limit for the check."),
        key(
            "expected_schema",
            Ty::Any,
            "JSON Schema that the validation result must satisfy.",
        ),
        key(
            "on_incomplete",
            Ty::OneOf(&[HANDLER_COMMANDS_TY, Ty::Object(&ON_INCOMPLETE)]),
            "What runs while the work is below `threshold`, before checking again: a list of commands or a mapping.",
        ),
    ],
};

/// `validate.on_incomplete` as a mapping.
pub static ON_INCOMPLETE: Shape = Shape {
    name: "on_incomplete",
    doc: "What runs while validation finds the work incomplete.",
    keys: &[
        key(
            "shell",
            Ty::Template,
            "Shell command that completes the work, with `${validation.*}` set.",
        ),
        key(
            "claude",
            CLAUDE_TY,
            "Claude command that completes the work, with `${validation.*}` set; or `{prompt, model, ...}`.",
        ),
        key(
            "command",
            Ty::Template,
            "Deprecated spelling of `shell` (a warning says so).",
        ),
        key(
            "commands",
            HANDLER_COMMANDS_TY,
            "Commands that complete the work, run in order: strings (a leading `/` means Claude, else shell) or steps.",
        ),
        key(
            "max_attempts",
            Ty::Int { min: 1 },
            "Rounds of completing and checking again (default 2).",
        ),
        key(
            "fail_workflow",
            Ty::Bool,
            "Fail the workflow when the work is still incomplete after the last round (default true).",
        ),
        key(
            "commit_required",
            Ty::Bool,
            "The commands that complete the work must create a git commit (default false).",
        ),
        key(
            "prompt",
            Ty::Template,
            "Question asked interactively when the work is still incomplete.",
        ),
    ],
};

/// `step_validate` as a mapping.
pub static STEP_VALIDATE: Shape = Shape {
    name: "step_validate",
    doc: "Checks run after a step's command succeeds; the step fails when they fail.",
    keys: &[
        key(
            "commands",
            Ty::List(&Ty::OneOf(&[Ty::Template, Ty::Object(&VALIDATION_COMMAND)])),
            "Check commands: strings, or `{command, expect_output, expect_exit_code, command_type}`.",
        ),
        key(
            "success_criteria",
            Ty::OneOf(&[Ty::Enum(&["all", "any"]), Ty::Object(&AT_LEAST)]),
            "How many checks must pass: `all` (default), `any` or `{at_least: N}`.",
        ),
        key(
            "max_attempts",
            Ty::Int { min: 1 },
            "Runs of the checks before the step fails (default 1).",
        ),
        key(
            "retry_delay",
            Ty::Duration,
            "Delay between runs of the checks (default 5s).",
        ),
    ],
};

/// One `step_validate.commands` entry written as a mapping.
pub static VALIDATION_COMMAND: Shape = Shape {
    name: "validation_command",
    doc: "One check of `step_validate`.",
    keys: &[
        key("command", Ty::Template, "Command to run."),
        key(
            "expect_output",
            Ty::Text,
            "Regular expression that the output must match.",
        ),
        key(
            "expect_exit_code",
            Ty::Int { min: 0 },
            "Exit code, from 0 to 255, that the command must return (default 0).",
        ),
        key(
            "command_type",
            Ty::Enum(&["shell", "claude"]),
            "How `command` runs: `shell` (default) or `claude`.",
        ),
    ],
};

/// `success_criteria` as a mapping.
pub static AT_LEAST: Shape = Shape {
    name: "at_least",
    doc: "A `success_criteria` that needs a number of passing checks.",
    keys: &[
        key(
            "atleast",
            Ty::Int { min: 1 },
            "Checks that must pass, at least 1.",
        ),
        key("at_least", Ty::Int { min: 1 }, "Alias of `atleast`."),
    ],
};

/// One entry of a step's `outputs`.
pub static OUTPUT: Shape = Shape {
    name: "output",
    doc: "One named output of a step.",
    keys: &[key(
        "file_pattern",
        Ty::Text,
        "Glob over the files the step's commits touched; the matches become `${ID.NAME}`.",
    )],
};

/// The `write_file` command.
pub static WRITE_FILE: Shape = Shape {
    name: "write_file",
    doc: "The `write_file` command: writes text to a file inside the working directory.",
    keys: &[
        key(
            "path",
            Ty::Template,
            "File to write, relative to the working directory and inside it.",
        ),
        key("content", Ty::Template, "Text to write."),
        key(
            "format",
            Ty::Enum(&["text", "json", "yaml"]),
            "Format of `content`: `text` (default), or `json` or `yaml`, which are checked and pretty-printed.",
        ),
        key(
            "mode",
            Ty::Text,
            "Permission bits as an octal string (default `\"0644\"`).",
        ),
        key(
            "create_dirs",
            Ty::Bool,
            "Create missing parent directories (default false).",
        ),
    ],
};

/// The nested form of `foreach`.
pub static FOREACH: Shape = Shape {
    name: "foreach",
    doc: "The nested form of `foreach`: its items and the steps each runs.",
    keys: &[
        key(
            "foreach",
            TEMPLATES_TY,
            "Items: a command whose non-blank output lines are the items, or a list.",
        ),
        key("input", TEMPLATES_TY, "Same as `foreach`."),
        key("items", TEMPLATES_TY, "Same as `foreach`."),
        key(
            "parallel",
            PARALLEL_TY,
            "Items run at once: a number, or `true` for 10 (default 1).",
        ),
        key(
            "do",
            Ty::Steps,
            "Steps run for each item, with `${item}`, `${index}` and `${total}` set.",
        ),
        key(
            "continue_on_error",
            Ty::Bool,
            "Go on with the other items after one fails (default false).",
        ),
        key("max_items", Ty::Int { min: 1 }, "Most items to run."),
    ],
};

// Durations (`lower/values.rs`).

/// A duration written as serde's `{secs, nanos}`.
pub static SECS_NANOS: Shape = Shape {
    name: "secs_nanos",
    doc: "A duration in serde's `{secs, nanos}` form.",
    keys: &[
        key("secs", Ty::Int { min: 0 }, "Whole seconds (default 0)."),
        key(
            "nanos",
            Ty::Int { min: 0 },
            "Nanoseconds added to `secs` (default 0).",
        ),
    ],
};

// Environment (`lower/env.rs`).

/// An env value from a command.
pub static ENV_DYNAMIC: Shape = Shape {
    name: "env_dynamic",
    doc: "An env value taken from a command's output.",
    keys: &[
        key(
            "command",
            Ty::Template,
            "Command whose trimmed stdout is the value.",
        ),
        key(
            "cache",
            Ty::Bool,
            "Run the command once and reuse its output (default false).",
        ),
    ],
};

/// An env value chosen by a condition.
pub static ENV_CONDITIONAL: Shape = Shape {
    name: "env_conditional",
    doc: "An env value chosen by a condition.",
    keys: &[
        key(
            "condition",
            Ty::Expression,
            "Condition that chooses the value.",
        ),
        key(
            "when_true",
            Ty::Template,
            "Value when the condition is true.",
        ),
        key(
            "when_false",
            Ty::Template,
            "Value when the condition is false.",
        ),
    ],
};

/// An env value that may be masked.
pub static ENV_MASKED: Shape = Shape {
    name: "env_masked",
    doc: "An env value that may be masked in output.",
    keys: &[
        key(
            "secret",
            Ty::Bool,
            "Mask the value as `***` in everything prodigy prints or writes (default false).",
        ),
        key("value", Ty::Template, "The value."),
    ],
};

/// A secret read through a provider.
pub static SECRET_PROVIDER: Shape = Shape {
    name: "secret_provider",
    doc: "A secret read through a provider.",
    keys: &[
        key(
            "provider",
            Ty::Enum(&["env", "file"]),
            "Where the secret is: `env` (default), a process variable, or `file`, a file's contents.",
        ),
        key(
            "key",
            Ty::Text,
            "Name of the variable, or path of the file.",
        ),
        key(
            "version",
            Ty::Any,
            "Has no effect: only vault-style providers have versions.",
        ),
    ],
};

// MapReduce (`lower/mapreduce.rs`).

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
        key(
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
        key(
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
        key(
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
            "Retries of failed items, for `on_item_failure: retry`.",
        ),
    ],
};

/// `{size}` of the `batched` error collection.
pub static BATCHED: Shape = Shape {
    name: "batched",
    doc: "The parameters of `batched` error collection.",
    keys: &[key(
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
        key(
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

/// Every shape, for the schema and the language server.
pub static SHAPES: &[&Shape] = &[
    &WORKFLOW,
    &STEP,
    &CLAUDE_STEP,
    &CLAUDE_DEFAULTS,
    &PHASE_COMMANDS,
    &TEST,
    &METADATA,
    &CAPTURE_STREAMS,
    &ON_FAILURE_DETAILED,
    &ON_FAILURE_ADVANCED,
    &RETRY_CONFIG,
    &BACKOFF_FIXED,
    &BACKOFF_LINEAR,
    &BACKOFF_EXPONENTIAL,
    &BACKOFF_FIBONACCI,
    &BACKOFF_CUSTOM,
    &BACKOFF_BY_NAME,
    &BACKOFF_TYPED,
    &RETRY_ON_PATTERN,
    &FALLBACK,
    &RETRY_EXHAUSTED,
    &COMMIT_CONFIG,
    &VALIDATE,
    &ON_INCOMPLETE,
    &STEP_VALIDATE,
    &VALIDATION_COMMAND,
    &AT_LEAST,
    &OUTPUT,
    &WRITE_FILE,
    &FOREACH,
    &SECS_NANOS,
    &ENV_DYNAMIC,
    &ENV_CONDITIONAL,
    &ENV_MASKED,
    &SECRET_PROVIDER,
    &SETUP,
    &CAPTURE_OUTPUT,
    &MAP,
    &TIMEOUT_CONFIG,
    &MERGE,
    &ERROR_POLICY,
    &BATCHED,
    &CIRCUIT_BREAKER,
    &POLICY_RETRY,
    &ITEM_FAILURE_CUSTOM,
    &ERROR_COLLECTION_BATCHED,
    &SLURM,
];

#[cfg(test)]
mod tests {
    use super::{Key, SHAPES, STEP, Shape, Ty};
    use std::collections::BTreeSet;

    #[test]
    fn shape_names_are_unique() {
        let mut seen = BTreeSet::new();
        for shape in SHAPES {
            assert!(seen.insert(shape.name), "shape `{}` twice", shape.name);
        }
    }

    #[test]
    fn key_names_are_unique_within_a_shape() {
        for shape in SHAPES {
            let mut seen = BTreeSet::new();
            for key in shape.keys {
                assert!(
                    seen.insert(key.name),
                    "key `{}` twice in `{}`",
                    key.name,
                    shape.name
                );
            }
        }
    }

    fn check_doc(doc: &str, of: &str) {
        assert!(!doc.is_empty(), "{of} has no documentation");
        assert_eq!(doc, doc.trim_end(), "{of}: trailing whitespace");
        assert!(!doc.contains('\n'), "{of}: documentation is one line");
        assert!(
            doc.starts_with(|c: char| c.is_ascii_uppercase()),
            "{of}: documentation starts with a capital letter"
        );
        assert!(doc.ends_with('.'), "{of}: documentation ends with a period");
    }

    #[test]
    fn every_shape_and_key_is_documented() {
        for shape in SHAPES {
            check_doc(shape.doc, &format!("shape `{}`", shape.name));
            for key in shape.keys {
                check_doc(key.doc, &format!("`{}.{}`", shape.name, key.name));
            }
        }
    }

    /// Every shape that a key refers to is listed in `SHAPES`.
    #[test]
    fn shapes_lists_every_referenced_shape() {
        fn walk(ty: &Ty, at: &Key, shape: &Shape) {
            match ty {
                Ty::Object(target) => assert!(
                    SHAPES.iter().any(|s| std::ptr::eq(*s, *target)),
                    "`{}.{}` refers to `{}`, which `SHAPES` lacks",
                    shape.name,
                    at.name,
                    target.name
                ),
                Ty::List(inner) | Ty::Map(inner) => walk(inner, at, shape),
                Ty::OneOf(forms) => forms.iter().for_each(|f| walk(f, at, shape)),
                _ => {}
            }
        }
        for shape in SHAPES {
            for key in shape.keys {
                walk(&key.ty, key, shape);
            }
        }
    }

    /// The schema defines `step` (a mapping or a string) and `steps` itself.
    #[test]
    fn step_and_steps_are_not_shape_names() {
        assert!(SHAPES.iter().all(|s| s.name != "step" && s.name != "steps"));
    }

    #[test]
    fn lookup_by_name() {
        assert!(STEP.key("retry_config").is_some());
        assert!(STEP.key("retries").is_none());
    }
}

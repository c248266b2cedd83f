//! A step, its commands (`test`, `write_file`, `foreach`) and its structures (`metadata`,
//! `capture_streams`, `commit_config`, `outputs`).

use super::{
    CAPTURE_FORMATS, CLAUDE_TY, ENV_VALUE_TY, HANDLER_COMMANDS_TY, ON_FAILURE_TY, PARALLEL_TY,
    RETRY_CONFIG, STEP_OR_STEPS_TY, STEP_VALIDATE, Shape, TEMPLATES_TY, TEXTS_TY, Ty, VALIDATE,
    deprecated, key, removed, required,
};

/// The keys of a step that are its command; a step has exactly one of them, or the legacy
/// `name:` form.
pub const COMMAND_KINDS: &[&str] = &[
    "shell",
    "claude",
    "write_file",
    "foreach",
    "test",
    "command",
];

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
        deprecated(
            "test",
            Ty::Object(&TEST),
            "Deprecated: a shell `command` with an `on_failure` handler; write `shell:` with `on_failure:` instead.",
        ),
        deprecated("command", Ty::Template, "Deprecated spelling of `claude`."),
        removed(
            "analyze",
            "Removed in Prodigy 0.3: run an analysis tool with `shell:` instead.",
        ),
        removed(
            "goal_seek",
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
            Ty::Keyed {
                pattern: EXIT_CODE,
                what: "an exit code from 0 to 255",
                value: &STEP_OR_STEPS_TY,
            },
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
        deprecated(
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

/// An `on_exit_code` key: a whole number from 0 to 255 (leading zeros and spaces allowed).
const EXIT_CODE: &str = r"^\s*\+?0*(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\s*$";

/// The deprecated `{commands: [...]}` form of `reduce` and `agent_template` (`phase_steps`).
pub static PHASE_COMMANDS: Shape = Shape {
    name: "phase_commands",
    doc: "The deprecated `{commands: [...]}` form of a phase's steps.",
    keys: &[deprecated(
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
        required("command", Ty::Template, "Shell command to run."),
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
        deprecated(
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

/// One entry of a step's `outputs`.
pub static OUTPUT: Shape = Shape {
    name: "output",
    doc: "One named output of a step.",
    keys: &[required(
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
        required(
            "path",
            Ty::Template,
            "File to write, relative to the working directory and inside it.",
        ),
        required("content", Ty::Template, "Text to write."),
        key(
            "format",
            Ty::Enum(&["text", "json", "yaml"]),
            "Format of `content`: `text` (default), or `json` or `yaml`, which are checked and pretty-printed.",
        ),
        key(
            "mode",
            Ty::Matching {
                pattern: r"^\s*(0o)?0*[0-7]{1,4}\s*$",
                what: "octal permission bits",
            },
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

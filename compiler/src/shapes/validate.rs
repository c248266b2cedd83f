//! `validate` with `on_incomplete`, and `step_validate`.

use super::{CLAUDE_TY, HANDLER_COMMANDS_TY, Shape, Ty, deprecated, key};

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
        deprecated("command", Ty::Template, "Deprecated spelling of `shell`."),
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
        deprecated(
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

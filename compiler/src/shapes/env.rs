//! Environment values in their mapping forms, and secrets read through a provider.

use super::{Shape, Ty, key};

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

//! The shapes of the workflow format: every mapping's keys, with a type and a line of
//! documentation each.
//!
//! One table serves three readers: lowering checks keys against it (an unknown key is
//! V001), `prodigy schema` turns it into a JSON Schema, and `prodigy lsp` shows its
//! documentation on hover and offers its keys on completion.
//! Lowering still decides what each value means; these tables say what may be written.
//! Lowering reads a mapping only through the keys its shape declares (`lower/fields.rs`).
//! The tables are split by context: the workflow, steps, failure handling, validation,
//! environment, MapReduce and Claude calls.

mod claude;
mod env;
mod failure;
mod mapreduce;
mod step;
mod validate;
mod workflow;

pub(crate) use claude::workflow_only_help;
pub use claude::{CLAUDE_DEFAULTS, CLAUDE_STEP};
pub use env::{ENV_CONDITIONAL, ENV_DYNAMIC, ENV_MASKED, SECRET_PROVIDER};
pub use failure::{
    BACKOFF_BY_NAME, BACKOFF_CUSTOM, BACKOFF_EXPONENTIAL, BACKOFF_FIBONACCI, BACKOFF_FIXED,
    BACKOFF_LINEAR, BACKOFF_TYPED, FALLBACK, ON_FAILURE_ADVANCED, ON_FAILURE_DETAILED,
    RETRY_CONFIG, RETRY_EXHAUSTED, RETRY_ON_PATTERN,
};
pub use mapreduce::{
    BATCHED, CAPTURE_OUTPUT, CIRCUIT_BREAKER, ERROR_COLLECTION_BATCHED, ERROR_POLICY,
    ITEM_FAILURE_CUSTOM, MAP, MERGE, POLICY_RETRY, SETUP, TIMEOUT_CONFIG,
};
pub use step::{
    CAPTURE_STREAMS, COMMAND_KINDS, COMMIT_CONFIG, FOREACH, METADATA, OUTPUT, PHASE_COMMANDS, STEP,
    TEST, WRITE_FILE,
};
pub use validate::{AT_LEAST, ON_INCOMPLETE, STEP_VALIDATE, VALIDATE, VALIDATION_COMMAND};
pub use workflow::{CONTAINER, EXECUTOR, NOTIFY, SLURM, WORKFLOW, WORKTREE};

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
    /// A mapping whose keys match a regular expression, to values of one type.
    Keyed {
        /// The regular expression every key matches.
        pattern: &'static str,
        /// The keys, in words (`an exit code from 0 to 255`).
        what: &'static str,
        /// The type of the values.
        value: &'static Ty,
    },
    /// A string matching a regular expression.
    Matching {
        /// The regular expression.
        pattern: &'static str,
        /// The form, in words (`octal permission bits`).
        what: &'static str,
    },
    /// One of several forms.
    OneOf(&'static [Ty]),
    /// One step.
    Step,
    /// One step where a handler is expected (`on_success`, `on_exit_code`): a mapping with
    /// both `shell` and `claude` runs the shell command, then Claude.
    HandlerStep,
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
    /// Whether it is current, deprecated or removed.
    pub status: Status,
    /// Whether the mapping must have it.
    pub required: bool,
}

/// Whether a key is still part of the language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Written today.
    Current,
    /// Still accepted, with a warning (W001) or no effect (W002); not offered on completion.
    Deprecated,
    /// Refused (V009); known only to explain that it was removed.
    Removed,
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

    /// The keys written today (neither deprecated nor removed): what V001 lists and the
    /// language server offers.
    pub fn current(&self) -> impl Iterator<Item = &'static Key> + use<> {
        let keys: &'static [Key] = self.keys;
        keys.iter().filter(|k| k.status == Status::Current)
    }
}

/// A key, in the tables below.
const fn key(name: &'static str, ty: Ty, doc: &'static str) -> Key {
    Key {
        name,
        doc,
        ty,
        status: Status::Current,
        required: false,
    }
}

/// A key the mapping must have.
const fn required(name: &'static str, ty: Ty, doc: &'static str) -> Key {
    Key {
        required: true,
        ..key(name, ty, doc)
    }
}

/// A deprecated key: still accepted, with a warning or to no effect.
const fn deprecated(name: &'static str, ty: Ty, doc: &'static str) -> Key {
    Key {
        status: Status::Deprecated,
        ..key(name, ty, doc)
    }
}

/// A removed key: refused, its documentation says what replaces it.
const fn removed(name: &'static str, doc: &'static str) -> Key {
    Key {
        status: Status::Removed,
        ..key(name, Ty::Any, doc)
    }
}

// Forms shared by several keys.

/// A string or a list of strings.
const TEXTS_TY: Ty = Ty::OneOf(&[Ty::Text, Ty::List(&Ty::Text)]);
/// A template or a list of templates.
const TEMPLATES_TY: Ty = Ty::OneOf(&[Ty::Template, Ty::List(&Ty::Template)]);
/// One step or a list of steps (`on_success`, `on_exit_code` targets).
const STEP_OR_STEPS_TY: Ty = Ty::OneOf(&[Ty::HandlerStep, Ty::Steps]);
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
    "stalled",
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

// Durations.

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
    &WORKTREE,
    &NOTIFY,
    &EXECUTOR,
    &CONTAINER,
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
                Ty::List(inner) | Ty::Map(inner) | Ty::Keyed { value: inner, .. } => {
                    walk(inner, at, shape);
                }
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

    /// The schema defines `step` (a mapping or a string), `handler_step` and `steps` itself.
    #[test]
    fn step_and_steps_are_not_shape_names() {
        assert!(
            SHAPES
                .iter()
                .all(|s| !["step", "steps", "handler_step"].contains(&s.name))
        );
    }

    #[test]
    fn lookup_by_name() {
        assert!(STEP.key("retry_config").is_some());
        assert!(STEP.key("retries").is_none());
    }
}

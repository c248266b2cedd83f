//! The registry of diagnostic codes.
//!
//! Every code is stable and never reused.
//! Each has a default severity, a one-line summary and a long explanation in
//! `explanations/<CODE>.md` (shown by `prodigy explain CODE`); a test checks that each code also
//! has a fixture under `workflows/err/`.

use super::Severity;

macro_rules! codes {
    ($($variant:ident = $code:literal, $severity:ident, $summary:literal;)*) => {
        /// A stable diagnostic code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code {
            $(
                #[doc = $summary]
                $variant,
            )*
        }

        impl Code {
            /// Every code, in registry order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code as users write it, e.g. `V001`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }

            /// The severity a diagnostic with this code has unless promoted.
            pub fn default_severity(self) -> Severity {
                match self { $(Code::$variant => Severity::$severity,)* }
            }

            /// A one-line summary.
            pub fn summary(self) -> &'static str {
                match self { $(Code::$variant => $summary,)* }
            }

            /// The long explanation in Markdown.
            pub fn explanation(self) -> &'static str {
                match self {
                    $(Code::$variant => include_str!(concat!("explanations/", $code, ".md")),)*
                }
            }
        }
    };
}

codes! {
    YamlSyntax = "P001", Error, "the file is not valid YAML";
    AliasBomb = "P002", Error, "YAML alias expansion exceeds the limit";
    DuplicateKey = "P003", Error, "a mapping sets the same key twice";
    MultipleDocuments = "P004", Error, "a file holds more than one YAML document";
    TooDeep = "P005", Error, "the YAML nests too deeply";
    NotAWorkflow = "P006", Error, "the document is neither a list of steps nor a workflow mapping";
    TemplateSyntax = "P101", Error, "a `${...}` template that does not parse";
    ExpressionSyntax = "P102", Error, "a filter or `when` expression that does not parse";
    SortSyntax = "P103", Error, "a `sort_by` specification that does not parse";
    JsonPathSyntax = "P104", Error, "a `json_path` that does not parse";
    ExpressionTooDeep = "P105", Error, "an expression that nests too deeply";
    UnknownKey = "V001", Error, "a key that means nothing in its place";
    MissingKey = "V002", Error, "a required key is missing";
    NoCommand = "V003", Error, "a step has no command";
    MultipleCommands = "V004", Error, "a step has more than one command kind";
    DuplicateStepId = "V005", Error, "two steps share an `id`";
    MapWithoutMapReduce = "V006", Error, "`map` in a workflow that is not `mode: mapreduce`";
    MapReduceWithoutMap = "V007", Error, "`mode: mapreduce` without a `map` phase";
    ConvenienceConflict = "V008", Error, "an error-policy setting is given both at the top level and in `error_policy`";
    RemovedFeature = "V009", Error, "a feature that Prodigy no longer has";
    WrongMode = "V010", Error, "a key that belongs to the other workflow mode";
    UnknownHandler = "V011", Error, "`custom:<name>` names no handler under `handlers`";
    UndefinedVariable = "V012", Error, "a variable that cannot exist where it is used";
    WrongType = "V101", Error, "a value of the wrong type or shape";
    InvalidDuration = "V102", Error, "a value that is not a duration";
    OutOfRange = "V103", Error, "a number outside its allowed range";
    UnknownVariant = "V104", Error, "a value that is not one of the accepted choices";
    InvalidExitCode = "V105", Error, "an `on_exit_code` key that is not an exit code";
    InvalidRegex = "V106", Error, "a regular expression that does not compile";
    InvalidFileMode = "V107", Error, "a `write_file` mode that is not an octal permission";
    PathEscapes = "V108", Error, "a `write_file` path that leaves the working directory";
    OutputFileEscapes = "V109", Error, "an `output_file` that leaves the project";
    WorktreePathEscapes = "V110", Error, "a `worktree` path that is absolute or leaves the repository";
    UnknownNotifyEvent = "V111", Error, "a `notify` entry names an event that does not exist";
    InvalidGlob = "V112", Error, "a `merge.protect` entry that is not a glob";
    Unreachable = "G001", Warning, "a step or handler that can never run";
    RetryNeverFires = "G002", Warning, "a retry policy that can never retry";
    RetryOutlastsTimeout = "G003", Warning, "a retry schedule longer than the time allowed for it";
    BreakerNeverTrips = "G004", Warning, "a circuit breaker that can never open";
    RetryWithoutPolicy = "G005", Warning, "`on_item_failure: retry` without an `error_policy.retry_config`";
    RecoveryNeverRetries = "G006", Warning, "`strategy: recovery` on a handler whose command is never run again";
    Deprecated = "W001", Warning, "a deprecated form that still works";
    NoEffect = "W002", Warning, "a setting that has no effect where it is";
    EmptyWorkflow = "W003", Warning, "a workflow without steps";
    MissingEnvFile = "W004", Warning, "an `env_files` entry names a file that does not exist";
    MaybeUndefined = "W005", Warning, "a variable that nothing in the workflow defines";
    UnquotedInterpolation = "W006", Warning, "untrusted text spliced into a shell command unquoted";
    UselessSuppression = "W007", Warning, "a `# prodigy: ignore[...]` comment that suppresses nothing";
    UnknownSlashCommand = "W008", Warning, "a Claude prompt that starts with a slash command the project does not define";
    MixedComparison = "W009", Warning, "a comparison whose sides are of types that never compare";
    ShellExpansion = "W010", Warning, "a `${...}` in a shell command that is the shell's own parameter expansion";
    FieldNoItemHas = "W011", Warning, "a map `filter` or `sort_by` that reads a field no item of the input has";
    MissingMapInput = "W012", Warning, "a map input file that does not exist, which no `setup` step makes";
    MissingCopy = "W013", Warning, "a `worktree.copy` entry that names no file of the checkout";
    TrackedCopy = "W014", Warning, "a `worktree.copy` entry that names a file git tracks";
    ForeignBraces = "W015", Warning, "a variable in another tool's `{{ ... }}` braces, which prodigy leaves as text";
    Unreadable = "F001", Error, "a workflow file that cannot be read";
    NotUtf8 = "F002", Error, "a workflow file that is not UTF-8 text";
    EmptyFile = "F003", Error, "a workflow file with no YAML document in it";
    Shellcheck = "S001", Warning, "a problem ShellCheck finds in a `shell:` command";
    Internal = "ICE", Error, "an internal error in prodigy";
}

impl Code {
    /// Looks a code up by its text, ignoring case.
    pub fn parse(text: &str) -> Option<Code> {
        Code::ALL
            .iter()
            .copied()
            .find(|c| c.as_str().eq_ignore_ascii_case(text.trim()))
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_explained() {
        let mut seen = std::collections::BTreeSet::new();
        for code in Code::ALL {
            assert!(seen.insert(code.as_str()), "{code} registered twice");
            let text = code.explanation();
            assert!(
                text.starts_with(&format!("# {code}")),
                "{code}: explanation must start with `# {code}`"
            );
            assert!(text.lines().count() > 3, "{code}: explanation too short");
        }
    }

    #[test]
    fn parse_ignores_case() {
        assert_eq!(Code::parse("v001"), Some(Code::UnknownKey));
        assert_eq!(Code::parse("X999"), None);
    }
}

//! The variables a run has: workflow env, secrets, captures, handler and item variables,
//! and how they are read by templates and conditions, exported to processes, and masked.

use std::borrow::Cow;
use std::collections::BTreeMap;

use prodigy_compiler::scope::{RESERVED_ENV, exported_name};
use prodigy_grammar::expr::{Context, EvalError};
use prodigy_grammar::path::{Path, Segment, lookup_segments};
use prodigy_grammar::template::Scope;
use serde_json::Value;

/// Capture metadata fields, read as `${NAME.exit_code}` and so on.
const META: &[&str] = &["exit_code", "success", "stderr", "duration"];

/// The largest derived value exported to a process, in bytes.
const MAX_DERIVED: usize = 100_000;

/// The variables of a run (or of one map item, or one `foreach` item).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Vars {
    /// Name → value: env, secrets, captures, `shell`, `error`, `item`, ...
    pub values: BTreeMap<String, Value>,
    /// Capture name → `{exit_code, success, stderr, duration}`.
    pub meta: BTreeMap<String, Value>,
    /// The stdout of the last command run with these variables, whether shell or Claude
    /// (a handler's `capture` and a validation without `result_file` read it).
    #[serde(skip)]
    pub last_output: Option<String>,
    /// Names that are exported to processes (workflow env, profile, secrets).
    #[serde(skip)]
    pub exported: Vec<String>,
    /// What each step's own command last printed, by step id (a setup step's
    /// `capture_outputs` reads its step's, whatever its handlers ran after it).
    #[serde(skip)]
    pub commands: BTreeMap<u32, CommandOutput>,
}

/// What a command printed, and whether it succeeded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Its standard output, less one trailing newline.
    pub stdout: String,
    /// Its standard error, less one trailing newline.
    pub stderr: String,
    /// Whether it exited 0.
    pub success: bool,
}

/// Secret values to mask: never empty, each once, longest first (so that a secret that
/// contains another is masked whole).
#[derive(Clone, Debug, Default)]
pub struct Secrets(Vec<String>);

impl Secrets {
    /// Registers a value; an empty one would mask between every character, so it is not.
    pub fn add(&mut self, value: &str) {
        if !value.is_empty() && !self.0.iter().any(|s| s == value) {
            self.0.push(value.to_owned());
            self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// Replaces every secret value in `text` with `***`.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.0 {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "***");
            }
        }
        out
    }

    /// Masks secrets in every string of a JSON value.
    pub fn mask_json(&self, value: Value) -> Value {
        if self.0.is_empty() {
            return value;
        }
        match value {
            Value::String(s) => Value::String(self.mask(&s)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.mask_json(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (k, self.mask_json(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

impl Vars {
    /// Sets a variable.
    pub fn set(&mut self, name: impl Into<String>, value: Value) {
        self.values.insert(name.into(), value);
    }

    /// Adds FIELDS to the object variable NAME (made an object if it is not one), keeping
    /// its other fields.
    pub fn merge(&mut self, name: &str, fields: serde_json::Map<String, Value>) {
        let entry = self
            .values
            .entry(name.to_owned())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(serde_json::Map::new());
        }
        if let Value::Object(map) = entry {
            map.extend(fields);
        }
    }

    /// Sets a variable that processes see in their environment too.
    pub fn set_exported(&mut self, name: impl Into<String>, value: Value) {
        let name = name.into();
        if !self.exported.contains(&name) {
            self.exported.push(name.clone());
        }
        self.values.insert(name, value);
    }

    /// The value of a path, or `None` when the variable does not exist.
    pub fn lookup(&self, path: &Path) -> Option<Cow<'_, Value>> {
        // `${env.NAME}`: the environment commands see: what the workflow exports (env,
        // env files, profile, secrets, params), else what prodigy inherited.
        if path.root == "env" && !self.values.contains_key("env") {
            let Some(Segment::Field(name)) = path.segments.first() else {
                return None;
            };
            if self.exported.contains(name)
                && let Some(value) = self.values.get(name)
            {
                return Some(Cow::Borrowed(value));
            }
            return std::env::var(name)
                .ok()
                .map(|v| Cow::Owned(Value::String(v)));
        }
        if let (Some(meta), Some(Segment::Field(field))) =
            (self.meta.get(&path.root), path.segments.first())
            && META.contains(&field.as_str())
        {
            return lookup_segments(meta, &path.segments).map(Cow::Borrowed);
        }
        if let Some(value) = self.values.get(&path.root) {
            // A missing field of an existing variable is null, never undefined.
            return Some(
                lookup_segments(value, &path.segments)
                    .map_or(Cow::Owned(Value::Null), Cow::Borrowed),
            );
        }
        // A name nothing in the workflow defines may be an inherited environment variable.
        if path.segments.is_empty() {
            return std::env::var(&path.root)
                .ok()
                .map(|v| Cow::Owned(Value::String(v)));
        }
        None
    }

    /// The environment exported to a process: exported names as they are, every other
    /// variable under a shell-safe upper-case name (`item.id` → `ITEM_ID` for objects'
    /// scalar fields, `build` → `BUILD`).
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        // A derived name never replaces what the process inherited: `capture: path` must not
        // become `PATH`.
        // Nor is a derived value exported past 100 kB: Linux refuses to start a process
        // with one environment string over 128 kB, and `${map.results}` can be far larger
        // (templates still read it).
        let mut derived = |name: String, value: &Value| {
            if !name.is_empty()
                && std::env::var_os(&name).is_none()
                && !RESERVED_ENV.contains(&name.as_str())
            {
                let text = prodigy_grammar::value::render(value);
                if text.len() <= MAX_DERIVED {
                    out.push((name, text));
                }
            }
        };
        for (name, value) in &self.values {
            if self.exported.contains(name) {
                continue;
            }
            derived(exported_name(name), value);
            if let Value::Object(map) = value {
                for (field, inner) in map {
                    if !matches!(inner, Value::Object(_) | Value::Array(_)) {
                        derived(exported_name(&format!("{name}.{field}")), inner);
                    }
                }
            }
        }
        // Names the workflow exports on purpose (env, profile, secrets, params) win.
        for name in &self.exported {
            if let Some(value) = self.values.get(name) {
                out.push((name.clone(), prodigy_grammar::value::render(value)));
            }
        }
        out
    }
}

impl Scope for Vars {
    fn get(&self, path: &Path) -> Option<Value> {
        self.lookup(path).map(Cow::into_owned)
    }

    /// A bare `$NAME` is a prodigy variable or left for the shell: never the environment
    /// prodigy itself inherited (SPEC §7).
    fn get_bare(&self, name: &str) -> Option<Value> {
        self.values.get(name).cloned()
    }
}

impl Context for Vars {
    fn path(&self, path: &Path) -> Result<Cow<'_, Value>, EvalError> {
        if let Some(Segment::Field(last)) = path.segments.last()
            && last == "exists"
        {
            let mut base = path.clone();
            base.segments.pop();
            return Ok(Cow::Owned(Value::Bool(self.lookup(&base).is_some())));
        }
        self.lookup(path)
            .ok_or_else(|| EvalError::Undefined(path.to_string()))
    }
}

/// Whether a variable's name says it holds a credential (password, token, API key, ...):
/// `-vv` shows such a step `env` value as `***REDACTED***`.
pub fn sensitive_name(name: &str) -> bool {
    const MARKERS: &[&str] = &[
        "password",
        "passwd",
        "pwd",
        "token",
        "apikey",
        "api_key",
        "api-key",
        "secret",
        "auth",
        "bearer",
        "private_key",
        "privatekey",
        "ssh_key",
        "access_key",
        "accesskey",
        "credential",
    ];
    let lower = name.to_ascii_lowercase();
    MARKERS.iter().any(|m| lower.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_keeps_other_fields_and_replaces_non_objects() {
        let mut vars = Vars::default();
        vars.set("step", json!({"name": "a", "files_added": ["x"]}));
        let Value::Object(fields) = json!({"name": "b", "index": 1}) else {
            unreachable!()
        };
        vars.merge("step", fields.clone());
        assert_eq!(
            vars.values["step"],
            json!({"name": "b", "files_added": ["x"], "index": 1})
        );
        vars.set("plain", json!("text"));
        vars.merge("plain", fields);
        assert_eq!(vars.values["plain"], json!({"name": "b", "index": 1}));
    }

    #[test]
    fn captures_have_values_and_metadata() {
        let mut vars = Vars::default();
        vars.set("data", json!({"name": "x", "n": 5}));
        vars.meta
            .insert("data".into(), json!({"exit_code": 0, "success": true}));
        let t = prodigy_grammar::template::Template::parse(
            "${data.name} ${data.n} ${data.exit_code} ${data.missing}",
        )
        .unwrap();
        assert_eq!(t.render(&vars).unwrap(), "x 5 0 ");
    }

    #[test]
    fn secrets_are_masked_longest_first() {
        let mut secrets = Secrets::default();
        secrets.add("abc");
        secrets.add("abcdef");
        assert_eq!(secrets.mask("token=abcdef and abc"), "token=*** and ***");
        assert_eq!(
            secrets.mask_json(json!({"k": ["abc"]})),
            json!({"k": ["***"]})
        );
    }

    #[test]
    fn bare_names_are_prodigy_variables_or_left_for_the_shell() {
        let mut vars = Vars::default();
        vars.set("name", json!("Al"));
        let t = prodigy_grammar::template::Template::parse("$name in $PWD, ${HOME:-x}").unwrap();
        let home = std::env::var("HOME").unwrap_or_else(|_| "x".into());
        assert_eq!(t.render(&vars).unwrap(), format!("Al in $PWD, {home}"));
    }

    #[test]
    fn derived_names_never_replace_the_inherited_environment() {
        let mut vars = Vars::default();
        vars.set("path", json!("src/main.rs"));
        vars.set("shell", json!({"output": "x", "exit_code": 0}));
        vars.set("build", json!("ok"));
        let env = vars.environment();
        assert!(
            env.iter().all(|(k, _)| k != "PATH" && k != "SHELL"),
            "{env:?}"
        );
        assert!(env.contains(&("BUILD".to_owned(), "ok".to_owned())));
        assert!(env.contains(&("SHELL_OUTPUT".to_owned(), "x".to_owned())));
    }

    #[test]
    fn huge_derived_values_stay_out_of_the_environment() {
        let mut vars = Vars::default();
        vars.set("map", json!({"total": 2, "results": ["x".repeat(200_000)]}));
        let env = vars.environment();
        assert!(env.iter().any(|(k, v)| k == "MAP_TOTAL" && v == "2"));
        assert!(
            !env.iter().any(|(k, _)| k == "MAP"),
            "the whole map is too big"
        );
    }

    #[test]
    fn an_empty_secret_masks_nothing() {
        let mut secrets = Secrets::default();
        secrets.add("");
        assert_eq!(secrets.mask("plain text"), "plain text");
    }

    #[test]
    fn variables_are_exported_under_shell_safe_names() {
        let mut vars = Vars::default();
        vars.set("item", json!({"id": 7, "location": {"file": "a"}}));
        vars.set_exported("TARGET", json!("prod"));
        let env = vars.environment();
        assert!(env.contains(&("ITEM_ID".into(), "7".into())));
        assert!(env.contains(&("TARGET".into(), "prod".into())));
    }
}

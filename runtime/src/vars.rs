//! The variables a run has: workflow env, secrets, captures, handler and item variables,
//! and how they are read by templates and conditions, exported to processes, and masked.

use std::borrow::Cow;
use std::collections::BTreeMap;

use prodigy_grammar::expr::{Context, EvalError};
use prodigy_grammar::path::{Path, Segment, lookup_segments};
use prodigy_grammar::template::Scope;
use prodigy_plan::support::{EXPORT_SEPARATOR, RESERVED_ENV, export_field, export_root};
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

/// The shortest line of a multi-line secret that is masked on its own: shorter lines (a
/// lone brace, a blank line) would mask ordinary text everywhere.
const MIN_SECRET_LINE: usize = 4;

/// Starts a secret's key in sealed text (see [`Secrets::seal`]); doubled, it stands for
/// itself.
const SEAL_OPEN: char = '\u{1}';
/// Ends a secret's key in sealed text.
const SEAL_CLOSE: char = '\u{2}';

/// Secret values to mask: never empty, each once, longest first (so that a secret that
/// contains another is masked whole). Each has a key: the secret's name, or for a line of a
/// multi-line secret, the name and the line's number (`KEY:2`), which is how sealed text
/// names it.
#[derive(Clone, Debug, Default)]
pub struct Secrets(Vec<(String, String)>);

impl Secrets {
    /// Whether no secret is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Registers the secret NAME's VALUE, and each line of a multi-line value on its own (a
    /// line shows alone wherever output is cut into lines). An empty value would mask
    /// between every character, so it is not registered.
    pub fn add(&mut self, name: &str, value: &str) {
        self.insert(name, value);
        if value.contains('\n') {
            for (n, line) in value.lines().enumerate() {
                let line = line.trim();
                if line.chars().count() >= MIN_SECRET_LINE {
                    self.insert(&format!("{name}:{}", n + 1), line);
                }
            }
        }
    }

    fn insert(&mut self, name: &str, value: &str) {
        if value.is_empty() || self.0.iter().any(|(_, s)| s == value) {
            return;
        }
        // Two secrets of one name (a profile's over the workflow's) keep distinct keys.
        let mut key = name.to_owned();
        let mut n = 1;
        while self.0.iter().any(|(k, _)| *k == key) {
            n += 1;
            key = format!("{name}#{n}");
        }
        self.0.push((key, value.to_owned()));
        self.0.sort_by_key(|(_, s)| std::cmp::Reverse(s.len()));
    }

    /// Replaces every secret value in `text` with `***`.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (_, secret) in &self.0 {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "***");
            }
        }
        out
    }

    /// Masks secrets in every string and every object key of a JSON value.
    pub fn mask_json(&self, value: Value) -> Value {
        if self.0.is_empty() {
            return value;
        }
        map_json(value, &|s| self.mask(s))
    }

    /// TEXT with every secret value replaced by its key between [`SEAL_OPEN`] and
    /// [`SEAL_CLOSE`] (and a [`SEAL_OPEN`] of its own doubled): what is written to a
    /// checkpoint, so that the secret never reaches the disk and [`Secrets::unseal`] puts
    /// it back on resume.
    pub fn seal(&self, text: &str) -> String {
        if !text.contains(SEAL_OPEN) && !self.0.iter().any(|(_, s)| text.contains(s.as_str())) {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if let Some((key, secret)) = self.0.iter().find(|(_, s)| rest.starts_with(s.as_str())) {
                out.push(SEAL_OPEN);
                out.push_str(key);
                out.push(SEAL_CLOSE);
                rest = &rest[secret.len()..];
                continue;
            }
            if c == SEAL_OPEN {
                out.push(SEAL_OPEN);
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    /// Sealed TEXT with each secret's current value back in place; a key that names no
    /// secret any more (the workflow changed) becomes `***`.
    pub fn unseal(&self, text: &str) -> String {
        if !text.contains(SEAL_OPEN) {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(SEAL_OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + SEAL_OPEN.len_utf8()..];
            if let Some(tail) = after.strip_prefix(SEAL_OPEN) {
                out.push(SEAL_OPEN);
                rest = tail;
            } else if let Some(end) = after.find(SEAL_CLOSE) {
                let key = &after[..end];
                let value = self
                    .0
                    .iter()
                    .find(|(k, _)| k == key)
                    .map_or("***", |(_, v)| v);
                out.push_str(value);
                rest = &after[end + SEAL_CLOSE.len_utf8()..];
            } else {
                out.push_str(&rest[at..]);
                rest = "";
            }
        }
        out.push_str(rest);
        out
    }

    /// [`Secrets::seal`] over every string and every object key of a JSON value.
    pub fn seal_json(&self, value: Value) -> Value {
        map_json(value, &|s| self.seal(s))
    }

    /// [`Secrets::unseal`] over every string and every object key of a JSON value.
    pub fn unseal_json(&self, value: Value) -> Value {
        map_json(value, &|s| self.unseal(s))
    }
}

/// VALUE with F applied to every string and every object key.
fn map_json(value: Value, f: &dyn Fn(&str) -> String) -> Value {
    match value {
        Value::String(s) => Value::String(f(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| map_json(v, f)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (f(&k), map_json(v, f)))
                .collect(),
        ),
        other => other,
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

    /// Sets the field at the dotted path FIELDS (`target`, `a.b`) of the object variable ROOT
    /// (made an object, as is each field on the way, if it is not one), keeping its other
    /// fields.
    pub fn set_field(&mut self, root: &str, fields: &str, value: Value) {
        let mut entry = self
            .values
            .entry(root.to_owned())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        for field in fields.split('.') {
            if !entry.is_object() {
                *entry = Value::Object(serde_json::Map::new());
            }
            let Value::Object(map) = entry else {
                return;
            };
            entry = map.entry(field.to_owned()).or_insert(Value::Null);
        }
        *entry = value;
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

    /// The environment exported to a process: the names the workflow exports (env, profile,
    /// secrets, params) as they are, and every other variable under its exported name
    /// ([`prodigy_plan::support::exported_name`]): `build` → `BUILD`, `item_id` → `ITEM_ID`, and each field and
    /// element, nested, with `__` between the parts: `item.id` → `ITEM__ID`,
    /// `item.files[0]` → `ITEM__FILES__0`, a capture's `build.stderr` → `BUILD__STDERR`.
    /// Each holds the text `${...}` renders for the path, so a script reads
    /// `"$ITEM__ID"` where a template would splice `${item.id}`.
    ///
    /// What is left out: a variable whose name another takes (a name the workflow exports as
    /// it is, or a variable spelled in upper case over one in lower case) with its fields; a
    /// variable (not a field) named like one of [`RESERVED_ENV`] or like a variable prodigy
    /// inherited (`capture: path` must not become `PATH`); a value over 100 kB (Linux refuses
    /// an environment string over 128 kB, and `${map.results}` can be far larger); and,
    /// once 512 kB are exported, the rest, deepest fields first. Templates still read them all.
    pub fn environment(&self) -> Vec<(String, String)> {
        self.environment_left_out().0
    }

    /// [`Self::environment`], and what it left out that a command might read.
    pub fn environment_left_out(&self) -> (Vec<(String, String)>, LeftOut) {
        let mut left_out = LeftOut::default();
        let mut out: Vec<(String, String)> = Vec::new();
        let mut budget = MAX_DERIVED_TOTAL;
        // Roots spelled as their exported name come first, so that `BUILD` wins over `build`.
        let mut roots: Vec<(String, &String)> = self
            .values
            .keys()
            .filter(|name| !self.exported.contains(name))
            .filter_map(|name| Some((export_root(name)?, name)))
            .filter(|(env, _)| !self.exported.contains(env))
            .collect();
        roots.sort_by_key(|(env, name)| (env.clone(), *env != **name));
        roots.dedup_by(|later, first| later.0 == first.0);
        // Breadth first: every variable, then every field, then their fields... A value that
        // does not fit is left out while its siblings still get their turn, and the walk goes
        // no deeper than the level where the budget first fell short.
        let mut full = false;
        let mut level: Vec<(String, Node<'_>)> = Vec::new();
        for (env, name) in roots {
            let node = Node {
                value: &self.values[name],
                meta: self.meta.get(name),
            };
            let own_name =
                std::env::var_os(&env).is_none() && !RESERVED_ENV.contains(&env.as_str());
            if own_name {
                full |= !export(
                    &mut out,
                    &mut budget,
                    &mut left_out,
                    env.clone(),
                    node.value,
                );
            }
            left_out.roots.push(env.clone());
            level.push((env, node));
        }
        'levels: while !level.is_empty() && !full {
            let mut next = Vec::new();
            for (env, node) in &level {
                for (part, child) in node.children() {
                    if budget == 0 {
                        full = true;
                        break 'levels;
                    }
                    let name = format!("{env}{EXPORT_SEPARATOR}{part}");
                    full |= !export(
                        &mut out,
                        &mut budget,
                        &mut left_out,
                        name.clone(),
                        child.value,
                    );
                    next.push((name, child));
                }
            }
            level = next;
        }
        left_out.budget_spent = full;
        // Names the workflow exports on purpose (env, profile, secrets, params).
        for name in &self.exported {
            if let Some(value) = self.values.get(name) {
                out.push((name.clone(), prodigy_grammar::value::render(value)));
            }
        }
        (out, left_out)
    }
}

/// The environment variables the shell script TEXT reads, `$NAME` or `${NAME...}`, each once.
pub fn env_references(text: &str) -> std::collections::BTreeSet<&str> {
    let mut names = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('$') {
        let start = at + 1 + usize::from(bytes.get(at + 1) == Some(&b'{'));
        let len = bytes
            .get(start..)
            .unwrap_or_default()
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        if len > 0
            && bytes.get(start).is_some_and(|b| !b.is_ascii_digit())
            && let Some(name) = text.get(start..start + len)
        {
            names.insert(name);
        }
    }
    names
}

/// What [`Vars::environment_left_out`] left out of a process's environment.
#[derive(Clone, Debug, Default)]
pub struct LeftOut {
    /// Names whose value renders to more than [`MAX_DERIVED`] bytes.
    too_large: std::collections::BTreeSet<String>,
    /// The [`MAX_DERIVED_TOTAL`] budget ran out: some names were not exported.
    budget_spent: bool,
    /// The exported names of the variables, whose fields are exported below them.
    roots: Vec<String>,
}

impl LeftOut {
    /// Why NAME, which a command reads from its environment, is not in ENV, when prodigy
    /// left it out; `None` for a name it exported or never had.
    pub fn why(&self, name: &str, env: &[(String, String)]) -> Option<String> {
        if env.iter().any(|(n, _)| n == name) {
            return None;
        }
        if self.too_large.contains(name) {
            return Some(format!(
                "its value is over {} kB, the most one variable exports",
                MAX_DERIVED / 1000
            ));
        }
        let derived = self.roots.iter().any(|root| {
            name == root
                || name
                    .strip_prefix(root.as_str())
                    .is_some_and(|rest| rest.starts_with(EXPORT_SEPARATOR))
        });
        (self.budget_spent && derived).then(|| {
            format!(
                "the variables exported to one command reached {} kB before it",
                MAX_DERIVED_TOTAL / 1024
            )
        })
    }
}

/// The most a process is given of derived variables, in bytes of names and values.
const MAX_DERIVED_TOTAL: usize = 512 * 1024;

/// A value to export with what it contains: a capture's value has its metadata
/// (`exit_code`, `success`, `stderr`, `duration`) as fields too, and they win over the
/// value's own fields of the same names, as they do in templates.
#[derive(Clone, Copy)]
struct Node<'v> {
    value: &'v Value,
    meta: Option<&'v Value>,
}

impl<'v> Node<'v> {
    /// The parts under this value, each with its exported form: fields with a name that has
    /// one ([`export_field`]), and elements by index.
    fn children(&self) -> Vec<(String, Node<'v>)> {
        let leaf = |value| Node { value, meta: None };
        let mut out: Vec<(String, Node<'v>)> = Vec::new();
        let meta = self.meta.and_then(Value::as_object);
        match self.value {
            Value::Object(fields) => out.extend(
                fields
                    .iter()
                    .filter(|(k, _)| {
                        !meta.is_some_and(|m| META.contains(&k.as_str()) && m.contains_key(*k))
                    })
                    .filter_map(|(k, v)| Some((export_field(k)?, leaf(v)))),
            ),
            Value::Array(items) => out.extend(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (i.to_string(), leaf(v))),
            ),
            _ => {}
        }
        if let Some(meta) = meta {
            out.extend(
                meta.iter()
                    .filter(|(k, _)| META.contains(&k.as_str()))
                    .filter_map(|(k, v)| Some((export_field(k)?, leaf(v)))),
            );
        }
        out
    }
}

/// Adds `name=value` to the environment when the value renders to at most
/// [`MAX_DERIVED`] bytes, and charges the budget; `false` when the budget had no room left
/// for it (a value too big on its own is simply never exported).
fn export(
    out: &mut Vec<(String, String)>,
    budget: &mut usize,
    left_out: &mut LeftOut,
    name: String,
    value: &Value,
) -> bool {
    let Some(text) = render_bounded(value, MAX_DERIVED) else {
        left_out.too_large.insert(name);
        return true;
    };
    let cost = name.len() + text.len() + 2;
    if cost > *budget {
        return false;
    }
    *budget -= cost;
    out.push((name, text));
    true
}

/// [`prodigy_grammar::value::render`], or `None` as soon as the text passes `limit` bytes
/// (a huge value is never rendered whole just to find it is too big).
fn render_bounded(value: &Value, limit: usize) -> Option<String> {
    use std::io::Write as _;
    struct Bounded(Vec<u8>, usize);
    impl std::io::Write for Bounded {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0.len() + buf.len() > self.1 {
                return Err(std::io::Error::other("too long"));
            }
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    match value {
        Value::Array(items) if items.iter().all(|v| !v.is_array() && !v.is_object()) => {
            let mut out = Bounded(Vec::new(), limit);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b" ").ok()?;
                }
                out.write_all(prodigy_grammar::value::render(item).as_bytes())
                    .ok()?;
            }
            String::from_utf8(out.0).ok()
        }
        Value::Array(_) | Value::Object(_) => {
            let mut out = Bounded(Vec::new(), limit);
            serde_json::to_writer(&mut out, value).ok()?;
            String::from_utf8(out.0).ok()
        }
        scalar => Some(prodigy_grammar::value::render(scalar)).filter(|t| t.len() <= limit),
    }
}

impl Scope for Vars {
    fn get(&self, path: &Path) -> Option<Value> {
        self.lookup(path).map(Cow::into_owned)
    }

    /// A bare `$NAME` is a prodigy variable or left for the shell: never the environment
    /// prodigy itself inherited (docs/language.md §7).
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

    #[test]
    fn a_script_reads_the_names_after_a_dollar() {
        let names = env_references("echo \"$ITEM__BLOB\" ${ITEM__ID:-x} $1 $ $$ ${#A} cost=5$");
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["ITEM__BLOB", "ITEM__ID"]
        );
    }

    /// A value too big to export, or one the budget had no room for, is said to be left
    /// out; a name that was exported, or that no variable has, is not.
    #[test]
    fn what_was_left_out_is_said() {
        let mut vars = Vars::default();
        vars.set(
            "item",
            serde_json::json!({"id": 7, "blob": "x".repeat(MAX_DERIVED + 1)}),
        );
        let (env, left_out) = vars.environment_left_out();
        assert!(
            left_out
                .why("ITEM__BLOB", &env)
                .unwrap()
                .contains("over 100 kB")
        );
        assert!(left_out.why("ITEM", &env).is_some());
        assert_eq!(left_out.why("ITEM__ID", &env), None);
        assert_eq!(left_out.why("ITEM__NOPE", &env), None);
        let mut many = Vars::default();
        let big: Vec<String> = (0..100).map(|_| "y".repeat(60_000)).collect();
        many.set("parts", serde_json::json!(big));
        let (env, left_out) = many.environment_left_out();
        assert!(env.iter().any(|(n, _)| n == "PARTS__0"));
        assert!(!env.iter().any(|(n, _)| n == "PARTS__99"));
        assert!(left_out.why("PARTS__99", &env).unwrap().contains("512 kB"));
        assert_eq!(left_out.why("PARTS__0", &env), None);
    }
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
        secrets.add("A", "abc");
        secrets.add("B", "abcdef");
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
        assert!(env.contains(&("SHELL__OUTPUT".to_owned(), "x".to_owned())));
    }

    #[test]
    fn huge_derived_values_stay_out_of_the_environment() {
        let mut vars = Vars::default();
        vars.set("map", json!({"total": 2, "results": ["x".repeat(200_000)]}));
        let env = vars.environment();
        assert!(env.iter().any(|(k, v)| k == "MAP__TOTAL" && v == "2"));
        assert!(
            !env.iter().any(|(k, _)| k == "MAP"),
            "the whole map is too big"
        );
    }

    #[test]
    fn an_empty_secret_masks_nothing() {
        let mut secrets = Secrets::default();
        secrets.add("E", "");
        assert_eq!(secrets.mask("plain text"), "plain text");
    }

    #[test]
    fn every_line_of_a_multi_line_secret_is_masked_and_the_whole_value_too() {
        let mut secrets = Secrets::default();
        secrets.add(
            "KEY",
            "-----BEGIN KEY-----\nc2VjcmV0\n}\n-----END KEY-----\n",
        );
        assert_eq!(
            secrets.mask("got -----BEGIN KEY-----\nc2VjcmV0\n}\n-----END KEY-----\n!"),
            "got ***!"
        );
        // Output cut into lines shows each line alone; a short line masks nothing.
        assert_eq!(secrets.mask("last: -----END KEY-----"), "last: ***");
        assert_eq!(secrets.mask("  c2VjcmV0"), "  ***");
        assert_eq!(secrets.mask("{ x }"), "{ x }");
    }

    #[test]
    fn json_keys_are_masked_too() {
        let mut secrets = Secrets::default();
        secrets.add("TOKEN", "tok-123");
        assert_eq!(
            secrets.mask_json(json!({"tok-123": {"Bearer tok-123": "tok-123"}})),
            json!({"***": {"Bearer ***": "***"}})
        );
    }

    #[test]
    fn sealed_values_keep_no_secret_and_unseal_to_the_original() {
        let mut secrets = Secrets::default();
        secrets.add("TOKEN", "tok-123");
        secrets.add("PEM", "line-one\nline-two");
        let value = json!({
            "auth": "Bearer tok-123",
            "tok-123": ["x\u{1}y", "\u{1}\u{1}", "line-two alone", 5],
            "pem": "line-one\nline-two",
        });
        let sealed = secrets.seal_json(value.clone());
        let text = sealed.to_string();
        assert!(
            !text.contains("tok-123") && !text.contains("line-"),
            "{text}"
        );
        assert_eq!(secrets.unseal_json(sealed.clone()), value);
        // A secret the workflow no longer has comes back masked.
        let mut other = Secrets::default();
        other.add("PEM", "line-one\nline-two");
        assert_eq!(other.unseal_json(sealed)["auth"], json!("Bearer ***"));
        // Text without secrets is kept as it is, and so is text that was never sealed.
        assert_eq!(secrets.seal("plain"), "plain");
        assert_eq!(secrets.unseal("Bearer ***"), "Bearer ***");
    }

    #[test]
    fn variables_are_exported_under_shell_safe_names() {
        let mut vars = Vars::default();
        vars.set("item", json!({"id": 7, "location": {"file": "a"}}));
        vars.set_exported("TARGET", json!("prod"));
        let env = vars.environment();
        assert!(env.contains(&("ITEM__ID".into(), "7".into())));
        assert!(env.contains(&("ITEM__LOCATION__FILE".into(), "a".into())));
        assert!(env.contains(&("TARGET".into(), "prod".into())));
    }

    fn lookup(env: &[(String, String)], name: &str) -> Option<String> {
        let found: Vec<&String> = env
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v)
            .collect();
        assert!(found.len() <= 1, "{name} exported {} times", found.len());
        found.first().map(|v| (*v).clone())
    }

    /// `${item.id}` was exported as `ITEM_ID`, the name of `${item_id}` (the internal
    /// `item_0`), and the later of the two won.
    #[test]
    fn a_field_never_shares_a_name_with_a_variable() {
        let mut vars = Vars::default();
        vars.set(
            "item",
            json!({"id": "abc", "total": 9, "index": "x", "json": "j"}),
        );
        vars.set("item_id", json!("item_0"));
        vars.set("item_index", json!(0));
        vars.set("item_total", json!(3));
        vars.set("item_json", json!("{}"));
        let env = vars.environment();
        for (name, value) in [
            ("ITEM__ID", "abc"),
            ("ITEM_ID", "item_0"),
            ("ITEM__INDEX", "x"),
            ("ITEM_INDEX", "0"),
            ("ITEM__TOTAL", "9"),
            ("ITEM_TOTAL", "3"),
            ("ITEM__JSON", "j"),
            ("ITEM_JSON", "{}"),
        ] {
            assert_eq!(lookup(&env, name).as_deref(), Some(value), "{name}");
        }
    }

    #[test]
    fn nested_fields_elements_and_capture_metadata_are_exported() {
        let mut vars = Vars::default();
        vars.set(
            "data",
            json!({"files": ["a.rs", {"path": "b.rs"}], "stderr": "own", "camelCase": 1, "a__b": 2}),
        );
        vars.meta.insert(
            "data".into(),
            json!({"exit_code": 0, "success": true, "stderr": "warn", "duration": 0.5}),
        );
        vars.set("build", json!("done"));
        vars.meta
            .insert("build".into(), json!({"exit_code": 2, "stderr": "oops"}));
        let env = vars.environment();
        for (name, value) in [
            ("DATA__FILES__0", Some("a.rs")),
            ("DATA__FILES__1__PATH", Some("b.rs")),
            ("DATA__FILES__1", Some(r#"{"path":"b.rs"}"#)),
            // Metadata wins over a field of the same name, as in `${data.stderr}`.
            ("DATA__STDERR", Some("warn")),
            ("DATA__EXIT_CODE", Some("0")),
            ("DATA__DURATION", Some("0.5")),
            ("BUILD", Some("done")),
            ("BUILD__STDERR", Some("oops")),
            ("BUILD__EXIT_CODE", Some("2")),
            // Keys that upper-case ambiguously have no name.
            ("DATA__CAMELCASE", None),
            ("DATA__A__B", None),
        ] {
            assert_eq!(lookup(&env, name).as_deref(), value, "{name}");
        }
    }

    #[test]
    fn a_name_the_workflow_spells_out_wins_with_nothing_of_the_other() {
        let mut vars = Vars::default();
        vars.set("build", json!({"x": "lower"}));
        vars.set("BUILD", json!({"x": "upper"}));
        vars.set("line", json!({"x": "captured"}));
        vars.set_exported("LINE", json!("from env"));
        let env = vars.environment();
        assert_eq!(lookup(&env, "BUILD__X").as_deref(), Some("upper"));
        assert_eq!(lookup(&env, "LINE").as_deref(), Some("from env"));
        assert_eq!(lookup(&env, "LINE__X"), None);
    }

    #[test]
    fn a_value_that_does_not_fit_leaves_room_for_smaller_ones() {
        let mut vars = Vars::default();
        for name in ["a", "b", "c", "d", "e", "f"] {
            vars.set(name, json!("x".repeat(90_000)));
        }
        vars.set("zz", json!("small"));
        let env = vars.environment();
        // Five of 90 kB fit in 512 kB, the sixth does not, and the small one after it does.
        assert!(lookup(&env, "E").is_some());
        assert_eq!(lookup(&env, "F"), None);
        assert_eq!(lookup(&env, "ZZ").as_deref(), Some("small"));
    }

    #[test]
    fn the_environment_stays_within_its_budget() {
        let mut vars = Vars::default();
        let big: Vec<Value> = (0..100_000)
            .map(|i| json!({"n": i, "name": "x".repeat(20)}))
            .collect();
        vars.set("map", json!({"total": 100_000, "results": big}));
        vars.set("zeta", json!("last root"));
        let env = vars.environment();
        let size: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        assert!(size <= MAX_DERIVED_TOTAL, "{size}");
        // Shallow names first: every root and top field is there.
        assert_eq!(lookup(&env, "MAP__TOTAL").as_deref(), Some("100000"));
        assert_eq!(lookup(&env, "ZETA").as_deref(), Some("last root"));
        assert!(lookup(&env, "MAP__RESULTS__0").is_some());
        assert_eq!(lookup(&env, "MAP__RESULTS__99999"), None);
        assert_eq!(lookup(&env, "MAP__RESULTS__0__N"), None);
    }
}

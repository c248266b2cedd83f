//! Typed access to the keys of a mapping, checked against the mapping's shape.
//!
//! Lowering reads a mapping only through [`Fields`], built from the mapping and its entry of
//! the shapes table (the table that also drives V001, `prodigy schema` and `prodigy lsp`).
//! Every read names a key; a key the shape does not declare is a bug in lowering (it would
//! silently read nothing), so it is recorded and reported as an internal error (`ICE`) at the
//! mapping, never a panic. The typed readers take their label from the key (`` `timeout` ``),
//! so call sites no longer repeat it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use super::Lowerer;
use crate::ast::{Condition, Template};
use crate::diagnostics::{Code, Diagnostic};
use crate::shapes::Shape;
use crate::source::{Span, Spanned};
use crate::syntax::{Entry, Node};

/// Keys read that their shape does not declare, shared by every [`Fields`] of one pass.
pub(crate) type Misreads = Rc<RefCell<BTreeSet<Misread>>>;

/// One read of an undeclared key: a bug in lowering.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Misread {
    /// The mapping read.
    pub(crate) span: Span,
    /// The shape's name.
    pub(crate) shape: &'static str,
    /// The key read.
    pub(crate) key: String,
}

impl Misread {
    /// The internal error that reports it.
    pub(crate) fn diagnostic(&self) -> Diagnostic {
        Diagnostic::new(
            Code::Internal,
            format!(
                "internal error: lowering reads `{}`, which the `{}` shape does not declare",
                self.key, self.shape
            ),
        )
        .with_primary(self.span, "while reading this mapping")
        .with_help("this is a bug in prodigy; please report it with this workflow file")
    }
}

/// A mapping whose keys have been checked against its shape, read by key.
pub(crate) struct Fields<'n> {
    entries: Vec<(&'n str, &'n Entry)>,
    shape: &'static Shape,
    /// What the mapping is, in messages ("a step", "`retry_config`").
    what: String,
    /// The whole mapping, where a missing key is reported.
    span: Span,
    /// The parent named in labels (`` `map.input` ``), if any.
    parent: Option<&'static str>,
    misreads: Misreads,
}

impl<'n> Fields<'n> {
    pub(crate) fn new(
        entries: Vec<(&'n str, &'n Entry)>,
        shape: &'static Shape,
        what: &str,
        span: Span,
        misreads: Misreads,
    ) -> Self {
        Fields {
            entries,
            shape,
            what: what.to_owned(),
            span,
            parent: None,
            misreads,
        }
    }

    /// The same mapping, its labels qualified by PARENT (`` `slurm.time` ``).
    pub(crate) fn within(&self, parent: &'static str) -> Self {
        Fields {
            entries: self.entries.clone(),
            shape: self.shape,
            what: self.what.clone(),
            span: self.span,
            parent: Some(parent),
            misreads: Rc::clone(&self.misreads),
        }
    }

    /// Whether the shape declares KEY; an undeclared key is recorded as a lowering bug.
    fn declared(&self, key: &str) -> bool {
        if self.shape.key(key).is_some() {
            return true;
        }
        self.misreads.borrow_mut().insert(Misread {
            span: self.span,
            shape: self.shape.name,
            key: key.to_owned(),
        });
        false
    }

    /// The entry for a key.
    pub(crate) fn entry(&self, key: &str) -> Option<&'n Entry> {
        if !self.declared(key) {
            return None;
        }
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, e)| *e)
    }

    /// The value node for a key.
    pub(crate) fn node(&self, key: &str) -> Option<&'n Node> {
        self.entry(key).map(|e| &e.value)
    }

    /// Whether a key is present.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.entry(key).is_some()
    }

    /// The keys present, in source order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (&'n str, &'n Entry)> + '_ {
        self.entries.iter().copied()
    }

    /// The label of a key in messages: `` `key` `` or `` `parent.key` ``.
    pub(crate) fn label(&self, key: &str) -> String {
        match self.parent {
            Some(parent) => format!("`{parent}.{key}`"),
            None => format!("`{key}`"),
        }
    }

    /// A key's value converted by CONVERT, which reports problems under the key's label.
    pub(crate) fn read<'a, T>(
        &self,
        lw: &mut Lowerer<'a>,
        key: &str,
        convert: impl FnOnce(&mut Lowerer<'a>, &'n Node, &str) -> Option<T>,
    ) -> Option<T> {
        let node = self.node(key)?;
        convert(lw, node, &self.label(key))
    }

    /// A required key's value converted by CONVERT; a missing key is a
    /// [`Code::MissingKey`] diagnostic on the mapping, with HELP.
    pub(crate) fn require<'a, T>(
        &self,
        lw: &mut Lowerer<'a>,
        key: &str,
        help: &str,
        convert: impl FnOnce(&mut Lowerer<'a>, &'n Node, &str) -> Option<T>,
    ) -> Option<T> {
        let Some(node) = self.node(key) else {
            lw.missing(self.span, &self.what, key, help);
            return None;
        };
        convert(lw, node, &self.label(key))
    }

    /// The value node of a required key, or a [`Code::MissingKey`] diagnostic.
    pub(crate) fn required(&self, lw: &mut Lowerer<'_>, key: &str, help: &str) -> Option<&'n Node> {
        self.require(lw, key, help, |_, node, _| Some(node))
    }

    /// The entry for `key` or its alias; both together are an error (the key wins).
    pub(crate) fn aliased(
        &self,
        lw: &mut Lowerer<'_>,
        key: &str,
        alias: &str,
    ) -> Option<&'n Entry> {
        match (self.entry(key), self.entry(alias)) {
            (Some(k), Some(a)) => {
                lw.push(
                    Diagnostic::new(
                        Code::DuplicateKey,
                        format!("`{alias}` and `{key}` are the same key"),
                    )
                    .with_primary(a.key.span, format!("`{alias}` is an alias of `{key}`"))
                    .with_label(k.key.span, format!("`{key}` is set here"))
                    .with_help(format!("keep `{key}` and remove `{alias}`")),
                );
                Some(k)
            }
            (Some(e), None) | (None, Some(e)) => Some(e),
            (None, None) => None,
        }
    }

    /// A `${...}` template.
    pub(crate) fn template(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Template> {
        self.read(lw, key, Lowerer::template)
    }

    /// A template or a list of templates; absent is empty.
    pub(crate) fn templates(&self, lw: &mut Lowerer<'_>, key: &str) -> Vec<Template> {
        self.read(lw, key, |lw, n, what| Some(lw.template_list(n, what)))
            .unwrap_or_default()
    }

    /// A `when`-language condition.
    pub(crate) fn condition(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Condition> {
        self.read(lw, key, Lowerer::condition)
    }

    /// A string (numbers and booleans as their text).
    pub(crate) fn string(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Spanned<String>> {
        self.read(lw, key, Lowerer::string)
    }

    /// A string or a list of strings; `None` when the key is absent.
    pub(crate) fn strings(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Vec<Spanned<String>>> {
        self.read(lw, key, |lw, n, what| Some(lw.string_list(n, what)))
    }

    /// A boolean, or `None` when absent or not a boolean.
    pub(crate) fn boolean(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<bool> {
        self.read(lw, key, Lowerer::boolean)
    }

    /// A boolean with a default.
    pub(crate) fn flag(&self, lw: &mut Lowerer<'_>, key: &str, default: bool) -> bool {
        self.boolean(lw, key).unwrap_or(default)
    }

    /// A whole number in `min..=max`.
    pub(crate) fn integer(
        &self,
        lw: &mut Lowerer<'_>,
        key: &str,
        min: i64,
        max: i64,
    ) -> Option<Spanned<i64>> {
        self.read(lw, key, |lw, n, what| lw.integer(n, what, min, max))
    }

    /// A whole number ≥ `min` that fits in `u32`.
    pub(crate) fn u32(&self, lw: &mut Lowerer<'_>, key: &str, min: u32) -> Option<Spanned<u32>> {
        self.read(lw, key, |lw, n, what| lw.count(n, what, min))
    }

    /// A whole number ≥ `min` as `u64`.
    pub(crate) fn u64(&self, lw: &mut Lowerer<'_>, key: &str, min: u64) -> Option<Spanned<u64>> {
        self.read(lw, key, |lw, n, what| lw.size(n, what, min))
    }

    /// A number of attempts (1 to the most a retry may ask for).
    pub(crate) fn attempts(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Spanned<u32>> {
        self.read(lw, key, Lowerer::attempts)
    }

    /// A number in `min..=max`.
    pub(crate) fn number(
        &self,
        lw: &mut Lowerer<'_>,
        key: &str,
        min: f64,
        max: f64,
    ) -> Option<Spanned<f64>> {
        self.read(lw, key, |lw, n, what| lw.number(n, what, min, max))
    }

    /// A duration (a bare number is seconds).
    pub(crate) fn duration(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Spanned<Duration>> {
        self.read(lw, key, Lowerer::duration)
    }

    /// A delay (a bare number other than 0 needs a unit).
    pub(crate) fn delay(&self, lw: &mut Lowerer<'_>, key: &str) -> Option<Spanned<Duration>> {
        self.read(lw, key, Lowerer::delay)
    }

    /// One of a fixed set of words.
    pub(crate) fn choice<T: Clone>(
        &self,
        lw: &mut Lowerer<'_>,
        key: &str,
        choices: &[(&str, T)],
    ) -> Option<Spanned<T>> {
        self.read(lw, key, |lw, n, what| lw.choice(n, what, choices))
    }

    /// One of a fixed set of words, or DEFAULT when absent or invalid.
    pub(crate) fn choice_or<T: Clone>(
        &self,
        lw: &mut Lowerer<'_>,
        key: &str,
        choices: &[(&str, T)],
        default: T,
    ) -> T {
        self.choice(lw, key, choices).map_or(default, |c| c.value)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Lowerer;
    use crate::diagnostics::{Code, Diagnostic};
    use crate::shapes;
    use crate::source::SourceFile;
    use crate::syntax::{self, Node};

    /// Lowers TEXT's root as a step with READ, returning what READ returned and every
    /// diagnostic of the pass.
    fn with_step<T>(
        text: &str,
        read: impl FnOnce(&mut Lowerer<'_>, &Node) -> T,
    ) -> (T, Vec<Diagnostic>) {
        let file = SourceFile::new("t.yml", text);
        let root = syntax::parse(&file).root.unwrap();
        let mut lw = Lowerer::new(&file.text);
        let value = read(&mut lw, &root);
        (value, lw.finish())
    }

    #[test]
    fn a_misspelt_key_is_an_internal_error_at_the_mapping() {
        let (read, diagnostics) = with_step("shell: make\ntimeout: 30s\n", |lw, node| {
            let f = lw.fields(node, "a step", &shapes::STEP).unwrap();
            (f.duration(lw, "timeout"), f.duration(lw, "timout"))
        });
        assert_eq!(read.0.map(|d| d.value), Some(Duration::from_secs(30)));
        assert!(read.1.is_none());
        let [ice] = diagnostics.as_slice() else {
            panic!("expected one internal error, got {diagnostics:?}");
        };
        assert_eq!(ice.code, Code::Internal);
        assert_eq!(
            ice.message,
            "internal error: lowering reads `timout`, which the `step_mapping` shape does not declare"
        );
        assert_eq!(ice.primary.as_ref().map(|l| l.span.start), Some(0));
    }

    #[test]
    fn every_way_of_reading_checks_the_key() {
        let ((), diagnostics) = with_step("shell: make\n", |lw, node| {
            let f = lw.fields(node, "a step", &shapes::STEP).unwrap();
            let _ = f.has("shel");
            let _ = f.entry("entry");
            let _ = f.node("node");
            let _ = f.flag(lw, "flag", false);
            let _ = f.aliased(lw, "shell", "sh");
            let peeked = lw.peek(node, &shapes::ENV_DYNAMIC).unwrap();
            let _ = peeked.has("shell");
        });
        let mut keys: Vec<&str> = diagnostics
            .iter()
            .filter(|d| d.code == Code::Internal)
            .filter_map(|d| d.message.split('`').nth(1))
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["entry", "flag", "node", "sh", "shel", "shell"]);
    }

    #[test]
    fn labels_come_from_the_key() {
        let ((), diagnostics) = with_step("shell: make\ntimeout: soon\n", |lw, node| {
            let f = lw.fields(node, "a step", &shapes::STEP).unwrap();
            f.duration(lw, "timeout");
            f.within("step").duration(lw, "timeout");
        });
        let messages: Vec<&str> = diagnostics.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "`timeout` is not a duration",
                "`step.timeout` is not a duration"
            ]
        );
    }

    #[test]
    fn a_missing_required_key_is_reported_on_the_mapping() {
        let (path, diagnostics) = with_step("content: x\n", |lw, node| {
            let f = lw
                .fields(node, "`write_file`", &shapes::WRITE_FILE)
                .unwrap();
            f.require(lw, "path", "add `path:`", Lowerer::template)
        });
        assert!(path.is_none());
        let [missing] = diagnostics.as_slice() else {
            panic!("expected one diagnostic, got {diagnostics:?}");
        };
        assert_eq!(missing.code, Code::MissingKey);
        assert_eq!(missing.message, "`write_file` is missing `path`");
    }

    #[test]
    fn peeking_reports_nothing_about_unknown_keys() {
        let (has, diagnostics) = with_step("command: x\nbogus: 1\n", |lw, node| {
            lw.peek(node, &shapes::ENV_DYNAMIC)
                .is_some_and(|f| f.has("command"))
        });
        assert!(has);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
    }
}

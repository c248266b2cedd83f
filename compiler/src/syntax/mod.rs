//! The spanned YAML tree.
//!
//! Owns turning YAML text into [`Node`]s that remember the byte span of every key and value.
//! The tree is built from saphyr's event stream rather than a ready-made loader so that alias
//! expansion is bounded (a "billion laughs" file is rejected with [`Code::AliasBomb`] after a
//! fixed amount of work), merge keys (`<<`) are resolved, and duplicate keys are reported.
//! It must not know anything about workflows.

use saphyr_parser::{Event, Parser, ScanError, Span as YamlSpan};

use crate::diagnostics::{Code, Diagnostic};
use crate::source::{SourceFile, Span};

/// How many nodes alias expansion may copy in one document before the file is rejected.
const ALIAS_BUDGET: usize = 100_000;
/// How deeply collections may nest.
const MAX_DEPTH: usize = 200;

/// How a scalar was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarStyle {
    /// No quotes.
    Plain,
    /// `'...'`.
    SingleQuoted,
    /// `"..."`.
    DoubleQuoted,
    /// `|` block.
    Literal,
    /// `>` block.
    Folded,
}

/// A node of the YAML tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What the node holds.
    pub kind: NodeKind,
    /// Where the node was written (for an alias, where its anchor was defined).
    pub span: Span,
    /// A local tag such as `!exponential`, without the `!`; core-schema tags are resolved.
    pub tag: Option<String>,
}

/// The three YAML collections and scalars.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// A scalar with its text and style.
    Scalar {
        /// The scalar's value after unescaping.
        text: String,
        /// How it was written.
        style: ScalarStyle,
        /// A core-schema tag (`!!str`, `!!int`, ...) that forces its type.
        core_tag: Option<String>,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order, with merge keys resolved.
    Map(Vec<Entry>),
}

/// One key/value pair of a mapping.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The key node.
    pub key: Node,
    /// The value node.
    pub value: Node,
}

/// A scalar's value under the YAML 1.2 core schema.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar<'a> {
    /// `null`, `~` or nothing.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Anything else, and every quoted scalar.
    Str(&'a str),
}

impl Node {
    /// The scalar value under the core schema, or `None` for a collection.
    pub fn scalar(&self) -> Option<Scalar<'_>> {
        let NodeKind::Scalar {
            text,
            style,
            core_tag,
        } = &self.kind
        else {
            return None;
        };
        if let Some(tag) = core_tag {
            return Some(match tag.as_str() {
                "null" => Scalar::Null,
                "bool" => resolve_plain(text)
                    .filter(|s| matches!(s, Scalar::Bool(_)))
                    .unwrap_or(Scalar::Str(text)),
                "int" | "float" => resolve_plain(text).unwrap_or(Scalar::Str(text)),
                _ => Scalar::Str(text),
            });
        }
        if *style != ScalarStyle::Plain {
            return Some(Scalar::Str(text));
        }
        Some(resolve_plain(text).unwrap_or(Scalar::Str(text)))
    }

    /// The scalar's text whatever its type, or `None` for a collection.
    pub fn text(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { text, .. } => Some(text),
            NodeKind::Seq(_) | NodeKind::Map(_) => None,
        }
    }

    /// The scalar's style, or `None` for a collection.
    pub fn style(&self) -> Option<ScalarStyle> {
        match &self.kind {
            NodeKind::Scalar { style, .. } => Some(*style),
            NodeKind::Seq(_) | NodeKind::Map(_) => None,
        }
    }

    /// The entries of a mapping.
    pub fn as_map(&self) -> Option<&[Entry]> {
        match &self.kind {
            NodeKind::Map(entries) => Some(entries),
            NodeKind::Scalar { .. } | NodeKind::Seq(_) => None,
        }
    }

    /// The items of a sequence.
    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.kind {
            NodeKind::Seq(items) => Some(items),
            NodeKind::Scalar { .. } | NodeKind::Map(_) => None,
        }
    }

    /// Whether this is a null scalar (`~`, `null` or an empty value).
    pub fn is_null(&self) -> bool {
        matches!(self.scalar(), Some(Scalar::Null))
    }

    /// A short description of the node's type for messages: "a string", "a mapping", ...
    pub fn describe(&self) -> &'static str {
        match self.scalar() {
            None if self.as_seq().is_some() => "a list",
            None => "a mapping",
            Some(Scalar::Null) => "null",
            Some(Scalar::Bool(_)) => "a boolean",
            Some(Scalar::Int(_)) => "an integer",
            Some(Scalar::Float(_)) => "a number",
            Some(Scalar::Str(_)) => "a string",
        }
    }

    /// The node as JSON, scalars typed by the core schema (for `expected_schema`, the JSON
    /// Schema tests and anything else that wants the data without positions).
    pub fn to_json(&self) -> serde_json::Value {
        match &self.kind {
            NodeKind::Seq(items) => {
                serde_json::Value::Array(items.iter().map(Node::to_json).collect())
            }
            NodeKind::Map(entries) => serde_json::Value::Object(
                entries
                    .iter()
                    .map(|e| {
                        (
                            e.key.text().unwrap_or_default().to_owned(),
                            e.value.to_json(),
                        )
                    })
                    .collect(),
            ),
            NodeKind::Scalar { .. } => match self.scalar() {
                Some(Scalar::Bool(b)) => serde_json::Value::Bool(b),
                Some(Scalar::Int(i)) => serde_json::Value::from(i),
                Some(Scalar::Float(f)) => serde_json::Number::from_f64(f)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
                Some(Scalar::Str(s)) => serde_json::Value::String(s.to_owned()),
                Some(Scalar::Null) | None => serde_json::Value::Null,
            },
        }
    }

    /// How many nodes it holds and how deep it nests (a scalar: 1 and 1), without recursion.
    fn measure(&self) -> Measure {
        let mut measure = Measure { size: 0, depth: 0 };
        let mut todo = vec![(self, 1)];
        while let Some((node, depth)) = todo.pop() {
            measure.size += 1;
            measure.depth = measure.depth.max(depth);
            match &node.kind {
                NodeKind::Scalar { .. } => {}
                NodeKind::Seq(items) => todo.extend(items.iter().map(|n| (n, depth + 1))),
                NodeKind::Map(entries) => todo.extend(
                    entries
                        .iter()
                        .flat_map(|e| [(&e.key, depth + 1), (&e.value, depth + 1)]),
                ),
            }
        }
        measure
    }
}

fn too_deep(here: Span, label: String) -> Diagnostic {
    Diagnostic::new(Code::TooDeep, "the YAML nests too deeply")
        .with_primary(here, label)
        .with_help("flatten the structure; real workflows nest only a few levels")
}

/// The size and depth of an anchored node, which every alias to it copies.
#[derive(Clone, Copy, Debug)]
struct Measure {
    size: usize,
    depth: usize,
}

fn resolve_plain(text: &str) -> Option<Scalar<'_>> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Scalar::Null),
        "true" | "True" | "TRUE" => return Some(Scalar::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Scalar::Bool(false)),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Some(Scalar::Float(f64::INFINITY));
        }
        "-.inf" | "-.Inf" | "-.INF" => return Some(Scalar::Float(f64::NEG_INFINITY)),
        ".nan" | ".NaN" | ".NAN" => return Some(Scalar::Float(f64::NAN)),
        _ => {}
    }
    let bytes = text.as_bytes();
    let first = *bytes.first()?;
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.')) {
        return None;
    }
    if let Some(hex) = text.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16).ok().map(Scalar::Int);
    }
    if let Some(oct) = text.strip_prefix("0o") {
        return i64::from_str_radix(oct, 8).ok().map(Scalar::Int);
    }
    if text
        .bytes()
        .enumerate()
        .all(|(i, b)| b.is_ascii_digit() || (i == 0 && matches!(b, b'-' | b'+')))
    {
        return text.parse().ok().map(Scalar::Int);
    }
    let looks_float = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        && text.bytes().any(|b| b.is_ascii_digit());
    if looks_float {
        return text.parse().ok().map(Scalar::Float);
    }
    None
}

/// The result of parsing: the root node (absent when the text is not valid YAML) and problems.
#[derive(Debug)]
pub struct Document {
    /// The first document's root, or `None` when parsing failed or the file is empty.
    pub root: Option<Node>,
    /// YAML-level problems.
    pub diagnostics: Vec<Diagnostic>,
}

enum Frame {
    Seq {
        start: usize,
        anchor: usize,
        tag: Option<String>,
        items: Vec<Node>,
    },
    Map {
        start: usize,
        anchor: usize,
        tag: Option<String>,
        entries: Vec<Entry>,
        key: Option<Node>,
    },
}

struct Builder<'a> {
    file: &'a SourceFile,
    /// Byte offset of every character, when the text is not pure ASCII.
    char_to_byte: Option<Vec<u32>>,
    stack: Vec<Frame>,
    anchors: std::collections::BTreeMap<usize, (Node, Measure)>,
    alias_budget: usize,
    root: Option<Node>,
    documents: usize,
    diagnostics: Vec<Diagnostic>,
}

/// Parses a file's text into a spanned tree. Never fails: problems become diagnostics.
pub fn parse(file: &SourceFile) -> Document {
    let char_to_byte = (!file.text.is_ascii()).then(|| {
        let mut offsets: Vec<u32> = file
            .text
            .char_indices()
            .map(|(i, _)| u32::try_from(i).unwrap_or(u32::MAX))
            .collect();
        offsets.push(u32::try_from(file.text.len()).unwrap_or(u32::MAX));
        offsets
    });
    let mut builder = Builder {
        file,
        char_to_byte,
        stack: Vec::new(),
        anchors: std::collections::BTreeMap::new(),
        alias_budget: ALIAS_BUDGET,
        root: None,
        documents: 0,
        diagnostics: Vec::new(),
    };
    let mut parser = Parser::new_from_str(&file.text);
    let mut ok = true;
    while let Some(next) = parser.next_event() {
        match next {
            Ok((event, span)) => {
                if let Err(diag) = builder.on_event(event, span) {
                    builder.diagnostics.push(*diag);
                    ok = false;
                    break;
                }
            }
            Err(err) => {
                builder.diagnostics.push(builder.scan_error(&err));
                ok = false;
                break;
            }
        }
    }
    Document {
        root: if ok { builder.root } else { None },
        diagnostics: builder.diagnostics,
    }
}

/// The lines of TEXT with their byte offsets.
fn lines_at(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split_inclusive('\n').scan(0, |start, line| {
        let at = *start;
        *start += line.len();
        Some((at, line.trim_end_matches(['\n', '\r'])))
    })
}

/// A key at the start of LINE: its column and name (`  - shell: make` → 4, `shell`), and
/// whether a value follows it on the line.
fn key_of(line: &str) -> Option<(usize, &str, bool)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let mut rest = &line[indent..];
    let mut column = indent;
    while let Some(after) = rest.strip_prefix("- ") {
        let spaces = after.len() - after.trim_start_matches(' ').len();
        column += 2 + spaces;
        rest = &after[spaces..];
    }
    let end = rest.find(':')?;
    let key = &rest[..end];
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    let value = rest[end + 1..].trim();
    (valid && (rest[end + 1..].is_empty() || rest[end + 1..].starts_with(' '))).then_some((
        column,
        key,
        !value.is_empty() && !value.starts_with('#'),
    ))
}

/// A YAML error (at byte AT) that a tab in the indentation, or a key indented unlike the
/// key before it, explains: said in those words, with the fix.
fn indentation_mistake(text: &str, at: usize) -> Option<Diagnostic> {
    let lines: Vec<(usize, &str)> = lines_at(text).collect();
    let line = lines
        .iter()
        .rposition(|(start, _)| *start <= at)
        .unwrap_or(0);
    // A tab indenting the line of the error or the next one (the scanner may stop at the
    // end of the line before).
    for (start, text) in lines.iter().skip(line).take(2) {
        let indent = text.len() - text.trim_start_matches([' ', '\t']).len();
        if let Some(tab) = text[..indent].find('\t') {
            let tab = start + tab;
            return Some(
                Diagnostic::new(Code::YamlSyntax, "invalid YAML: a tab in the indentation")
                    .with_primary(Span::new(tab, tab + 1), "this `␉` is a tab")
                    .with_help("replace the tab with spaces: YAML indents with spaces only"),
            );
        }
    }
    // A key indented unlike the key above it, whose value is on its line (so that this one
    // cannot be nested under it).
    let (start, here) = lines.get(line)?;
    let (column, key, _) = key_of(here)?;
    let mut keys_above = lines[..line]
        .iter()
        .rev()
        .map(|(_, l)| *l)
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let (above, above_key, has_value) = keys_above.next().and_then(key_of)?;
    // Back out to a key of an enclosing mapping: that is a well-formed line.
    let dedent = column < above
        && keys_above
            .filter_map(key_of)
            .find(|(c, _, _)| *c <= column)
            .is_some_and(|(c, _, _)| c == column);
    if column == above || !has_value || dedent {
        return None;
    }
    let at = start + column;
    Some(
        Diagnostic::new(
            Code::YamlSyntax,
            format!("invalid YAML: `{key}` is indented unlike `{above_key}` above it"),
        )
        .with_primary(
            Span::new(at, at + key.len()),
            format!(
                "starts at column {}; `{above_key}` starts at column {}",
                column + 1,
                above + 1
            ),
        )
        .with_help(format!(
            "align `{key}` with `{above_key}` (indent it {above} spaces) if it belongs to the same step or mapping"
        )),
    )
}

impl Builder<'_> {
    fn byte(&self, char_index: usize) -> usize {
        match &self.char_to_byte {
            None => char_index.min(self.file.text.len()),
            Some(map) => map
                .get(char_index)
                .map_or(self.file.text.len(), |b| *b as usize),
        }
    }

    fn span(&self, span: YamlSpan) -> Span {
        Span::new(self.byte(span.start.index()), self.byte(span.end.index()))
    }

    fn scan_error(&self, err: &ScanError) -> Diagnostic {
        let at = self.byte(err.marker().index());
        if let Some(found) = indentation_mistake(&self.file.text, at) {
            return found;
        }
        // Point at one character so the label is visible even at the end of a line.
        let end = self.file.text[at..]
            .chars()
            .next()
            .map_or(at, |c| at + c.len_utf8());
        Diagnostic::new(Code::YamlSyntax, format!("invalid YAML: {}", err.info()))
            .with_primary(Span::new(at, end), "the YAML parser stopped here")
            .with_help("fix the YAML syntax; quote values that contain `: ` or start with a special character")
    }

    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: one arm per event of the YAML parser"
    )]
    fn on_event(&mut self, event: Event<'_>, span: YamlSpan) -> Result<(), Box<Diagnostic>> {
        let here = self.span(span);
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => Ok(()),
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(Box::new(
                        Diagnostic::new(
                            Code::MultipleDocuments,
                            "a workflow file holds one YAML document",
                        )
                        .with_primary(here, "a second document starts here")
                        .with_help("split the documents into separate files"),
                    ));
                }
                Ok(())
            }
            Event::Scalar(text, style, anchor, tag) => {
                let style = match style {
                    saphyr_parser::ScalarStyle::Plain => ScalarStyle::Plain,
                    saphyr_parser::ScalarStyle::SingleQuoted => ScalarStyle::SingleQuoted,
                    saphyr_parser::ScalarStyle::DoubleQuoted => ScalarStyle::DoubleQuoted,
                    saphyr_parser::ScalarStyle::Literal => ScalarStyle::Literal,
                    saphyr_parser::ScalarStyle::Folded => ScalarStyle::Folded,
                };
                let (core_tag, tag) = split_tag(tag.as_deref());
                let node = Node {
                    kind: NodeKind::Scalar {
                        text: text.into_owned(),
                        style,
                        core_tag,
                    },
                    span: here,
                    tag,
                };
                self.complete(node, anchor);
                Ok(())
            }
            Event::SequenceStart(anchor, tag) => {
                self.open(here)?;
                let (_, tag) = split_tag(tag.as_deref());
                self.stack.push(Frame::Seq {
                    start: here.start as usize,
                    anchor,
                    tag,
                    items: Vec::new(),
                });
                Ok(())
            }
            Event::MappingStart(anchor, tag) => {
                self.open(here)?;
                let (_, tag) = split_tag(tag.as_deref());
                self.stack.push(Frame::Map {
                    start: here.start as usize,
                    anchor,
                    tag,
                    entries: Vec::new(),
                    key: None,
                });
                Ok(())
            }
            Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Seq {
                    start,
                    anchor,
                    tag,
                    items,
                }) => {
                    let end = items
                        .last()
                        .map_or(here.end as usize, |n| n.span.end as usize);
                    let span = Span::new(start, end.max(start));
                    self.complete(
                        Node {
                            kind: NodeKind::Seq(items),
                            span,
                            tag,
                        },
                        anchor,
                    );
                    Ok(())
                }
                Some(Frame::Map { .. }) | None => Err(Box::new(internal(here))),
            },
            Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Map {
                    start,
                    anchor,
                    tag,
                    entries,
                    ..
                }) => {
                    let end = entries.last().map_or(here.end as usize, |e| {
                        e.value.span.end.max(e.key.span.end) as usize
                    });
                    let span = Span::new(start, end.max(start));
                    let entries = self.resolve_map(entries);
                    self.complete(
                        Node {
                            kind: NodeKind::Map(entries),
                            span,
                            tag,
                        },
                        anchor,
                    );
                    Ok(())
                }
                Some(Frame::Seq { .. }) | None => Err(Box::new(internal(here))),
            },
            Event::Alias(id) => {
                let Some((node, measure)) = self.anchors.get(&id) else {
                    return Err(Box::new(
                        Diagnostic::new(Code::YamlSyntax, "invalid YAML: unknown anchor")
                            .with_primary(here, "this alias names no anchor")
                            .with_help("define the anchor with `&name` before using `*name`"),
                    ));
                };
                let size = measure.size;
                // An alias copies the anchored node here: depth as written plus its own.
                if self.stack.len() + measure.depth > MAX_DEPTH {
                    return Err(Box::new(too_deep(
                        here,
                        format!("expanding this alias nests more than {MAX_DEPTH} levels"),
                    )));
                }
                if size > self.alias_budget {
                    return Err(Box::new(
                        Diagnostic::new(Code::AliasBomb, "alias expansion is too large")
                            .with_primary(here, "expanding this alias exceeds the limit")
                            .with_help(format!(
                                "aliases may expand to at most {ALIAS_BUDGET} nodes in one file; write the repeated parts out or use fewer nested aliases"
                            )),
                    ));
                }
                self.alias_budget -= size;
                let node = node.clone();
                self.complete(node, 0);
                Ok(())
            }
        }
    }

    fn open(&self, here: Span) -> Result<(), Box<Diagnostic>> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(Box::new(too_deep(
                here,
                format!("more than {MAX_DEPTH} levels of nesting"),
            )));
        }
        Ok(())
    }

    fn complete(&mut self, node: Node, anchor: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), node.measure()));
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => *key = Some(node),
                Some(k) => entries.push(Entry {
                    key: k,
                    value: node,
                }),
            },
        }
    }

    /// Resolves merge keys and reports duplicate keys.
    fn resolve_map(&mut self, entries: Vec<Entry>) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::with_capacity(entries.len());
        // Key text → index in `out`, so that large mappings stay linear.
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let mut merged: Vec<Entry> = Vec::new();
        for entry in entries {
            let is_merge = entry.key.tag.is_none()
                && entry.key.style() == Some(ScalarStyle::Plain)
                && entry.key.text() == Some("<<");
            if is_merge {
                match &entry.value.kind {
                    NodeKind::Map(inner) => merged.extend(inner.iter().cloned()),
                    NodeKind::Seq(items) if items.iter().all(|n| n.as_map().is_some()) => {
                        for item in items {
                            merged.extend(item.as_map().unwrap_or_default().iter().cloned());
                        }
                    }
                    NodeKind::Scalar { .. } | NodeKind::Seq(_) => self.diagnostics.push(
                        Diagnostic::new(
                            Code::WrongType,
                            "a merge key needs a mapping or a list of mappings",
                        )
                        .with_primary(
                            entry.value.span,
                            format!("found {}", entry.value.describe()),
                        )
                        .with_help("write `<<: *anchor` where the anchor names a mapping"),
                    ),
                }
                continue;
            }
            let prev = entry
                .key
                .text()
                .and_then(|k| seen.get(k))
                .and_then(|i| out.get(*i));
            if let Some(prev) = prev {
                self.diagnostics.push(
                    Diagnostic::new(
                        Code::DuplicateKey,
                        format!("duplicate key `{}`", entry.key.text().unwrap_or("?")),
                    )
                    .with_primary(entry.key.span, "this key is already set")
                    .with_label(prev.key.span, "first set here")
                    .with_help("remove one of the two; YAML keeps only one value per key"),
                );
                continue;
            }
            if let Some(k) = entry.key.text() {
                seen.insert(k.to_owned(), out.len());
            }
            out.push(entry);
        }
        // Explicit keys win over merged ones; among merged ones, the first wins.
        for entry in merged {
            let Some(k) = entry.key.text() else { continue };
            if !seen.contains_key(k) {
                seen.insert(k.to_owned(), out.len());
                out.push(entry);
            }
        }
        out
    }
}

fn split_tag(tag: Option<&saphyr_parser::Tag>) -> (Option<String>, Option<String>) {
    match tag {
        None => (None, None),
        Some(tag) if tag.is_yaml_core_schema() => (Some(tag.suffix.clone()), None),
        Some(tag) => (None, Some(tag.suffix.clone())),
    }
}

fn internal(span: Span) -> Diagnostic {
    Diagnostic::new(Code::Internal, "internal error: unbalanced YAML events")
        .with_primary(span, "while reading this")
        .with_help("this is a bug in prodigy; please report it with the file")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> (SourceFile, Document) {
        let file = SourceFile::new("t.yml", text);
        let doc = parse(&file);
        (file, doc)
    }

    #[test]
    fn spans_cover_keys_and_values_exactly() {
        let (file, doc) = parse_str("name: demo\ncommands:\n  - shell: \"echo hi\"\n");
        let root = doc.root.unwrap();
        let map = root.as_map().unwrap();
        assert_eq!(file.slice(map[0].key.span), "name");
        assert_eq!(file.slice(map[0].value.span), "demo");
        let step = &map[1].value.as_seq().unwrap()[0];
        let entry = &step.as_map().unwrap()[0];
        assert_eq!(file.slice(entry.key.span), "shell");
        assert_eq!(file.slice(entry.value.span), "\"echo hi\"");
    }

    #[test]
    fn spans_are_bytes_after_multibyte_text() {
        let (file, doc) = parse_str("é: ü\nkey: value\n");
        let root = doc.root.unwrap();
        let map = root.as_map().unwrap();
        assert_eq!(file.slice(map[1].key.span), "key");
        assert_eq!(file.slice(map[1].value.span), "value");
    }

    #[test]
    fn plain_scalars_resolve_with_the_core_schema() {
        let (_, doc) = parse_str("[1, 2.5, true, ~, '1', abc, 0x10]");
        let root = doc.root.unwrap();
        let values: Vec<_> = root
            .as_seq()
            .unwrap()
            .iter()
            .map(|n| n.scalar().unwrap())
            .collect();
        assert_eq!(
            values,
            [
                Scalar::Int(1),
                Scalar::Float(2.5),
                Scalar::Bool(true),
                Scalar::Null,
                Scalar::Str("1"),
                Scalar::Str("abc"),
                Scalar::Int(16)
            ]
        );
    }

    #[test]
    fn merge_keys_fill_missing_entries() {
        let (_, doc) = parse_str("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  b: 3\n");
        let root = doc.root.unwrap();
        let x = &root.as_map().unwrap()[1].value;
        let pairs: Vec<_> = x
            .as_map()
            .unwrap()
            .iter()
            .map(|e| (e.key.text().unwrap(), e.value.text().unwrap()))
            .collect();
        assert_eq!(pairs, [("b", "3"), ("a", "1")]);
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let (_, doc) = parse_str("a: 1\na: 2\n");
        assert_eq!(doc.diagnostics.len(), 1);
        assert_eq!(doc.diagnostics[0].code, Code::DuplicateKey);
    }

    #[test]
    fn billion_laughs_is_rejected_quickly() {
        let mut text = String::from(
            "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for i in 1..10 {
            let prev = format!("*a{}", i - 1);
            let items = [prev.as_str(); 9].join(",");
            text.push_str(
                &[
                    "a",
                    &i.to_string(),
                    ": &a",
                    &i.to_string(),
                    " [",
                    &items,
                    "]\n",
                ]
                .concat(),
            );
        }
        let (_, doc) = parse_str(&text);
        assert!(doc.root.is_none());
        assert_eq!(doc.diagnostics[0].code, Code::AliasBomb);
    }

    #[test]
    fn syntax_errors_point_at_the_parser_position() {
        let (file, doc) = parse_str("a: b: c\n");
        assert!(doc.root.is_none());
        let d = &doc.diagnostics[0];
        assert_eq!(d.code, Code::YamlSyntax);
        assert_eq!(
            file.line_col(d.primary.as_ref().unwrap().span.start).line,
            1
        );
    }

    #[test]
    fn tabs_and_misaligned_keys_are_named() {
        let message = |text: &str| parse_str(text).1.diagnostics[0].message.clone();
        assert_eq!(
            message("- shell: make\n\ttimeout: 5\n"),
            "invalid YAML: a tab in the indentation"
        );
        assert_eq!(
            message("- shell: make\n  timeout: 5\n capture: x\n"),
            "invalid YAML: `capture` is indented unlike `timeout` above it"
        );
        // Backing out to an enclosing mapping is well formed: the real mistake is the `: `.
        assert_eq!(
            message("- shell: make\n  on_failure:\n    shell: fix\n  timeout: x: y\n"),
            "invalid YAML: mapping values are not allowed in this context"
        );
    }

    #[test]
    fn deep_nesting_is_a_diagnostic() {
        let text = format!("{}{}", "[".repeat(250), "]".repeat(250));
        let (_, doc) = parse_str(&text);
        assert_eq!(doc.diagnostics[0].code, Code::TooDeep);
    }

    #[test]
    fn aliases_cannot_nest_past_the_limit() {
        // Each anchor is written 150 levels deep, under the limit of 200; the second holds
        // an alias to the first, so it expands to 300 levels.
        let deep = |inner: &str| format!("{}{inner}{}", "[".repeat(150), "]".repeat(150));
        let text = format!(
            "a: &a {}
b: &b {}
",
            deep("1"),
            deep("*a")
        );
        let (_, doc) = parse_str(&text);
        assert!(doc.root.is_none());
        assert_eq!(doc.diagnostics[0].code, Code::TooDeep);
    }
}

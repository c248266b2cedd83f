//! Variable and field paths: `a.b[0].c`.

use std::fmt;

/// One step of a path after its root.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Segment {
    /// `.name`
    Field(String),
    /// `[n]`; negative counts from the end.
    Index(i64),
}

/// A path such as `item.location.file` or `results[1].score`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Path {
    /// The first name.
    pub root: String,
    /// What follows it.
    pub segments: Vec<Segment>,
}

impl Path {
    /// A path of one name.
    pub fn name(root: impl Into<String>) -> Self {
        Path {
            root: root.into(),
            segments: Vec::new(),
        }
    }

    /// Looks the path up in a JSON value, the root being a field of `value`.
    pub fn lookup<'v>(&self, value: &'v serde_json::Value) -> Option<&'v serde_json::Value> {
        let first = value.get(&self.root)?;
        lookup_segments(first, &self.segments)
    }

    /// The dotted text of the first `n` parts (root counts as one), for flat-key lookups.
    pub fn prefix_text(&self, n: usize) -> String {
        let mut text = self.root.clone();
        for segment in self.segments.iter().take(n.saturating_sub(1)) {
            push_segment(&mut text, segment);
        }
        text
    }
}

/// Follows segments from a value.
pub fn lookup_segments<'v>(
    mut value: &'v serde_json::Value,
    segments: &[Segment],
) -> Option<&'v serde_json::Value> {
    for segment in segments {
        value = match segment {
            // `.0` is a key, never an index: indexes are written `[0]`.
            Segment::Field(name) => value.as_object()?.get(name)?,
            Segment::Index(i) => {
                let items = value.as_array()?;
                let index = if *i < 0 {
                    items
                        .len()
                        .checked_sub(usize::try_from(i.unsigned_abs()).ok()?)?
                } else {
                    usize::try_from(*i).ok()?
                };
                items.get(index)?
            }
        };
    }
    Some(value)
}

fn push_segment(text: &mut String, segment: &Segment) {
    match segment {
        Segment::Field(name) => {
            text.push('.');
            text.push_str(name);
        }
        Segment::Index(i) => {
            text.push('[');
            text.push_str(&i.to_string());
            text.push(']');
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.root.clone();
        for segment in &self.segments {
            push_segment(&mut text, segment);
        }
        f.write_str(&text)
    }
}

//! `map.sort_by` specifications: AST, canonical printer and a stable sort.
//!
//! `path [ASC|DESC] [NULLS FIRST|NULLS LAST], ...`, keywords in any case, `item.` prefix
//! optional. Nulls (and missing fields) go last in both directions unless placed
//! explicitly; other values order null < bool < number < string < array < object.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

use crate::path::Path;
use crate::{ParseError, Span, value};

/// A parsed sort specification.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SortSpec<S = Span> {
    /// The keys, most significant first.
    pub keys: Vec<SortKey<S>>,
}

/// One sort key.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SortKey<S = Span> {
    /// The field.
    pub path: Path,
    /// `DESC`.
    pub descending: bool,
    /// `NULLS FIRST` / `NULLS LAST`, when written.
    pub nulls: Option<Nulls>,
    /// Where.
    pub span: S,
}

/// Where nulls go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Nulls {
    /// Before every value.
    First,
    /// After every value.
    Last,
}

impl SortSpec<Span> {
    /// Parses a specification.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        crate::lower::parse_sort(text)
    }
}

impl<S: Clone> SortSpec<S> {
    /// The same specification without spans.
    pub fn strip(&self) -> SortSpec<()> {
        SortSpec {
            keys: self
                .keys
                .iter()
                .map(|k| SortKey {
                    path: k.path.clone(),
                    descending: k.descending,
                    nulls: k.nulls,
                    span: (),
                })
                .collect(),
        }
    }
}

impl<S> fmt::Display for SortSpec<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, key) in self.keys.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", key.path)?;
            if key.descending {
                f.write_str(" DESC")?;
            }
            match key.nulls {
                None => {}
                Some(Nulls::First) => f.write_str(" NULLS FIRST")?,
                Some(Nulls::Last) => f.write_str(" NULLS LAST")?,
            }
        }
        Ok(())
    }
}

fn field<'v>(item: &'v Value, path: &Path) -> Option<&'v Value> {
    crate::expr::item_field(item, path).filter(|v| !v.is_null())
}

impl<S> SortSpec<S> {
    /// Sorts items in place, stably.
    pub fn sort(&self, items: &mut Vec<Value>) {
        // Look every key up once, so that 1,000,000 items do not walk their paths n·log n times.
        let order: Vec<usize> = {
            let keys: Vec<Vec<Option<&Value>>> = items
                .iter()
                .map(|item| self.keys.iter().map(|k| field(item, &k.path)).collect())
                .collect();
            let mut order: Vec<usize> = (0..items.len()).collect();
            order.sort_by(|&a, &b| self.compare(&keys[a], &keys[b]));
            order
        };
        let mut taken: Vec<Option<Value>> = std::mem::take(items).into_iter().map(Some).collect();
        items.extend(
            order
                .into_iter()
                .filter_map(|i| taken.get_mut(i).and_then(Option::take)),
        );
    }

    fn compare(&self, a: &[Option<&Value>], b: &[Option<&Value>]) -> Ordering {
        for (i, key) in self.keys.iter().enumerate() {
            let (x, y) = (a.get(i).copied().flatten(), b.get(i).copied().flatten());
            let nulls_first = key.nulls == Some(Nulls::First);
            let ord = match (x, y) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => {
                    if nulls_first {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                }
                (Some(_), None) => {
                    if nulls_first {
                        Ordering::Greater
                    } else {
                        Ordering::Less
                    }
                }
                (Some(x), Some(y)) => {
                    let ord = value::sort_order(x, y);
                    if key.descending { ord.reverse() } else { ord }
                }
            };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn block_scalars_parse_and_keywords_need_their_space() {
        assert_eq!(
            SortSpec::parse("score DESC\n").unwrap().strip(),
            SortSpec::parse("score DESC").unwrap().strip()
        );
        assert!(SortSpec::parse("a nulls first").is_ok());
        assert!(SortSpec::parse("a nullsfirst").is_err());
    }

    #[test]
    fn nulls_go_last_in_both_directions_and_the_sort_is_stable() {
        let spec = SortSpec::parse("score desc, id").unwrap();
        let mut items = vec![
            json!({"id": 1, "score": 5}),
            json!({"id": 2}),
            json!({"id": 3, "score": 9}),
            json!({"id": 0, "score": 5}),
        ];
        spec.sort(&mut items);
        let ids: Vec<i64> = items.iter().map(|i| i["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, [3, 0, 1, 2]);
        assert_eq!(spec.to_string(), "score DESC, id");
    }
}

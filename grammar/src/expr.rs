//! The filter language (`map.filter`), also used by `when:` and env conditions:
//! AST, canonical printer and evaluator.
//!
//! Precedence, tightest first: `!`/`not`, comparisons (`== != < <= > >= in`, `not in`),
//! `&&`/`and`, `||`/`or`.
//! Numbers compare by value; a string beside a number compares as the number it reads as
//! (as GitHub Actions expressions do), and otherwise, like any other pair of different
//! types, is never equal (and never ordered); a missing path is `null`, and a bare value is
//! tested for truthiness.

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;

use crate::path::Path;
use crate::{ParseError, Span, value};

/// A parsed expression.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum Expr<S = Span> {
    /// `1`, `'a'`, `true`, `null`.
    Literal {
        /// The value.
        value: Value,
        /// Where.
        span: S,
    },
    /// `a.b[0]`: a field of the item (filters) or a variable (`when`).
    Path {
        /// The path.
        path: Path,
        /// Where.
        span: S,
    },
    /// `${a.b}`: a variable's typed value.
    Var {
        /// The path.
        path: Path,
        /// Where.
        span: S,
    },
    /// `[a, b]`.
    List {
        /// The elements.
        items: Vec<Expr<S>>,
        /// Where.
        span: S,
    },
    /// `!x`.
    Not {
        /// The operand.
        expr: Box<Expr<S>>,
        /// Where.
        span: S,
    },
    /// `a op b`.
    Binary {
        /// The operator.
        op: BinOp,
        /// Left operand.
        lhs: Box<Expr<S>>,
        /// Right operand.
        rhs: Box<Expr<S>>,
        /// Where.
        span: S,
    },
    /// `f(a, b)`.
    Call {
        /// The function.
        func: Func,
        /// The arguments.
        args: Vec<Expr<S>>,
        /// A literal `matches` pattern, compiled once.
        #[serde(skip)]
        regex: Option<Regex>,
        /// Where.
        span: S,
    },
}

/// A compiled regular expression that compares by its pattern.
#[derive(Clone, Debug)]
pub struct Regex(pub regex::Regex);

impl PartialEq for Regex {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

/// Binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum BinOp {
    /// `||`
    Or,
    /// `&&`
    And,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `in`
    In,
    /// `not in`
    NotIn,
}

impl BinOp {
    fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq
            | BinOp::Ne
            | BinOp::Lt
            | BinOp::Le
            | BinOp::Gt
            | BinOp::Ge
            | BinOp::In
            | BinOp::NotIn => 3,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            BinOp::Or => "||",
            BinOp::And => "&&",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::In => "in",
            BinOp::NotIn => "not in",
        }
    }
}

/// The built-in functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Func {
    /// `contains(s, x)`: substring, or list element.
    Contains,
    /// `starts_with(s, prefix)`.
    StartsWith,
    /// `ends_with(s, suffix)`.
    EndsWith,
    /// `matches(s, regex)`: an unanchored regex search.
    Matches,
    /// `is_null(x)`: null or missing.
    IsNull,
    /// `is_not_null(x)`.
    IsNotNull,
    /// `is_number(x)`.
    IsNumber,
    /// `is_string(x)`.
    IsString,
    /// `is_bool(x)`.
    IsBool,
    /// `is_array(x)`.
    IsArray,
    /// `is_object(x)`.
    IsObject,
    /// `length(x)`: characters, elements or keys; `length(x, n)` tests it equals `n`.
    Length,
}

/// Every function with its name and accepted argument counts.
pub const FUNCTIONS: &[(&str, Func, &[usize])] = &[
    ("contains", Func::Contains, &[2]),
    ("starts_with", Func::StartsWith, &[2]),
    ("ends_with", Func::EndsWith, &[2]),
    ("matches", Func::Matches, &[2]),
    ("is_null", Func::IsNull, &[1]),
    ("is_not_null", Func::IsNotNull, &[1]),
    ("is_number", Func::IsNumber, &[1]),
    ("is_string", Func::IsString, &[1]),
    ("is_bool", Func::IsBool, &[1]),
    ("is_array", Func::IsArray, &[1]),
    ("is_object", Func::IsObject, &[1]),
    ("length", Func::Length, &[1, 2]),
];

impl Func {
    /// The function's name.
    pub fn name(self) -> &'static str {
        FUNCTIONS
            .iter()
            .find(|(_, f, _)| *f == self)
            .map_or("?", |(n, _, _)| n)
    }
}

impl Expr<Span> {
    /// Parses an expression.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        crate::lower::parse_expr(text)
    }
}

impl<S: Clone> Expr<S> {
    /// The span of this node.
    pub fn span(&self) -> S {
        match self {
            Expr::Literal { span, .. }
            | Expr::Path { span, .. }
            | Expr::Var { span, .. }
            | Expr::List { span, .. }
            | Expr::Not { span, .. }
            | Expr::Binary { span, .. }
            | Expr::Call { span, .. } => span.clone(),
        }
    }

    /// The same expression without spans, for comparisons in tests.
    pub fn strip(&self) -> Expr<()> {
        match self {
            Expr::Literal { value, .. } => Expr::Literal {
                value: value.clone(),
                span: (),
            },
            Expr::Path { path, .. } => Expr::Path {
                path: path.clone(),
                span: (),
            },
            Expr::Var { path, .. } => Expr::Var {
                path: path.clone(),
                span: (),
            },
            Expr::List { items, .. } => Expr::List {
                items: items.iter().map(Expr::strip).collect(),
                span: (),
            },
            Expr::Not { expr, .. } => Expr::Not {
                expr: Box::new(expr.strip()),
                span: (),
            },
            Expr::Binary { op, lhs, rhs, .. } => Expr::Binary {
                op: *op,
                lhs: Box::new(lhs.strip()),
                rhs: Box::new(rhs.strip()),
                span: (),
            },
            Expr::Call {
                func, args, regex, ..
            } => Expr::Call {
                func: *func,
                args: args.iter().map(Expr::strip).collect(),
                regex: regex.clone(),
                span: (),
            },
        }
    }

    /// Every path and `${...}` variable the expression reads, with their spans.
    pub fn references(&self) -> Vec<(&Path, S, bool)> {
        let mut out = Vec::new();
        self.collect_references(&mut out);
        out
    }

    fn collect_references<'a>(&'a self, out: &mut Vec<(&'a Path, S, bool)>) {
        match self {
            Expr::Literal { .. } => {}
            Expr::Path { path, span } => out.push((path, span.clone(), false)),
            Expr::Var { path, span } => out.push((path, span.clone(), true)),
            Expr::List { items, .. } | Expr::Call { args: items, .. } => {
                for item in items {
                    item.collect_references(out);
                }
            }
            Expr::Not { expr, .. } => expr.collect_references(out),
            Expr::Binary { lhs, rhs, .. } => {
                lhs.collect_references(out);
                rhs.collect_references(out);
            }
        }
    }
}

fn precedence<S>(expr: &Expr<S>) -> u8 {
    match expr {
        Expr::Binary { op, .. } => op.precedence(),
        Expr::Not { .. } => 4,
        Expr::Literal { .. }
        | Expr::Path { .. }
        | Expr::Var { .. }
        | Expr::List { .. }
        | Expr::Call { .. } => 5,
    }
}

struct Child<'a, S>(&'a Expr<S>, u8);

impl<S> fmt::Display for Child<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if precedence(self.0) < self.1 {
            write!(f, "({})", self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

fn write_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    if s.contains('\'') {
        f.write_str("\"")?;
        for c in s.chars() {
            if c == '"' || c == '\\' {
                f.write_str("\\")?;
            }
            write!(f, "{c}")?;
        }
        f.write_str("\"")
    } else {
        write!(f, "'{s}'")
    }
}

fn write_list<S>(f: &mut fmt::Formatter<'_>, items: &[Expr<S>]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

impl<S> fmt::Display for Expr<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Literal {
                value: Value::String(s),
                ..
            } => write_string(f, s),
            Expr::Literal { value, .. } => write!(f, "{value}"),
            Expr::Path { path, .. } => write!(f, "{path}"),
            Expr::Var { path, .. } => write!(f, "${{{path}}}"),
            Expr::List { items, .. } => {
                f.write_str("[")?;
                write_list(f, items)?;
                f.write_str("]")
            }
            Expr::Not { expr, .. } => write!(f, "!{}", Child(expr, 4)),
            Expr::Binary { op, lhs, rhs, .. } => {
                let p = op.precedence();
                // Comparisons do not chain, so both sides must bind tighter; `&&` and `||`
                // fold to the left.
                let (left, right) = if p == 3 { (4, 4) } else { (p, p + 1) };
                write!(
                    f,
                    "{} {} {}",
                    Child(lhs, left),
                    op.symbol(),
                    Child(rhs, right)
                )
            }
            Expr::Call { func, args, .. } => {
                write!(f, "{}(", func.name())?;
                write_list(f, args)?;
                f.write_str(")")
            }
        }
    }
}

/// Where an expression finds the values of its paths and variables.
pub trait Context {
    /// The value of a bare path (`a.b`): in filters a field of the item (with an optional
    /// `item.` prefix), in `when` a variable. A missing field is `null`.
    fn path(&self, path: &Path) -> Result<Cow<'_, Value>, EvalError>;
    /// The typed value of `${a.b}`.
    fn var(&self, path: &Path) -> Result<Cow<'_, Value>, EvalError> {
        self.path(path)
    }
}

/// Why an expression could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// A variable that does not exist.
    #[error("undefined variable `{0}`")]
    Undefined(String),
}

/// A map item as the context of a filter: paths are its fields, `item.` prefix optional,
/// missing fields are null.
pub struct Item<'a>(pub &'a Value);

impl Context for Item<'_> {
    fn path(&self, path: &Path) -> Result<Cow<'_, Value>, EvalError> {
        Ok(item_field(self.0, path).map_or(Cow::Owned(Value::Null), Cow::Borrowed))
    }
}

/// A field of a map item; the `item.` prefix is optional and `item` alone is the item.
pub fn item_field<'v>(item: &'v Value, path: &Path) -> Option<&'v Value> {
    if path.root == "item" {
        return crate::path::lookup_segments(item, &path.segments);
    }
    crate::path::lookup_segments(item.get(&path.root)?, &path.segments)
}

impl<S> Expr<S> {
    /// Evaluates to a value, borrowing from the expression and the context where it can.
    pub fn eval<'a>(&'a self, ctx: &'a dyn Context) -> Result<Cow<'a, Value>, EvalError> {
        Ok(match self {
            Expr::Literal { value, .. } => Cow::Borrowed(value),
            Expr::Path { path, .. } => ctx.path(path)?,
            Expr::Var { path, .. } => ctx.var(path)?,
            Expr::List { items, .. } => Cow::Owned(Value::Array(
                items
                    .iter()
                    .map(|e| e.eval(ctx).map(Cow::into_owned))
                    .collect::<Result<_, _>>()?,
            )),
            Expr::Not { expr, .. } => Cow::Owned(Value::Bool(!expr.test(ctx)?)),
            Expr::Binary {
                op: BinOp::And,
                lhs,
                rhs,
                ..
            } => Cow::Owned(Value::Bool(lhs.test(ctx)? && rhs.test(ctx)?)),
            Expr::Binary {
                op: BinOp::Or,
                lhs,
                rhs,
                ..
            } => Cow::Owned(Value::Bool(lhs.test(ctx)? || rhs.test(ctx)?)),
            Expr::Binary { op, lhs, rhs, .. } => {
                let (a, b) = (lhs.eval(ctx)?, rhs.eval(ctx)?);
                Cow::Owned(Value::Bool(compare(*op, &a, &b)))
            }
            Expr::Call {
                func, args, regex, ..
            } => {
                let values = args
                    .iter()
                    .map(|e| e.eval(ctx))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Value> = values.iter().map(AsRef::as_ref).collect();
                Cow::Owned(call(*func, &refs, regex.as_ref()))
            }
        })
    }

    /// Evaluates and tests for truthiness.
    pub fn test(&self, ctx: &dyn Context) -> Result<bool, EvalError> {
        Ok(value::truthy(self.eval(ctx)?.as_ref()))
    }

    /// Why the expression is false, when a comparison in it mixes types that never compare
    /// ([`value::mismatch`]): the first such comparison, left to right, with the reason
    /// (`"abc" is not a number`). `None` when no comparison does, or one cannot be evaluated.
    pub fn mismatch(&self, ctx: &dyn Context) -> Option<String> {
        match self {
            Expr::Literal { .. } | Expr::Path { .. } | Expr::Var { .. } => None,
            Expr::List { items, .. } | Expr::Call { args: items, .. } => {
                items.iter().find_map(|e| e.mismatch(ctx))
            }
            Expr::Not { expr, .. } => expr.mismatch(ctx),
            Expr::Binary { op, lhs, rhs, .. } => match op {
                BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                    let (a, b) = (lhs.eval(ctx).ok()?, rhs.eval(ctx).ok()?);
                    value::mismatch(&a, &b)
                }
                BinOp::In | BinOp::NotIn | BinOp::And | BinOp::Or => {
                    lhs.mismatch(ctx).or_else(|| rhs.mismatch(ctx))
                }
            },
        }
    }

    /// Whether a map item passes this filter. Filters cannot fail: a missing field is null.
    pub fn matches_item(&self, item: &Value) -> bool {
        self.test(&Item(item)).unwrap_or(false)
    }
}

fn compare(op: BinOp, a: &Value, b: &Value) -> bool {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let (a, b) = match op {
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            value::coerce(a, b)
        }
        BinOp::In | BinOp::NotIn | BinOp::And | BinOp::Or => (Cow::Borrowed(a), Cow::Borrowed(b)),
    };
    let (a, b) = (a.as_ref(), b.as_ref());
    match op {
        BinOp::Eq => value::equal(a, b),
        BinOp::Ne => !value::equal(a, b),
        BinOp::Lt => value::compare(a, b) == Some(Less),
        BinOp::Le => matches!(value::compare(a, b), Some(Less | Equal)),
        BinOp::Gt => value::compare(a, b) == Some(Greater),
        BinOp::Ge => matches!(value::compare(a, b), Some(Greater | Equal)),
        BinOp::In => contains(b, a),
        BinOp::NotIn => !contains(b, a),
        BinOp::And => value::truthy(a) && value::truthy(b),
        BinOp::Or => value::truthy(a) || value::truthy(b),
    }
}

/// `needle in haystack`: an element of a list, a substring of a string, a key of an object.
fn contains(haystack: &Value, needle: &Value) -> bool {
    match (haystack, needle) {
        (Value::Array(items), _) => items.iter().any(|i| value::equal(i, needle)),
        (Value::String(s), Value::String(n)) => s.contains(n.as_str()),
        (Value::Object(map), Value::String(k)) => map.contains_key(k),
        _ => false,
    }
}

fn call(func: Func, args: &[&Value], regex: Option<&Regex>) -> Value {
    let first = args.first().copied().unwrap_or(&Value::Null);
    let second = args.get(1).copied().unwrap_or(&Value::Null);
    let strings = || Some((first.as_str()?, second.as_str()?));
    Value::Bool(match func {
        Func::Contains => contains(first, second),
        Func::StartsWith => strings().is_some_and(|(s, p)| s.starts_with(p)),
        Func::EndsWith => strings().is_some_and(|(s, p)| s.ends_with(p)),
        Func::Matches => match (first.as_str(), regex) {
            (Some(s), Some(re)) => re.0.is_match(s),
            // A pattern from the item itself: built per item, within the size bound.
            (Some(s), None) => second
                .as_str()
                .and_then(|p| crate::compile_regex(p).ok())
                .is_some_and(|re| re.is_match(s)),
            (None, _) => false,
        },
        Func::IsNull => first.is_null(),
        Func::IsNotNull => !first.is_null(),
        Func::IsNumber => first.is_number(),
        Func::IsString => first.is_string(),
        Func::IsBool => first.is_boolean(),
        Func::IsArray => first.is_array(),
        Func::IsObject => first.is_object(),
        Func::Length => {
            let length = match first {
                Value::String(s) => s.chars().count(),
                Value::Array(items) => items.len(),
                Value::Object(map) => map.len(),
                Value::Null | Value::Bool(_) | Value::Number(_) => return Value::Null,
            };
            if args.len() == 1 {
                return Value::from(length);
            }
            value::equal(&Value::from(length), second)
        }
    })
}

/// Variables as the context of `when` and env conditions: a bare path or `${path}` names a
/// variable; dotted keys stored flat (`build.success`) are found too; a missing field of an
/// existing variable is null; `${x.exists}` tests whether `x` exists; an undefined variable
/// is an error.
pub struct Vars<'a>(pub &'a serde_json::Map<String, Value>);

impl Context for Vars<'_> {
    fn path(&self, path: &Path) -> Result<Cow<'_, Value>, EvalError> {
        if let Some(crate::path::Segment::Field(last)) = path.segments.last()
            && last == "exists"
        {
            let mut base = path.clone();
            base.segments.pop();
            return Ok(Cow::Owned(Value::Bool(self.lookup(&base).is_ok())));
        }
        self.lookup(path)
    }
}

impl Vars<'_> {
    fn lookup(&self, path: &Path) -> Result<Cow<'_, Value>, EvalError> {
        // The longest flat key that prefixes the path wins: `build.success` may be stored whole.
        for n in (1..=path.segments.len() + 1).rev() {
            let key = path.prefix_text(n);
            if let Some(value) = self.0.get(&key) {
                let rest = path.segments.get(n - 1..).unwrap_or_default();
                return Ok(crate::path::lookup_segments(value, rest)
                    .map_or(Cow::Owned(Value::Null), Cow::Borrowed));
            }
        }
        Err(EvalError::Undefined(path.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[track_caller]
    fn check(expr: &str, item: &Value, expect: bool) {
        let parsed = Expr::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert_eq!(parsed.matches_item(item), expect, "{expr} on {item}");
    }

    #[test]
    fn semantics_follow_the_spec() {
        check("priority == 5", &json!({"priority": 5.0}), true);
        check("item.priority > 5", &json!({"priority": 7}), true);
        // A string beside a number compares as the number it reads as, or not at all.
        check("score > 5", &json!({"score": "10"}), true);
        check("score == 10", &json!({"score": " 10\n"}), true);
        check("score <= 5", &json!({"score": "abc"}), false);
        check("score > 5", &json!({"score": "abc"}), false);
        check("score != 5", &json!({"score": "abc"}), true);
        check("score > '5'", &json!({"score": "10"}), false);
        check("missing == null", &json!({}), true);
        check("a > 1 && b < 2 || c == 3", &json!({"c": 3}), true);
        check("!(a > 1) and b in [1, 2]", &json!({"a": 0, "b": 2}), true);
        check("tag not in ['x']", &json!({"tag": "y"}), true);
        check(
            "contains(name, 'test') && length(tags) == 2",
            &json!({"name": "my test", "tags": [1, 2]}),
            true,
        );
        check("matches(file, '\\.rs$')", &json!({"file": "main.rs"}), true);
        check("is_null(x)", &json!({}), true);
    }

    #[test]
    fn a_mismatch_explains_why_a_condition_is_false() {
        let why = |expr: &str, item: &Value| Expr::parse(expr).ok()?.mismatch(&Item(item));
        assert_eq!(
            why("a == 1 || n > 10", &json!({"a": 2, "n": "abc"})).as_deref(),
            Some("\"abc\" is not a number")
        );
        assert_eq!(why("n > 10", &json!({"n": "61"})), None);
        assert_eq!(
            why("n > 'x'", &json!({"n": 3})).as_deref(),
            Some("\"x\" is not a number")
        );
    }

    #[test]
    fn printing_is_canonical() {
        for (input, printed) in [
            ("a>1 AND (b<2 or c)", "a > 1 && (b < 2 || c)"),
            ("!(a == 1)", "!(a == 1)"),
            ("x in [1,'a']", "x in [1, 'a']"),
        ] {
            let e = Expr::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(e.to_string(), printed);
        }
    }
}

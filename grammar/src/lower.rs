//! Pest parse trees → typed ASTs, and pest errors → [`ParseError`]s with hand-written
//! messages for the common mistakes.
//! This is the only module that names pest types.

use pest::Parser as _;
use pest::error::InputLocation;
use pest::iterators::Pair;
use serde_json::Value;

use crate::expr::{BinOp, Expr, FUNCTIONS, Func, Regex};
use crate::path::{Path, Segment};
use crate::sort::{Nulls, SortKey, SortSpec};
use crate::template::{FILTERS, Filter, Modifier, Part, Template, Var};
use crate::{ParseError, ParseErrorKind, Span};

mod tpl {
    #[derive(pest_derive::Parser)]
    #[grammar = "template.pest"]
    pub(super) struct P;
}

mod ex {
    #[derive(pest_derive::Parser)]
    #[grammar = "expr.pest"]
    pub(super) struct P;
}

mod so {
    #[derive(pest_derive::Parser)]
    #[grammar = "sort.pest"]
    pub(super) struct P;
}

fn span_of<R: pest::RuleType>(pair: &Pair<'_, R>, offset: usize) -> Span {
    let s = pair.as_span();
    Span::new(s.start() + offset, s.end() + offset)
}

fn error_pos<R: pest::RuleType>(err: &pest::error::Error<R>) -> usize {
    match err.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((s, _)) => s,
    }
}

/// One character at `at`, or an empty span at the end of the text.
/// The character at byte `at` (moved back to the start of its character when `at` falls
/// inside one), or an empty span at the end.
pub(crate) fn char_span(text: &str, at: usize) -> Span {
    let at = text.floor_char_boundary(at.min(text.len()));
    Span::new(
        at,
        text[at..].chars().next().map_or(at, |c| at + c.len_utf8()),
    )
}

fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| {
            (
                c,
                strsim::damerau_levenshtein(&word.to_ascii_lowercase(), c),
            )
        })
        .filter(|(c, d)| *d <= 2.max(c.len() / 3) && *d < c.len().max(word.len()))
        .min_by_key(|(_, d)| *d)
        .map(|(c, _)| c)
}

fn path_of<R: pest::RuleType>(pair: Pair<'_, R>) -> Path {
    let mut parts = pair.into_inner();
    let root = parts
        .next()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let segments = parts
        .map(|p| {
            let text = p.as_str();
            match text.parse::<i64>() {
                // `[n]` arrives as an index pair; `.n` as a key pair, which stays a field.
                Ok(i) if format!("{:?}", p.as_rule()) == "index" => Segment::Index(i),
                _ => Segment::Field(text.to_owned()),
            }
        })
        .collect();
    Path { root, segments }
}

// ---------------------------------------------------------------------------------------
// Templates.

pub(crate) fn parse_template(text: &str, offset: usize) -> Result<Template, ParseError> {
    parse_template_in(text, offset, false)
}

/// Parses a template; in a shell command (SHELL) a parameter expansion only the shell reads
/// (`${f%.rs}`) is kept as written, elsewhere it is a syntax error.
pub(crate) fn parse_template_in(
    text: &str,
    offset: usize,
    shell: bool,
) -> Result<Template, ParseError> {
    crate::error::check_template_depth(text).map_err(|mut e| {
        e.span = Span::new(e.span.start + offset, e.span.end + offset);
        e
    })?;
    let mut pairs = tpl::P::parse(tpl::Rule::template, text)
        .map_err(|e| template_error(text, error_pos(&e), offset))?;
    let mut parts: Vec<Part> = Vec::new();
    let Some(top) = pairs.next() else {
        return Ok(Template { parts });
    };
    for pair in top.into_inner() {
        let part = match pair.as_rule() {
            tpl::Rule::escaped_dollar => Part::Dollar,
            tpl::Rule::double_dollar => Part::Text("$$".to_owned()),
            tpl::Rule::lone_dollar => Part::Text("$".to_owned()),
            tpl::Rule::shell_param if shell => Part::Shell {
                text: pair.as_str().to_owned(),
                span: span_of(&pair, offset),
            },
            tpl::Rule::shell_param => {
                let written = pair.as_str();
                return Err(ParseError::new(
                    ParseErrorKind::Template,
                    format!("`{written}` is shell syntax, not a variable reference"),
                    span_of(&pair, offset),
                    "only a shell reads this",
                )
                .help(format!(
                    "write `${written}` for the literal text; a reference is `${{path}}`, with an optional `:-default`, `:json`/`:lines`/`:GLOB` and `|filter`s"
                )));
            }
            tpl::Rule::literal => Part::Text(pair.as_str().to_owned()),
            tpl::Rule::bare_var => Part::Bare {
                name: pair.as_str()[1..].to_owned(),
                span: span_of(&pair, offset),
            },
            tpl::Rule::braced => Part::Var(braced(pair, offset, shell)?),
            _ => continue,
        };
        // Adjacent text merges, so that `$1` is one text part, as it prints.
        match (parts.last_mut(), &part) {
            (Some(Part::Text(prev)), Part::Text(next)) => prev.push_str(next),
            _ => parts.push(part),
        }
    }
    Ok(Template { parts })
}

fn braced(pair: Pair<'_, tpl::Rule>, offset: usize, shell: bool) -> Result<Var, ParseError> {
    let span = span_of(&pair, offset);
    let mut var = Var {
        path: Path::name(""),
        default: None,
        modifier: None,
        filters: Vec::new(),
        span,
        path_span: span,
    };
    for inner in pair.into_inner() {
        match inner.as_rule() {
            tpl::Rule::path => {
                var.path_span = span_of(&inner, offset);
                var.path = path_of(inner);
            }
            tpl::Rule::default => {
                if let Some(text) = inner.into_inner().next() {
                    let start = text.as_span().start() + offset;
                    var.default = Some(parse_template_in(text.as_str(), start, shell)?);
                }
            }
            tpl::Rule::modifier => {
                let text = inner.as_str()[1..].to_owned();
                let at = span_of(&inner, offset);
                var.modifier = Some(match text.as_str() {
                    "json" => Modifier::Json,
                    "lines" => Modifier::Lines,
                    glob => {
                        if globset::Glob::new(glob).is_err() {
                            return Err(ParseError::new(
                                ParseErrorKind::Template,
                                format!("invalid glob `{glob}`"),
                                at,
                                "this pattern does not compile",
                            )
                            .help("write a glob such as `*.md` or `specs/**/*.md`"));
                        }
                        Modifier::Glob(glob.to_owned())
                    }
                });
            }
            tpl::Rule::filter => var.filters.push(filter(inner, offset)?),
            _ => {}
        }
    }
    // `${env:NAME}` reads the process environment, like `${env.NAME}`.
    if var.path.root == "env"
        && var.path.segments.is_empty()
        && let Some(Modifier::Glob(name)) = &var.modifier
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        var.path.segments.push(Segment::Field(name.clone()));
        var.modifier = None;
    }
    Ok(var)
}

fn filter(pair: Pair<'_, tpl::Rule>, offset: usize) -> Result<Filter, ParseError> {
    let at = span_of(&pair, offset);
    let mut inner = pair.into_inner();
    let name = inner
        .next()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let arg = inner.next().map(|p| p.as_str().to_owned());
    let takes_no_value = |name: &str| {
        ParseError::new(
            ParseErrorKind::Template,
            format!("the `{name}` filter takes no value"),
            at,
            "unexpected `:`",
        )
        .help(format!("write `|{name}`"))
    };
    match (name.as_str(), arg) {
        ("shell", None) => Ok(Filter::Shell),
        ("json", None) => Ok(Filter::Json),
        ("trim", None) => Ok(Filter::Trim),
        ("default", Some(v)) => Ok(Filter::Default(v)),
        ("default", None) => Err(ParseError::new(
            ParseErrorKind::Template,
            "the `default` filter needs a value",
            at,
            "no value given",
        )
        .help("write `|default:VALUE`")),
        ("shell" | "json" | "trim", Some(_)) => Err(takes_no_value(&name)),
        (other, _) => {
            let help = match did_you_mean(other, FILTERS.iter().copied()) {
                Some(s) => format!("did you mean `|{s}`?"),
                None => {
                    "the filters are `|shell`, `|json`, `|trim` and `|default:VALUE`".to_owned()
                }
            };
            Err(ParseError::new(
                ParseErrorKind::Template,
                format!("unknown filter `{other}`"),
                at,
                "not a filter",
            )
            .help(help))
        }
    }
}

fn template_error(text: &str, pos: usize, offset: usize) -> ParseError {
    let shift = |s: Span| Span::new(s.start + offset, s.end + offset);
    let through = text.ceil_char_boundary(pos.saturating_add(1).min(text.len()));
    let open = text[..through].rfind("${").or_else(|| text.find("${"));
    let Some(open) = open else {
        return ParseError::new(
            ParseErrorKind::Template,
            "invalid template",
            shift(char_span(text, pos)),
            "unexpected character",
        )
        .help("write `$${` for a literal `${`");
    };
    let close = text[open..].find('}').map(|c| open + c);
    match close {
        None => ParseError::new(
            ParseErrorKind::Template,
            "unclosed `${`",
            shift(Span::new(open, open + 2)),
            "this `${` is never closed",
        )
        .help("close the reference with `}`, or write `$${` for a literal `${`"),
        Some(c) if text[open + 2..c].trim().is_empty() => ParseError::new(
            ParseErrorKind::Template,
            "empty `${}`",
            shift(Span::new(open, c + 1)),
            "no variable named here",
        )
        .help("name a variable, such as `${item.id}`, or write `$${}` for the literal text"),
        Some(c) => {
            let inner = &text[open + 2..c];
            ParseError::new(
                ParseErrorKind::Template,
                format!("invalid variable reference `${{{inner}}}`"),
                shift(Span::new(open, c + 1)),
                "expected a name such as `${name}` or `${item.field[0]}`",
            )
            .help("a reference is `${path}`, with an optional `:-default`, `:json`/`:lines`/`:GLOB` and `|filter`s; write `$${` for a literal `${`")
        }
    }
}

// ---------------------------------------------------------------------------------------
// Expressions.

pub(crate) fn parse_expr(text: &str) -> Result<Expr, ParseError> {
    crate::error::check_depth(text)?;
    if text.trim().is_empty() {
        return Err(ParseError::new(
            ParseErrorKind::Expression,
            "empty expression",
            Span::new(0, text.len()),
            "nothing to evaluate",
        )
        .help("write a condition such as `priority > 5`"));
    }
    let mut pairs = ex::P::parse(ex::Rule::expression, text).map_err(|e| expr_error(text, &e))?;
    let top = pairs.next().and_then(|p| p.into_inner().next());
    let Some(pair) = top else {
        return Err(ParseError::new(
            ParseErrorKind::Expression,
            "empty expression",
            Span::new(0, text.len()),
            "nothing to evaluate",
        ));
    };
    // Long `&&` chains and `!` runs nest without brackets; the tree is bounded while it is
    // built, so that no deep tree ever exists for a recursive walk (evaluation, printing,
    // dropping) to overflow the stack on.
    expr(pair, 1)
}

/// How deep an expression tree may be.
const MAX_TREE_DEPTH: usize = 256;

fn too_deep(span: Span) -> ParseError {
    ParseError::new(
        ParseErrorKind::TooDeep,
        "the expression nests too deeply",
        span,
        format!("more than {MAX_TREE_DEPTH} levels"),
    )
    .help("split the condition into simpler parts")
}

/// Builds the node of `pair`, which sits at `depth` in the tree (the root is at 1). A node
/// deeper than [`MAX_TREE_DEPTH`] is refused before anything under it is built.
#[expect(
    clippy::too_many_lines,
    reason = "table-shaped lowering: one arm per rule of the expression grammar, read best whole"
)]
fn expr(pair: Pair<'_, ex::Rule>, depth: usize) -> Result<Expr, ParseError> {
    let span = span_of(&pair, 0);
    if depth > MAX_TREE_DEPTH {
        return Err(too_deep(span));
    }
    match pair.as_rule() {
        ex::Rule::or_expr | ex::Rule::and_expr => {
            let op = if pair.as_rule() == ex::Rule::or_expr {
                BinOp::Or
            } else {
                BinOp::And
            };
            let operands: Vec<Pair<'_, ex::Rule>> = pair
                .into_inner()
                .filter(|p| !matches!(p.as_rule(), ex::Rule::or_op | ex::Rule::and_op))
                .collect();
            // `a || b || c` folds to the left: the first operand lies deepest, one level
            // below the root for every operator.
            let levels = operands.len().saturating_sub(1);
            if depth + levels > MAX_TREE_DEPTH {
                // Point at the first operand past the limit.
                let at = (MAX_TREE_DEPTH + 1).saturating_sub(depth).min(levels);
                return Err(too_deep(operands.get(at).map_or(span, |p| span_of(p, 0))));
            }
            let mut operands = operands.into_iter();
            let Some(first) = operands.next() else {
                return Err(internal(span));
            };
            let mut acc = expr(first, depth + levels)?;
            for (i, next) in operands.enumerate() {
                let rhs = expr(next, depth + levels - i)?;
                let start = acc.span().start;
                let end = rhs.span().end;
                acc = Expr::Binary {
                    op,
                    lhs: Box::new(acc),
                    rhs: Box::new(rhs),
                    span: Span::new(start, end),
                };
            }
            Ok(acc)
        }
        ex::Rule::comparison => {
            let mut inner = pair.into_inner();
            let Some(lhs_pair) = inner.next() else {
                return Err(internal(span));
            };
            let Some(op_pair) = inner.next() else {
                return expr(lhs_pair, depth);
            };
            let lhs = expr(lhs_pair, depth + 1)?;
            let op = match op_pair.as_str() {
                "==" => BinOp::Eq,
                "!=" => BinOp::Ne,
                "<" => BinOp::Lt,
                "<=" => BinOp::Le,
                ">" => BinOp::Gt,
                ">=" => BinOp::Ge,
                _ if op_pair.as_rule() == ex::Rule::in_op
                    && op_pair
                        .clone()
                        .into_inner()
                        .next()
                        .is_some_and(|p| p.as_rule() == ex::Rule::not_in) =>
                {
                    BinOp::NotIn
                }
                _ => BinOp::In,
            };
            let rhs = match inner.next() {
                Some(p) => expr(p, depth + 1)?,
                None => return Err(internal(span)),
            };
            Ok(Expr::Binary {
                op,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                span,
            })
        }
        ex::Rule::unary => {
            let mut nots = 0usize;
            let mut primary = None;
            for p in pair.into_inner() {
                if p.as_rule() == ex::Rule::not_op {
                    nots += 1;
                    if depth + nots > MAX_TREE_DEPTH {
                        return Err(too_deep(span_of(&p, 0)));
                    }
                } else {
                    primary = Some(expr(p, depth + nots)?);
                }
            }
            let mut e = primary.ok_or_else(|| internal(span))?;
            for _ in 0..nots {
                e = Expr::Not {
                    expr: Box::new(e),
                    span,
                };
            }
            Ok(e)
        }
        ex::Rule::number => {
            let text = pair.as_str();
            let value = if text.contains(['.', 'e', 'E']) {
                text.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
            } else {
                text.parse::<i64>().ok().map(Value::from)
            };
            value
                .map(|value| Expr::Literal { value, span })
                .ok_or_else(|| {
                    ParseError::new(
                        ParseErrorKind::Expression,
                        format!("`{text}` is not a number"),
                        span,
                        "out of range",
                    )
                })
        }
        ex::Rule::sq_string => Ok(Expr::Literal {
            value: Value::String(
                pair.into_inner()
                    .next()
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_default(),
            ),
            span,
        }),
        ex::Rule::dq_string => {
            let raw = pair
                .into_inner()
                .next()
                .map(|p| p.as_str())
                .unwrap_or_default();
            Ok(Expr::Literal {
                value: Value::String(unescape(raw)),
                span,
            })
        }
        ex::Rule::true_lit => Ok(Expr::Literal {
            value: Value::Bool(true),
            span,
        }),
        ex::Rule::false_lit => Ok(Expr::Literal {
            value: Value::Bool(false),
            span,
        }),
        ex::Rule::null_lit => Ok(Expr::Literal {
            value: Value::Null,
            span,
        }),
        ex::Rule::var => Ok(Expr::Var {
            path: pair
                .into_inner()
                .next()
                .map_or_else(|| Path::name(""), path_of),
            span,
        }),
        ex::Rule::path => Ok(Expr::Path {
            path: path_of(pair),
            span,
        }),
        ex::Rule::list => Ok(Expr::List {
            items: pair
                .into_inner()
                .map(|p| expr(p, depth + 1))
                .collect::<Result<_, _>>()?,
            span,
        }),
        ex::Rule::call => call(pair, span, depth),
        _ => Err(internal(span)),
    }
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && matches!(chars.peek(), Some('"' | '\\')) {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    out
}

fn call(pair: Pair<'_, ex::Rule>, span: Span, depth: usize) -> Result<Expr, ParseError> {
    let mut inner = pair.into_inner();
    let Some(name_pair) = inner.next() else {
        return Err(internal(span));
    };
    let name = name_pair.as_str();
    let name_span = span_of(&name_pair, 0);
    let Some((_, func, arities)) = FUNCTIONS.iter().find(|(n, _, _)| *n == name) else {
        let help = match did_you_mean(name, FUNCTIONS.iter().map(|(n, _, _)| *n)) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!(
                "the functions are {}",
                FUNCTIONS
                    .iter()
                    .map(|(n, _, _)| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return Err(ParseError::new(
            ParseErrorKind::Expression,
            format!("unknown function `{name}`"),
            name_span,
            "not a function",
        )
        .help(help));
    };
    let args: Vec<Expr> = inner
        .map(|p| expr(p, depth + 1))
        .collect::<Result<_, _>>()?;
    if !arities.contains(&args.len()) {
        let wanted = arities
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(ParseError::new(
            ParseErrorKind::Expression,
            format!(
                "`{name}` takes {wanted} argument{}",
                if arities == &[1] { "" } else { "s" }
            ),
            span,
            format!("{} given", args.len()),
        )
        .help(format!(
            "write `{name}({})`",
            if *func == Func::Matches {
                "text, 'regex'"
            } else if arities[0] == 1 {
                "value"
            } else {
                "text, value"
            }
        )));
    }
    let mut regex = None;
    if *func == Func::Matches
        && let Some(Expr::Literal {
            value: Value::String(pattern),
            span: at,
        }) = args.get(1)
    {
        match crate::compile_regex(pattern) {
            Ok(re) => regex = Some(Regex(re)),
            Err(why) => {
                return Err(ParseError::new(
                    ParseErrorKind::Expression,
                    "invalid regular expression",
                    *at,
                    why,
                )
                .help("fix the pattern; escape literal characters such as `(` or `[` with `\\`"));
            }
        }
    }
    Ok(Expr::Call {
        func: *func,
        args,
        regex,
        span,
    })
}

fn internal(span: Span) -> ParseError {
    ParseError::new(
        ParseErrorKind::Expression,
        "internal error: unexpected parse tree",
        span,
        "here",
    )
    .help("this is a bug in prodigy; please report it with the expression")
}

/// The last token before `pos`, for messages.
fn previous_token(text: &str, pos: usize) -> &str {
    let before = text[..pos.min(text.len())].trim_end();
    let start = before
        .rfind(|c: char| c.is_whitespace() || c == '(')
        .map_or(0, |i| i + 1);
    &before[start..]
}

fn word_at(text: &str, pos: usize) -> &str {
    let rest = &text[pos.min(text.len())..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// `item.name.starts_with('a')` at POS (the `(`), PREV the token before it: a function
/// called as a method, as in Python or Rust, explained with the call to write.
fn method_call(text: &str, pos: usize, prev: &str) -> Option<ParseError> {
    let rest = &text[pos..];
    let (subject, method) = prev.rsplit_once('.')?;
    if !rest.starts_with('(')
        || subject.is_empty()
        || !FUNCTIONS.iter().any(|(n, _, _)| *n == method)
    {
        return None;
    }
    let inner = rest[1..].split(')').next().unwrap_or("").trim();
    let call = if inner.is_empty() {
        format!("{method}({subject})")
    } else {
        format!("{method}({subject}, {inner})")
    };
    let start = text[..pos].trim_end().len() - prev.len();
    Some(
        ParseError::new(
            ParseErrorKind::Expression,
            format!("`{method}` is a function, not a method"),
            Span::new(start, pos),
            "called on a value",
        )
        .help(format!("functions take the value first: write `{call}`")),
    )
}

fn expr_error(text: &str, err: &pest::error::Error<ex::Rule>) -> ParseError {
    let pos = error_pos(err).min(text.len());
    let rest = &text[pos..];
    let here = char_span(text, pos);
    let mk = |message: String, label: &str| {
        ParseError::new(ParseErrorKind::Expression, message, here, label)
    };
    let operators = [
        "==", "!=", "<=", ">=", "<", ">", "&&", "||", "!", "and", "or", "not", "in",
    ];
    let prev = previous_token(text, pos);
    // `=>` and `=<` are `>=` and `<=` written backwards.
    for (written, meant) in [("=>", ">="), ("=<", "<=")] {
        if rest.starts_with(written) {
            return ParseError::new(
                ParseErrorKind::Expression,
                format!("`{written}` is not an operator"),
                Span::new(pos, pos + written.len()),
                format!("did you mean `{meant}`?"),
            )
            .help(format!("write `{meant}`: the `=` comes second"));
        }
    }
    if rest.starts_with('=') && !rest.starts_with("==") {
        return mk("use `==` to compare".to_owned(), "a single `=`")
            .help("write `==` for equality, `!=` for inequality");
    }
    if rest.starts_with('&') && !rest.starts_with("&&") {
        return mk("use `&&` for a logical and".to_owned(), "a single `&`")
            .help("write `&&` or `and`");
    }
    if rest.starts_with('|') && !rest.starts_with("||") {
        return mk("use `||` for a logical or".to_owned(), "a single `|`")
            .help("write `||` or `or`");
    }
    let at_end = rest.trim().is_empty() || rest.trim_start().starts_with([')', ',', ']']);
    if at_end
        && operators
            .iter()
            .any(|op| prev.eq_ignore_ascii_case(op) || prev.ends_with(op))
        && !prev.is_empty()
    {
        let op = operators
            .iter()
            .find(|op| prev.eq_ignore_ascii_case(op) || prev.ends_with(*op))
            .copied()
            .unwrap_or(prev);
        return mk(
            format!("`{op}` is missing its right operand"),
            "a value was expected here",
        )
        .help(format!(
            "write a value after `{op}`, such as `{op} 5` or `{op} 'text'`"
        ));
    }
    if rest.starts_with(['\'', '"']) && !rest[1..].contains(rest.chars().next().unwrap_or('\'')) {
        return mk("unclosed string".to_owned(), "this quote is never closed")
            .help("close the string with the same quote");
    }
    if rest.trim().is_empty() && text.matches('(').count() > text.matches(')').count() {
        return mk("missing `)`".to_owned(), "the expression ends here")
            .help("close every `(` with a `)`");
    }
    let word = word_at(text, pos);
    if !word.is_empty() && !prev.is_empty() {
        if FUNCTIONS.iter().any(|(n, _, _)| *n == word) {
            let right = rest[word.len()..]
                .split("&&")
                .next()
                .unwrap_or("")
                .split("||")
                .next()
                .unwrap_or("")
                .trim();
            return ParseError::new(
                ParseErrorKind::Expression,
                format!("`{word}` is a function, not an operator"),
                Span::new(pos, pos + word.len()),
                "used between two values",
            )
            .help(format!("write `{word}({prev}, {right})`"));
        }
        return ParseError::new(
            ParseErrorKind::Expression,
            format!("unexpected `{word}`"),
            Span::new(pos, pos + word.len()),
            "expected an operator such as `==`, `&&` or `||`",
        )
        .help("join conditions with `&&` or `||`, and quote text values: `'text'`");
    }
    if let Some(method) = method_call(text, pos, prev) {
        return method;
    }
    match rest.chars().next() {
        Some(c) => mk(format!("unexpected `{c}`"), "the expression cannot continue here")
            .help("expected a value, a path such as `item.score`, or an operator such as `==`, `&&` or `||`"),
        None => mk("the expression ends too early".to_owned(), "a value was expected here")
            .help("finish the condition, such as `score > 5`"),
    }
}

// ---------------------------------------------------------------------------------------
// Sort specifications.

pub(crate) fn parse_sort(text: &str) -> Result<SortSpec, ParseError> {
    if text.split(',').all(|k| k.trim().is_empty()) {
        return Err(ParseError::new(
            ParseErrorKind::Sort,
            "empty sort specification",
            Span::new(0, text.len()),
            "no sort key",
        )
        .help("write keys such as `priority DESC, name`"));
    }
    let mut pairs =
        so::P::parse(so::Rule::sort_spec, text).map_err(|e| sort_error(text, error_pos(&e)))?;
    let Some(top) = pairs.next() else {
        return Ok(SortSpec { keys: Vec::new() });
    };
    let mut keys = Vec::new();
    for key in top
        .into_inner()
        .filter(|p| p.as_rule() == so::Rule::sort_key)
    {
        let span = span_of(&key, 0);
        let mut sort_key = SortKey {
            path: Path::name(""),
            descending: false,
            nulls: None,
            span,
        };
        for part in key.into_inner() {
            match part.as_rule() {
                so::Rule::path => sort_key.path = path_of(part),
                so::Rule::direction => {
                    sort_key.descending = part
                        .into_inner()
                        .next()
                        .is_some_and(|d| d.as_rule() == so::Rule::desc);
                }
                so::Rule::nulls => {
                    let first = part
                        .into_inner()
                        .next()
                        .is_some_and(|n| n.as_rule() == so::Rule::nulls_first);
                    sort_key.nulls = Some(if first { Nulls::First } else { Nulls::Last });
                }
                _ => {}
            }
        }
        keys.push(sort_key);
    }
    Ok(SortSpec { keys })
}

fn sort_error(text: &str, pos: usize) -> ParseError {
    let word = word_at(text, pos);
    let span = if word.is_empty() {
        char_span(text, pos)
    } else {
        Span::new(pos, pos + word.len())
    };
    let mk =
        |message: String, label: &str| ParseError::new(ParseErrorKind::Sort, message, span, label);
    let prev = previous_token(text, pos);
    match word.to_ascii_uppercase().as_str() {
        "DESCENDING" => {
            return mk(
                "use `DESC` for a descending key".to_owned(),
                "not a keyword",
            )
            .help("write `DESC`");
        }
        "ASCENDING" => {
            return mk("use `ASC` for an ascending key".to_owned(), "not a keyword")
                .help("write `ASC`, or nothing: keys are ascending by default");
        }
        _ => {}
    }
    if prev.eq_ignore_ascii_case("nulls") {
        let help = match did_you_mean(word, ["first", "last"]) {
            Some(s) => format!("did you mean `NULLS {}`?", s.to_ascii_uppercase()),
            None => "write `NULLS FIRST` or `NULLS LAST`".to_owned(),
        };
        return mk(
            "`NULLS` needs `FIRST` or `LAST`".to_owned(),
            "expected `FIRST` or `LAST`",
        )
        .help(help);
    }
    if !word.is_empty() {
        let help = match did_you_mean(word, ["asc", "desc", "nulls"]) {
            Some(s) => format!("did you mean `{}`?", s.to_ascii_uppercase()),
            None => {
                "a key is `path [ASC|DESC] [NULLS FIRST|NULLS LAST]`; separate keys with commas"
                    .to_owned()
            }
        };
        return mk(format!("unexpected `{word}`"), "not part of a sort key").help(help);
    }
    mk(
        "invalid sort specification".to_owned(),
        "unexpected character",
    )
    .help("a key is `path [ASC|DESC] [NULLS FIRST|NULLS LAST]`; separate keys with commas")
}

// ---------------------------------------------------------------------------------------
// JSON path errors from jsonpath-rust.

pub(crate) fn jsonpath_error_position(
    err: &jsonpath_rust::parser::errors::JsonPathError,
) -> Option<usize> {
    match err {
        jsonpath_rust::parser::errors::JsonPathError::PestError(e) => Some(error_pos(e)),
        _ => None,
    }
}

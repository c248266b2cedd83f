//! Property tests: printing any AST and parsing the text gives the same AST back, and no
//! input makes a parser panic or overflow the stack.

use prodigy_grammar::expr::{BinOp, Expr, Func};
use prodigy_grammar::path::{Path, Segment};
use prodigy_grammar::sort::{Nulls, SortKey, SortSpec};
use prodigy_grammar::template::{Filter, Modifier, Part, Template, Var};
use prodigy_grammar::{ParseErrorKind, jsonpath::JsonPath};
use proptest::prelude::*;
use serde_json::Value;

const KEYWORDS: &[&str] = &["and", "or", "not", "in", "true", "false", "null"];

fn ident() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,6}".prop_filter("not a keyword", |s| !KEYWORDS.contains(&s.as_str()))
}

fn path() -> impl Strategy<Value = Path> {
    let segment = prop_oneof![
        ident().prop_map(Segment::Field),
        (0i64..20).prop_map(Segment::Index)
    ];
    (ident(), prop::collection::vec(segment, 0..3))
        .prop_map(|(root, segments)| Path { root, segments })
}

fn literal() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i32>().prop_map(Value::from),
        (-1000.0f64..1000.0).prop_map(|f| Value::from((f * 8.0).round() / 8.0 + 0.5)),
        "[a-zA-Z0-9 .,'\"\\\\-]{0,8}".prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
    ]
}

fn expr() -> impl Strategy<Value = Expr<()>> {
    let leaf = prop_oneof![
        literal().prop_map(|value| Expr::Literal { value, span: () }),
        path().prop_map(|path| Expr::Path { path, span: () }),
        path().prop_map(|path| Expr::Var { path, span: () }),
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        let op = prop_oneof![
            Just(BinOp::Or),
            Just(BinOp::And),
            Just(BinOp::Eq),
            Just(BinOp::Ne),
            Just(BinOp::Lt),
            Just(BinOp::Ge),
            Just(BinOp::In),
            Just(BinOp::NotIn),
        ];
        let unary_func = prop_oneof![Just(Func::IsNull), Just(Func::IsString), Just(Func::Length)];
        prop_oneof![
            (op, inner.clone(), inner.clone()).prop_map(|(op, l, r)| Expr::Binary {
                op,
                lhs: Box::new(l),
                rhs: Box::new(r),
                span: ()
            }),
            inner.clone().prop_map(|e| Expr::Not {
                expr: Box::new(e),
                span: ()
            }),
            prop::collection::vec(inner.clone(), 0..3)
                .prop_map(|items| Expr::List { items, span: () }),
            (unary_func, inner.clone()).prop_map(|(func, a)| Expr::Call {
                func,
                args: vec![a],
                regex: None,
                span: ()
            }),
            (inner.clone(), inner).prop_map(|(a, b)| Expr::Call {
                func: Func::Contains,
                args: vec![a, b],
                regex: None,
                span: ()
            }),
        ]
    })
}

fn template() -> impl Strategy<Value = Template<()>> {
    let modifier = prop_oneof![
        Just(None),
        Just(Some(Modifier::Json)),
        Just(Some(Modifier::Lines)),
        Just(Some(Modifier::Glob("*.md".into())))
    ];
    let filter = prop_oneof![
        Just(Filter::Shell),
        Just(Filter::Json),
        Just(Filter::Trim),
        "[a-z0-9 ]{0,5}".prop_map(Filter::Default)
    ];
    let var = (
        path(),
        modifier,
        prop::collection::vec(filter, 0..3),
        prop::option::of("[a-z ]{0,6}"),
    )
        .prop_map(|(path, modifier, filters, default)| Var {
            path,
            default: default.map(|d| Template {
                parts: if d.is_empty() {
                    vec![]
                } else {
                    vec![Part::Text(d)]
                },
            }),
            modifier,
            filters,
            span: (),
            path_span: (),
        });
    let part = prop_oneof![
        "[a-zA-Z0-9 {}:|.,'\"-]{1,8}".prop_map(Part::Text),
        Just(Part::Dollar),
        ident().prop_map(|name| Part::Bare { name, span: () }),
        var.prop_map(Part::Var),
    ];
    prop::collection::vec(part, 0..6).prop_map(normalize)
}

/// Merges adjacent text and drops text that would glue onto a preceding `$NAME`, the way
/// the parser reads it back.
fn normalize(parts: Vec<Part<()>>) -> Template<()> {
    let mut out: Vec<Part<()>> = Vec::new();
    for part in parts {
        match (out.last_mut(), part) {
            (Some(Part::Text(prev)), Part::Text(next)) => prev.push_str(&next),
            (Some(Part::Bare { .. }), Part::Text(next))
                if next.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') => {}
            (Some(Part::Bare { .. }), Part::Bare { .. }) => {}
            (_, part) => out.push(part),
        }
    }
    Template { parts: out }
}

fn sort_spec() -> impl Strategy<Value = SortSpec<()>> {
    let nulls = prop_oneof![
        Just(None),
        Just(Some(Nulls::First)),
        Just(Some(Nulls::Last))
    ];
    let key = (path(), any::<bool>(), nulls).prop_map(|(path, descending, nulls)| SortKey {
        path,
        descending,
        nulls,
        span: (),
    });
    prop::collection::vec(key, 1..4).prop_map(|keys| SortSpec { keys })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// JSON whose numbers a 64-bit value holds is read as it was: nothing is quoted.
    #[test]
    fn numbers_a_64_bit_value_holds_are_left_alone(
        numbers in proptest::collection::vec(
            prop_oneof![
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            ],
            0..8,
        )
    ) {
        let text = Value::Array(numbers).to_string();
        let (quoted, kept) = prodigy_grammar::exact::quote_inexact_numbers(&text);
        prop_assert!(kept.is_empty(), "{} kept {:?}", text, kept);
        prop_assert_eq!(quoted.as_ref(), text.as_str());
    }

    #[test]
    fn expressions_round_trip(e in expr()) {
        let text = e.to_string();
        let parsed = Expr::parse(&text).map_err(|err| TestCaseError::fail(format!("{text}: {err}")))?;
        prop_assert_eq!(parsed.strip(), e, "{}", text);
    }

    #[test]
    fn templates_round_trip(t in template()) {
        let text = t.to_string();
        let parsed = Template::parse(&text).map_err(|err| TestCaseError::fail(format!("{text}: {err}")))?;
        prop_assert_eq!(parsed.strip(), t, "{}", text);
    }

    #[test]
    fn sort_specs_round_trip(s in sort_spec()) {
        let text = s.to_string();
        let parsed = SortSpec::parse(&text).map_err(|err| TestCaseError::fail(format!("{text}: {err}")))?;
        prop_assert_eq!(parsed.strip(), s, "{}", text);
    }

    #[test]
    fn parsers_never_panic(text in "([ -~]|[éü😀]){0,40}") {
        parse_all(&text);
    }
}

/// Parses TEXT as every language; an error's span must lie on character boundaries.
fn parse_all(text: &str) {
    let spans = [
        Expr::parse(text).err().map(|e| e.span),
        Template::parse(text).err().map(|e| e.span),
        SortSpec::parse(text).err().map(|e| e.span),
        JsonPath::parse(text).err().map(|e| e.span),
    ];
    for span in spans.into_iter().flatten() {
        assert!(
            text.is_char_boundary(span.start) && text.is_char_boundary(span.end),
            "{text:?}: {span:?}"
        );
    }
}

#[test]
fn errors_next_to_non_ascii_text_do_not_panic() {
    for text in [
        "${é}",
        "${a.é}",
        "${aé",
        "x ${a|é}",
        "${a[ü]}",
        "]ééé",
        "@é",
        "..é]",
        "é]",
    ] {
        parse_all(text);
    }
}

#[test]
fn brackets_in_command_text_do_not_count_as_template_nesting() {
    let shell = format!("echo {}x{} ${{name}}", "(".repeat(100), ")".repeat(100));
    assert!(Template::parse(&shell).is_ok());
    let defaults = format!("{}x{}", "${a:-".repeat(100), "}".repeat(100));
    assert_eq!(
        Template::parse(&defaults).unwrap_err().kind,
        ParseErrorKind::TooDeep
    );
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let deep = format!("{}a{}", "(".repeat(10_000), ")".repeat(10_000));
    assert_eq!(
        Expr::parse(&deep).unwrap_err().kind,
        ParseErrorKind::TooDeep
    );
    let chain = vec!["a"; 5_000].join(" && ");
    assert_eq!(
        Expr::parse(&chain).unwrap_err().kind,
        ParseErrorKind::TooDeep
    );
    let nots = format!("{}a", "!".repeat(5_000));
    assert_eq!(
        Expr::parse(&nots).unwrap_err().kind,
        ParseErrorKind::TooDeep
    );
    let nested = format!("{}x{}", "${a:-".repeat(1_000), "}".repeat(1_000));
    assert_eq!(
        Template::parse(&nested).unwrap_err().kind,
        ParseErrorKind::TooDeep
    );
    let path = format!("$.a{}", "[?@.b".repeat(1_000));
    assert!(JsonPath::parse(&path).is_err());
}

/// 160,000 operators overflowed the stack when the refused tree was dropped: the depth is now
/// bounded while the tree is built, so no deep tree ever exists.
#[test]
fn huge_operator_runs_are_refused_before_a_tree_is_built() {
    for text in [
        format!("{}true", "!".repeat(160_000)),
        vec!["a"; 160_000].join(" || "),
        vec!["a"; 160_000].join(" and "),
        format!(
            "x in [{}]",
            vec![format!("{}a", "!".repeat(300)); 10].join(", ")
        ),
    ] {
        let err = Expr::parse(&text).unwrap_err();
        assert_eq!(
            err.kind,
            ParseErrorKind::TooDeep,
            "{}: {err:?}",
            &text[..40]
        );
        assert_eq!(err.label, "more than 256 levels");
    }
    // The limit itself is unchanged: 256 levels parse, 257 do not.
    assert!(Expr::parse(&vec!["a"; 256].join(" || ")).is_ok());
    assert!(Expr::parse(&vec!["a"; 257].join(" || ")).is_err());
    assert!(Expr::parse(&format!("{}a", "!".repeat(255))).is_ok());
    assert!(Expr::parse(&format!("{}a", "!".repeat(256))).is_err());
}

//! Strings in the small languages: parsed with `prodigy-grammar`, their syntax errors
//! reported at the exact characters inside the YAML scalar.

use prodigy_grammar::{ParseError, ParseErrorKind};

use super::Lowerer;
use crate::ast::{Condition, Parsed, Template};
use crate::diagnostics::{Code, Diagnostic};
use crate::source::{Span, Spanned};
use crate::syntax::{Node, ScalarStyle};

impl Lowerer<'_> {
    /// Whether a scalar's value can be mapped character by character onto its source.
    fn exact(&self, node: &Node) -> bool {
        let source = self
            .text
            .get(node.span.start as usize..node.span.end as usize)
            .unwrap_or("");
        match node.style() {
            Some(ScalarStyle::Plain | ScalarStyle::SingleQuoted | ScalarStyle::Literal) => true,
            Some(ScalarStyle::DoubleQuoted) => !source.contains('\\'),
            Some(ScalarStyle::Folded) | None => false,
        }
    }

    /// A string field parsed by one of the grammars.
    pub(crate) fn parsed<T>(
        &mut self,
        node: &Node,
        what: &str,
        parse: impl Fn(&str) -> Result<T, ParseError>,
    ) -> Option<Parsed<T>> {
        let text = self.string(node, what)?;
        let exact = self.exact(node);
        self.parse_text(text, exact, parse)
    }

    /// Parses text that is already lowered, reporting a syntax error inside it.
    pub(crate) fn parse_text<T>(
        &mut self,
        text: Spanned<String>,
        exact: bool,
        parse: impl Fn(&str) -> Result<T, ParseError>,
    ) -> Option<Parsed<T>> {
        match parse(&text.value) {
            Ok(parsed) => Some(Parsed {
                value: text.value,
                span: text.span,
                parsed,
                exact,
            }),
            Err(err) => {
                let shell = Parsed {
                    value: text.value,
                    span: text.span,
                    parsed: (),
                    exact,
                };
                self.syntax_error(&shell, &err);
                None
            }
        }
    }

    /// Reports a grammar's syntax error at its place in the file.
    pub(crate) fn syntax_error<T>(&mut self, at: &Parsed<T>, err: &ParseError) {
        let code = match err.kind {
            ParseErrorKind::Template => Code::TemplateSyntax,
            ParseErrorKind::Expression => Code::ExpressionSyntax,
            ParseErrorKind::Sort => Code::SortSyntax,
            ParseErrorKind::JsonPath => Code::JsonPathSyntax,
            ParseErrorKind::TooDeep => Code::ExpressionTooDeep,
        };
        let span = at.rebase(self.text, err.span);
        let label = if !at.exact && span == at.span {
            // The scalar uses escapes or folding: say which characters, since the label cannot.
            let snippet = at
                .value
                .get(err.span.start..err.span.end)
                .unwrap_or("")
                .trim();
            if snippet.is_empty() {
                err.label.clone()
            } else {
                format!("{} (at `{snippet}`)", err.label)
            }
        } else {
            err.label.clone()
        };
        let mut d = Diagnostic::new(code, err.message.clone()).with_primary(span, label);
        if let Some(help) = &err.help {
            d = d.with_help(help.clone());
        }
        self.push(d);
    }

    /// A `${...}` template.
    pub(crate) fn template(&mut self, node: &Node, what: &str) -> Option<Template> {
        self.parsed(node, what, prodigy_grammar::template::Template::parse)
    }

    /// A `shell:` command: a template where the shell's own parameter expansions
    /// (`${f%.rs}`) are kept as written, for W010 to report.
    pub(crate) fn shell_template(&mut self, node: &Node, what: &str) -> Option<Template> {
        self.parsed(node, what, prodigy_grammar::template::Template::parse_shell)
    }

    /// A template built by lowering (not written as one scalar): diagnostics label `span`.
    pub(crate) fn synthesized(&mut self, text: String, span: Span) -> Option<Template> {
        self.parse_text(
            Spanned::new(text, span),
            false,
            prodigy_grammar::template::Template::parse,
        )
    }

    /// A list of templates; a single string is a list of one.
    pub(crate) fn template_list(&mut self, node: &Node, what: &str) -> Vec<Template> {
        match node.as_seq() {
            Some(items) => items
                .iter()
                .filter_map(|n| self.template(n, what))
                .collect(),
            None => self.template(node, what).into_iter().collect(),
        }
    }

    /// A `when`-language condition.
    pub(crate) fn condition(&mut self, node: &Node, what: &str) -> Option<Condition> {
        self.parsed(node, what, prodigy_grammar::expr::Expr::parse)
    }
}

//! `${...}` interpolation templates: AST, canonical printer and renderer.
//!
//! Syntax: `${path}`, `${path:-default}` (the default is itself a template),
//! `${path:json}` / `${path:lines}` / `${path:GLOB}` for list variables (before a default),
//! `${path|shell}` / `|json` / `|trim` / `|default:VALUE` filters, `$NAME` (bare), and `$${`
//! for a literal `${` (docs/language.md §7); any other `$$` is itself, so that the shell's
//! `$$` survives. `${env:NAME}` is the same as `${env.NAME}`. In a `shell:` command
//! ([`Template::parse_shell`]) a parameter expansion only the shell reads (`${f%.rs}`) is
//! kept as written.

use std::fmt;

use serde_json::Value;

use crate::path::Path;
use crate::{ParseError, Span, value};

/// A parsed template.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Template<S = Span> {
    /// Text and references in order.
    pub parts: Vec<Part<S>>,
}

/// One piece of a template.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum Part<S = Span> {
    /// Literal text (never contains `${`).
    Text(String),
    /// `$${`: a literal `${`.
    Dollar,
    /// `$NAME`: a Prodigy variable if one has that name, otherwise left for the shell.
    Bare {
        /// The name.
        name: String,
        /// Where it was written.
        span: S,
    },
    /// `${...}`.
    Var(Var<S>),
    /// A parameter expansion only a shell reads (`${f%.rs}`, `${#f}`, `${1}`), in a `shell:`
    /// command: rendered as written.
    Shell {
        /// The whole `${...}` as written.
        text: String,
        /// Where it was written.
        span: S,
    },
}

/// A `${...}` reference.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Var<S = Span> {
    /// The variable path.
    pub path: Path,
    /// `:-default`.
    pub default: Option<Template<S>>,
    /// `:json`, `:lines` or `:GLOB`.
    pub modifier: Option<Modifier>,
    /// `|filter`s, applied in order.
    pub filters: Vec<Filter>,
    /// The whole `${...}`.
    pub span: S,
    /// The path alone.
    pub path_span: S,
}

/// A list modifier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Modifier {
    /// `:json`: a JSON array.
    Json,
    /// `:lines`: one entry per line.
    Lines,
    /// `:GLOB`: the entries matching the glob.
    Glob(String),
}

/// A `|filter`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Filter {
    /// POSIX single-quote escaping.
    Shell,
    /// JSON encoding.
    Json,
    /// Surrounding whitespace removed.
    Trim,
    /// This text when the variable is undefined or null.
    Default(String),
}

/// Filter names, for messages and suggestions.
pub const FILTERS: &[&str] = &["shell", "json", "trim", "default"];

impl Template<Span> {
    /// Parses a template.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        crate::lower::parse_template(text, 0)
    }

    /// Parses a `shell:` command, where a parameter expansion only the shell reads
    /// (`${f%.rs}`, `${#f}`, `${1}`) is kept for the shell as written.
    pub fn parse_shell(text: &str) -> Result<Self, ParseError> {
        crate::lower::parse_template_in(text, 0, true)
    }
}

impl<S: Clone> Template<S> {
    /// The same template without spans, for comparisons in tests.
    pub fn strip(&self) -> Template<()> {
        Template {
            parts: self.parts.iter().map(Part::strip).collect(),
        }
    }

    /// Every `${...}` reference, nested defaults included.
    pub fn vars(&self) -> Vec<&Var<S>> {
        let mut out = Vec::new();
        for part in &self.parts {
            if let Part::Var(var) = part {
                out.push(var);
                if let Some(default) = &var.default {
                    out.extend(default.vars());
                }
            }
        }
        out
    }

    /// Whether the template is plain text with no reference at all.
    pub fn is_literal(&self) -> bool {
        self.parts
            .iter()
            .all(|p| matches!(p, Part::Text(_) | Part::Dollar | Part::Shell { .. }))
    }
}

impl<S: Clone> Part<S> {
    fn strip(&self) -> Part<()> {
        match self {
            Part::Text(t) => Part::Text(t.clone()),
            Part::Dollar => Part::Dollar,
            Part::Bare { name, .. } => Part::Bare {
                name: name.clone(),
                span: (),
            },
            Part::Shell { text, .. } => Part::Shell {
                text: text.clone(),
                span: (),
            },
            Part::Var(v) => Part::Var(Var {
                path: v.path.clone(),
                default: v.default.as_ref().map(Template::strip),
                modifier: v.modifier.clone(),
                filters: v.filters.clone(),
                span: (),
                path_span: (),
            }),
        }
    }
}

impl<S> fmt::Display for Template<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Text(t) => f.write_str(t)?,
                Part::Dollar => f.write_str("$${")?,
                Part::Shell { text, .. } => f.write_str(text)?,
                Part::Bare { name, .. } => write!(f, "${name}")?,
                Part::Var(var) => write!(f, "{var}")?,
            }
        }
        Ok(())
    }
}

impl<S> fmt::Display for Var<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${{{}", self.path)?;
        match &self.modifier {
            None => {}
            Some(Modifier::Json) => f.write_str(":json")?,
            Some(Modifier::Lines) => f.write_str(":lines")?,
            Some(Modifier::Glob(g)) => write!(f, ":{g}")?,
        }
        if let Some(default) = &self.default {
            write!(f, ":-{default}")?;
        }
        for filter in &self.filters {
            match filter {
                Filter::Shell => f.write_str("|shell")?,
                Filter::Json => f.write_str("|json")?,
                Filter::Trim => f.write_str("|trim")?,
                Filter::Default(v) => write!(f, "|default:{v}")?,
            }
        }
        f.write_str("}")
    }
}

/// Where a template finds its variables.
pub trait Scope {
    /// The value of a path, or `None` when the variable does not exist.
    fn get(&self, path: &Path) -> Option<Value>;

    /// The value of a bare `$NAME`, or `None` to leave it for the shell. By default the
    /// same as `${NAME}`.
    fn get_bare(&self, name: &str) -> Option<Value> {
        self.get(&Path::name(name.to_owned()))
    }
}

impl Scope for Value {
    fn get(&self, path: &Path) -> Option<Value> {
        path.lookup(self).cloned()
    }
}

/// Why a template could not be rendered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A `${...}` names a variable that does not exist and has no default.
    #[error("undefined variable `{name}`")]
    Undefined {
        /// The path as written.
        name: String,
    },
    /// A glob modifier that does not compile.
    #[error("invalid glob `{glob}`")]
    BadGlob {
        /// The glob.
        glob: String,
    },
}

impl<S> Template<S> {
    /// Renders the template. An undefined `${...}` without a default is an error; an
    /// undefined `$NAME` is left for the shell.
    pub fn render(&self, scope: &dyn Scope) -> Result<String, RenderError> {
        self.render_parts(scope, false)
    }

    /// Renders what can be rendered and leaves every other `${...}` as written, for
    /// previews of commands whose variables do not exist yet (`run --dry-run`).
    pub fn render_lenient(&self, scope: &dyn Scope) -> String {
        self.render_parts(scope, true).unwrap_or_default()
    }

    fn render_parts(&self, scope: &dyn Scope, lenient: bool) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Dollar => out.push_str("${"),
                Part::Shell { text, .. } => out.push_str(text),
                Part::Bare { name, .. } => {
                    if let Some(v) = scope.get_bare(name) {
                        out.push_str(&value::render(&v));
                    } else {
                        out.push('$');
                        out.push_str(name);
                    }
                }
                Part::Var(var) => match var.render(scope) {
                    Ok(text) => out.push_str(&text),
                    Err(_) if lenient => out.push_str(&var.to_string()),
                    Err(e) => return Err(e),
                },
            }
        }
        Ok(out)
    }
}

impl<S> Var<S> {
    /// Renders one reference.
    pub fn render(&self, scope: &dyn Scope) -> Result<String, RenderError> {
        let fallback = self.filters.iter().find_map(|f| match f {
            Filter::Default(v) => Some(v.clone()),
            _ => None,
        });
        // A default applies when the path resolves to nothing or to JSON null (a missing
        // field of an existing variable, say `${item.owner}` of an item without one).
        let has_default = self.default.is_some() || fallback.is_some();
        let mut current = match scope.get(&self.path) {
            Some(v) if !(v.is_null() && has_default) => v,
            _ => match (&self.default, &fallback) {
                (Some(default), _) => return default.render(scope),
                (None, Some(v)) => Value::String(v.clone()),
                (None, None) => {
                    return Err(RenderError::Undefined {
                        name: self.path.to_string(),
                    });
                }
            },
        };
        if let Some(modifier) = &self.modifier {
            current = apply_modifier(current, modifier)?;
        }
        for filter in &self.filters {
            current = match filter {
                Filter::Shell => Value::String(value::shell_quote(&value::render(&current))),
                Filter::Json => Value::String(current.to_string()),
                Filter::Trim => Value::String(value::render(&current).trim().to_owned()),
                Filter::Default(v) if current.is_null() => Value::String(v.clone()),
                Filter::Default(_) => current,
            };
        }
        Ok(value::render(&current))
    }
}

fn apply_modifier(current: Value, modifier: &Modifier) -> Result<Value, RenderError> {
    let items = match current {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        Value::String(s) => s
            .split_whitespace()
            .map(|w| Value::String(w.to_owned()))
            .collect(),
        other => vec![other],
    };
    Ok(match modifier {
        Modifier::Json => Value::String(Value::Array(items).to_string()),
        Modifier::Lines => Value::String(
            items
                .iter()
                .map(value::render)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Modifier::Glob(glob) => {
            let matcher = globset::Glob::new(glob)
                .map_err(|_| RenderError::BadGlob { glob: glob.clone() })?
                .compile_matcher();
            Value::Array(
                items
                    .into_iter()
                    .filter(|v| v.as_str().is_some_and(|s| matcher.is_match(s)))
                    .collect(),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[track_caller]
    fn check(template: &str, vars: &Value, expect: &str) {
        let parsed = Template::parse(template).unwrap();
        assert_eq!(parsed.render(vars).unwrap(), expect);
    }

    #[test]
    fn lenient_rendering_keeps_what_it_cannot_resolve() {
        let vars = json!({"name": "Al"});
        let t = Template::parse("${name} ${later.field|shell} $HOME").unwrap();
        assert_eq!(t.render_lenient(&vars), "Al ${later.field|shell} $HOME");
    }

    #[test]
    fn renders_paths_defaults_filters_and_modifiers() {
        let vars = json!({"name": "Al", "n": 5, "item": {"a": {"b": [1, 2]}}, "files": ["a.md", "b.rs"], "q": "it's"});
        check(
            "Hi ${name}, $name and $${HOME}",
            &vars,
            "Hi Al, Al and ${HOME}",
        );
        // Only `$${` is an escape: the shell's `$$` (its process id) stays.
        check("echo $$ $$HOME $$$", &vars, "echo $$ $$HOME $$$");
        check("${item.a.b[1]} ${n}", &vars, "2 5");
        check("${missing:-${name}!}", &vars, "Al!");
        check("${a:-${b:-${name}}}", &vars, "Al");
        check(
            "${files:*.md} ${files:json}",
            &vars,
            "a.md [\"a.md\",\"b.rs\"]",
        );
        check("echo ${q|shell}", &vars, "echo 'it'\\''s'");
        check("${missing|default:none} $UNKNOWN", &vars, "none $UNKNOWN");
        check("${env:HOME}", &json!({"env": {"HOME": "/h"}}), "/h");
    }

    #[test]
    fn a_default_applies_to_a_null_or_missing_field() {
        let vars = json!({"item": {"id": 1, "owner": null}, "name": "Al"});
        check("${item.owner:-nobody}", &vars, "nobody");
        check("${item.team:-${name}}", &vars, "Al");
        check("${item.owner|default:none}", &vars, "none");
        check("${item.id:-x}", &vars, "1");
        // Without a default, null renders as nothing, as before.
        check("[${item.owner}]", &vars, "[]");
    }

    #[test]
    fn shell_parameter_expansions_stay_for_the_shell_in_shell_commands() {
        let vars = json!({"f": "Prodigy's", "name": "Al"});
        for text in [
            "${f%.rs}",
            "${f#*/}",
            "${f/a/b}",
            "${f:=x}",
            "${f:?unset}",
            "${f:+set}",
            "${#f}",
            "${!f}",
            "${1}",
            "${@}",
            "${#}",
            "${a[@]}",
            "${1:-${name}}",
        ] {
            let parsed = Template::parse_shell(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(parsed.render(&vars).unwrap(), text);
            assert_eq!(parsed.to_string(), text);
            let err = Template::parse(text).expect_err(text);
            assert!(
                err.help.as_deref().is_some_and(|h| h.contains("$${")),
                "{text}: {err:?}"
            );
        }
        // Prodigy's own syntax keeps its meaning.
        let parsed = Template::parse_shell("${f:-x} ${missing:-x} ${name|shell}").unwrap();
        assert_eq!(parsed.render(&vars).unwrap(), "Prodigy's x 'Al'");
    }

    #[test]
    fn undefined_variables_are_errors() {
        let parsed = Template::parse("echo ${nope}").unwrap();
        assert_eq!(
            parsed.render(&json!({})),
            Err(RenderError::Undefined {
                name: "nope".into()
            })
        );
    }
}

//! `env`, `secrets`, `profiles` and named `handlers`.

use super::{Lowerer, step::Ctx};
use crate::ast::{EnvValue, EnvVar, NamedSteps, Profile, Secret, SecretSource};
use crate::diagnostics::{Code, Diagnostic};
use crate::shapes;
use crate::source::Spanned;
use crate::syntax::{Node, Scalar};

impl Lowerer<'_> {
    /// An `env` mapping: names to strings, numbers, booleans, or the masked, dynamic and
    /// conditional forms.
    pub(crate) fn env_map(&mut self, node: &Node, what: &str) -> Vec<EnvVar> {
        let Some(map) = node.as_map() else {
            if !node.is_null() {
                self.wrong_type(node, what, "a mapping of variable names to values");
            }
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in map {
            let Some(name) = self.string(&entry.key, "a variable name") else {
                continue;
            };
            if let Some(value) = self.env_value(&entry.value) {
                out.push(EnvVar { name, value });
            }
        }
        out
    }

    fn env_value(&mut self, node: &Node) -> Option<EnvValue> {
        if node.as_map().is_none() {
            if node.as_seq().is_some() || node.is_null() {
                self.wrong_type(
                    node,
                    "an env value",
                    "a string, a number, a boolean, `{secret: true, value: ...}`, `{command: ...}` or `{condition, when_true, when_false}`",
                );
                return None;
            }
            return self.template(node, "an env value").map(EnvValue::Static);
        }
        // The form is the one whose distinguishing key the mapping has.
        let has = |lw: &Self, shape, key| lw.peek(node, shape).is_some_and(|f| f.has(key));
        if has(self, &shapes::ENV_DYNAMIC, "command") {
            let f = self.fields(node, "a dynamic env value", &shapes::ENV_DYNAMIC)?;
            let command = f.template(self, "command")?;
            let cache = f.flag(self, "cache", false);
            return Some(EnvValue::Dynamic { command, cache });
        }
        if has(self, &shapes::ENV_CONDITIONAL, "condition") {
            let f = self.fields(node, "a conditional env value", &shapes::ENV_CONDITIONAL)?;
            let condition = f.condition(self, "condition")?;
            let branch = |lw: &mut Self, key: &str| {
                f.require(
                    lw,
                    key,
                    "give both `when_true` and `when_false`",
                    Lowerer::template,
                )
            };
            let when_true = branch(self, "when_true");
            let when_false = branch(self, "when_false");
            return Some(EnvValue::Conditional {
                condition,
                when_true: when_true?,
                when_false: when_false?,
            });
        }
        let f = self.fields(node, "a masked env value", &shapes::ENV_MASKED)?;
        if !f.has("value") {
            self.missing(
                node.span,
                "an env value",
                "value",
                "write `{secret: true, value: \"...\"}`",
            );
            return None;
        }
        let value = f.template(self, "value")?;
        let secret = f.flag(self, "secret", false);
        Some(if secret {
            EnvValue::Masked(value)
        } else {
            EnvValue::Static(value)
        })
    }

    /// `secrets`: a process variable name, `${env:NAME}`, or `{provider: env|file, key}`.
    pub(crate) fn secrets(&mut self, node: &Node) -> Vec<Secret> {
        let Some(map) = node.as_map() else {
            self.wrong_type(node, "`secrets`", "a mapping of names to sources");
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in map {
            let Some(name) = self.string(&entry.key, "a secret name") else {
                continue;
            };
            let source = if entry.value.as_map().is_some() {
                self.secret_provider(&entry.value)
            } else {
                self.string(&entry.value, "a secret")
                    .map(|s| {
                        let var = s
                            .value
                            .trim()
                            .strip_prefix("${env:")
                            .or_else(|| s.value.trim().strip_prefix("${env."))
                            .and_then(|rest| rest.strip_suffix('}'))
                            .unwrap_or(s.value.trim())
                            .to_owned();
                        SecretSource::Env(Spanned::new(var, s.span))
                    })
                    .filter(|source| self.env_var_name(source))
            };
            if let Some(source) = source {
                out.push(Secret { name, source });
            }
        }
        out
    }

    fn secret_provider(&mut self, node: &Node) -> Option<SecretSource> {
        let f = self.fields(node, "a secret", &shapes::SECRET_PROVIDER)?;
        let provider = match f.node("provider") {
            Some(p) => {
                self.choice(p, "secret provider", &[("env", true), ("file", false)])?
                    .value
            }
            None => true,
        };
        if let Some(e) = f.entry("version") {
            self.no_effect(
                e,
                "only vault-style providers have versions",
                "remove `version`",
            );
        }
        let key = f.require(
            self,
            "key",
            "add `key:` naming the variable or file",
            Lowerer::string,
        )?;
        Some(if provider {
            SecretSource::Env(key)
        } else {
            SecretSource::File(key)
        })
    }

    /// Checks that a secret read from the environment names a variable.
    fn env_var_name(&mut self, source: &SecretSource) -> bool {
        let SecretSource::Env(name) = source else {
            return true;
        };
        let valid = name
            .value
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name
                .value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            self.push(
                Diagnostic::new(Code::WrongType, format!("`{}` is not an environment variable name", name.value))
                    .with_primary(name.span, "a secret names the variable that holds it")
                    .with_help("write the variable's name, such as `API_TOKEN` or `${env:API_TOKEN}`, never the secret itself"),
            );
        }
        valid
    }

    /// `profiles`: names to env overlays with an optional `description`.
    pub(crate) fn profiles(&mut self, node: &Node) -> Vec<Profile> {
        let Some(map) = node.as_map() else {
            self.wrong_type(
                node,
                "`profiles`",
                "a mapping of profile names to variables",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in map {
            let Some(name) = self.string(&entry.key, "a profile name") else {
                continue;
            };
            let Some(vars) = entry.value.as_map() else {
                self.wrong_type(
                    &entry.value,
                    "a profile",
                    "a mapping of variable names to values",
                );
                continue;
            };
            let mut profile = Profile {
                name,
                description: None,
                env: Vec::new(),
            };
            for var in vars {
                if var.key.text() == Some("description") {
                    profile.description = self.string(&var.value, "`description`");
                    continue;
                }
                let Some(var_name) = self.string(&var.key, "a variable name") else {
                    continue;
                };
                if matches!(var.value.scalar(), Some(Scalar::Null) | None) {
                    self.wrong_type(&var.value, "a profile value", "a string, number or boolean");
                    continue;
                }
                if let Some(value) = self.template(&var.value, "a profile value") {
                    profile.env.push(EnvVar {
                        name: var_name,
                        value: EnvValue::Static(value),
                    });
                }
            }
            out.push(profile);
        }
        out
    }

    /// `handlers`: names to step lists.
    pub(crate) fn handlers(&mut self, node: &Node) -> Vec<NamedSteps> {
        let Some(map) = node.as_map() else {
            self.wrong_type(
                node,
                "`handlers`",
                "a mapping of handler names to lists of steps",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in map {
            let Some(name) = self.string(&entry.key, "a handler name") else {
                continue;
            };
            let steps = self.steps(&entry.value, "a handler", Ctx::default());
            out.push(NamedSteps { name, steps });
        }
        out
    }

    /// Reports a `custom:<name>` that names no handler.
    pub(crate) fn check_handler_name(&mut self, name: &Spanned<String>, known: &[&str]) {
        if known.contains(&name.value.as_str()) {
            return;
        }
        let help = match super::suggest(&name.value, known.iter().copied()) {
            Some(s) => format!("did you mean `custom:{s}`?"),
            None => format!(
                "define it under `handlers:` at the top level, e.g. `handlers: {{{}: [...]}}`",
                name.value
            ),
        };
        self.push(
            Diagnostic::new(
                Code::UnknownHandler,
                format!("no handler named `{}`", name.value),
            )
            .with_primary(name.span, "not defined under `handlers`")
            .with_help(help),
        );
    }
}

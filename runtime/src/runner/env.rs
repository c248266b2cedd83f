//! A run's starting variables: workflow and profile `env`, `env_files`, secrets, and the
//! values of `command:` env entries.

use crate::message::Message;
use std::time::Duration;

use prodigy_grammar::template::Template;
use prodigy_plan::{self as plan, EnvValue, SecretSource};
use serde_json::Value;

use crate::exec::{self, Command, Output};
use crate::lock;
use crate::runner::{Runner, StartError};
use crate::vars::Vars;

impl Runner {
    /// The variables a run starts with: env files, workflow env, profile, secrets, args and
    /// params (docs/language.md §1 precedence, lowest first).
    pub async fn initial_vars(&self) -> Result<Vars, StartError> {
        self.starting_vars(false).await
    }

    /// The variables a dry run can know without running anything: secrets are not read
    /// (they show as `***`) and `command:` env values stay unresolved.
    pub async fn preview_vars(&self) -> Result<Vars, StartError> {
        self.starting_vars(true).await
    }

    pub(crate) async fn starting_vars(&self, dry: bool) -> Result<Vars, StartError> {
        let mut vars = Vars::default();
        for file in &self.plan.env_files {
            let name = file.parsed.render(&vars).map_err(|e| StartError::Env {
                name: format!("env_files: {}", file.value),
                why: e.to_string(),
            })?;
            let path = self.opts.project.join(&name);
            let read = std::fs::read_to_string(&path);
            if let Err(e) = &read {
                self.say(Message::EnvFileNotLoaded {
                    path: path.clone(),
                    why: e.to_string(),
                });
            }
            if let Ok(text) = read {
                for line in text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                {
                    if let Some((k, v)) = line.split_once('=') {
                        let v = v.trim().trim_matches('"').trim_matches('\'');
                        vars.set_exported(
                            k.trim().trim_start_matches("export ").trim(),
                            Value::String(v.to_owned()),
                        );
                    }
                }
            }
        }
        for (i, arg) in self.opts.args.iter().enumerate() {
            if i == 0 {
                vars.set_exported("ARG", Value::String(arg.clone()));
            }
            vars.set_exported(format!("ARG_{}", i + 1), Value::String(arg.clone()));
        }
        for (k, v) in &self.opts.params {
            match k.split_once('.') {
                // `--param build.target=release` is `${build.target}`.
                Some((root, fields)) => vars.set_field(root, fields, Value::String(v.clone())),
                None => vars.set_exported(k.clone(), Value::String(v.clone())),
            }
        }
        let mut secrets = Vec::new();
        for secret in &self.plan.secrets {
            if dry {
                secrets.push((secret.name.value.clone(), "***".to_owned()));
                continue;
            }
            let value = match &secret.source {
                SecretSource::Env(name) => {
                    std::env::var(&name.value).map_err(|_| StartError::Secret {
                        name: secret.name.value.clone(),
                        why: format!("environment variable `{}` is not set", name.value),
                    })?
                }
                SecretSource::File(path) => {
                    std::fs::read_to_string(self.opts.project.join(&path.value))
                        .map(|t| t.trim().to_owned())
                        .map_err(|e| StartError::Secret {
                            name: secret.name.value.clone(),
                            why: format!("cannot read `{}`: {e}", path.value),
                        })?
                }
            };
            self.add_secret(&secret.name.value, &value);
            secrets.push((secret.name.value.clone(), value));
        }
        for var in &self.plan.env {
            if let Some(value) = self
                .env_value(&var.name.value, &var.value, &vars, dry)
                .await?
            {
                vars.set_exported(var.name.value.clone(), value);
            }
        }
        if let Some(name) = &self.opts.profile {
            let profile = self
                .plan
                .profiles
                .iter()
                .find(|p| &p.name.value == name)
                .ok_or_else(|| StartError::Profile(name.clone()))?;
            for var in &profile.env {
                if let Some(value) = self
                    .env_value(&var.name.value, &var.value, &vars, dry)
                    .await?
                {
                    vars.set_exported(var.name.value.clone(), value);
                }
            }
        }
        // Secrets last: they win over everything.
        for (name, value) in secrets {
            vars.set_exported(name, Value::String(value));
        }
        Ok(vars)
    }

    /// Runs again, before each step, the workflow's and the profile's `command:` env values
    /// that are not cached (`cache: false`, the default), so each step sees a fresh value.
    pub(crate) async fn refresh_env(&self, vars: &mut Vars) -> Result<(), StartError> {
        let profile = self
            .opts
            .profile
            .as_ref()
            .and_then(|name| self.plan.profiles.iter().find(|p| &p.name.value == name));
        let overridden =
            |name: &str| profile.is_some_and(|p| p.env.iter().any(|v| v.name.value == name));
        let fresh = self
            .plan
            .env
            .iter()
            .filter(|v| !overridden(&v.name.value))
            .chain(profile.into_iter().flat_map(|p| &p.env))
            .filter(|v| matches!(v.value, EnvValue::Dynamic { cache: false, .. }));
        for var in fresh {
            if let Some(value) = self
                .env_value(&var.name.value, &var.value, vars, false)
                .await?
            {
                vars.set_exported(var.name.value.clone(), value);
            }
        }
        Ok(())
    }

    /// An env value; `None` for a `command:` value in a dry run (it is not run).
    pub(crate) async fn env_value(
        &self,
        name: &str,
        value: &EnvValue,
        vars: &Vars,
        dry: bool,
    ) -> Result<Option<Value>, StartError> {
        let render = |t: &plan::Template, vars: &Vars| {
            t.parsed.render(vars).map_err(|e| StartError::Env {
                name: name.to_owned(),
                why: e.to_string(),
            })
        };
        Ok(Some(match value {
            EnvValue::Static(t) => Value::String(render(t, vars)?),
            EnvValue::Masked(t) => {
                let text = render(t, vars)?;
                self.add_secret(name, &text);
                Value::String(text)
            }
            EnvValue::Dynamic { .. } if dry => return Ok(None),
            EnvValue::Dynamic { command, cache } => {
                let text = render(command, vars)?;
                if *cache && let Some(hit) = lock(&self.env_cache).get(&text) {
                    return Ok(Some(Value::String(hit.clone())));
                }
                let out = self.run_shell(&text, vars).await;
                if out.code != Some(0) {
                    return Err(StartError::Env {
                        name: name.to_owned(),
                        why: format!("`{text}` failed: {}", out.stderr.trim()),
                    });
                }
                let value = out.stdout.trim().to_owned();
                if *cache {
                    lock(&self.env_cache).insert(text, value.clone());
                }
                Value::String(value)
            }
            EnvValue::Conditional {
                condition,
                when_true,
                when_false,
            } => {
                let test = condition.parsed.test(vars).map_err(|e| StartError::Env {
                    name: name.to_owned(),
                    why: e.to_string(),
                })?;
                Value::String(render(if test { when_true } else { when_false }, vars)?)
            }
        }))
    }

    /// Runs TEXT with `sh -c` in the project with the environment of VARS, for at most
    /// 5 minutes: env `command:` values and map input commands.
    pub(crate) async fn run_shell(&self, text: &str, vars: &Vars) -> Output {
        let (program, args) = exec::shell(text);
        let cmd = Command {
            program,
            args,
            cwd: self.workdir(),
            env: vars.environment(),
            clear_env: false,
            timeout: Some(Duration::from_mins(5)),
            grace: self.opts.grace,
            output_limit: self.opts.output_limit,
            spill: None,
            mask: None,
            stdin: None,
            agent: None,
        };
        let request = crate::executor::Request {
            kind: crate::executor::RequestKind::Shell {
                text: text.to_owned(),
            },
            command: cmd,
            watch: None,
            cancel: self.cancel_rx(),
        };
        self.executor.run(request).await
    }

    /// A template as `--dry-run` shows it: what can be resolved is, the rest stays as
    /// written, secrets are masked.
    pub fn preview(&self, template: &Template, vars: &Vars) -> String {
        self.mask(&template.render_lenient(vars))
    }
}

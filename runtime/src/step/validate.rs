//! `validate` and `step_validate`: running the checks, reading the result, `on_incomplete`.

use crate::message::Message;
use prodigy_plan as plan;
use prodigy_plan::PlanStep;
use serde_json::{Value, json};

use crate::exec;
use crate::machine::Outcome;
use crate::runner::Runner;
use crate::vars::Vars;

impl Runner {
    /// `step_validate`: run the checks, up to `max_attempts` rounds `retry_delay` apart,
    /// until `success_criteria` holds.
    pub(crate) async fn step_validate(
        &self,
        step: &PlanStep,
        checks: &plan::StepValidate,
        vars: &Vars,
    ) -> bool {
        let timeout = checks.timeout.as_ref().map(|t| t.value).or(step.timeout);
        let rounds = checks.max_attempts.max(1);
        for round in 1..=rounds {
            let mut passed = 0u32;
            for check in &checks.checks {
                let out = if check.claude {
                    self.run_claude(&check.command, step, vars, timeout, false, None)
                        .await
                } else {
                    self.run_command_for(&exec::shell, &check.command, step, vars, timeout, false)
                        .await
                };
                let output_ok = check
                    .expect_output
                    .as_ref()
                    .is_none_or(|p| p.is_match(&out.stdout));
                if out.code == Some(check.expect_exit_code) && output_ok {
                    passed += 1;
                }
            }
            let total = u32::try_from(checks.checks.len()).unwrap_or(u32::MAX);
            let ok = match checks.success_criteria {
                plan::SuccessCriteria::All => passed == total,
                plan::SuccessCriteria::Any => passed > 0 || total == 0,
                plan::SuccessCriteria::AtLeast(n) => passed >= n,
            };
            self.record(&crate::events::Event::StepValidationFinished {
                step: step.label.clone(),
                round,
                passed,
                checks: total,
                success: ok,
            });
            if ok {
                return true;
            }
            if round < rounds {
                let mut cancel = self.cancel_rx();
                tokio::select! {
                    () = tokio::time::sleep(checks.retry_delay) => {}
                    () = exec::cancelled(&mut cancel) => return false,
                }
            }
        }
        self.say(Message::StepValidateFailed {
            label: step.label.clone(),
            ignored: false,
        });
        false
    }

    pub(crate) async fn validate(
        &self,
        step: &PlanStep,
        validate: &prodigy_plan::PlanValidate,
        vars: &mut Vars,
        outcome: Outcome,
    ) -> Outcome {
        let rounds = validate
            .on_incomplete
            .as_ref()
            .map_or(1, |o| o.max_attempts.max(1));
        for round in 1..=rounds {
            vars.last_output = None;
            let ok = match self.run_list(&validate.commands, vars).await {
                Outcome::Cancelled => return Outcome::Cancelled,
                ended => ended.continues(),
            };
            let mut result = self.validation_result(validate, vars, ok);
            if let Some(schema) = &validate.expected_schema
                && let Err(why) = matches_schema(schema, &result)
            {
                let why = why.to_string();
                self.say(Message::ValidationInvalid {
                    label: step.label.clone(),
                    why: why.clone(),
                });
                result = json!({"completion_percentage": 0, "status": "invalid", "missing": [why]});
            }
            // The value as the validator wrote it, so `${validation.completion}` renders `100`.
            let reported = result
                .get("completion_percentage")
                .filter(|v| v.is_number())
                .cloned()
                .unwrap_or_else(|| json!(if ok { 100 } else { 0 }));
            let completion = reported.as_f64().unwrap_or(0.0);
            let complete = completion >= validate.threshold;
            let missing = result.get("missing").cloned().unwrap_or(json!([]));
            vars.set(
                "validation",
                json!({"completion": reported, "missing": missing, "gaps": result.get("gaps").cloned().unwrap_or(json!({})), "status": result.get("status").cloned().unwrap_or(json!(if complete {"complete"} else {"incomplete"})), "attempt_number": round}),
            );
            self.record(&crate::events::Event::ValidationFinished {
                step: step.label.clone(),
                round,
                completion,
                complete,
            });
            if complete {
                return outcome;
            }
            let Some(on_incomplete) = &validate.on_incomplete else {
                self.say(Message::ValidationIncomplete {
                    label: step.label.clone(),
                    completion,
                    threshold: validate.threshold,
                });
                return outcome;
            };
            if round == rounds {
                if on_incomplete.fail_workflow {
                    self.say(Message::ValidationGaveUp {
                        label: step.label.clone(),
                        completion,
                        fails_after: Some(rounds),
                    });
                    return Outcome::Failed;
                }
                self.say(Message::ValidationGaveUp {
                    label: step.label.clone(),
                    completion,
                    fails_after: None,
                });
                return outcome;
            }
            if let Some(prompt) = &on_incomplete.prompt {
                self.say(Message::PromptPreview(self.preview(&prompt.parsed, vars)));
            }
            let head_before = if on_incomplete.commit_required {
                crate::worktree::facts::head(&self.workdir()).await
            } else {
                None
            };
            let ended = self
                .run_triggered(&on_incomplete.commands, vars, outcome)
                .await;
            if !ended.continues() {
                return ended;
            }
            if on_incomplete.commit_required
                && self
                    .made_commit(step, "`on_incomplete` of ", head_before.as_deref())
                    .await
                    .is_err()
            {
                return Outcome::Failed;
            }
        }
        outcome
    }

    pub(crate) fn validation_result(
        &self,
        validate: &prodigy_plan::PlanValidate,
        vars: &Vars,
        ok: bool,
    ) -> Value {
        let Some(template) = &validate.result_file else {
            // Without a result file the validator's output may be the result; if it is not
            // JSON, its exit status decides.
            return vars
                .last_output
                .as_deref()
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_else(|| json!({"completion_percentage": if ok {100} else {0}}));
        };
        // A result file the validator promised but did not write is an incomplete result.
        let result = template
            .parsed
            .render(vars)
            .map_err(ResultFileError::Render)
            .and_then(|p| {
                std::fs::read_to_string(self.workdir().join(&p))
                    .map_err(|source| ResultFileError::Read { path: p, source })
            })
            .and_then(|t| serde_json::from_str(&t).map_err(ResultFileError::NotJson));
        result.unwrap_or_else(|why| {
            json!({"completion_percentage": 0, "status": "invalid", "missing": [format!("result_file: {why}")]})
        })
    }
}

/// Why a validation's `result_file` gave no result (the result is then incomplete).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum ResultFileError {
    /// Its path did not render.
    #[error("{0}")]
    Render(#[source] prodigy_grammar::template::RenderError),
    /// It could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The path, as rendered.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// It is not JSON.
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
}

/// Why a validation result does not pass `expected_schema`.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum SchemaError {
    /// `expected_schema` is not a JSON Schema.
    #[error("the schema is invalid: {0}")]
    Invalid(#[source] Box<jsonschema::ValidationError<'static>>),
    /// The result does not match it.
    #[error("{0}")]
    Mismatch(#[source] Box<jsonschema::ValidationError<'static>>),
}

/// Checks a validation result against `expected_schema`.
pub(crate) fn matches_schema(schema: &Value, result: &Value) -> Result<(), SchemaError> {
    let validator =
        jsonschema::validator_for(schema).map_err(|e| SchemaError::Invalid(Box::new(e)))?;
    validator
        .validate(result)
        .map_err(|e| SchemaError::Mismatch(Box::new(e.to_owned())))
}

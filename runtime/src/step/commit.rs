//! `commit_required` and `auto_commit`: whether a step made a commit, and making one.

use crate::message::Message;
use prodigy_plan::PlanStep;

use crate::runner::Runner;
use crate::vars::Vars;

impl Runner {
    /// Whether HEAD moved since BEFORE (`commit_required`); when it did not, records and says
    /// `CommitValidationFailed` for WHAT (`""`, "the handler of ", ...) of STEP, and returns
    /// what it said.
    pub(crate) async fn made_commit(
        &self,
        step: &PlanStep,
        what: &str,
        before: Option<&str>,
    ) -> Result<(), String> {
        let after = crate::git::head(&self.workdir()).await;
        if after.is_some() && after.as_deref() != before {
            return Ok(());
        }
        self.record(&crate::events::Event::StepFailed {
            step: step.label.clone(),
            error: "CommitValidationFailed".to_owned(),
        });
        let why = format!(
            "{what}`{}` requires a commit and made none (CommitValidationFailed)",
            step.label
        );
        self.say(Message::CommitFailed(why.clone()));
        Err(why)
    }

    /// `auto_commit` / `commit_config`: stage (all, or the included paths minus the excluded
    /// ones), commit with the rendered message (checked against `message_pattern`), the
    /// `author`, signed when asked, and squash what the step committed into one commit.
    pub(crate) async fn commit(
        &self,
        step: &PlanStep,
        vars: &Vars,
        head_before: Option<&str>,
    ) -> Result<(), String> {
        let config = step.commit_config.as_ref();
        let message = config
            .and_then(|c| c.message_template.as_ref())
            .map(|t| {
                t.parsed
                    .render(vars)
                    .map_err(|e| format!("commit message: {e}"))
            })
            .transpose()?
            .unwrap_or_else(|| format!("prodigy: {}", step.label));
        if let Some(pattern) = config.and_then(|c| c.message_pattern.as_ref())
            && !pattern.is_match(&message)
        {
            return Err(format!(
                "commit message `{message}` does not match `message_pattern` `{}`",
                pattern.as_str()
            ));
        }
        let author = config
            .and_then(|c| c.author.as_ref())
            .map(|t| {
                t.parsed
                    .render(vars)
                    .map_err(|e| format!("commit author: {e}"))
            })
            .transpose()?;
        let options = crate::git::CommitOptions {
            message,
            author,
            sign: config.is_some_and(|c| c.sign),
            include: config
                .map(|c| c.include_files.iter().map(|f| f.value.clone()).collect())
                .unwrap_or_default(),
            exclude: config
                .map(|c| c.exclude_files.iter().map(|f| f.value.clone()).collect())
                .unwrap_or_default(),
            squash_since: config
                .is_some_and(|c| c.squash)
                .then_some(head_before)
                .flatten()
                .map(str::to_owned),
        };
        crate::git::commit(&self.workdir(), &options).await
    }
}

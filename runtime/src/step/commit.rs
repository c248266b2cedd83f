//! `commit_required` and `auto_commit`: whether a step made a commit, and making one.

use crate::message::Message;
use prodigy_plan::PlanStep;

use crate::runner::Runner;
use crate::vars::Vars;
use prodigy_grammar::template::RenderError;

/// Why a step's commit check or commit failed (`commit_required`, `auto_commit`).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum StepCommitError {
    /// `commit_required`: HEAD did not move. OF says whose commands ran (`""`, "the handler
    /// of ", ...).
    #[error("{of}`{label}` requires a commit and made none (CommitValidationFailed)")]
    NoCommit {
        /// Whose commands: the step's own (`""`) or a handler's.
        of: &'static str,
        /// The step.
        label: String,
    },
    /// `commit_config.message_template` did not render.
    #[error("commit message: {0}")]
    Message(#[source] RenderError),
    /// The rendered message does not match `message_pattern`.
    #[error("commit message `{message}` does not match `message_pattern` `{pattern}`")]
    Pattern {
        /// The rendered message.
        message: String,
        /// The pattern.
        pattern: String,
    },
    /// `commit_config.author` did not render.
    #[error("commit author: {0}")]
    Author(#[source] RenderError),
    /// Git refused the commit.
    #[error(transparent)]
    Git(#[from] crate::worktree::facts::CommitError),
}

impl Runner {
    /// Whether HEAD moved since BEFORE (`commit_required`); when it did not, records and says
    /// `CommitValidationFailed` for WHAT (`""`, "the handler of ", ...) of STEP, and returns
    /// what it said.
    pub(crate) async fn made_commit(
        &self,
        step: &PlanStep,
        what: &'static str,
        before: Option<&str>,
    ) -> Result<(), StepCommitError> {
        let after = crate::worktree::facts::head(&self.workdir()).await;
        if after.is_some() && after.as_deref() != before {
            return Ok(());
        }
        self.record(&crate::events::Event::StepFailed {
            step: step.label.clone(),
            error: "CommitValidationFailed".to_owned(),
        });
        let why = StepCommitError::NoCommit {
            of: what,
            label: step.label.clone(),
        };
        self.say(Message::CommitFailed(why.to_string()));
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
    ) -> Result<(), StepCommitError> {
        let config = step.commit_config.as_ref();
        let message = config
            .and_then(|c| c.message_template.as_ref())
            .map(|t| t.parsed.render(vars).map_err(StepCommitError::Message))
            .transpose()?
            .unwrap_or_else(|| format!("prodigy: {}", step.label));
        if let Some(pattern) = config.and_then(|c| c.message_pattern.as_ref())
            && !pattern.is_match(&message)
        {
            return Err(StepCommitError::Pattern {
                message,
                pattern: pattern.as_str().to_owned(),
            });
        }
        let author = config
            .and_then(|c| c.author.as_ref())
            .map(|t| t.parsed.render(vars).map_err(StepCommitError::Author))
            .transpose()?;
        let options = crate::worktree::facts::CommitOptions {
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
        Ok(crate::worktree::facts::commit(&self.workdir(), &options).await?)
    }
}

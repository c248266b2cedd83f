//! The resume rules: which checkpoints continue, which only merge back, which are refused.

use prodigy_plan::{Plan, StepId};

use crate::jobstore::{JobCheckpoint, JobPhase, Status};
use crate::store::{Checkpoint, SessionStatus};
use crate::worktree::{self, SessionWorktree};

/// What resuming a checkpoint does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// It completed and its work is merged back (or it had no worktree): nothing to do.
    Nothing,
    /// It completed, and its session branch is not merged back yet: resuming merges it.
    MergeBack,
    /// It continues where it stopped.
    Continue,
}

/// Whether a completed run's session branch is still to be merged: a resume of it merges it
/// back (with its `merge` steps).
fn unmerged(saved: Option<&SessionWorktree>) -> bool {
    saved.is_some_and(worktree::pending_merge)
}

fn resume(completed: bool, saved: Option<&SessionWorktree>) -> Resume {
    match (completed, unmerged(saved)) {
        (false, _) => Resume::Continue,
        (true, true) => Resume::MergeBack,
        (true, false) => Resume::Nothing,
    }
}

/// What resuming the standard run of CHECKPOINT does.
#[must_use]
pub fn session(checkpoint: &Checkpoint) -> Resume {
    resume(
        checkpoint.status == SessionStatus::Completed,
        checkpoint.worktree.as_ref(),
    )
}

/// What resuming the job of CHECKPOINT does.
#[must_use]
pub fn job(checkpoint: &JobCheckpoint) -> Resume {
    resume(
        checkpoint.status == Status::Completed,
        checkpoint.worktree.as_ref(),
    )
}

/// Why a resume is refused.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum Refused {
    /// The workflow of a session changed since it started (without `--force`).
    #[error(
        "{} changed since the session started; resume with --force to run the new version from step {}",
        workflow.display(),
        next_step.saturating_add(1)
    )]
    #[diagnostic(code(prodigy::resume::session_edited))]
    SessionEdited {
        /// The workflow file.
        workflow: std::path::PathBuf,
        /// The step (0-based) it would continue from.
        next_step: usize,
    },
    /// The workflow of a job changed since it started (without `--force`).
    #[error(
        "{} changed since the job started; resume with --force to continue with the new version",
        workflow.display()
    )]
    #[diagnostic(code(prodigy::resume::job_edited))]
    JobEdited {
        /// The workflow file.
        workflow: std::path::PathBuf,
    },
    /// Its error policy stopped the job (without `--force`): resumed as it is, it stops
    /// again at its next failure.
    #[error("job {job} stopped: {reason}")]
    #[diagnostic(code(prodigy::resume::stopped))]
    Stopped {
        /// The job.
        job: String,
        /// Why it stopped, as the runtime said.
        reason: String,
    },
}

/// Whether the session of CHECKPOINT may continue with the workflow now reading TEXT: an
/// edited workflow only with FORCE (the new version is then the session's from now on).
///
/// # Errors
///
/// [`Refused::SessionEdited`].
pub fn check_session(checkpoint: &Checkpoint, text: &str, force: bool) -> Result<(), Refused> {
    if crate::store::hash(text) != checkpoint.workflow_hash && !force {
        return Err(Refused::SessionEdited {
            workflow: checkpoint.workflow.clone(),
            next_step: checkpoint.next_step,
        });
    }
    Ok(())
}

/// Whether the job of CHECKPOINT may continue with the workflow now reading TEXT: an edited
/// workflow, or a job its error policy stopped, only with FORCE.
///
/// # Errors
///
/// [`Refused::JobEdited`], then [`Refused::Stopped`].
pub fn check_job(checkpoint: &JobCheckpoint, text: &str, force: bool) -> Result<(), Refused> {
    if force {
        return Ok(());
    }
    if crate::store::hash(text) != checkpoint.workflow_hash {
        return Err(Refused::JobEdited {
            workflow: checkpoint.workflow_file.clone(),
        });
    }
    // A job stopped at its Claude budget continues (under a larger `--max-cost-usd`, or it
    // stops again at once): nothing about it needs fixing first.
    if checkpoint.status == Status::Stopped && checkpoint.claude_budget_reached.is_none() {
        return Err(Refused::Stopped {
            job: checkpoint.job_id.clone(),
            reason: checkpoint
                .stop_reason
                .clone()
                .unwrap_or_else(|| "its error policy stopped it".to_owned()),
        });
    }
    Ok(())
}

/// The steps a resumed session starts from, for [`super::preflight`]: from its next step
/// unless it completed, and the `merge` steps when it has a worktree to merge back.
#[must_use]
pub fn session_roots(plan: &Plan, checkpoint: &Checkpoint) -> Vec<StepId> {
    let completed = checkpoint.status == SessionStatus::Completed;
    super::roots(
        plan,
        (!completed).then_some(JobPhase::Setup),
        checkpoint.next_step,
        checkpoint.worktree.is_some(),
    )
}

/// The steps a resumed job starts from, for [`super::preflight`]: from the phase it stopped
/// in unless it completed, and the `merge` steps when it has a worktree to merge back.
#[must_use]
pub fn job_roots(plan: &Plan, checkpoint: &JobCheckpoint) -> Vec<StepId> {
    let completed = checkpoint.status == Status::Completed;
    super::roots(
        plan,
        (!completed).then_some(checkpoint.phase),
        0,
        checkpoint.worktree.is_some(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SessionStatus;
    use prodigy_plan::StepId;
    use std::path::PathBuf;

    fn session_checkpoint(status: SessionStatus, text: &str) -> Checkpoint {
        Checkpoint {
            version: 1,
            session_id: "session-1".into(),
            workflow: PathBuf::from("/p/w.yml"),
            project: PathBuf::from("/p"),
            workflow_hash: crate::store::hash(text),
            next_step: 2,
            status,
            variables: serde_json::Value::Null,
            params: Vec::new(),
            args: Vec::new(),
            profile: None,
            started_at: String::new(),
            updated_at: String::new(),
            worktree: None,
            continued: Vec::new(),
            claude: None,
            seq: 0,
        }
    }

    fn job_checkpoint(status: Status, text: &str) -> JobCheckpoint {
        let opts = crate::runner::Options::new(
            PathBuf::from("/p/w.yml"),
            text,
            PathBuf::from("/p"),
            crate::layout::Layout {
                home: PathBuf::from("/home"),
                repo: "demo".into(),
            },
            crate::runner::Inputs::default(),
        );
        JobCheckpoint {
            status,
            phase: JobPhase::Map,
            ..crate::session::new_job_checkpoint("job-1", &opts)
        }
    }

    fn plan(commands: u32) -> Plan {
        Plan {
            commands: (0..commands).map(StepId).collect(),
            ..Plan::empty("w.yml")
        }
    }

    #[test]
    fn a_completed_run_without_a_worktree_has_nothing_to_resume_and_others_continue() {
        let text = "commands: []";
        assert_eq!(
            session(&session_checkpoint(SessionStatus::Completed, text)),
            Resume::Nothing
        );
        for status in [
            SessionStatus::Running,
            SessionStatus::Failed,
            SessionStatus::Interrupted,
        ] {
            assert_eq!(session(&session_checkpoint(status, text)), Resume::Continue);
        }
        assert_eq!(
            job(&job_checkpoint(Status::Completed, text)),
            Resume::Nothing
        );
        for status in [
            Status::Running,
            Status::Failed,
            Status::Stopped,
            Status::Interrupted,
        ] {
            assert_eq!(job(&job_checkpoint(status, text)), Resume::Continue);
        }
    }

    #[test]
    fn an_edited_workflow_is_refused_unless_forced_and_says_the_step() {
        let c = session_checkpoint(SessionStatus::Failed, "old");
        assert!(check_session(&c, "old", false).is_ok());
        assert!(check_session(&c, "new", true).is_ok());
        let e = check_session(&c, "new", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/p/w.yml changed since the session started; resume with --force to run the new version from step 3"
        );
    }

    #[test]
    fn a_job_stopped_at_its_claude_budget_resumes_without_force_unless_edited() {
        let mut c = job_checkpoint(Status::Stopped, "old");
        c.stop_reason = Some("Claude budget reached ($0.30 of $0.25)".into());
        c.claude_budget_reached = Some(crate::claude::budget::Reached {
            spent: 0.3,
            limit: 0.25,
        });
        assert!(check_job(&c, "old", false).is_ok());
        let e = check_job(&c, "new", false).unwrap_err();
        assert!(matches!(e, Refused::JobEdited { .. }), "{e}");
    }

    #[test]
    fn a_stopped_job_is_refused_unless_forced_after_the_edited_check() {
        let mut c = job_checkpoint(Status::Stopped, "old");
        // Both refusals apply: the edit is named first.
        let e = check_job(&c, "new", false).unwrap_err();
        assert!(matches!(e, Refused::JobEdited { .. }), "{e}");
        let e = check_job(&c, "old", false).unwrap_err();
        assert!(
            matches!(&e, Refused::Stopped { job, reason } if job == "job-1" && reason == "its error policy stopped it"),
            "{e:?}"
        );
        c.stop_reason = Some("`max_failures` (2) reached".into());
        let e = check_job(&c, "old", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "job job-1 stopped: `max_failures` (2) reached"
        );
        assert!(check_job(&c, "new", true).is_ok());
        c.status = Status::Failed;
        assert!(check_job(&c, "old", false).is_ok());
    }

    #[test]
    fn a_resumed_run_runs_with_what_its_checkpoint_kept() {
        let layout = crate::layout::Layout {
            home: PathBuf::from("/home"),
            repo: "demo".into(),
        };
        let inputs = crate::runner::Inputs {
            params: vec![("KEY".into(), "value".into())],
            args: vec!["first".into()],
            profile: Some("ci".into()),
        };
        let mut c = session_checkpoint(SessionStatus::Failed, "old");
        c.params.clone_from(&inputs.params);
        c.args.clone_from(&inputs.args);
        c.profile.clone_from(&inputs.profile);
        let opts = crate::runner::Options::resumed(&c, "new", layout.clone());
        assert_eq!(
            (opts.params, opts.args, opts.profile),
            (
                inputs.params.clone(),
                inputs.args.clone(),
                inputs.profile.clone()
            )
        );
        assert_eq!(opts.workflow, c.workflow);
        assert_eq!(opts.project, c.project);
        assert_eq!(opts.workflow_hash, crate::store::hash("new"));
        let mut j = job_checkpoint(Status::Failed, "old");
        j.params = inputs.params.clone();
        j.args = inputs.args.clone();
        j.profile = inputs.profile.clone();
        let opts = crate::runner::Options::resumed_job(&j, "old", layout);
        assert_eq!(crate::runner::Inputs::from(&j), inputs);
        assert_eq!(
            (opts.params, opts.args, opts.profile),
            (inputs.params, inputs.args, inputs.profile)
        );
        assert_eq!(opts.workflow, j.workflow_file);
    }

    #[test]
    fn a_resumed_session_is_checked_from_its_next_step_and_a_completed_one_not_at_all() {
        let p = plan(4);
        let c = session_checkpoint(SessionStatus::Failed, "");
        assert_eq!(session_roots(&p, &c), vec![StepId(2), StepId(3)]);
        let c = session_checkpoint(SessionStatus::Completed, "");
        assert!(session_roots(&p, &c).is_empty());
    }
}

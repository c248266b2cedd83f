//! The run's side of bringing a session's work back (docs/running.md): the end of a map
//! phase into the session worktree, and the session branch merged into the branch the run
//! started from, with the workflow's `merge` steps or `git merge`. Git's side is in
//! `worktree` (`worktree/merge.rs`).

use crate::message::Message;
use crate::runner::Runner;
use crate::vars::Vars;
use crate::worktree::merge::{
    Conflicted, MergeBack, MergeBackError, PhaseEnd, ResolveError, ResolveFailure, merge_session,
    merged, session_changes, set_merge_vars,
};
use crate::worktree::{
    SessionWorktree, WorktreeError, abort_merge, begin_conflicted_merge, changes, merge_resolved,
    remove, uncommitted,
};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

impl Runner {
    /// Whether the workflow resolves conflicted merges (`merge.on_conflict`).
    pub(crate) fn resolves_conflicts(&self) -> bool {
        self.plan
            .merge
            .as_ref()
            .is_some_and(|m| !m.on_conflict.is_empty())
    }

    /// Runs the `merge.on_conflict` steps in a worktree holding the conflicted merge of
    /// `other` into `dir`, with `${merge.*}` and `${merge.conflicted_files}` set. Ok when they
    /// leave the merge committed and nothing unmerged; else the merge is given up (the
    /// worktree is as before it) and the error says why, for the DLQ.
    pub(crate) async fn resolve_conflict(
        &self,
        c: Conflicted<'_>,
        vars: &mut Vars,
    ) -> Result<(), ResolveError> {
        let Some(merge) = self
            .plan
            .merge
            .as_ref()
            .filter(|m| !m.on_conflict.is_empty())
        else {
            return Err(ResolveFailure::NoSteps.into());
        };
        let message = format!(
            "Merge {} into {} (conflicts resolved by `merge.on_conflict`)",
            c.target_branch, c.source_branch
        );
        let files = begin_conflicted_merge(c.dir, c.other, &message).await?;
        if files.is_empty() {
            // It merged cleanly after all.
            return Ok(());
        }
        vars.set(
            "merge",
            json!({
                "worktree": c.dir,
                "source_branch": c.source_branch,
                "target_branch": c.target_branch,
                "session_id": self.session(),
                "conflicted_files": files,
            }),
        );
        self.record(&crate::events::Event::MergeConflictHandlerStarted {
            source_branch: c.source_branch.to_owned(),
            target_branch: c.target_branch.to_owned(),
            conflicted_files: files.clone(),
            worktree: c.dir.to_owned(),
        });
        self.say(Message::MergeConflict {
            source_branch: c.source_branch.to_owned(),
            target_branch: c.target_branch.to_owned(),
            files: files.clone(),
            worktree: c.dir.to_owned(),
        });
        let ended = self
            .run_phase_in(
                &merge.on_conflict,
                merge.timeout,
                c.item,
                c.workdir.clone(),
                vars,
            )
            .await
            .0;
        let result = match ended {
            PhaseEnd::TimedOut => Err(ResolveFailure::TimedOut {
                timeout: merge.timeout.unwrap_or_default(),
            }),
            PhaseEnd::Interrupted => Err(ResolveFailure::Interrupted),
            PhaseEnd::StepFailed => Err(ResolveFailure::StepFailed),
            PhaseEnd::Completed => merge_resolved(c.dir, c.other)
                .await
                .map_err(ResolveFailure::Unresolved),
        };
        let log = vars.last_output.clone().unwrap_or_default();
        self.record(&crate::events::Event::MergeConflictHandlerFinished {
            source_branch: c.source_branch.to_owned(),
            success: result.is_ok(),
            error: result.as_ref().err().map(ToString::to_string),
        });
        vars.values.remove("merge");
        match result {
            Ok(()) => Ok(()),
            Err(failure) => {
                abort_merge(c.dir).await;
                Err(ResolveError { failure, log })
            }
        }
    }

    /// Brings the session worktree back: the `merge` steps with `${merge.*}` (checked
    /// afterwards: the session branch must be merged into its target), else `git merge
    /// --no-ff` into the branch the run started from. On success the session worktree and
    /// branch are removed. The caller has asked the user first.
    pub async fn merge_session(&self, vars: &mut Vars) -> Result<MergeBack, MergeBackError> {
        let Some(session) = &self.opts.worktree else {
            return Ok(MergeBack::Nothing { left: 0 });
        };
        let left = uncommitted(&session.path).len();
        let (commits, files) = session_changes(session);
        if commits.is_empty() {
            if left == 0 {
                self.retire_session(session).await;
            }
            return Ok(MergeBack::Nothing { left });
        }
        let target = session
            .target_branch
            .clone()
            .ok_or(MergeBackError::DetachedHead)?;
        // Another run merging into the same branch finishes first (docs/running.md, "Git worktrees").
        let _merging = crate::worktree::lock_branch(&session.repo, &target).await?;
        self.record(&crate::events::Event::MergeStarted {
            source_branch: session.branch.clone(),
            target_branch: target.clone(),
            commits: commits.len(),
        });
        if let Some(merge) = self.plan.merge.as_ref().filter(|m| !m.steps.is_empty()) {
            set_merge_vars(vars, session, &target, self.session(), &commits, &files);
            self.run_merge_steps(merge, session, &target, vars).await?;
        } else {
            self.git_merge_session(session, &target, vars).await?;
        }
        self.record(&crate::events::Event::MergeFinished {
            source_branch: session.branch.clone(),
            target_branch: target.clone(),
        });
        // The `merge` steps may have left changes of their own: counted again.
        let left = changes(&session.path).await.len();
        if left == 0 {
            self.retire_session(session).await;
        }
        Ok(MergeBack::Merged {
            commits: commits.len(),
            target,
            left,
        })
    }

    /// Removes the merged SESSION worktree and its branch; with `worktree.persist` (a
    /// MapReduce job) the worktree is kept as a spare for the next job instead, which is
    /// said.
    async fn retire_session(&self, session: &SessionWorktree) {
        if !self.persists() {
            remove(&session.repo, &session.path, &session.branch).await;
            return;
        }
        let layout = &self.opts.layout;
        let keep = &self.plan.worktree.keep;
        let repo = &session.repo;
        if crate::worktree::spare::park_or_remove(
            layout,
            repo,
            &session.path,
            &session.branch,
            keep,
        )
        .await
        {
            self.say(crate::message::Message::SparesKept {
                count: 1,
                dir: layout.worktrees_dir(),
            });
        }
    }

    /// Runs STEPS (the `merge`, `merge.on_conflict` or `merge.verify` steps) as an agent
    /// would, for ITEM in WORKDIR if given, under TIMEOUT and stopped like any step (SIGTERM
    /// to the process groups, then SIGKILL after the grace period); with the step that
    /// failed, when one did.
    pub(crate) async fn run_phase_in(
        &self,
        steps: &[prodigy_plan::StepId],
        timeout: Option<Duration>,
        item: Option<usize>,
        workdir: Option<PathBuf>,
        vars: &mut Vars,
    ) -> (PhaseEnd, Option<crate::runner::StepFailure>) {
        let (scope, stop) = crate::mapreduce::scope_for(item, None, workdir);
        let agent = self.in_agent(scope.clone());
        let body = agent.run_phase(steps, vars);
        let (outcome, why) = crate::mapreduce::guarded(self, stop, body, timeout, None).await;
        let end = match (why, outcome.continues()) {
            (Some(crate::mapreduce::Stopped::TimedOut), _) => PhaseEnd::TimedOut,
            (Some(crate::mapreduce::Stopped::Cancelled), _) => PhaseEnd::Interrupted,
            (None, false) => PhaseEnd::StepFailed,
            (None, true) => PhaseEnd::Completed,
        };
        let failure = scope.failure.borrow_mut().take();
        (end, failure)
    }

    /// The workflow's `merge` steps, under their `timeout` and stopped like any step
    /// (SIGTERM to the process groups, then SIGKILL after the grace period); they must
    /// leave the session branch merged into TARGET.
    async fn run_merge_steps(
        &self,
        merge: &prodigy_plan::PlanMerge,
        session: &SessionWorktree,
        target: &str,
        vars: &mut Vars,
    ) -> Result<(), MergeBackError> {
        self.say(Message::MergeStepsStarted {
            steps: merge.steps.len(),
            worktree: session.path.clone(),
        });
        match self
            .run_phase_in(&merge.steps, merge.timeout, None, None, vars)
            .await
            .0
        {
            PhaseEnd::TimedOut => {
                return Err(MergeBackError::TimedOut {
                    timeout: merge.timeout.unwrap_or_default(),
                });
            }
            PhaseEnd::Interrupted => return Err(MergeBackError::Interrupted),
            PhaseEnd::StepFailed => return Err(MergeBackError::StepFailed),
            PhaseEnd::Completed => {}
        }
        if !merged(session) {
            return Err(MergeBackError::NotMerged {
                branch: session.branch.clone(),
                target: target.to_owned(),
            });
        }
        Ok(())
    }

    /// `git merge --no-ff` of the session branch into TARGET; a conflict goes to the
    /// `merge.on_conflict` steps when there are some: the target's new work is merged into
    /// the session branch in the session worktree, which then merges back cleanly.
    async fn git_merge_session(
        &self,
        session: &SessionWorktree,
        target: &str,
        vars: &mut Vars,
    ) -> Result<(), MergeBackError> {
        match merge_session(session).await {
            Err(WorktreeError::Conflict { files, .. }) if self.resolves_conflicts() => {
                self.resolve_conflict(
                    Conflicted {
                        dir: &session.path,
                        other: target,
                        source_branch: &session.branch,
                        target_branch: target,
                        item: None,
                        workdir: None,
                    },
                    vars,
                )
                .await
                .map_err(|source| MergeBackError::Unresolved {
                    branch: session.branch.clone(),
                    files,
                    source,
                })?;
                merge_session(session).await?;
            }
            other => other?,
        }
        Ok(())
    }
}

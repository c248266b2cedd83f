//! A standard run: its steps in order, the git context after each, and a checkpoint after
//! every step.

use crate::message::{Message, Phase};
use serde_json::json;

use crate::lock;
use crate::machine::Outcome;
use crate::runner::{Report, RunOutcome, Runner, fields};
use crate::store::{Checkpoint, ContinuedStep, SessionStatus};
use crate::vars::Vars;

impl Runner {
    /// Runs the standard workflow's steps from `start` (0 for a new run).
    pub async fn run(&self, mut vars: Vars, start: usize) -> Report {
        self.record(&crate::events::Event::WorkflowStarted {
            workflow: self.plan.name.clone(),
            session_id: self.session.clone(),
            resumed_at_step: start,
            steps: self.plan.commands.len(),
        });
        let total = self.plan.commands.len();
        vars.merge(
            "workflow",
            fields(json!({"name": self.plan.name, "id": self.session})),
        );
        // The git context costs a few git commands per step: only when the workflow reads it.
        let git_base = if self
            .plan
            .variables
            .iter()
            .any(|v| matches!(v.name.as_str(), "step" | "workflow" | "git"))
        {
            crate::git::head(&self.workdir()).await
        } else {
            None
        };
        // Steps from START on run again: what they did before a resume no longer counts.
        lock(&self.continued).retain(|c| c.index < start);
        let mut outcome = RunOutcome::Succeeded;
        let mut failed_step = None;
        let mut next = start;
        let mut state_error = None;
        for (index, &id) in self.plan.commands.iter().enumerate().skip(start) {
            if self.cancelled() {
                outcome = RunOutcome::Interrupted;
                break;
            }
            // A checkpoint written while the last step ran has landed by now, most often.
            let landed = lock(&self.pending_checkpoint)
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished);
            if landed {
                self.settle_checkpoint().await;
            }
            // A run whose state cannot be written stops: what it did since is not kept.
            if let Some(why) = self.state_failure() {
                self.say(Message::error(format!("{why}; no further step starts")));
                outcome = RunOutcome::Failed;
                state_error = Some(why);
                break;
            }
            let label = self
                .plan
                .step(id)
                .map(|s| s.label.clone())
                .unwrap_or_default();
            // The first step sees the values the run started with.
            if index > start
                && let Err(e) = self.refresh_env(&mut vars).await
            {
                self.say(Message::step_error(e.to_string()));
                outcome = RunOutcome::Failed;
                failed_step = Some(label);
                break;
            }
            let before = if git_base.is_some() {
                crate::git::head(&self.workdir()).await
            } else {
                None
            };
            self.say(Message::StepStarted {
                phase: Phase::Steps,
                number: index + 1,
                total,
                label: label.clone(),
            });
            let step_outcome = self.run_step(id, &mut vars, Some(index)).await;
            if let (Some(base), Some(before)) = (&git_base, &before) {
                self.git_context(&mut vars, base, before).await;
            }
            if let Outcome::FailedContinued | Outcome::Ignored = step_outcome {
                let handled = step_outcome == Outcome::FailedContinued;
                self.record(&crate::events::Event::StepFailedContinued {
                    step: label.clone(),
                    step_index: index,
                    handled,
                });
                let mut continued = lock(&self.continued);
                continued.retain(|c| c.index != index);
                continued.push(ContinuedStep {
                    index,
                    step: label.clone(),
                    handled,
                });
            }
            match step_outcome {
                Outcome::Cancelled => {
                    outcome = RunOutcome::Interrupted;
                    break;
                }
                o if o.continues() => next = index + 1,
                _ => {
                    outcome = RunOutcome::Failed;
                    failed_step = Some(label);
                    break;
                }
            }
            if index + 1 < total {
                self.checkpoint(&vars, next, SessionStatus::Running, false)
                    .await;
            }
        }
        // A run some of whose state was lost does not end as completed.
        self.settle_checkpoint().await;
        if let (None, Some(why)) = (&state_error, self.state_failure())
            && outcome != RunOutcome::Interrupted
        {
            self.say(Message::error(why.clone()));
            outcome = RunOutcome::Failed;
            state_error = Some(why);
        }
        let status = match outcome {
            RunOutcome::Succeeded => SessionStatus::Completed,
            RunOutcome::Failed => SessionStatus::Failed,
            RunOutcome::Interrupted => SessionStatus::Interrupted,
        };
        self.checkpoint(&vars, next, status, true).await;
        if let (None, Some(why)) = (&state_error, self.state_failure()) {
            // Not durable: resuming runs the steps since the last checkpoint that landed.
            self.say(Message::error(why.clone()));
            if outcome == RunOutcome::Succeeded {
                outcome = RunOutcome::Failed;
            }
            state_error = Some(why);
        }
        let continued = lock(&self.continued).clone();
        let claude = *lock(&self.claude_totals);
        self.record(&crate::events::Event::WorkflowFinished {
            outcome: status,
            failed_step: failed_step.clone(),
            failed_continued: continued.len(),
            duration_secs: self.started.elapsed().as_secs_f64(),
            claude: (claude.calls > 0).then_some(claude),
        });
        self.say_claude_totals();
        let events = self.sink.path();
        Report {
            outcome,
            session_id: self.session.clone(),
            failed_step,
            events,
            vars,
            continued,
            state_error,
        }
    }

    /// After a step: what it committed (`step.*`), what the run has committed so far
    /// (`workflow.*`), and the working tree (`git.*`).
    pub(crate) async fn git_context(&self, vars: &mut Vars, base: &str, before: &str) {
        let project = &self.workdir();
        for (name, from) in [("step", before), ("workflow", base)] {
            vars.merge(name, fields(crate::git::changes(project, from).await));
        }
        vars.set("git", crate::git::status(project).await);
    }

    /// Writes the checkpoint atomically (temporary file, fsync, rename, fsync of the
    /// directory) on a blocking thread. The fsyncs of a step's checkpoint overlap the start
    /// of the next step; each checkpoint waits for the previous one, so they land in order,
    /// and `wait` (the last one of a run) returns only once it is durable. The
    /// `checkpoint_saved` event is recorded when the checkpoint is on disk.
    pub(crate) async fn checkpoint(
        &self,
        vars: &Vars,
        next_step: usize,
        status: SessionStatus,
        wait: bool,
    ) {
        let checkpoint = Checkpoint {
            version: 1,
            session_id: self.session.clone(),
            workflow: self.opts.workflow.clone(),
            project: self.opts.project.clone(),
            workflow_hash: self.opts.workflow_hash.clone(),
            next_step,
            status,
            variables: self.seal_json(json!({"values": vars.values, "meta": vars.meta})),
            params: self.opts.params.clone(),
            args: self.opts.args.clone(),
            profile: self.opts.profile.clone(),
            started_at: self.started_at.clone(),
            updated_at: crate::store::timestamp(),
            worktree: self.opts.worktree.clone(),
            continued: lock(&self.continued).clone(),
        };
        self.settle_checkpoint().await;
        let layout = self.opts.layout.clone();
        let handle =
            tokio::task::spawn_blocking(move || (checkpoint.save(&layout), next_step, status));
        *lock(&self.pending_checkpoint) = Some(handle);
        if wait {
            self.settle_checkpoint().await;
        }
    }

    /// Waits for the checkpoint in flight, if any, and records how it went.
    pub(crate) async fn settle_checkpoint(&self) {
        let Some(handle) = lock(&self.pending_checkpoint).take() else {
            return;
        };
        match handle.await {
            Ok((Ok(path), next_step, status)) => {
                self.record(&crate::events::Event::CheckpointSaved {
                    next_step,
                    status,
                    path,
                });
            }
            Ok((Err(e), _, _)) => {
                let path = self
                    .opts
                    .layout
                    .session_dir(&self.session)
                    .join("checkpoint.json");
                lock(&self.checkpoint_failed)
                    .get_or_insert_with(|| crate::statefs::describe(&path, &e));
            }
            Err(e) => self.say(Message::internal(format!(
                "the checkpoint writer stopped: {e}"
            ))),
        }
    }
}

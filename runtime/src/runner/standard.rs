//! A standard run's dispatcher: it feeds the run's order machine ([`Sequence`]) what
//! happened and does what it answers: start a step (its variables refreshed, the git
//! context after it), write a checkpoint after every step, settle the state and end.

use crate::message::{Bug, Message, StepList};
use serde_json::json;

use crate::lock;
use crate::machine::Outcome;
use crate::runner::{Report, Runner, fields};
use crate::sequence::{Ending, Sequence, SequenceAction, SequenceEvent};
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
        let mut machine = Sequence::new(start, total);
        let mut budget = crate::budget::Budget::of(&self.plan, self.opts.max_cost_usd);
        let mut event = self.ready(start, &mut budget);
        let ending = loop {
            let reaction = machine.on(event);
            if let Some(message) = reaction.say {
                self.say(message);
            }
            event = match reaction.action {
                SequenceAction::Start(index) => {
                    self.start_step(index, start, &mut vars, git_base.as_deref())
                        .await
                }
                SequenceAction::Checkpoint(next) => {
                    self.checkpoint(&vars, next, SessionStatus::Running, false)
                        .await;
                    self.notify_pending(&vars).await;
                    self.ready(next, &mut budget)
                }
                SequenceAction::Settle => {
                    self.settle_checkpoint().await;
                    SequenceEvent::Settled(self.state_failure())
                }
                SequenceAction::SaveLast { status, next } => {
                    self.checkpoint(&vars, next, status, true).await;
                    SequenceEvent::Saved(self.state_failure())
                }
                SequenceAction::End(ending) => break ending,
            };
        };
        let Ending {
            outcome,
            failed_step,
            state_error,
        } = ending;
        let status = outcome.status();
        let failed_step = failed_step.map(|index| self.label_of(index));
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
        self.notify_pending(&vars).await;
        let events = self.sink.path();
        Report {
            outcome,
            session_id: self.session.clone(),
            failed_step,
            events,
            vars,
            continued,
            state_error,
            budget: budget.and_then(|b| b.reached()),
        }
    }

    /// Whether the step at NEXT may start: a signal, a state that can no longer be written
    /// (a checkpoint write in flight that failed already counts), or, for a Claude step,
    /// the Claude BUDGET.
    fn ready(&self, next: usize, budget: &mut Option<crate::budget::Budget>) -> SequenceEvent {
        let cancelled = self.cancelled();
        let state_lost = self.state_failure();
        let over_budget = !cancelled && state_lost.is_none() && self.over_budget(next, budget);
        SequenceEvent::Ready {
            cancelled,
            state_lost,
            over_budget,
        }
    }

    /// Whether BUDGET keeps the step at NEXT from starting: a Claude step, when what was
    /// spent and an average call would pass it. Once reached, records and says so.
    fn over_budget(&self, next: usize, budget: &mut Option<crate::budget::Budget>) -> bool {
        use crate::budget::{Admit, Spend};
        let Some(budget) = budget.as_mut() else {
            return false;
        };
        let claude_step = self
            .plan
            .commands
            .get(next)
            .and_then(|&id| self.plan.step(id))
            .is_some_and(|s| matches!(s.command, prodigy_plan::PlanCommand::Claude(_)));
        if !claude_step {
            return false;
        }
        let totals = self.claude_so_far();
        let spend = Spend {
            spent: totals.cost_usd,
            running: 0,
            running_cost: 0.0,
            average: (totals.calls > 0).then(|| totals.cost_usd / f64::from(totals.calls)),
        };
        match budget.admit(spend) {
            Admit::Start => false,
            Admit::Refused => true,
            Admit::Reached(reached) => {
                let not_started = self.plan.commands.len().saturating_sub(next) as u64;
                self.record(&crate::events::Event::ClaudeBudgetReached {
                    spent: reached.spent,
                    limit: reached.limit,
                    not_started,
                });
                self.say(Message::ClaudeBudgetReached {
                    reached,
                    not_started,
                    unit: "step",
                    stops_running: budget.stops_running(),
                });
                true
            }
        }
    }

    /// What the session's Claude calls have cost, those of earlier processes included.
    fn claude_so_far(&self) -> crate::claude::Totals {
        let mut totals = self.opts.claude_before;
        totals.merge(&lock(&self.claude_totals));
        totals
    }

    /// The label of the standard run's step at INDEX.
    fn label_of(&self, index: usize) -> String {
        self.plan
            .commands
            .get(index)
            .and_then(|&id| self.plan.step(id))
            .map(|s| s.label.clone())
            .unwrap_or_default()
    }

    /// Runs the step at INDEX of a run that started at START: refreshes the variables
    /// (not for the run's first step, which sees the values it started with), shows it,
    /// runs it, and notes the git context and a failure the workflow goes on after.
    async fn start_step(
        &self,
        index: usize,
        start: usize,
        vars: &mut Vars,
        git_base: Option<&str>,
    ) -> SequenceEvent {
        let Some(&id) = self.plan.commands.get(index) else {
            self.say(Message::Bug(Bug::NoSuchStep(index)));
            return SequenceEvent::StepEnded(Outcome::Failed);
        };
        if index > start
            && let Err(e) = self.refresh_env(vars).await
        {
            return SequenceEvent::EnvFailed(e.to_string());
        }
        let label = self.label_of(index);
        let before = match git_base {
            Some(_) => crate::git::head(&self.workdir()).await,
            None => None,
        };
        self.say(Message::StepStarted {
            phase: StepList::Steps,
            number: index + 1,
            total: self.plan.commands.len(),
            label: label.clone(),
        });
        let outcome = self.run_step(id, vars, Some(index)).await;
        if let (Some(base), Some(before)) = (git_base, &before) {
            self.git_context(vars, base, before).await;
        }
        if let Outcome::FailedContinued | Outcome::Ignored = outcome {
            let handled = outcome == Outcome::FailedContinued;
            self.record(&crate::events::Event::StepFailedContinued {
                step: label.clone(),
                step_index: index,
                handled,
            });
            let mut continued = lock(&self.continued);
            continued.retain(|c| c.index != index);
            continued.push(ContinuedStep {
                index,
                step: label,
                handled,
            });
        }
        SequenceEvent::StepEnded(outcome)
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
            claude: Some(self.claude_so_far()).filter(|c| c.calls > 0),
        };
        self.settle_checkpoint().await;
        let layout = self.opts.layout.clone();
        // A write that fails is noted at once, so that the next step does not start; one
        // that lands is recorded when the run next settles its checkpoint (in order).
        let state = std::sync::Arc::clone(&self.state);
        let handle = tokio::task::spawn_blocking(move || {
            let saved = checkpoint.save(&layout);
            if let Err(e) = &saved {
                state.checkpoint_write_failed(e);
            }
            (saved, next_step, status)
        });
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
            // Noted by the writer itself.
            Ok((Err(_), _, _)) => {}
            Err(e) => self.say(Message::Bug(Bug::CheckpointWriterStopped(e.to_string()))),
        }
    }
}

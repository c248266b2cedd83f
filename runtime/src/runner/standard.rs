//! A standard run's dispatcher: it feeds the run's order machine ([`Sequence`]) what
//! happened and does what it answers: start a step (its variables refreshed, the git
//! context after it), write a checkpoint after every step, settle the state and end.

use crate::message::{Bug, Message, StepList};
use serde_json::json;

use crate::lock;
use crate::machine::Outcome;
use crate::runner::{Report, Runner, fields};
use crate::sequence::{Ending, Sequence, SequenceAction, SequenceEvent};
use crate::store::{Checkpoint, CheckpointJournal, ContinuedStep, SessionStatus};
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
            crate::worktree::facts::head(&self.workdir()).await
        } else {
            None
        };
        // Steps from START on run again: what they did before a resume no longer counts.
        lock(&self.continued).retain(|c| c.index < start);
        let mut machine = Sequence::new(start, total);
        let mut budget = crate::claude::budget::Budget::of(&self.plan, self.opts.max_cost_usd);
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
    fn ready(
        &self,
        next: usize,
        budget: &mut Option<crate::claude::budget::Budget>,
    ) -> SequenceEvent {
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
    fn over_budget(&self, next: usize, budget: &mut Option<crate::claude::budget::Budget>) -> bool {
        use crate::claude::budget::{Admit, Spend};
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
            Some(_) => crate::worktree::facts::head(&self.workdir()).await,
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
            vars.merge(
                name,
                fields(crate::worktree::facts::changes(project, from).await),
            );
        }
        vars.set("git", crate::worktree::facts::status(project).await);
    }

    /// Hands the checkpoint to the run's writer, which makes it durable on a blocking
    /// thread while the next steps run ([`CheckpointWriter`]). Checkpoints land in order;
    /// no step starts while more than [`MAX_AHEAD`] are not yet durable, and the first one
    /// of a process and `wait` (the last one of a run) return only once they are durable. The `checkpoint_saved` event of
    /// each is recorded once it is on disk.
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
            seq: 0,
        };
        let (start, behind, first) = {
            let mut writer = lock(&self.pending_checkpoint);
            writer.queued.push(checkpoint);
            writer.unsaved += 1;
            (
                !std::mem::replace(&mut writer.busy, true),
                writer.unsaved,
                !std::mem::replace(&mut writer.handed, true),
            )
        };
        if start {
            let state = std::sync::Arc::clone(&self.state);
            let handle = tokio::task::spawn_blocking(move || drain(&state));
            lock(&self.pending_checkpoint).handle = Some(handle);
        }
        // The first one is waited for too: a run can be resumed once its first step ended.
        if wait || first {
            self.settle_checkpoint().await;
        } else if behind > MAX_AHEAD {
            self.catch_up().await;
        } else {
            self.record_saved();
        }
    }

    /// Waits until no more than [`MAX_AHEAD`] handed checkpoints are still on their way to
    /// disk, and records those that landed. Not until all have: the one just handed over is
    /// synced while the next step runs, instead of before it.
    async fn catch_up(&self) {
        loop {
            let landed = {
                let writer = lock(&self.pending_checkpoint);
                let writing =
                    writer.busy && writer.handle.as_ref().is_some_and(|h| !h.is_finished());
                (writer.unsaved > MAX_AHEAD && writing)
                    .then(|| std::sync::Arc::clone(&writer.landed))
            };
            let Some(landed) = landed else {
                break;
            };
            landed.notified().await;
        }
        self.record_saved();
    }

    /// Waits until every checkpoint handed to the writer is durable (or failed), and
    /// records those that landed.
    pub(crate) async fn settle_checkpoint(&self) {
        let handle = lock(&self.pending_checkpoint).handle.take();
        if let Some(handle) = handle
            && let Err(e) = handle.await
        {
            self.say(Message::Bug(Bug::CheckpointWriterStopped(e.to_string())));
        }
        self.record_saved();
    }

    /// Records `checkpoint_saved` for the checkpoints that landed since the last call.
    fn record_saved(&self) {
        let saved = std::mem::take(&mut lock(&self.pending_checkpoint).saved);
        for (path, next_step, status) in saved {
            self.record(&crate::events::Event::CheckpointSaved {
                next_step,
                status,
                path,
            });
        }
    }
}

/// How many checkpoints may wait to be durable before the next step waits for them: when
/// steps end faster than the disk syncs, the checkpoints of several steps are appended and
/// synced together, and a crash resumes at most this many steps earlier than the last
/// step that ended.
///
/// One: a crash re-runs at most the one step whose checkpoint was in flight, as before the
/// journal (a re-run Claude step costs money and time); the journal makes that one sync cheap.
pub(crate) const MAX_AHEAD: usize = 1;

/// A standard run's checkpoints on their way to disk. One blocking task at a time takes
/// every queued checkpoint, saves them through the session's [`CheckpointJournal`] (one
/// append and one fdatasync for all), and takes the next ones, until none is left.
#[derive(Debug, Default)]
pub(crate) struct CheckpointWriter {
    /// Checkpoints not yet taken by the writer, oldest first.
    queued: Vec<Checkpoint>,
    /// Checkpoints handed over and not yet saved (or failed).
    unsaved: usize,
    /// Whether a writer task runs.
    busy: bool,
    /// Whether this process handed over a checkpoint yet.
    handed: bool,
    /// The writer task.
    handle: Option<tokio::task::JoinHandle<()>>,
    /// The journal, while no writer has it.
    journal: Option<CheckpointJournal>,
    /// The checkpoints saved, not yet recorded as events: `checkpoint.json`, the next step
    /// and the status of each.
    saved: Vec<(std::path::PathBuf, usize, SessionStatus)>,
    /// Told each time a batch landed (or failed).
    landed: std::sync::Arc<tokio::sync::Notify>,
}

/// The writer task: saves what is queued until nothing is. A batch that cannot be saved is
/// noted at once (so that no further step starts) and dropped; the next batch is tried.
fn drain(state: &crate::runner::RunState) {
    loop {
        let (mut batch, journal) = {
            let mut writer = lock(&state.pending_checkpoint);
            if writer.queued.is_empty() {
                writer.busy = false;
                return;
            }
            (std::mem::take(&mut writer.queued), writer.journal.take())
        };
        let mut journal =
            journal.unwrap_or_else(|| CheckpointJournal::new(&state.opts.layout, &state.session));
        let saved = journal.save(&mut batch);
        if let Err(e) = &saved {
            state.checkpoint_write_failed(e);
        }
        let landed = {
            let mut writer = lock(&state.pending_checkpoint);
            writer.journal = Some(journal);
            writer.unsaved = writer.unsaved.saturating_sub(batch.len());
            if let Ok(path) = saved {
                writer
                    .saved
                    .extend(batch.iter().map(|c| (path.clone(), c.next_step, c.status)));
            }
            std::sync::Arc::clone(&writer.landed)
        };
        landed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeExecutor, Harness};

    /// When a step ends while the previous step's checkpoint is still being synced, the
    /// next step waits for that older checkpoint only, not for the one just handed over
    /// too: that one is synced while the next step runs.
    #[tokio::test]
    async fn the_next_step_waits_for_the_older_checkpoint_only() {
        let harness = Harness::new(FakeExecutor::new());
        let yaml = "commands:\n  - shell: \"true\"\n  - shell: \"true\"\n";
        let (_tx, cancel) = tokio::sync::watch::channel(false);
        let runner = Runner::with_id(
            Harness::plan(yaml),
            harness.options(yaml),
            cancel,
            "session-ahead".into(),
            None,
        )
        .unwrap();
        // A writer busy with the previous step's checkpoint, which lands only when told.
        let (land, landing) = std::sync::mpsc::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let state = std::sync::Arc::clone(&runner.state);
        let writer = tokio::task::spawn_blocking(move || {
            let _ = landing.recv();
            let landed = {
                let mut writer = lock(&state.pending_checkpoint);
                writer.unsaved -= 1;
                std::sync::Arc::clone(&writer.landed)
            };
            landed.notify_one();
            // Still at work: the checkpoint handed over below is not saved yet.
            let _ = released.recv();
        });
        {
            let mut pending = lock(&runner.pending_checkpoint);
            pending.busy = true;
            pending.handed = true;
            pending.unsaved = 1;
            pending.handle = Some(writer);
        }
        let vars = runner.initial_vars().await.unwrap();
        land.send(()).unwrap();
        let handed = runner.checkpoint(&vars, 2, SessionStatus::Running, false);
        tokio::time::timeout(std::time::Duration::from_secs(30), handed)
            .await
            .expect("the step waited for the checkpoint it just handed over");
        let pending = lock(&runner.pending_checkpoint);
        assert_eq!((pending.unsaved, pending.queued.len()), (1, 1));
        drop(pending);
        release.send(()).unwrap();
    }
}

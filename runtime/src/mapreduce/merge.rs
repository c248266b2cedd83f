//! Merging an agent's worktree into the session worktree, with `merge.on_conflict` when
//! the merge conflicts.

use crate::backend::Ended;
use crate::dlq::ErrorType;
use crate::jobstore::{ItemRecord, ItemStatus};
use crate::mapreduce::verify::{self, Verdict};
use crate::mapreduce::{AgentRun, MapJob, agent_id, artifacts, item_id};
use crate::message::Message;
use crate::runner::{Runner, StepFailure};
use crate::vars::Vars;
use crate::worktree::{
    AgentWorktree, ResolveError, ResolveFailure, SessionWorktree, WorktreeError,
};
use prodigy_plan::PlanMerge;

/// An agent's merge conflicted: `merge.on_conflict` resolves it in the agent's worktree (the
/// session's merged work merged into the agent's branch), and the agent's new head is merged
/// again. The outer error is why the resolver did not resolve it.
pub(crate) async fn resolve_agent_conflict(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: &AgentWorktree,
    index: usize,
    vars: &mut Vars,
    message: &str,
) -> Result<Result<crate::worktree::Merged, WorktreeError>, ResolveError> {
    let head = resolve_in_agent(runner, session, worktree, index, vars).await?;
    Ok(
        crate::worktree::merge_head(session, &runner.agent_worktrees, worktree, &head, message)
            .await,
    )
}

/// Runs `merge.on_conflict` in the worktree of item INDEX's agent on the merge of the
/// session's merged work into its branch; returns the agent's new head.
async fn resolve_in_agent(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: &AgentWorktree,
    index: usize,
    vars: &mut Vars,
) -> Result<String, ResolveError> {
    let current = runner.agent_worktrees.integration(session).await?;
    runner
        .resolve_conflict(
            crate::worktree::Conflicted {
                dir: &worktree.path,
                other: &current,
                source_branch: &worktree.branch,
                target_branch: &session.branch,
                item: Some(index),
                workdir: Some(worktree.workdir.clone()),
            },
            vars,
        )
        .await?;
    Ok(crate::worktree::agent_head(worktree)
        .await?
        .ok_or(ResolveFailure::NoCommit)?)
}

/// Appends the merge of HEAD, the last commit of the agent for item INDEX, to the job's
/// merge journal, with what its outcome will say.
fn journal_intent(
    runner: &Runner,
    worktree: &AgentWorktree,
    index: usize,
    attempt: u32,
    run: &AgentRun,
    head: &str,
) -> Result<(), crate::merge_journal::JournalError> {
    let intent = crate::merge_journal::MergeIntent {
        item_id: item_id(index),
        index,
        attempts: attempt,
        branch: worktree.branch.clone(),
        worktree: worktree.path.clone(),
        head: head.to_owned(),
        output: run.output.as_ref().map(|o| runner.mask(o)),
        duration_secs: run.duration.as_secs_f64(),
        claude: (run.claude.calls > 0).then_some(run.claude),
    };
    let dir = runner.opts.layout.job_dir(runner.session());
    crate::merge_journal::append(&dir, &intent)
}

/// How an agent's work meets the merge queue: the job's variables (for `merge.verify`) and
/// whether a refusal sends the item back to its agent (`merge.redispatch` left), so that
/// its worktree is let go rather than kept for the DLQ.
pub(crate) struct Queueing<'a> {
    pub(crate) base: &'a Vars,
    pub(crate) send_back: bool,
}

/// After an agent in a worktree: a successful agent's commits go into the session's merged
/// work through the merge queue and its worktree goes back to the pool (kept instead when
/// it left uncommitted changes); a conflict fails the item with `MergeConflict`. The
/// worktree of an agent that failed is kept when it holds commits or changes (its path goes
/// into the DLQ entry), else it goes back to the pool.
pub(crate) async fn merge_back(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: AgentWorktree,
    (index, attempt): (usize, u32),
    run: &mut AgentRun,
    vars: &mut Vars,
    queueing: &Queueing<'_>,
) {
    if run.end == Ended::Succeeded {
        merge_succeeded(
            runner,
            session,
            worktree,
            (index, attempt),
            run,
            vars,
            queueing,
        )
        .await;
        return;
    }
    let committed = matches!(crate::worktree::agent_head(&worktree).await, Ok(Some(_)));
    let left = crate::worktree::changes(&worktree.path).await;
    let kept = committed || !left.is_empty();
    if kept && run.end != Ended::Cancelled {
        let logs = run.failure.as_ref().map(|f| f.message.clone());
        run.artifacts = Some(artifacts(runner, &worktree, &left, logs));
    } else if !kept {
        runner.agent_worktrees.release(worktree);
    }
}

/// [`merge_back`] for an agent that succeeded: only agents that committed wait for the
/// merge queue; the merge's outcome decides the item's.
async fn merge_succeeded(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: AgentWorktree,
    (index, attempt): (usize, u32),
    run: &mut AgentRun,
    vars: &mut Vars,
    queueing: &Queueing<'_>,
) {
    let merged = match crate::worktree::agent_head(&worktree).await {
        Ok(Some(head)) if runner.plan.merge.as_ref().is_some_and(PlanMerge::queued) => {
            // Journalled before the ref moves, so that a kill after the merge and before
            // the outcome is written is recognised on resume (`merge_journal`); a kill
            // before it lands leaves the item to run again, verified again.
            if let Err(why) = journal_intent(runner, &worktree, index, attempt, run, &head) {
                journal_failed(runner, &worktree, run, &why).await;
                return;
            }
            match through_queue(runner, session, &worktree, index, &head, vars, queueing).await {
                Verdict::Landed(stacked) => {
                    run.merge_commit = Some(stacked.commit);
                    Ok(if stacked.fast_forward {
                        crate::worktree::Merged::FastForward
                    } else {
                        crate::worktree::Merged::MergeCommit
                    })
                }
                Verdict::Refused(refusal) => {
                    refuse_item(runner, worktree, index, run, refusal, queueing.send_back).await;
                    return;
                }
                Verdict::Failed(e) => Err(e),
                Verdict::Interrupted => {
                    // Nothing of it landed: the item stays pending, and runs again.
                    run.end = Ended::Cancelled;
                    return;
                }
            }
        }
        Ok(Some(head)) => {
            let _queue = runner.merge_queue.lock().await;
            // Journalled before the ref moves, so that a kill after the merge and before
            // the outcome is written is recognised on resume (`merge_journal`).
            if let Err(why) = journal_intent(runner, &worktree, index, attempt, run, &head) {
                journal_failed(runner, &worktree, run, &why).await;
                return;
            }
            merge_under_queue(runner, session, &worktree, index, &head, run, vars).await
        }
        Ok(None) => Ok(crate::worktree::Merged::Nothing),
        Err(e) => Err(e),
    };
    match merged {
        Ok(how) => merged_cleanly(runner, worktree, index, how, run).await,
        Err(e) => merge_failed(runner, &worktree, run, &e).await,
    }
}

/// The merge journal could not be written: the merge is not attempted, and the item fails.
async fn journal_failed(
    runner: &Runner,
    worktree: &AgentWorktree,
    run: &mut AgentRun,
    why: &crate::merge_journal::JournalError,
) {
    let failure = StepFailure {
        step: "merge".into(),
        message: format!("the merge was not attempted: {why}"),
        error_type: ErrorType::WorktreeError,
        output: None,
        log: None,
    };
    fail_item(runner, worktree, run, failure, None).await;
}

/// Item INDEX's work, up to HEAD, through the verified queue. A conflict goes to
/// `merge.on_conflict` first when the workflow has it: the resolver merges the merged work
/// into the agent's branch, and the resolved head queues again, once.
async fn through_queue(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: &AgentWorktree,
    index: usize,
    head: &str,
    vars: &mut Vars,
    queueing: &Queueing<'_>,
) -> Verdict {
    let verdict = verify::submit(runner, session, worktree, (index, head), queueing.base).await;
    let Verdict::Refused(refusal) = verdict else {
        return verdict;
    };
    if refusal.reason != verify::Reason::Conflict || !runner.resolves_conflicts() {
        return Verdict::Refused(refusal);
    }
    let resolved = resolve_in_agent(runner, session, worktree, index, vars);
    match resolved.await {
        Ok(head) => verify::submit(runner, session, worktree, (index, &head), queueing.base).await,
        Err(why) => Verdict::Refused(verify::Refusal {
            output: format!(
                "{}\n`merge.on_conflict` did not resolve it: {why}",
                refusal.output
            ),
            ..refusal
        }),
    }
}

/// The queue refused item INDEX's work: the item fails at its merge with the refusal's
/// classification. When it goes back to its agent (`send_back`), its worktree is let go (the
/// agent starts again from the merged work); else it is kept for the DLQ, with
/// `${verify.output}` as its logs.
async fn refuse_item(
    runner: &Runner,
    worktree: AgentWorktree,
    index: usize,
    run: &mut AgentRun,
    refusal: verify::Refusal,
    send_back: bool,
) {
    let message = match refusal.reason {
        verify::Reason::VerifyFailed => {
            "its work failed `merge.verify` on the merged work".to_owned()
        }
        verify::Reason::Conflict => format!(
            "its work conflicts with the merged work in {}",
            refusal.paths.join(", ")
        ),
        verify::Reason::Protected => format!(
            "its work changes protected paths (`merge.protect`): {}",
            refusal.paths.join(", ")
        ),
        verify::Reason::Integrity => format!(
            "its work weakens the tests (`merge.integrity: fail`) at {}",
            refusal.paths.join(", ")
        ),
    };
    let failure = StepFailure {
        step: "merge".into(),
        message,
        error_type: refusal.reason.error_type(),
        output: refusal.tail.clone(),
        log: None,
    };
    let logs = refusal.output.clone();
    run.refusal = Some(refusal);
    if send_back {
        run.end = Ended::Failed;
        run.failure = Some(failure);
        let_go(runner, worktree, index).await;
    } else {
        fail_item(runner, &worktree, run, failure, Some(logs)).await;
    }
}

/// Merges HEAD, the agent's last commit, into the session's merged work; the caller holds
/// the merge queue. A conflict goes to `merge.on_conflict` when the workflow has it (the
/// resolver merges what is merged now into the agent's branch, which then merges
/// cleanly); a merge that brought something sets the item's merge commit.
async fn merge_under_queue(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: &AgentWorktree,
    index: usize,
    head: &str,
    run: &mut AgentRun,
    vars: &mut Vars,
) -> Result<crate::worktree::Merged, WorktreeError> {
    let message = format!("Merge {} (agent {})", item_id(index), agent_id(index));
    let merged =
        crate::worktree::merge_head(session, &runner.agent_worktrees, worktree, head, &message)
            .await;
    let merged = match merged {
        Err(WorktreeError::Conflict {
            branch,
            files,
            output,
        }) if runner.resolves_conflicts() => {
            resolve_agent_conflict(runner, session, worktree, index, vars, &message)
                .await
                .unwrap_or_else(|why| {
                    Err(WorktreeError::Conflict {
                        branch,
                        files,
                        output: format!("{output}\n{why}"),
                    })
                })
        }
        other => other,
    };
    if matches!(&merged, Ok(how) if *how != crate::worktree::Merged::Nothing) {
        crate::merge_journal::kill_point_after_merge();
        // The integration ref as the merge just set it, still under the queue.
        run.merge_commit = runner.agent_worktrees.integration(session).await.ok();
    }
    merged
}

/// After a merge that went through (or had nothing to bring): the commits are the item's,
/// and its worktree goes back to the pool, or is kept (and noted) when the agent left
/// uncommitted changes, which are never wiped.
async fn merged_cleanly(
    runner: &Runner,
    worktree: AgentWorktree,
    index: usize,
    how: crate::worktree::Merged,
    run: &mut AgentRun,
) {
    if how != crate::worktree::Merged::Nothing {
        run.trail.commits = crate::worktree::agent_commits(&worktree).await;
        runner.record(&crate::events::Event::AgentMerged {
            branch: worktree.branch.clone(),
            merge: format!("{how:?}"),
        });
    }
    let_go(runner, worktree, index).await;
}

/// The worktree of item INDEX's agent, its work merged or dropped, goes back to the pool,
/// or is kept (and noted) when the agent left uncommitted changes, which are never wiped.
async fn let_go(runner: &Runner, worktree: AgentWorktree, index: usize) {
    let left = runner.agent_worktrees.changes(&worktree).await;
    if left.is_empty() {
        runner.agent_worktrees.release(worktree);
        return;
    }
    let dir = runner.opts.layout.job_dir(runner.session());
    if let Err(why) = crate::merge_journal::note_kept(&dir, &worktree.path) {
        runner.say(Message::KeptWorktreeNotNoted {
            path: worktree.path.clone(),
            why: why.to_string(),
        });
    }
    runner.agent_worktrees.keep(worktree.path.clone());
    runner.record(&crate::events::Event::AgentWorktreeKept {
        path: worktree.path.clone(),
        branch: worktree.branch.clone(),
        uncommitted: left.clone(),
    });
    runner.say(Message::AgentWorktreeKept {
        item: item_id(index),
        changes: left.len(),
        path: worktree.path.clone(),
    });
}

/// A merge that failed fails the item: `MergeConflict` for a conflict (its output goes
/// into the DLQ entry's logs), `WorktreeError` otherwise.
async fn merge_failed(
    runner: &Runner,
    worktree: &AgentWorktree,
    run: &mut AgentRun,
    e: &WorktreeError,
) {
    let error_type = if matches!(e, WorktreeError::Conflict { .. }) {
        ErrorType::MergeConflict
    } else {
        ErrorType::WorktreeError
    };
    runner.record(&crate::events::Event::AgentMergeFailed {
        branch: worktree.branch.clone(),
        error: e.to_string(),
        error_type: error_type.name().to_owned(),
    });
    let logs = match e {
        WorktreeError::Conflict { output, .. } => output.clone(),
        other => other.to_string(),
    };
    let failure = StepFailure {
        step: "merge".into(),
        message: e.to_string(),
        error_type,
        output: None,
        log: None,
    };
    fail_item(runner, worktree, run, failure, Some(logs)).await;
}

/// Fails the item of RUN at its merge with FAILURE; its worktree, with what it holds and
/// LOGS, goes into the DLQ entry.
async fn fail_item(
    runner: &Runner,
    worktree: &AgentWorktree,
    run: &mut AgentRun,
    failure: StepFailure,
    logs: Option<String>,
) {
    run.end = Ended::Failed;
    run.failure = Some(failure);
    let left = crate::worktree::changes(&worktree.path).await;
    run.artifacts = Some(artifacts(runner, worktree, &left, logs));
}

impl MapJob<'_> {
    /// Items whose agent's work a killed process merged without writing their outcome: the
    /// merge journal names the commit each was about to merge, and where the session's
    /// merged work holds it, the item succeeded. Its outcome is written now, with the merge
    /// commit, and it does not run again (`merge_journal`).
    pub(crate) async fn recover_merged(&mut self, records: &mut [Option<ItemRecord>]) {
        self.land_verified().await;
        for intent in crate::merge_journal::load(self.files.dir()) {
            if !matches!(records.get(intent.index), Some(None)) {
                continue;
            }
            let Some(run) = merged_run(self.runner, &intent).await else {
                continue;
            };
            let record = ItemRecord {
                item_id: intent.item_id.clone(),
                index: intent.index,
                status: ItemStatus::Succeeded,
                attempts: intent.attempts,
                output: run.output,
                error: None,
                error_type: None,
                duration_secs: intent.duration_secs,
                dead_lettered: false,
                claude: intent.claude,
                task: None,
                slurm: None,
                merge_commit: run.merge_commit,
                trail: run.trail,
            };
            if let Err(e) = self.files.append(&record) {
                self.write_failed(super::StateWriteError::Job(e).into());
                return;
            }
            if let Some(slot) = records.get_mut(intent.index) {
                *slot = Some(record);
            }
        }
    }
}

impl MapJob<'_> {
    /// A candidate of the verified queue that passed and was journalled, where the killed
    /// process did not move the integration ref to it (the ref is still where the candidate
    /// was stacked): the ref moves now, and its items' intents then find their work merged.
    async fn land_verified(&self) {
        let Some(session) = &self.runner.opts.worktree else {
            return;
        };
        let Some(verified) = crate::merge_journal::last_verified(self.files.dir()) else {
            return;
        };
        let pool = &self.runner.agent_worktrees;
        let at_base = pool
            .integration(session)
            .await
            .is_ok_and(|current| current == verified.base);
        if at_base
            && pool
                .advance(session, &verified.verified, &verified.base)
                .await
                .is_ok()
        {
            self.runner.record(&crate::events::Event::VerifiedLanded {
                candidate: verified.verified.clone(),
                item_ids: verified.items.iter().map(|&i| item_id(i)).collect(),
            });
        }
    }

    /// After a map phase in which every item was decided: [`sweep_job_agents`].
    pub(crate) async fn sweep_agents(&self) {
        sweep_job_agents(self.runner, self.files.dir(), &self.dlq).await;
    }
}

/// The agent worktrees of the job whose files are in `job_dir` that must stay as they are:
/// those the DLQ names, and those kept for a successful agent's uncommitted changes (noted
/// by this process or, in the job's files, by an earlier one).
fn kept_worktrees(
    runner: &Runner,
    job_dir: &std::path::Path,
    dlq: &crate::dlq::Dlq,
) -> Vec<std::path::PathBuf> {
    let mut keep = crate::merge_journal::kept(job_dir);
    keep.extend(runner.agent_worktrees.kept());
    keep.extend(
        dlq.items()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| e.worktree_artifacts.map(|a| a.worktree_path)),
    );
    keep
}

impl MapJob<'_> {
    /// Before a map phase's agents start: the agent worktrees an earlier process of this
    /// job left (killed, or stopped) go back into the pool, cleaned, unless they are kept
    /// ([`kept_worktrees`]). Not on a backend whose task a killed coordinator left may
    /// still be working in its worktree (Slurm).
    pub(crate) async fn adopt_agents(&self) {
        let runner = self.runner;
        let Some(session) = runner.worktree() else {
            return;
        };
        if self.opts.host.outlives_coordinator() {
            return;
        }
        let keep = kept_worktrees(runner, self.files.dir(), &self.dlq);
        runner
            .agent_worktrees
            .adopt(&runner.opts.layout, session, &keep, process_start(runner))
            .await;
    }
}

/// Removes the agent worktrees and branches of the job whose files are in `job_dir` that
/// nothing keeps (the worktrees the DLQ names, and those kept for a successful agent's
/// uncommitted changes, stay), including what a killed process left. Only once every item
/// is decided: an attempt left then is no longer wanted.
pub(crate) async fn sweep_job_agents(
    runner: &Runner,
    job_dir: &std::path::Path,
    dlq: &crate::dlq::Dlq,
) {
    let Some(session) = runner.worktree() else {
        return;
    };
    let keep = kept_worktrees(runner, job_dir, dlq);
    let swept =
        crate::worktree::sweep_agents(&runner.opts.layout, session, &keep, process_start(runner))
            .await;
    if let Some(left) = swept.left {
        runner.say(Message::AgentBranchesLeft(left));
    }
    if swept.worktrees > 0 || swept.branches > 0 {
        runner.record(&crate::events::Event::AgentWorktreesSwept {
            worktrees: swept.worktrees,
            branches: swept.branches,
        });
    }
}

/// When this process started, by the wall clock (file times are compared with it): a lock
/// file last changed before then was made by no git of this process.
fn process_start(runner: &Runner) -> std::time::SystemTime {
    std::time::SystemTime::now()
        .checked_sub(runner.started.elapsed())
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// The run of an agent whose work a killed process merged (its intent in the merge
/// journal, its commit in the session's merged work), without running it again: `None`
/// when INTENT was not merged.
pub(crate) async fn merged_run(
    runner: &Runner,
    intent: &crate::merge_journal::MergeIntent,
) -> Option<AgentRun> {
    let session = runner.worktree()?;
    let commit = crate::worktree::merged_commit(session, &intent.head).await?;
    runner.record(&crate::events::Event::AgentMergeRecovered {
        item_id: intent.item_id.clone(),
        branch: intent.branch.clone(),
        merge_commit: commit.clone(),
    });
    runner.say(Message::MergeRecovered {
        item: intent.item_id.clone(),
    });
    Some(AgentRun {
        end: Ended::Succeeded,
        output: intent.output.clone(),
        failure: None,
        // Read from `merges.jsonl`: a damaged value is no duration, never a panic.
        duration: std::time::Duration::try_from_secs_f64(intent.duration_secs).unwrap_or_default(),
        artifacts: None,
        claude: intent.claude.unwrap_or_default(),
        task: None,
        merge_commit: Some(commit),
        trail: crate::jobstore::ItemTrail::default(),
        stop_job: None,
        refusal: None,
    })
}

//! Merging an agent's worktree into the session worktree, with `merge.on_conflict` when
//! the merge conflicts.

use crate::dlq::ErrorType;
use crate::mapreduce::{AgentRun, RunEnd, agent_id, artifacts, item_id};
use crate::message::Message;
use crate::runner::{Runner, StepFailure};
use crate::vars::Vars;
use crate::worktree::{AgentWorktree, SessionWorktree, WorktreeError};

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
) -> Result<Result<crate::worktree::Merged, WorktreeError>, String> {
    let current = runner
        .agent_worktrees
        .integration(session)
        .await
        .map_err(|e| e.to_string())?;
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
    let head = crate::worktree::agent_head(worktree)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the resolved merge left no commit")?;
    Ok(
        crate::worktree::merge_head(session, &runner.agent_worktrees, worktree, &head, message)
            .await,
    )
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
    index: usize,
    run: &mut AgentRun,
    vars: &mut Vars,
) {
    if run.end == RunEnd::Succeeded {
        let message = format!("Merge {} (agent {})", item_id(index), agent_id(index));
        // Only agents that committed wait for the merge queue.
        let merged = match crate::worktree::agent_head(&worktree).await {
            Ok(Some(head)) => {
                let _queue = runner.merge_queue.lock().await;
                let merged = crate::worktree::merge_head(
                    session,
                    &runner.agent_worktrees,
                    &worktree,
                    &head,
                    &message,
                )
                .await;
                match merged {
                    Err(WorktreeError::Conflict {
                        branch,
                        files,
                        output,
                    }) if runner.resolves_conflicts() => {
                        // Still holding the queue: the resolver merges what is merged now
                        // into the agent's branch, which then merges cleanly.
                        resolve_agent_conflict(runner, session, &worktree, index, vars, &message)
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
                }
            }
            Ok(None) => Ok(crate::worktree::Merged::Nothing),
            Err(e) => Err(e),
        };
        match merged {
            Ok(how) => {
                if how != crate::worktree::Merged::Nothing {
                    run.trail.commits = crate::worktree::agent_commits(&worktree).await;
                    runner.record(&crate::events::Event::AgentMerged {
                        branch: worktree.branch.clone(),
                        merge: format!("{how:?}"),
                    });
                }
                // Only commits come back; changes left uncommitted are kept, not wiped.
                let left = crate::worktree::changes(&worktree.path).await;
                if left.is_empty() {
                    runner.agent_worktrees.release(worktree);
                } else {
                    runner.record(&crate::events::Event::AgentWorktreeKept {
                        path: worktree.path.clone(),
                        branch: worktree.branch.clone(),
                        uncommitted: left.clone(),
                    });
                    runner.say(Message::warning(format!("{} left {} in {}; only commits are merged, so that worktree is kept (`prodigy worktree clean` removes it)",
                        item_id(index),
                        crate::progress::count(left.len(), "uncommitted change"),
                        worktree.path.display())));
                }
                return;
            }
            Err(e) => {
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
                let logs = match &e {
                    WorktreeError::Conflict { output, .. } => output.clone(),
                    other => other.to_string(),
                };
                run.end = RunEnd::Failed;
                run.failure = Some(StepFailure {
                    step: "merge".into(),
                    message: e.to_string(),
                    error_type,
                    output: None,
                    log: None,
                });
                let left = crate::worktree::changes(&worktree.path).await;
                run.artifacts = Some(artifacts(runner, &worktree, &left, Some(logs)));
                return;
            }
        }
    }
    let committed = matches!(crate::worktree::agent_head(&worktree).await, Ok(Some(_)));
    let left = crate::worktree::changes(&worktree.path).await;
    let kept = committed || !left.is_empty();
    if kept && run.end != RunEnd::Cancelled {
        let logs = run.failure.as_ref().map(|f| f.message.clone());
        run.artifacts = Some(artifacts(runner, &worktree, &left, logs));
    } else if !kept {
        runner.agent_worktrees.release(worktree);
    }
}

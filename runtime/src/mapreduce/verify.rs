//! The verified merge queue (docs/mapreduce.md, "Verified integration"): an agent's work
//! reaches the job's integration ref only once `merge.verify` has passed on the merged work
//! with it on top.
//!
//! Agents hand their last commit in ([`submit`]) and wait. Whoever takes the queue's lock
//! first takes up to `merge.batch` waiting candidates, in queue order, and settles them for
//! everyone (a group commit): it stacks them on the ref (`git merge-tree`, no checkout), tests
//! the top of the stack in a scratch worktree, and moves the ref there when it passes. A
//! failed batch is bisected: its first half is settled on the ref, then the rest on what
//! landed, until each failing candidate is alone; every other one lands. The ref is only
//! ever moved to a commit that passed, so no state of it is red.
//!
//! A candidate that conflicts, or changes a path of `merge.protect` (checked before it
//! queues), is refused without a verification. A refused candidate's agent runs its item
//! again on the current ref (`merge.redispatch`, [`SentBack`]) or the item goes to the DLQ.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::dlq::ErrorType;
use crate::events::QueueCounts;
use crate::mapreduce::item_id;
use crate::runner::{Runner, StepFailure};
use crate::vars::Vars;
use crate::worktree::candidate::{self, Stacked};
use crate::worktree::{AgentWorktree, SessionWorktree, WorktreeError};

/// Why the queue refused an agent's work: `${verify.reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// `merge.verify` failed on the merged work with it on top.
    VerifyFailed,
    /// It conflicts with the merged work.
    Conflict,
    /// It changes a path of `merge.protect`.
    Protected,
    /// Its test-integrity verdict is `fail` (`merge.integrity: fail`).
    Integrity,
}

impl Reason {
    /// The name `${verify.reason}` and the events give.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reason::VerifyFailed => "verify_failed",
            Reason::Conflict => "conflict",
            Reason::Protected => "protected",
            Reason::Integrity => "integrity",
        }
    }

    /// How the DLQ classifies an item refused for this reason once it is sent back no more.
    pub(crate) fn error_type(self) -> ErrorType {
        match self {
            Reason::VerifyFailed => ErrorType::VerifyFailed,
            Reason::Conflict => ErrorType::MergeConflict,
            Reason::Protected => ErrorType::ProtectedPath,
            Reason::Integrity => ErrorType::IntegrityFailed,
        }
    }
}

/// The queue's refusal of one agent's work.
#[derive(Clone, Debug)]
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    /// `${verify.output}`: the failing verification's output, the conflicted files with
    /// both sides' hunks, or the protected paths.
    pub(crate) output: String,
    /// The conflicted or protected paths.
    pub(crate) paths: Vec<String>,
    /// The failing verification step's tail, for the DLQ entry.
    pub(crate) tail: Option<crate::dlq::CommandTail>,
}

/// What became of a candidate.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// It is in the merged work: the commit the ref moved to for it.
    Landed(Stacked),
    /// It was refused.
    Refused(Refusal),
    /// Git failed around it: nothing of it landed.
    Failed(WorktreeError),
    /// The run was interrupted before it was settled: nothing of it landed.
    Interrupted,
}

/// A refused item's agent, run again: what `${verify.*}` holds for it.
#[derive(Clone, Debug)]
pub(crate) struct SentBack {
    pub(crate) reason: Reason,
    pub(crate) output: String,
    /// The re-dispatch's number, from 1.
    pub(crate) attempt: u32,
    /// The session of each Claude step of the refused run, by step label, for a step
    /// with `on_retry: continue`.
    pub(crate) sessions: std::collections::HashMap<String, String>,
}

impl SentBack {
    /// `${verify}` for an agent run: empty fields on its first run.
    pub(crate) fn vars(sent: Option<&SentBack>) -> serde_json::Value {
        match sent {
            Some(s) => serde_json::json!({
                "output": s.output,
                "reason": s.reason.name(),
                "attempt": s.attempt,
            }),
            None => serde_json::json!({ "output": "", "reason": "", "attempt": 0 }),
        }
    }

    /// What a continued Claude session is told: why its work came back.
    pub(crate) fn message(&self) -> String {
        let what = match self.reason {
            Reason::VerifyFailed => "failed `merge.verify` on the merged work",
            Reason::Conflict => "conflicts with the merged work",
            Reason::Protected => "changes a protected path",
            Reason::Integrity => "weakens the tests",
        };
        format!("your work {what}:\n{}", self.output.trim_end())
    }
}

/// An agent's work waiting in the queue.
struct Submission {
    index: usize,
    head: String,
    base: String,
    branch: String,
    message: String,
    tx: oneshot::Sender<Verdict>,
}

/// The queue's waiting candidates and its counts, for `status` and the progress line.
#[derive(Default)]
pub(crate) struct Queue {
    waiting: std::sync::Mutex<VecDeque<Submission>>,
    /// Candidates in the verification running now.
    pub(crate) verifying: AtomicU64,
    /// Verifications run.
    pub(crate) verifications: AtomicU64,
    /// Candidates landed.
    pub(crate) landed: AtomicU64,
    /// Candidates refused.
    pub(crate) refused: AtomicU64,
    /// Items sent back to their agents.
    pub(crate) redispatched: AtomicU64,
}

impl Queue {
    /// The counts now.
    pub(crate) fn counts(&self) -> QueueCounts {
        QueueCounts {
            queued: crate::lock(&self.waiting).len() as u64,
            verifying: self.verifying.load(Ordering::Relaxed),
            verifications: self.verifications.load(Ordering::Relaxed),
            landed: self.landed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            redispatched: self.redispatched.load(Ordering::Relaxed),
        }
    }
}

/// Hands the work of item INDEX (its agent's worktree, up to HEAD) to the queue and waits
/// for its verdict; BASE holds the job's variables for `merge.verify`.
pub(crate) async fn submit(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: &AgentWorktree,
    (index, head): (usize, &str),
    base: &Vars,
) -> Verdict {
    let Some(merge) = runner.plan.merge.as_ref() else {
        return Verdict::Interrupted;
    };
    if let Some(refusal) = integrity_refusal(runner, session, (index, head)).await {
        return refused(runner, index, refusal);
    }
    if !merge.protect.is_empty() {
        let current = match runner.agent_worktrees.integration(session).await {
            Ok(c) => c,
            Err(e) => return Verdict::Failed(e),
        };
        let changed = match candidate::changed_paths(session, &current, head).await {
            Ok(c) => c,
            Err(e) => return Verdict::Failed(e),
        };
        let hit: Vec<String> = candidate::protected(&merge.protect, &changed)
            .into_iter()
            .map(str::to_owned)
            .collect();
        if !hit.is_empty() {
            let output = format!(
                "these paths are protected (`merge.protect`), and no agent may change them: {}\nleave them as they are in the merged work",
                hit.join(", ")
            );
            return refused(
                runner,
                index,
                Refusal {
                    reason: Reason::Protected,
                    output,
                    paths: hit,
                    tail: None,
                },
            );
        }
    }
    runner.record(&crate::events::Event::MergeQueued {
        item_id: item_id(index),
    });
    let (tx, mut rx) = oneshot::channel();
    crate::lock(&runner.verify_queue.waiting).push_back(Submission {
        index,
        head: head.to_owned(),
        base: worktree.base.clone(),
        branch: worktree.branch.clone(),
        message: format!(
            "Merge {} (agent {})",
            item_id(index),
            crate::mapreduce::agent_id(index)
        ),
        tx,
    });
    let batch = usize::try_from(merge.batch.max(1)).unwrap_or(1);
    loop {
        let _queue = runner.merge_queue.lock().await;
        match rx.try_recv() {
            Ok(verdict) => return verdict,
            Err(oneshot::error::TryRecvError::Closed) => return Verdict::Interrupted,
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let taken: Vec<Submission> = {
            let mut waiting = crate::lock(&runner.verify_queue.waiting);
            let n = batch.min(waiting.len());
            waiting.drain(..n).collect()
        };
        if taken.is_empty() {
            return Verdict::Interrupted;
        }
        let settler = Settler {
            runner,
            session,
            base,
        };
        settler.settle(taken, None, false).await;
    }
}

/// The test-integrity verdict of item INDEX's work up to HEAD, recorded (`merge.integrity`
/// other than `off`); a refusal when it is `fail` and the workflow says `fail`. Git failing
/// to give the diff is a `warn` finding, never a refusal.
async fn integrity_refusal(
    runner: &Runner,
    session: &SessionWorktree,
    (index, head): (usize, &str),
) -> Option<Refusal> {
    use crate::mapreduce::integrity;
    let mode = runner.plan.merge.as_ref()?.integrity();
    if mode == prodigy_plan::Integrity::Off {
        return None;
    }
    let verdict = match candidate::work_diff(&runner.agent_worktrees, session, head).await {
        Ok((patch, fork)) => {
            let old = |path: &str| candidate::file_at(session, &fork, path);
            integrity::judge(&patch, &old)
        }
        Err(e) => integrity::Verdict {
            findings: vec![integrity::Finding {
                level: integrity::Level::Warn,
                what: format!("no verdict: {e}"),
                place: head.to_owned(),
            }],
        },
    };
    let level = verdict.level();
    runner.record(&crate::events::Event::IntegrityChecked {
        item_id: item_id(index),
        verdict: level.name().to_owned(),
        findings: verdict.text().lines().map(str::to_owned).collect(),
    });
    (mode == prodigy_plan::Integrity::Fail && level == integrity::Level::Fail).then(|| {
        let paths: Vec<String> = verdict
            .findings
            .iter()
            .filter(|f| f.level == integrity::Level::Fail)
            .map(|f| f.place.clone())
            .collect();
        Refusal {
            reason: Reason::Integrity,
            output: format!(
                "the work weakens the tests (`merge.integrity: fail`):\n{}keep every test, its assertions and the test configuration as they are, and make the change pass them",
                verdict.text()
            ),
            paths,
            tail: None,
        }
    })
}

/// Counts and records a refusal of item INDEX's work.
fn refused(runner: &Runner, index: usize, refusal: Refusal) -> Verdict {
    runner.verify_queue.refused.fetch_add(1, Ordering::Relaxed);
    runner.record(&crate::events::Event::MergeRefused {
        item_id: item_id(index),
        reason: refusal.reason.name().to_owned(),
        paths: refusal.paths.clone(),
    });
    Verdict::Refused(refusal)
}

/// The holder of the queue's lock, settling candidates for their agents.
struct Settler<'a> {
    runner: &'a Runner,
    session: &'a SessionWorktree,
    base: &'a Vars,
}

/// How a verification ended.
enum Tested {
    Passed,
    Failed {
        output: String,
        tail: Option<crate::dlq::CommandTail>,
    },
    Interrupted,
    Broken(WorktreeError),
}

impl Settler<'_> {
    /// Settles BATCH on the ref as it is now; KNOWN: how this very stack failed already
    /// (the second half of a bisection whose first half all landed), so it is not tested
    /// again. Returns how many landed.
    fn settle(
        &self,
        batch: Vec<Submission>,
        known: Option<Tested>,
        bisecting: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = usize> + '_>> {
        Box::pin(async move {
            let pool = &self.runner.agent_worktrees;
            let start = match pool.integration(self.session).await {
                Ok(c) => c,
                Err(e) => {
                    fail_all(batch, &e);
                    return 0;
                }
            };
            let (stacked, dropped) = self.stack(batch, &start).await;
            let Some(top) = stacked.last().map(|(_, s)| s.commit.clone()) else {
                return 0;
            };
            let tested = match known {
                Some(failed) if !dropped => failed,
                Some(_) | None => self.verify(&stacked, &start, &top, bisecting).await,
            };
            let tested = match tested {
                Tested::Passed => self.journal_verified(&stacked, &start, &top),
                other => other,
            };
            match tested {
                Tested::Passed => match pool.advance(self.session, &top, &start).await {
                    Ok(()) => {
                        crate::merge_journal::kill_point_after_merge();
                        let landed = stacked.len();
                        let queue = &self.runner.verify_queue;
                        queue.landed.fetch_add(landed as u64, Ordering::Relaxed);
                        for (sub, s) in stacked {
                            let _ = sub.tx.send(Verdict::Landed(s));
                        }
                        landed
                    }
                    Err(e) => {
                        fail_all(stacked.into_iter().map(|(s, _)| s).collect(), &e);
                        0
                    }
                },
                Tested::Failed { output, tail } if stacked.len() == 1 => {
                    for (sub, _) in stacked {
                        let refusal = Refusal {
                            reason: Reason::VerifyFailed,
                            output: output.clone(),
                            paths: Vec::new(),
                            tail: tail.clone(),
                        };
                        let _ = sub.tx.send(refused(self.runner, sub.index, refusal));
                    }
                    0
                }
                failed @ Tested::Failed { .. } => {
                    let mut first: Vec<Submission> = stacked.into_iter().map(|(s, _)| s).collect();
                    let rest = first.split_off(first.len() / 2);
                    let half = first.len();
                    let landed = self.settle(first, None, true).await;
                    let known = (landed == half).then_some(failed);
                    landed + self.settle(rest, known, true).await
                }
                Tested::Interrupted => {
                    for (sub, _) in stacked {
                        let _ = sub.tx.send(Verdict::Interrupted);
                    }
                    0
                }
                Tested::Broken(e) => {
                    fail_all(stacked.into_iter().map(|(s, _)| s).collect(), &e);
                    0
                }
            }
        })
    }

    /// Journals TOP, the top of STACKED on START, as verified before the ref moves to it
    /// (`merge_journal::Verified`); a journal that cannot be written lands nothing.
    fn journal_verified(
        &self,
        stacked: &[(Submission, Stacked)],
        start: &str,
        top: &str,
    ) -> Tested {
        let verified = crate::merge_journal::Verified {
            verified: top.to_owned(),
            base: start.to_owned(),
            items: stacked.iter().map(|(s, _)| s.index).collect(),
        };
        let dir = self.runner.opts.layout.job_dir(self.runner.session());
        match crate::merge_journal::append_verified(&dir, &verified) {
            Ok(()) => {
                crate::merge_journal::kill_point_after_verified();
                Tested::Passed
            }
            Err(e) => Tested::Broken(WorktreeError::Git {
                args: "merge journal".into(),
                stderr: e.to_string(),
            }),
        }
    }

    /// Stacks BATCH on START in order; a candidate that conflicts is refused at once (with
    /// both sides' hunks) and the rest stack without it. The second value: whether one was.
    async fn stack(
        &self,
        batch: Vec<Submission>,
        start: &str,
    ) -> (Vec<(Submission, Stacked)>, bool) {
        let mut top = start.to_owned();
        let mut stacked = Vec::new();
        let mut dropped = false;
        for sub in batch {
            let agent = (sub.base.as_str(), sub.branch.as_str());
            let how = (sub.message.as_str(), false);
            match candidate::stack(self.session, agent, &top, &sub.head, how).await {
                Ok(s) => {
                    top.clone_from(&s.commit);
                    stacked.push((sub, s));
                }
                Err(WorktreeError::Conflict { files, .. }) => {
                    dropped = true;
                    let output =
                        candidate::conflict_report(self.session, &top, &sub.head, &files).await;
                    let refusal = Refusal {
                        reason: Reason::Conflict,
                        output: self.runner.mask(&output),
                        paths: files,
                        tail: None,
                    };
                    let _ = sub.tx.send(refused(self.runner, sub.index, refusal));
                }
                Err(e) => {
                    dropped = true;
                    let _ = sub.tx.send(Verdict::Failed(e));
                }
            }
        }
        (stacked, dropped)
    }

    /// Runs `merge.verify` on TOP, the top of STACKED on START, in the scratch worktree.
    async fn verify(
        &self,
        stacked: &[(Submission, Stacked)],
        start: &str,
        top: &str,
        bisecting: bool,
    ) -> Tested {
        let runner = self.runner;
        let Some(merge) = runner.plan.merge.as_ref() else {
            return Tested::Interrupted;
        };
        if merge.verify.is_empty() {
            return Tested::Passed;
        }
        let items: Vec<String> = stacked.iter().map(|(s, _)| item_id(s.index)).collect();
        let queue = &runner.verify_queue;
        queue
            .verifying
            .store(stacked.len() as u64, Ordering::Relaxed);
        queue.verifications.fetch_add(1, Ordering::Relaxed);
        runner.record(&crate::events::Event::VerifyStarted {
            item_ids: items.clone(),
            candidate: top.to_owned(),
            bisecting,
        });
        let started = Instant::now();
        let tested = self
            .run_steps(&merge.verify, merge.timeout, stacked, start, top)
            .await;
        queue.verifying.store(0, Ordering::Relaxed);
        let (passed, output) = match &tested {
            Tested::Passed => (true, None),
            Tested::Failed { output, .. } => (false, Some(output.clone())),
            Tested::Interrupted => (false, Some("interrupted".to_owned())),
            Tested::Broken(e) => (false, Some(e.to_string())),
        };
        runner.record(&crate::events::Event::VerifyFinished {
            item_ids: items,
            candidate: top.to_owned(),
            passed,
            duration_secs: started.elapsed().as_secs_f64(),
            output,
        });
        tested
    }

    /// The steps of `merge.verify` in the scratch worktree holding TOP, with `${merge.*}`.
    async fn run_steps(
        &self,
        steps: &[prodigy_plan::StepId],
        timeout: Option<std::time::Duration>,
        stacked: &[(Submission, Stacked)],
        start: &str,
        top: &str,
    ) -> Tested {
        let runner = self.runner;
        let session = self.session;
        let (path, created) = match candidate::scratch(&runner.opts.layout, session, top).await {
            Ok(made) => made,
            Err(e) => return Tested::Broken(e),
        };
        let mut vars = self.base.clone();
        if created && let Err(e) = runner.prepare_worktree(&path, true, &mut vars).await {
            return Tested::Broken(WorktreeError::Git {
                args: "worktree preparation".into(),
                stderr: e.to_string(),
            });
        }
        let prefix = session
            .workdir
            .strip_prefix(&session.path)
            .unwrap_or(std::path::Path::new(""));
        let workdir = path.join(prefix);
        let (commits, files) = candidate_changes(session, start, top).await;
        let source = stacked
            .last()
            .map(|(s, _)| s.branch.clone())
            .unwrap_or_default();
        let mut fake = session.clone();
        fake.path.clone_from(&path);
        fake.branch = source;
        crate::worktree::set_merge_vars(
            &mut vars,
            &fake,
            &session.branch,
            runner.session(),
            &commits,
            &files,
        );
        let (end, failure) = runner
            .run_phase_in(steps, timeout, None, Some(workdir), &mut vars)
            .await;
        match end {
            crate::worktree::PhaseEnd::Completed => Tested::Passed,
            crate::worktree::PhaseEnd::Interrupted => Tested::Interrupted,
            crate::worktree::PhaseEnd::TimedOut => Tested::Failed {
                output: format!(
                    "`merge.verify` took longer than the merge's timeout ({})",
                    humantime::format_duration(timeout.unwrap_or_default())
                ),
                tail: None,
            },
            crate::worktree::PhaseEnd::StepFailed => {
                let (output, tail) = failure_output(runner, failure.as_ref(), &vars);
                Tested::Failed { output, tail }
            }
        }
    }
}

/// The commits and files the candidate TOP brings over START.
async fn candidate_changes(
    session: &SessionWorktree,
    start: &str,
    top: &str,
) -> (Vec<String>, Vec<String>) {
    let lines = |out: Result<String, WorktreeError>| -> Vec<String> {
        out.unwrap_or_default().lines().map(str::to_owned).collect()
    };
    let range = format!("{start}..{top}");
    let commits =
        lines(crate::worktree::git(&session.path, &["rev-list", "--reverse", &range]).await);
    let files =
        lines(crate::worktree::git(&session.path, &["diff", "--name-only", start, top]).await);
    (commits, files)
}

/// `${verify.output}` of a failed verification: the failing step, how it ended and the
/// last lines of what it printed (secrets masked), with that tail for the DLQ.
fn failure_output(
    runner: &Runner,
    failure: Option<&StepFailure>,
    vars: &Vars,
) -> (String, Option<crate::dlq::CommandTail>) {
    let Some(f) = failure else {
        let last = vars.last_output.clone().unwrap_or_default();
        return (runner.mask(&last), None);
    };
    let mut text = format!("`{}` failed", f.step);
    if let Some(tail) = &f.output {
        if let Some(code) = tail.exit_code {
            let _ = write!(text, " (exit code {code})");
        }
        for stream in [&tail.stdout, &tail.stderr] {
            if !stream.trim().is_empty() {
                text.push('\n');
                text.push_str(stream.trim_end());
            }
        }
    } else if !f.message.is_empty() {
        text.push_str(": ");
        text.push_str(&f.message);
    }
    let tail = f.output.as_ref().map(|t| crate::dlq::CommandTail {
        exit_code: t.exit_code,
        stdout: runner.mask(&t.stdout),
        stderr: runner.mask(&t.stderr),
    });
    (runner.mask(&text), tail)
}

/// Sends every submission of BATCH the failure E.
fn fail_all(batch: Vec<Submission>, e: &WorktreeError) {
    for sub in batch {
        let again = WorktreeError::Git {
            args: "merge queue".into(),
            stderr: e.to_string(),
        };
        let _ = sub.tx.send(Verdict::Failed(again));
    }
}

//! The lifecycle of a session (a standard run) or a MapReduce job, around the runner:
//!
//! 1. [`preflight`]: before anything is made, where the run works ([`choose_place`]) and
//!    whether the programs it needs (`git`, the Claude CLI) are there;
//! 2. [`Place::enter`]: the session worktree created, or reopened for a resumed run;
//! 3. [`start`]: the lock of the session or job taken, its event log opened, its starting
//!    variables computed and, on resume, what its checkpoint saved put back ([`restore`]);
//!    a map agent run apart from its job (on Slurm) does the same without the lock ([`open`]);
//! 4. the runner runs (the binary drives it), checkpointing as it goes ([`new_job_checkpoint`]
//!    for a job's first one);
//! 5. [`leave`]: a successful run's worktree merged back (after the caller's decision) or
//!    kept.
//!
//! [`resume`] holds the rules of `resume` and `resume-job`: which checkpoints continue,
//! which only merge back, and which are refused (an edited workflow, a stopped job).
//!
//! Nothing here prints or asks: each step returns a typed outcome, and a question to the
//! user (merge back?) is the caller's callback.

mod place;
mod preflight;
pub mod resume;

use crate::layout::RunKind;
use std::sync::Arc;

use prodigy_plan::Plan;

use crate::jobstore::{JobCheckpoint, JobPhase, Status};
use crate::runner::{Options, Runner, StartError};
use crate::store::SessionLock;
use crate::vars::Vars;

pub use place::{
    EnterError, Entered, Left, MergeQuestion, Place, PlaceError, Placement, choose_place, leave,
};
pub use preflight::{PreflightError, git_installed, preflight, roots};

/// A runner ready to go: its lock held and its starting variables, with what a checkpoint
/// saved put back (its callers ran [`preflight`] before making anything).
pub struct Started {
    /// The runner.
    pub runner: Runner,
    /// Its starting variables.
    pub vars: Vars,
    /// Held until the run ends.
    pub lock: SessionLock,
    /// How many processes earlier runs left behind were ended before anything ran
    /// ([`crate::reap::end_earlier`]).
    pub ended: usize,
}

/// Why a session or job could not start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StartFailed {
    /// Another live process runs it (or its lock cannot be made).
    #[error(transparent)]
    #[diagnostic(code(prodigy::session::locked))]
    Locked(crate::store::LockError),
    /// Its event log cannot be opened.
    #[error(transparent)]
    #[diagnostic(code(prodigy::session::store))]
    Store(StartError),
    /// Its starting variables cannot be computed (a secret, an env file, …).
    #[error(transparent)]
    #[diagnostic(code(prodigy::session::variables))]
    Variables(StartError),
    /// Processes an earlier run of it left would not go.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Survivors(crate::reap::Survivors),
}

/// Takes the lock of ID, ends what earlier runs of a resumed ID (`started_at` set) left
/// running ([`crate::reap::end_earlier`]), opens its event log and computes the starting
/// variables (plus SAVED, a checkpoint's variables, put back with [`restore`]); what the run
/// shows goes to REPORTER.
///
/// # Errors
///
/// [`StartFailed`]: the lock is held, an earlier run's processes would not go, the event log
/// cannot be opened, or the variables cannot be computed.
#[expect(
    clippy::too_many_arguments,
    reason = "what a session starts from, each given by the caller"
)]
pub async fn start(
    plan: Arc<Plan>,
    opts: Options,
    reporter: Arc<dyn crate::events::Reporter>,
    cancel: tokio::sync::watch::Receiver<bool>,
    kind: RunKind,
    id: String,
    started_at: Option<String>,
    saved: Option<&serde_json::Value>,
) -> Result<Started, StartFailed> {
    let lock = match kind {
        RunKind::Run => SessionLock::acquire(&opts.layout, &id),
        RunKind::Job => SessionLock::acquire_in(&opts.layout.job_dir(&id), &format!("job `{id}`")),
    }
    .map_err(StartFailed::Locked)?;
    // Under the lock no live coordinator runs ID: whatever still carries its mark was left
    // by one that died, and goes before anything runs again.
    let ended = if started_at.is_some() {
        crate::reap::end_earlier(&id, opts.grace)
            .await
            .map_err(StartFailed::Survivors)?
    } else {
        0
    };
    let (runner, vars) = open(plan, opts, reporter, cancel, id, started_at, saved).await?;
    Ok(Started {
        runner,
        vars,
        lock,
        ended,
    })
}

/// [`start`] without the lock, for one map agent run apart from its job (on Slurm) while
/// its coordinator holds the job's lock: opens the event log of ID and computes the
/// starting variables, with SAVED, a checkpoint's variables, put back with [`restore`].
///
/// # Errors
///
/// [`StartFailed::Store`] or [`StartFailed::Variables`].
pub async fn open(
    plan: Arc<Plan>,
    opts: Options,
    reporter: Arc<dyn crate::events::Reporter>,
    cancel: tokio::sync::watch::Receiver<bool>,
    id: String,
    started_at: Option<String>,
    saved: Option<&serde_json::Value>,
) -> Result<(Runner, Vars), StartFailed> {
    let runner = Runner::with_id(plan, opts, cancel, id, started_at)
        .map_err(StartFailed::Store)?
        .report_to(reporter);
    let mut vars = runner
        .initial_vars()
        .await
        .map_err(StartFailed::Variables)?;
    if let Some(saved) = saved {
        restore(&mut vars, &runner.unseal(saved.clone()));
    }
    Ok((runner, vars))
}

/// Puts back what earlier steps captured, without overriding env, secrets or params.
pub fn restore(vars: &mut Vars, variables: &serde_json::Value) {
    if let Some(values) = variables.get("values").and_then(|v| v.as_object()) {
        for (k, v) in values {
            if !vars.values.contains_key(k) {
                vars.set(k.clone(), v.clone());
            }
        }
    }
    if let Some(meta) = variables.get("meta").and_then(|v| v.as_object()) {
        for (k, v) in meta {
            vars.meta.insert(k.clone(), v.clone());
        }
    }
}

/// The first checkpoint of a new job `job_id` run with `opts`: in setup, running, nothing done.
#[must_use]
pub fn new_job_checkpoint(job_id: &str, opts: &Options) -> JobCheckpoint {
    let now = crate::store::timestamp();
    JobCheckpoint {
        version: 1,
        job_id: job_id.to_owned(),
        workflow_file: opts.workflow.clone(),
        project: opts.project.clone(),
        workflow_hash: opts.workflow_hash.clone(),
        phase: JobPhase::Setup,
        status: Status::Running,
        items_processed: 0,
        items_total: 0,
        items_remaining: Vec::new(),
        successful_items: 0,
        failed_items: 0,
        skipped_items: 0,
        started_at: now.clone(),
        last_checkpoint_at: now,
        reduce_next_step: 0,
        variables: serde_json::Value::Null,
        params: opts.params.clone(),
        args: opts.args.clone(),
        profile: opts.profile.clone(),
        max_parallel: 0,
        stop_reason: None,
        error_metrics: None,
        claude_cost_usd: 0.0,
        claude_counted_to: None,
        claude_budget_reached: None,
        worktree: opts.worktree.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn restored_variables_do_not_override_env_secrets_or_params() {
        let mut vars = Vars::default();
        vars.set("PARAM".to_owned(), json!("from the command line"));
        restore(
            &mut vars,
            &json!({
                "values": {"PARAM": "saved", "captured": "kept"},
                "meta": {"step": 3},
            }),
        );
        assert_eq!(vars.values["PARAM"], json!("from the command line"));
        assert_eq!(vars.values["captured"], json!("kept"));
        assert_eq!(vars.meta["step"], json!(3));
    }
}

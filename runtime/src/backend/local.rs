//! The default backend: an agent's steps run in the coordinator's process, their commands
//! as its child processes, `max_parallel` at a time.

use super::{AgentBackend, Dispatch, Dispatched, Ended, Pending};
use crate::machine::Outcome;
use crate::mapreduce::{Stopped, guarded};
use crate::runner::Runner;
use crate::vars::Vars;

/// Runs each agent's steps here, under its timeout and stop signals.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalBackend;

impl AgentBackend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn outlives_coordinator(&self) -> bool {
        false
    }

    fn dispatch<'a>(
        &'a self,
        runner: &'a Runner,
        d: Dispatch,
        vars: &'a mut Vars,
    ) -> Pending<'a, Dispatched> {
        Box::pin(run(runner, d, vars))
    }

    fn adoptable<'a>(
        &'a self,
        _runner: &'a Runner,
        _job_dir: &'a std::path::Path,
        _index: usize,
    ) -> Pending<'a, Option<Option<crate::worktree::records::AgentWorktree>>> {
        // Nothing outlives a killed coordinator here: its agents died with it.
        Box::pin(async { None })
    }
}

/// Runs D's steps with RUNNER, the agent's runner ([`Runner::in_agent`]).
async fn run(runner: &Runner, d: Dispatch, vars: &mut Vars) -> Dispatched {
    let Dispatch {
        steps,
        stop,
        timeout,
        halt,
        ..
    } = d;
    let (outcome, why) = guarded(
        runner,
        stop,
        runner.run_agent_steps(&steps, vars),
        timeout,
        halt,
    )
    .await;
    // Stopped by the job (`on_budget: stop`, `--cancel-running`) once its last step had
    // ended, the agent finished its work: its item's outcome is what its steps made of it,
    // not a cancellation that would run it again.
    let finished = why == Some(Stopped::Cancelled) && !*runner.cancel.borrow();
    let end = match (why, outcome) {
        (Some(Stopped::TimedOut), _) => Ended::TimedOut,
        (Some(Stopped::Cancelled), o) if finished && o.continues_agent() => Ended::Succeeded,
        (Some(Stopped::Cancelled), _) | (None, Outcome::Cancelled) => Ended::Cancelled,
        // A step whose failure was only handled fails the item.
        (None, o) if o.continues_agent() => Ended::Succeeded,
        (None, _) => Ended::Failed,
    };
    let scope = runner.agent();
    let output = vars.last_output.take();
    Dispatched {
        end,
        output,
        failure: scope.and_then(|s| s.failure.borrow().clone()),
        task: None,
        claude: scope.map(|s| *s.claude.borrow()).unwrap_or_default(),
        trail: scope.map(|s| s.trail.take()).unwrap_or_default(),
        stop_job: None,
    }
}

//! The executor seam: every command a step starts (a shell command, a Claude call, a
//! validation, an env `command:` value) is rendered into a [`Request`] and handed to the
//! run's [`Executor`], which runs it and reports the [`Output`] the step machines consume.
//!
//! [`LocalExecutor`] runs a local process ([`crate::exec::run_watched`]: its own process
//! group, the timeout, the grace period, the output limit). Tests inject a scripted executor
//! instead, so whole orchestrations run with no process and on tokio's paused clock.

use futures::future::LocalBoxFuture;
use tokio::sync::watch;

use crate::exec::{Command, Output};

/// What a request runs, as the workflow said it once rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A shell command (`sh -c TEXT`): a step's `shell`, a check, a handler, an env value.
    Shell {
        /// The rendered script.
        text: String,
    },
    /// A Claude call; the program and its arguments (the CLI's argv) are in the command.
    Claude {
        /// The rendered prompt.
        prompt: String,
    },
}

/// A fully rendered command, ready to run.
pub struct Request<'w> {
    /// What it is, as the workflow said it.
    pub kind: RequestKind,
    /// The program, its arguments, directory, environment, timeout, grace period and
    /// output limit.
    pub command: Command,
    /// Sees each line of standard output as it arrives (Claude's event stream, `-v`).
    pub watch: Option<&'w mut dyn FnMut(&str)>,
    /// Set when the command must stop (a signal, the agent's timeout, the job stopping).
    pub cancel: watch::Receiver<bool>,
}

impl Request<'_> {
    /// The rendered script of a shell command, or the prompt of a Claude call.
    pub fn text(&self) -> &str {
        match &self.kind {
            RequestKind::Shell { text } => text,
            RequestKind::Claude { prompt } => prompt,
        }
    }
}

/// Runs a command and reports how it ended. Implementations must honour the request's
/// timeout (`timed_out`), its cancel signal (`cancelled`) and its watcher (each line of
/// standard output, in order, before the future resolves).
pub trait Executor: Send + Sync {
    /// Runs REQUEST to its end.
    fn run<'a, 'w: 'a>(&'a self, request: Request<'w>) -> LocalBoxFuture<'a, Output>;
}

/// Local processes: today's [`crate::exec::run_watched`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalExecutor;

impl Executor for LocalExecutor {
    fn run<'a, 'w: 'a>(&'a self, request: Request<'w>) -> LocalBoxFuture<'a, Output> {
        Box::pin(async move {
            let Request {
                kind,
                command,
                watch,
                mut cancel,
            } = request;
            let longest = match kind {
                RequestKind::Claude { .. } => crate::exec::CLAUDE_LINE,
                RequestKind::Shell { .. } => crate::logs::LONGEST_LINE,
            };
            crate::exec::run_watched(&command, &mut cancel, watch, longest).await
        })
    }
}

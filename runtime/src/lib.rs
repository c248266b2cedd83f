//! The Prodigy interpreter: walks a compiled plan as explicit state machines.
//!
//! It consumes only the compiler's [`prodigy_plan::Plan`] and never reads YAML.

pub mod backend;
pub mod breaker;
pub mod claude;
pub mod confine;
pub mod dlq;
pub mod durable;
pub mod events;
pub mod exec;
pub mod executor;
pub mod input;
pub mod job;
pub mod jobstore;
pub mod layout;
pub mod live;
pub mod logs;
pub mod machine;
pub mod mapreduce;
pub mod merge_journal;
pub mod message;
pub mod progress;
pub mod reap;
pub mod runner;
pub mod runs;
pub mod sequence;
pub mod session;
pub(crate) mod step;
pub mod store;
#[cfg(test)]
pub(crate) mod testing;
pub mod text;
pub mod vars;
pub mod worktree;

/// Locks M; a panic elsewhere while it was held does not poison it for the rest of the run.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

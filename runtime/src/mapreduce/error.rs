//! What can go wrong in a MapReduce job's own machinery, apart from its steps: writing its
//! state, the map phase, `max_parallel`, and a DLQ retry. Each message is worded here, once.

use std::path::PathBuf;
use std::sync::Arc;

use prodigy_grammar::template::RenderError;

use crate::dlq::DlqError;
use crate::jobstore::JobStoreError;

/// A failed write of the job's state (its checkpoint, results or DLQ), for people: the file
/// and the OS error, or what is damaged.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum StateWriteError {
    /// The DLQ's index or an item of it.
    #[error("{}", super::dlq_write_failure(.0))]
    Dlq(DlqError),
    /// The job's checkpoint or results.
    #[error("{}", super::job_write_failure(.0))]
    Job(JobStoreError),
}

/// The first failed state write of a job, as the job keeps it: a write of its own files
/// (the typed error, shared by the places that report it) or of the run's checkpoint or
/// event log (as the runner words it).
#[derive(Clone, Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum WriteFailure {
    /// The job's checkpoint, results or DLQ.
    #[error(transparent)]
    Job(Arc<StateWriteError>),
    /// The run's checkpoint or event log.
    #[error("{0}")]
    Run(String),
}

impl From<StateWriteError> for WriteFailure {
    fn from(e: StateWriteError) -> Self {
        WriteFailure::Job(Arc::new(e))
    }
}

/// The same failure: the one write that was kept, not another that reads alike.
impl PartialEq for WriteFailure {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (WriteFailure::Job(a), WriteFailure::Job(b)) => Arc::ptr_eq(a, b),
            (WriteFailure::Run(a), WriteFailure::Run(b)) => a == b,
            (WriteFailure::Job(_), WriteFailure::Run(_))
            | (WriteFailure::Run(_), WriteFailure::Job(_)) => false,
        }
    }
}

/// Why a job's results can no longer be kept.
#[derive(Clone, Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum StateLost {
    /// Its state directory was removed while it ran.
    #[error(
        "the job's state directory `{}` was removed while the job ran (is `PRODIGY_HOME` still there?), so its results cannot be kept",
        .dir.display()
    )]
    DirRemoved {
        /// The job's state directory.
        dir: PathBuf,
    },
    /// The agents' backend cannot go on, in the backend's words.
    #[error("{0}")]
    Backend(String),
}

/// Why the map phase ended in error rather than with its items decided.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum MapError {
    /// The job's results cannot be kept: its state directory vanished while it ran, or its
    /// backend cannot go on.
    #[error(transparent)]
    StateLost(StateLost),
    /// A state write failed; the job stops.
    #[error(transparent)]
    StateWrite(WriteFailure),
    /// The job's items could not be read back.
    #[error(transparent)]
    Items(JobStoreError),
    /// The results of earlier attempts could not be read.
    #[error(transparent)]
    Results(JobStoreError),
    /// `max_parallel` is not usable.
    #[error(transparent)]
    MaxParallel(#[from] MaxParallelError),
}

/// Why `max_parallel` gives no number of agents.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum MaxParallelError {
    /// Its `${VAR}` did not render.
    #[error("`max_parallel`: {0}")]
    Render(#[source] RenderError),
    /// It rendered to something other than a positive number.
    #[error("`max_parallel` is `{written}`, which is `{text}`: not a positive number")]
    NotPositive {
        /// As written.
        written: String,
        /// As rendered.
        text: String,
    },
}

/// Why `prodigy dlq retry` could not go on.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RetryError {
    /// `--parallel`'s fallback, `max_parallel`, is not usable.
    #[error(transparent)]
    MaxParallel(#[from] MaxParallelError),
    /// The DLQ could not be read or written.
    #[error(transparent)]
    Dlq(#[from] DlqError),
    /// A success could not be added to the job's results.
    #[error(transparent)]
    Results(#[from] JobStoreError),
}

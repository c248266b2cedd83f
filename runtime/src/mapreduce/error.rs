//! What can go wrong in a MapReduce job's own machinery, apart from its steps: writing its
//! state, the map phase, `max_parallel`, and a DLQ retry. Each message is worded here, once.

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

/// Why the map phase ended in error rather than with its items decided.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum MapError {
    /// The job's state directory vanished while it ran: its results cannot be kept (the
    /// loss, described).
    #[error("{0}")]
    StateLost(String),
    /// A state write failed (described); the job stops.
    #[error("{0}")]
    StateWrite(String),
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

//! `${map.*}` error metrics: counts, failure rate, and the dominant causes of failure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::job::Counts;
use crate::jobstore::{ItemRecord, ItemStatus};

/// Error metrics (docs/language.md §8): printed at the end of the job and stored with it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorMetrics {
    /// Items after the input pipeline.
    pub total_items: u64,
    /// Items that succeeded.
    pub successful: u64,
    /// Items that failed.
    pub failed: u64,
    /// Items skipped by policy.
    pub skipped: u64,
    /// Failed over finished items (0.0 to 1.0).
    pub failure_rate: f64,
    /// Failures by error type.
    pub error_types: BTreeMap<String, u64>,
    /// Error types seen 3 or more times, with what to do about them.
    pub failure_patterns: Vec<FailurePattern>,
}

/// A recurring failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailurePattern {
    /// The error type.
    pub pattern: String,
    /// How often it occurred.
    pub frequency: u64,
    /// What to do.
    pub suggestion: String,
}

/// How many of RECORDS succeeded, failed and were skipped.
pub(crate) fn tally<'r>(records: impl Iterator<Item = &'r ItemRecord>) -> Counts {
    let mut counts = Counts::default();
    for record in records {
        match record.status {
            ItemStatus::Succeeded => counts.succeeded += 1,
            ItemStatus::Failed => counts.failed += 1,
            ItemStatus::Skipped => counts.skipped += 1,
        }
    }
    counts
}

/// Error metrics from the item outcomes (docs/language.md §8: a pattern is an error type seen 3 or
/// more times; timeouts, network and permission errors get their own suggestion, any other
/// points to `prodigy dlq stats JOB`).
pub fn error_metrics(records: &[ItemRecord], total: u64, job: &str) -> ErrorMetrics {
    let mut metrics = ErrorMetrics {
        total_items: total,
        ..ErrorMetrics::default()
    };
    let counts = tally(records.iter());
    (metrics.successful, metrics.failed, metrics.skipped) =
        (counts.succeeded, counts.failed, counts.skipped);
    let mut messages: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for record in records {
        if record.status != ItemStatus::Succeeded {
            let kind = record
                .error_type
                .clone()
                .unwrap_or_else(|| "Unknown".into());
            *metrics.error_types.entry(kind.clone()).or_default() += 1;
            messages
                .entry(kind)
                .or_default()
                .push(record.error.as_deref().unwrap_or(""));
        }
    }
    let finished = counts.finished();
    if finished > 0 {
        #[expect(
            clippy::cast_precision_loss,
            reason = "item counts stay far below 2^52"
        )]
        let rate = metrics.failed as f64 / finished as f64;
        metrics.failure_rate = rate;
    }
    for (kind, count) in &metrics.error_types {
        if *count < 3 {
            continue;
        }
        let suggestion = if kind == "Timeout" {
            "Consider increasing agent_timeout_secs in timeout_config".to_owned()
        } else {
            match dominant_cause(messages.get(kind).map_or(&[][..], Vec::as_slice)) {
                Cause::Network => "Check network connectivity and retry settings".to_owned(),
                Cause::Permission => "Verify file permissions and access rights".to_owned(),
                // The documented words first (a user's tooling may match them), then how.
                Cause::Other => format!(
                    "Review error logs for more details: `prodigy dlq stats {job}` shows which items failed and why"
                ),
            }
        };
        metrics.failure_patterns.push(FailurePattern {
            pattern: kind.clone(),
            frequency: *count,
            suggestion,
        });
    }
    metrics
}

/// What an error message says went wrong, for the advice of a failure pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    Network,
    Permission,
    Other,
}

impl Cause {
    pub(crate) fn of(message: &str) -> Cause {
        let text = message.to_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| text.contains(w));
        if any(&["permission", "access denied", "not permitted"]) {
            Cause::Permission
        } else if any(&["network", "connection", "unreachable", "could not resolve"]) {
            Cause::Network
        } else {
            Cause::Other
        }
    }
}

/// The cause most of MESSAGES share; on a tie, a specific cause (network, then permission)
/// wins over the rest, so the advice names what most failures have in common.
pub(crate) fn dominant_cause(messages: &[&str]) -> Cause {
    let order = [Cause::Network, Cause::Permission, Cause::Other];
    let count = |cause: Cause| messages.iter().filter(|m| Cause::of(m) == cause).count();
    let mut best = (Cause::Other, 0);
    for cause in order {
        let n = count(cause);
        if n > best.1 {
            best = (cause, n);
        }
    }
    best.0
}

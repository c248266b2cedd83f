//! The map phase's bookkeeping as a pure state machine (docs/language.md §8): what happens to a failed
//! item (`on_item_failure`), and when the job stops (`continue_on_failure`, `max_failures`,
//! `failure_threshold`). Stopping means no new agents; items not started stay pending.

use std::time::Duration;

pub use prodigy_plan::{HandlerId, ItemFailure, JobPolicy};

/// Items finished so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Succeeded.
    pub succeeded: u64,
    /// Failed for good (dead-lettered, or failed under `stop`/`custom`).
    pub failed: u64,
    /// Failed and skipped by policy.
    pub skipped: u64,
}

impl Counts {
    /// Items that reached an outcome.
    pub fn finished(&self) -> u64 {
        self.succeeded + self.failed + self.skipped
    }
}

/// Why the job stopped early.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// `on_item_failure: stop`.
    ItemFailureStop,
    /// `continue_on_failure: false`.
    NoContinueOnFailure,
    /// `max_failures` items failed.
    MaxFailures(u64),
    /// An agent timed out under `timeout_action: fail`.
    AgentTimeout,
    /// `on_item_failure: custom:NAME` names no handler (a plan built despite V011).
    MissingHandler(String),
    /// The failure rate went above `failure_threshold`.
    FailureRate {
        /// The rate seen.
        rate: f64,
        /// The threshold.
        threshold: f64,
    },
}

/// The job's phase.
#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    /// Agents start as slots free up.
    Running,
    /// No new agents; the running ones finish.
    Stopping(StopReason),
}

/// What happened to an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemEvent {
    /// Its agent succeeded.
    Succeeded,
    /// Its agent failed on run `attempt` (1-based).
    Failed {
        /// The run that failed.
        attempt: u32,
    },
}

/// What to do with the item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemAction {
    /// Nothing more: it succeeded.
    Done,
    /// Run it again after `delay`.
    Retry {
        /// The next run (1-based).
        attempt: u32,
        /// The wait first.
        delay: Duration,
    },
    /// Put it in the DLQ.
    DeadLetter,
    /// Record it as skipped.
    Skip,
    /// Run this handler for it, then record it as failed.
    Handler(HandlerId),
    /// Record it as failed (the job stops).
    Fail,
}

/// The map phase's state: counts and whether new agents may start.
#[derive(Clone, Debug)]
pub struct Job {
    policy: JobPolicy,
    counts: Counts,
    state: JobState,
    /// Items in the job, for when the failure rate starts to count.
    total: u64,
}

/// Finished items before `failure_threshold` is evaluated, when the job has more.
const RATE_FROM: u64 = 10;

impl Job {
    /// A running job of TOTAL items.
    pub fn new(policy: JobPolicy, total: u64) -> Self {
        Self::resumed(policy, Counts::default(), total)
    }

    /// A running job of TOTAL items that continues with the counts of an earlier run
    /// (`resume-job`), so that `max_failures` and `failure_threshold` count every item of
    /// the job.
    pub fn resumed(policy: JobPolicy, counts: Counts, total: u64) -> Self {
        Job {
            policy,
            counts,
            state: JobState::Running,
            total,
        }
    }

    /// Records a failed item and stops the job from outside the policy (a timed-out agent
    /// under `timeout_action: fail`).
    pub fn fail_and_stop(&mut self, reason: StopReason) {
        self.counts.failed += 1;
        self.stop(reason);
    }

    /// Records an item skipped outside the policy (a timed-out agent under
    /// `timeout_action: skip`).
    pub fn skip(&mut self) {
        self.counts.skipped += 1;
        self.check_rate();
    }

    /// Counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Running or stopping.
    pub fn state(&self) -> &JobState {
        &self.state
    }

    /// Whether a new agent may start.
    pub fn admits(&self) -> bool {
        match self.state {
            JobState::Running => true,
            JobState::Stopping(_) => false,
        }
    }

    /// Feeds an item's result; returns what to do with the item.
    pub fn on_item(&mut self, event: ItemEvent) -> ItemAction {
        let (action, counted_failure) = match event {
            ItemEvent::Succeeded => {
                self.counts.succeeded += 1;
                (ItemAction::Done, false)
            }
            ItemEvent::Failed { attempt } if attempt < self.policy.max_attempts => {
                let delay = self
                    .policy
                    .retry_delays
                    .get((attempt as usize).saturating_sub(1))
                    .copied()
                    .unwrap_or_default();
                return ItemAction::Retry {
                    attempt: attempt + 1,
                    delay,
                };
            }
            ItemEvent::Failed { .. } => match &self.policy.on_item_failure {
                ItemFailure::Retry | ItemFailure::Dlq => {
                    self.counts.failed += 1;
                    (ItemAction::DeadLetter, true)
                }
                ItemFailure::Skip => {
                    self.counts.skipped += 1;
                    (ItemAction::Skip, false)
                }
                ItemFailure::Stop => {
                    self.counts.failed += 1;
                    self.stop(StopReason::ItemFailureStop);
                    (ItemAction::Fail, true)
                }
                ItemFailure::Custom(handler) => {
                    self.counts.failed += 1;
                    (ItemAction::Handler(*handler), true)
                }
                ItemFailure::MissingHandler(name) => {
                    // Nothing is lost: the item is dead-lettered, and the job stops because
                    // the policy it was given cannot be followed.
                    self.counts.failed += 1;
                    self.stop(StopReason::MissingHandler(name.clone()));
                    (ItemAction::DeadLetter, true)
                }
            },
        };
        if counted_failure {
            self.check_failure_limits();
        }
        // The rate is evaluated after every finished item: a success can be the item that
        // brings the count to where the rate starts to count.
        self.check_rate();
        action
    }

    fn stop(&mut self, reason: StopReason) {
        match self.state {
            JobState::Running => self.state = JobState::Stopping(reason),
            JobState::Stopping(_) => {}
        }
    }

    fn check_failure_limits(&mut self) {
        if !self.policy.continue_on_failure {
            self.stop(StopReason::NoContinueOnFailure);
        }
        // "Stop after this many failures": the Nth failure stops the job.
        if let Some(max) = self.policy.max_failures
            && self.counts.failed >= max
        {
            self.stop(StopReason::MaxFailures(max));
        }
    }

    /// `failure_threshold`, once 10 items have finished, or every item of a smaller job.
    fn check_rate(&mut self) {
        let finished = self.counts.finished();
        if let Some(threshold) = self.policy.failure_threshold
            && finished > 0
            && finished >= RATE_FROM.min(self.total)
        {
            #[expect(
                clippy::cast_precision_loss,
                reason = "item counts stay far below 2^52"
            )]
            let rate = self.counts.failed as f64 / finished as f64;
            if rate > threshold {
                self.stop(StopReason::FailureRate { rate, threshold });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job with more items than the failure rate waits for.
    fn big_job(policy: JobPolicy) -> Job {
        Job::new(policy, 100)
    }

    fn fail(job: &mut Job, attempt: u32) -> ItemAction {
        job.on_item(ItemEvent::Failed { attempt })
    }

    #[test]
    fn by_default_failures_go_to_the_dlq_and_the_job_goes_on() {
        let mut job = big_job(JobPolicy::default());
        for _ in 0..20 {
            assert_eq!(fail(&mut job, 1), ItemAction::DeadLetter);
        }
        assert!(job.admits());
        assert_eq!(job.counts().failed, 20);
    }

    #[test]
    fn retry_runs_again_with_the_policy_delays_then_dead_letters() {
        let mut job = big_job(JobPolicy {
            on_item_failure: ItemFailure::Retry,
            max_attempts: 3,
            retry_delays: vec![Duration::from_secs(1), Duration::from_secs(2)],
            ..JobPolicy::default()
        });
        assert_eq!(
            fail(&mut job, 1),
            ItemAction::Retry {
                attempt: 2,
                delay: Duration::from_secs(1)
            }
        );
        assert_eq!(
            fail(&mut job, 2),
            ItemAction::Retry {
                attempt: 3,
                delay: Duration::from_secs(2)
            }
        );
        assert_eq!(job.counts().failed, 0, "a retried item has not failed yet");
        assert_eq!(fail(&mut job, 3), ItemAction::DeadLetter);
        assert_eq!(job.counts().failed, 1);
    }

    #[test]
    fn a_retry_config_retries_before_any_policy_applies() {
        let mut job = big_job(JobPolicy {
            max_attempts: 2,
            retry_delays: vec![Duration::from_secs(1)],
            ..JobPolicy::default()
        });
        assert_eq!(
            fail(&mut job, 1),
            ItemAction::Retry {
                attempt: 2,
                delay: Duration::from_secs(1)
            }
        );
        assert_eq!(fail(&mut job, 2), ItemAction::DeadLetter);
    }

    #[test]
    fn a_missing_handler_dead_letters_the_item_and_stops_the_job() {
        let mut job = big_job(JobPolicy {
            on_item_failure: ItemFailure::MissingHandler("notify".into()),
            ..JobPolicy::default()
        });
        assert_eq!(fail(&mut job, 1), ItemAction::DeadLetter);
        assert_eq!(job.counts().failed, 1);
        assert_eq!(
            job.state(),
            &JobState::Stopping(StopReason::MissingHandler("notify".into()))
        );
    }

    #[test]
    fn skip_stop_and_custom() {
        let mut skip = big_job(JobPolicy {
            on_item_failure: ItemFailure::Skip,
            max_failures: Some(0),
            ..JobPolicy::default()
        });
        assert_eq!(fail(&mut skip, 1), ItemAction::Skip);
        assert!(skip.admits(), "skipped items are not failures");
        let mut stop = big_job(JobPolicy {
            on_item_failure: ItemFailure::Stop,
            ..JobPolicy::default()
        });
        assert_eq!(fail(&mut stop, 1), ItemAction::Fail);
        assert_eq!(
            stop.state(),
            &JobState::Stopping(StopReason::ItemFailureStop)
        );
        let mut custom = big_job(JobPolicy {
            on_item_failure: ItemFailure::Custom(HandlerId(1)),
            ..JobPolicy::default()
        });
        assert_eq!(fail(&mut custom, 1), ItemAction::Handler(HandlerId(1)));
    }

    #[test]
    fn max_failures_stops_at_that_many() {
        let mut job = big_job(JobPolicy {
            max_failures: Some(2),
            ..JobPolicy::default()
        });
        fail(&mut job, 1);
        assert!(job.admits());
        fail(&mut job, 1);
        assert_eq!(job.state(), &JobState::Stopping(StopReason::MaxFailures(2)));
    }

    #[test]
    fn continue_on_failure_false_stops_at_the_first_failure() {
        let mut job = big_job(JobPolicy {
            continue_on_failure: false,
            ..JobPolicy::default()
        });
        job.on_item(ItemEvent::Succeeded);
        assert!(job.admits());
        fail(&mut job, 1);
        assert_eq!(
            job.state(),
            &JobState::Stopping(StopReason::NoContinueOnFailure)
        );
    }

    #[test]
    fn the_failure_rate_counts_from_ten_items_and_must_exceed_the_threshold() {
        let mut job = big_job(JobPolicy {
            failure_threshold: Some(0.2),
            ..JobPolicy::default()
        });
        // 3 failures in the first 3 items: 100%, but fewer than 10 items finished.
        for _ in 0..3 {
            fail(&mut job, 1);
        }
        assert!(job.admits());
        for _ in 0..6 {
            job.on_item(ItemEvent::Succeeded);
        }
        assert!(job.admits(), "9 finished: still too early");
        // The 10th finished item, a success, completes 3/10 = 30% > 20%; but check the
        // boundary first with a fresh job.
        let mut boundary = big_job(JobPolicy {
            failure_threshold: Some(0.2),
            ..JobPolicy::default()
        });
        for _ in 0..8 {
            boundary.on_item(ItemEvent::Succeeded);
        }
        fail(&mut boundary, 1);
        fail(&mut boundary, 1);
        assert!(boundary.admits(), "2 of 10 is 20%, not above it");
        job.on_item(ItemEvent::Succeeded);
        match job.state() {
            JobState::Stopping(StopReason::FailureRate { rate, threshold }) => {
                assert!((rate - 3.0 / 10.0).abs() < 1e-9);
                assert!((threshold - 0.2).abs() < 1e-9);
            }
            other => panic!("{other:?}"),
        }
        assert!(!job.admits());
    }
    #[test]
    fn a_small_job_evaluates_the_rate_once_all_its_items_finished() {
        // 3 failures out of 5 items at 0.2: the rate counts once the 5 items finished.
        let policy = JobPolicy {
            failure_threshold: Some(0.2),
            ..JobPolicy::default()
        };
        let mut job = Job::new(policy.clone(), 5);
        for _ in 0..3 {
            fail(&mut job, 1);
        }
        job.on_item(ItemEvent::Succeeded);
        assert!(job.admits(), "4 of 5 finished: too early");
        // The last item succeeds, and still the job stops: 3/5 = 60% > 20%.
        job.on_item(ItemEvent::Succeeded);
        match job.state() {
            JobState::Stopping(StopReason::FailureRate { rate, .. }) => {
                assert!((rate - 0.6).abs() < 1e-9, "{rate}");
            }
            other => panic!("{other:?}"),
        }
        // At or below the threshold, a small job goes on.
        let mut fine = Job::new(policy, 5);
        fail(&mut fine, 1);
        for _ in 0..4 {
            fine.on_item(ItemEvent::Succeeded);
        }
        assert!(fine.admits(), "1 of 5 is 20%, not above it");
    }

    #[test]
    fn the_rate_is_evaluated_after_a_success_too() {
        // 3 early failures, then successes: the 10th finished item is a success, and the rate
        // it completes (3/10) is above 0.25.
        let mut job = big_job(JobPolicy {
            failure_threshold: Some(0.25),
            ..JobPolicy::default()
        });
        for _ in 0..3 {
            fail(&mut job, 1);
        }
        for _ in 0..6 {
            job.on_item(ItemEvent::Succeeded);
        }
        assert!(job.admits(), "9 finished");
        job.on_item(ItemEvent::Succeeded);
        assert!(
            matches!(
                job.state(),
                JobState::Stopping(StopReason::FailureRate { .. })
            ),
            "{:?}",
            job.state()
        );
        // A timed-out item skipped by `timeout_action: skip` finishes an item too.
        let mut skipped = Job::new(
            JobPolicy {
                failure_threshold: Some(0.5),
                ..JobPolicy::default()
            },
            3,
        );
        fail(&mut skipped, 1);
        fail(&mut skipped, 1);
        skipped.skip();
        assert!(!skipped.admits(), "2 of 3 failed");
    }
}

//! The resolved policies: what the runtime's state machines need, decided once by the
//! planner so that no run converts, clamps or defaults anything.
//!
//! - [`RetryPolicy`] and [`HandlerPolicy`]: a step's `retry_config` (schedule, jitter, budget,
//!   compiled `retry_on` matchers) and `on_failure`, as the step machine reads them.
//! - [`BreakerConfig`]: `error_policy.circuit_breaker`, every threshold at least 1.
//! - [`JobPolicy`]: the map phase's error policy with the defaults of docs/language.md §8
//!   filled in and its retry schedule computed; `on_item_failure: custom` names its handler
//!   by [`HandlerId`].
//! - [`OutputCapture`]: a setup `capture_outputs` entry.
//!
//! None of these carries a span; the plan keeps the policies as written (with spans) beside
//! them for the graph checks and `prodigy graph`.

use std::time::Duration;

use prodigy_grammar::jsonpath::JsonPath;

use crate::vocab::{
    self, CaptureFormat, CaptureSource, ErrorCollection, Multiline, Parsed, Pattern, RetryConfig,
    Template,
};

/// Which failures a step's `retry_config` retries, ready to match.
#[derive(Clone, Debug)]
pub enum Matcher {
    /// `network`.
    Network,
    /// `timeout`.
    Timeout,
    /// `server_error`.
    ServerError,
    /// `rate_limit`.
    RateLimit,
    /// `overloaded`: a Claude call that met an overloaded API (529).
    Overloaded,
    /// `auth`: a Claude call whose credentials were refused.
    Auth,
    /// `stalled`: a Claude call stopped by its `stall_timeout`.
    Stalled,
    /// `{pattern: REGEX}`, compiled.
    Pattern(regex::Regex),
}

/// What happens when `retry_config`'s attempts run out.
#[derive(Clone, Debug, PartialEq)]
pub enum Exhausted {
    /// The run fails (then `on_failure` applies).
    Stop,
    /// The step is recorded failed and the workflow goes on.
    Continue,
    /// Run this fallback command; its result is the run's.
    Fallback(Template),
}

/// A step's `retry_config`, as the step machine needs it.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Runs of the command in one run of the step, counting the first (at least 1).
    pub attempts: u32,
    /// Nominal delay before retry n (index n-1), already capped at `max_delay`: the step's
    /// one retry schedule (the serialised plan shows it as `retry.schedule`).
    pub delays: Vec<Duration>,
    /// The cap.
    pub max_delay: Duration,
    /// Spread jitter by this factor (only when `Some`).
    pub jitter: Option<f64>,
    /// Which failures are retried (empty: all).
    pub retry_on: Vec<Matcher>,
    /// Total time for all attempts and delays.
    pub budget: Option<Duration>,
    /// After the last attempt.
    pub exhausted: Exhausted,
}

impl RetryPolicy {
    /// A policy that never retries.
    pub const fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            delays: Vec::new(),
            max_delay: Duration::ZERO,
            jitter: None,
            retry_on: Vec::new(),
            budget: None,
            exhausted: Exhausted::Stop,
        }
    }

    /// The nominal delay before retry `n` (1-based), before jitter; `max_delay` past the
    /// schedule.
    pub fn nominal(&self, n: u32) -> Duration {
        self.delays
            .get((n as usize).saturating_sub(1))
            .copied()
            .unwrap_or(self.max_delay)
    }

    /// Resolves a `retry_config` as written: its schedule, jitter and compiled matchers.
    pub fn resolve(config: &RetryConfig) -> Self {
        RetryPolicy {
            attempts: config.attempts.max(1),
            delays: schedule(config),
            max_delay: config.max_delay,
            jitter: config.jitter.then_some(config.jitter_factor),
            retry_on: config
                .retry_on
                .iter()
                .map(|m| match m {
                    vocab::Matcher::Network => Matcher::Network,
                    vocab::Matcher::Timeout => Matcher::Timeout,
                    vocab::Matcher::ServerError => Matcher::ServerError,
                    vocab::Matcher::RateLimit => Matcher::RateLimit,
                    vocab::Matcher::Overloaded => Matcher::Overloaded,
                    vocab::Matcher::Auth => Matcher::Auth,
                    vocab::Matcher::Stalled => Matcher::Stalled,
                    vocab::Matcher::Pattern(p) => Matcher::Pattern(p.regex().clone()),
                })
                .collect(),
            budget: config.retry_budget,
            exhausted: match &config.on_failure {
                vocab::RetryExhausted::Stop => Exhausted::Stop,
                vocab::RetryExhausted::Continue => Exhausted::Continue,
                vocab::RetryExhausted::Fallback(command) => Exhausted::Fallback(command.clone()),
            },
        }
    }
}

/// A step's `on_failure`, as the step machine needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per documented field"
)]
pub struct HandlerPolicy {
    /// There are handler commands to run.
    pub has_handler: bool,
    /// Runs of the command, counting the first (at least 1).
    pub max_attempts: u32,
    /// Fail the workflow when attempts are exhausted.
    pub fail_workflow: bool,
    /// A failing handler fails the workflow.
    pub handler_failure_fatal: bool,
    /// A successful handler recovers the step: `strategy: fallback`, whose result stands in
    /// for the command's. Any other handler only handles the failure.
    pub recovers: bool,
}

impl HandlerPolicy {
    /// No `on_failure`: a failure fails the workflow.
    pub fn none() -> Self {
        HandlerPolicy {
            has_handler: false,
            max_attempts: 1,
            fail_workflow: true,
            handler_failure_fatal: false,
            recovers: false,
        }
    }
}

/// The circuit breaker's settings, each threshold at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// How long it stays open before probing.
    pub timeout: Duration,
    /// Probes admitted at a time while half-open.
    pub half_open_requests: u32,
    /// Probe successes that close it.
    pub success_threshold: u32,
}

impl BreakerConfig {
    /// From `error_policy.circuit_breaker` as written.
    pub fn resolve(config: &vocab::CircuitBreaker) -> Self {
        BreakerConfig {
            failure_threshold: config.failure_threshold.max(1),
            timeout: config.timeout,
            half_open_requests: config.half_open_requests.max(1),
            success_threshold: config.success_threshold.max(1),
        }
    }
}

/// A dense index into [`crate::Plan::handlers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct HandlerId(pub u32);

impl HandlerId {
    /// The index into [`crate::Plan::handlers`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What happens to a map item that failed its last run (`on_item_failure`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemFailure {
    /// Dead-letter the item.
    Dlq,
    /// Retried under the policy's retry schedule, then dead-lettered.
    Retry,
    /// Skip it.
    Skip,
    /// Stop the job.
    Stop,
    /// Run this handler.
    Custom(HandlerId),
    /// `custom:NAME` with no handler NAME. `check` reports it (V011), so only a plan built
    /// from a workflow with errors has it; the runtime dead-letters the item and stops the
    /// job, naming the handler.
    MissingHandler(String),
}

/// The map phase's error policy, with the defaults of docs/language.md §8 filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct JobPolicy {
    /// What happens to a failed item.
    pub on_item_failure: ItemFailure,
    /// Whether other items go on after a failure.
    pub continue_on_failure: bool,
    /// More failures than this stop the job.
    pub max_failures: Option<u64>,
    /// A failure rate strictly above this stops the job, checked after every finished item
    /// once 10 items (or all of them, when there are fewer) have finished.
    pub failure_threshold: Option<f64>,
    /// Runs of an item before `on_item_failure` applies, counting the first
    /// (`retry_config.max_attempts`; 1 without a `retry_config`).
    pub max_attempts: u32,
    /// Delays before the item's retries (retry n at index n-1).
    pub retry_delays: Vec<Duration>,
    /// `retry_config.jitter`: the spread of each delay.
    pub jitter: Option<f64>,
    /// `retry_config.max_delay`: no delay, jitter included, is longer.
    pub max_delay: Option<Duration>,
    /// `error_collection`: when failed items are reported.
    pub error_collection: ErrorCollection,
    /// `circuit_breaker`, when there is one.
    pub circuit_breaker: Option<BreakerConfig>,
}

impl Default for JobPolicy {
    fn default() -> Self {
        JobPolicy {
            on_item_failure: ItemFailure::Dlq,
            continue_on_failure: true,
            max_failures: None,
            failure_threshold: None,
            max_attempts: 1,
            retry_delays: Vec::new(),
            jitter: None,
            max_delay: None,
            error_collection: ErrorCollection::Aggregate,
            circuit_breaker: None,
        }
    }
}

impl JobPolicy {
    /// Resolves the workflow's `error_policy` (absent: the defaults); HANDLERS are the names
    /// of [`crate::Plan::handlers`], in order.
    pub fn resolve(policy: Option<&vocab::ErrorPolicy>, handlers: &[&str]) -> Self {
        let Some(p) = policy else {
            return JobPolicy::default();
        };
        let written = p
            .on_item_failure
            .as_ref()
            .map_or(vocab::ItemFailure::Dlq, |s| s.value.clone());
        // `retry_config` retries a failed item whatever `on_item_failure` says, before it
        // applies; `on_item_failure: retry` without one uses the default policy.
        let default =
            (written == vocab::ItemFailure::Retry).then(|| vocab::PolicyRetry::default_at(p.span));
        let retry = p.retry_config.as_ref().or(default.as_ref());
        let on_item_failure = match written {
            vocab::ItemFailure::Dlq => ItemFailure::Dlq,
            vocab::ItemFailure::Retry => ItemFailure::Retry,
            vocab::ItemFailure::Skip => ItemFailure::Skip,
            vocab::ItemFailure::Stop => ItemFailure::Stop,
            vocab::ItemFailure::Custom(name) => handlers
                .iter()
                .position(|h| *h == name)
                .and_then(|i| u32::try_from(i).ok())
                .map_or(ItemFailure::MissingHandler(name), |i| {
                    ItemFailure::Custom(HandlerId(i))
                }),
        };
        JobPolicy {
            on_item_failure,
            continue_on_failure: p.continue_on_failure.as_ref().is_none_or(|s| s.value),
            max_failures: p.max_failures.as_ref().map(|s| s.value),
            failure_threshold: p.failure_threshold.as_ref().map(|s| s.value),
            max_attempts: retry.map_or(1, |r| r.max_attempts.max(1)),
            retry_delays: retry.map(policy_schedule).unwrap_or_default(),
            jitter: retry.filter(|r| r.jitter).map(|r| r.jitter_factor),
            max_delay: retry.and_then(|r| r.max_delay),
            error_collection: p
                .error_collection
                .as_ref()
                .map_or(ErrorCollection::Aggregate, |c| c.value),
            circuit_breaker: p.circuit_breaker.as_ref().map(BreakerConfig::resolve),
        }
    }
}

/// A setup `capture_outputs` entry: a variable made from a setup step's output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OutputCapture {
    /// The variable name.
    pub name: String,
    /// Which setup step (0-based).
    pub command_index: u64,
    /// `format`.
    pub format: CaptureFormat,
    /// `source`.
    pub source: CaptureSource,
    /// `pattern`: a regex whose first group (or whole match) is the value, compiled; the
    /// plan shows its text.
    #[serde(serialize_with = "text_of_pattern")]
    pub pattern: Option<Pattern>,
    /// `json_path` into the output, parsed; the plan shows its text.
    #[serde(serialize_with = "text_of_path")]
    pub json_path: Option<Parsed<JsonPath>>,
    /// `max_size` in bytes.
    pub max_size: u64,
    /// `default` when pattern or path fail.
    pub default: Option<String>,
    /// `multiline`.
    pub multiline: Multiline,
}

impl OutputCapture {
    /// A capture of NAME from the whole stdout of setup step INDEX as a string, the
    /// defaults of `capture_outputs`.
    pub fn new(name: impl Into<String>, command_index: u64) -> Self {
        OutputCapture {
            name: name.into(),
            command_index,
            format: CaptureFormat::String,
            source: CaptureSource::Stdout,
            pattern: None,
            json_path: None,
            max_size: 1024 * 1024,
            default: None,
            multiline: Multiline::Preserve,
        }
    }

    /// From a `capture_outputs` entry as written.
    pub fn resolve(capture: &vocab::SetupCapture) -> Self {
        OutputCapture {
            name: capture.name.value.clone(),
            command_index: capture.command_index.value,
            format: capture.format,
            source: capture.source,
            pattern: capture.pattern.clone(),
            json_path: capture.json_path.clone(),
            max_size: capture.max_size,
            default: capture.default.as_ref().map(|d| d.value.clone()),
            multiline: capture.multiline,
        }
    }
}

/// An optional pattern as the text it was written as (the plan before patterns were kept
/// compiled showed that).
#[expect(
    clippy::ref_option,
    reason = "serde's `serialize_with` passes the field itself"
)]
fn text_of_pattern<S: serde::Serializer>(
    pattern: &Option<Pattern>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&pattern.as_ref().map(Pattern::as_str), serializer)
}

/// An optional JSON path as the text it was written as.
#[expect(
    clippy::ref_option,
    reason = "serde's `serialize_with` passes the field itself"
)]
fn text_of_path<S: serde::Serializer>(
    path: &Option<Parsed<JsonPath>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&path.as_ref().map(|p| p.value.as_str()), serializer)
}

/// The nominal delays of a retry policy: before retry n (n = 1..attempts-1), capped.
pub fn schedule(config: &RetryConfig) -> Vec<Duration> {
    (1..config.attempts).map(|n| delay(config, n)).collect()
}

/// The delay before retry `n` (1-based), docs/language.md §4, before jitter.
pub fn delay(config: &RetryConfig, n: u32) -> Duration {
    let initial = config.initial_delay;
    let raw = match &config.backoff {
        vocab::Backoff::Fixed { delay } => delay.unwrap_or(initial),
        vocab::Backoff::Linear {
            initial: i,
            increment,
        } => {
            let i = i.unwrap_or(initial);
            i.saturating_add(increment.unwrap_or(initial).saturating_mul(n - 1))
        }
        vocab::Backoff::Exponential { initial: i, base } => {
            let i = i.unwrap_or(initial);
            let factor = base.powi(i32::try_from(n - 1).unwrap_or(i32::MAX));
            Duration::try_from_secs_f64(i.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        }
        vocab::Backoff::Fibonacci { initial: i } => {
            i.unwrap_or(initial).saturating_mul(fibonacci(n))
        }
        vocab::Backoff::Custom { delays } => delays
            .get((n - 1) as usize)
            .copied()
            .unwrap_or(config.max_delay),
    };
    raw.min(config.max_delay)
}

/// The delays between the runs of an item under `error_policy.retry_config`, with the
/// error-policy formulas of docs/language.md §4: fixed `delay`; linear `initial +
/// n·increment`; exponential `initial · base^(n-1)`; fibonacci `initial · fib(n)`; custom
/// `delays[n-1]`. A missing initial delay is 1 s; `max_delay` caps every delay.
pub fn policy_schedule(config: &vocab::PolicyRetry) -> Vec<Duration> {
    const DEFAULT: Duration = Duration::from_secs(1);
    let cap = config.max_delay.unwrap_or(Duration::MAX);
    (1..config.max_attempts.max(1))
        .map(|n| {
            let raw = match &config.backoff {
                vocab::Backoff::Fixed { delay } => delay.unwrap_or(DEFAULT),
                vocab::Backoff::Linear { initial, increment } => initial
                    .unwrap_or(DEFAULT)
                    .saturating_add(increment.unwrap_or(DEFAULT).saturating_mul(n)),
                vocab::Backoff::Exponential { initial, base } => {
                    let factor = base.powi(i32::try_from(n - 1).unwrap_or(i32::MAX));
                    Duration::try_from_secs_f64(initial.unwrap_or(DEFAULT).as_secs_f64() * factor)
                        .unwrap_or(Duration::MAX)
                }
                vocab::Backoff::Fibonacci { initial } => {
                    initial.unwrap_or(DEFAULT).saturating_mul(fibonacci(n))
                }
                vocab::Backoff::Custom { delays } => delays
                    .get((n - 1) as usize)
                    .copied()
                    .unwrap_or(config.max_delay.unwrap_or(DEFAULT)),
            };
            raw.min(cap)
        })
        .collect()
}

fn fibonacci(n: u32) -> u32 {
    let (mut a, mut b) = (1u32, 1u32);
    for _ in 2..n {
        (a, b) = (b, a.saturating_add(b));
    }
    if n <= 2 { 1 } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::{Span, Spanned};

    #[test]
    fn error_policy_delays_use_the_seed_formulas() {
        let secs = Duration::from_secs;
        let policy = |backoff, max_delay| vocab::PolicyRetry {
            span: Span::default(),
            max_attempts: 5,
            backoff,
            max_delay,
            jitter: false,
            jitter_factor: 0.3,
        };
        let linear = vocab::Backoff::Linear {
            initial: Some(secs(1)),
            increment: Some(secs(2)),
        };
        // Linear counts from n (not n-1) in the error-policy formula.
        assert_eq!(
            policy_schedule(&policy(linear, None)),
            [secs(3), secs(5), secs(7), secs(9)]
        );
        let fib = vocab::Backoff::Fibonacci {
            initial: Some(secs(1)),
        };
        assert_eq!(
            policy_schedule(&policy(fib, Some(secs(2)))),
            [secs(1), secs(1), secs(2), secs(2)]
        );
        let exp = vocab::Backoff::Exponential {
            initial: None,
            base: 3.0,
        };
        assert_eq!(
            policy_schedule(&policy(exp, None)),
            [secs(1), secs(3), secs(9), secs(27)]
        );
    }

    fn config(backoff: vocab::Backoff, attempts: u32) -> RetryConfig {
        RetryConfig {
            attempts,
            backoff,
            ..RetryConfig::defaults(Span::default())
        }
    }

    fn secs(v: &[Duration]) -> Vec<f64> {
        v.iter().map(Duration::as_secs_f64).collect()
    }

    #[test]
    fn delay_formulas_follow_spec_section_4() {
        let s = |b, n| secs(&schedule(&config(b, n)));
        assert_eq!(s(vocab::Backoff::Fixed { delay: None }, 4), [1.0, 1.0, 1.0]);
        assert_eq!(
            s(
                vocab::Backoff::Linear {
                    initial: None,
                    increment: Some(Duration::from_secs(2))
                },
                4
            ),
            [1.0, 3.0, 5.0]
        );
        assert_eq!(
            s(
                vocab::Backoff::Exponential {
                    initial: None,
                    base: 2.0
                },
                7
            ),
            [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
        );
        assert_eq!(
            s(vocab::Backoff::Fibonacci { initial: None }, 7),
            [1.0, 1.0, 2.0, 3.0, 5.0, 8.0]
        );
        let custom = vocab::Backoff::Custom {
            delays: vec![Duration::from_secs(5), Duration::from_secs(7)],
        };
        assert_eq!(s(custom, 5), [5.0, 7.0, 30.0, 30.0]);
        assert_eq!(
            s(vocab::Backoff::Fixed { delay: None }, 1),
            Vec::<f64>::new()
        );
    }

    fn error_policy(on_item_failure: vocab::ItemFailure) -> vocab::ErrorPolicy {
        vocab::ErrorPolicy {
            on_item_failure: Some(Spanned::new(on_item_failure, Span::default())),
            ..vocab::ErrorPolicy::default()
        }
    }

    #[test]
    fn custom_names_its_handler_by_id_and_a_missing_one_stays_visible() {
        let handlers = ["notify", "fixer"];
        let policy = |name: &str| {
            JobPolicy::resolve(
                Some(&error_policy(vocab::ItemFailure::Custom(name.into()))),
                &handlers,
            )
            .on_item_failure
        };
        assert_eq!(policy("fixer"), ItemFailure::Custom(HandlerId(1)));
        assert_eq!(
            policy("nobody"),
            ItemFailure::MissingHandler("nobody".into())
        );
    }

    #[test]
    fn the_job_policy_fills_the_defaults() {
        assert_eq!(JobPolicy::resolve(None, &[]), JobPolicy::default());
        let retry = JobPolicy::resolve(Some(&error_policy(vocab::ItemFailure::Retry)), &[]);
        assert_eq!(
            retry.max_attempts, 3,
            "the default policy runs an item 3 times"
        );
        assert_eq!(
            retry.retry_delays,
            [Duration::from_secs(1), Duration::from_secs(2)]
        );
        let plain = JobPolicy::resolve(Some(&vocab::ErrorPolicy::default()), &[]);
        assert_eq!(plain.max_attempts, 1, "no retry_config, no retries");
        assert!(plain.continue_on_failure);
        assert_eq!(plain.error_collection, ErrorCollection::Aggregate);
    }

    #[test]
    fn breaker_thresholds_are_at_least_one() {
        let written = vocab::CircuitBreaker {
            span: Span::default(),
            failure_threshold: 0,
            success_threshold: 0,
            timeout: Duration::from_secs(5),
            half_open_requests: 0,
        };
        let mut policy = error_policy(vocab::ItemFailure::Dlq);
        policy.circuit_breaker = Some(written);
        assert_eq!(
            JobPolicy::resolve(Some(&policy), &[]).circuit_breaker,
            Some(BreakerConfig {
                failure_threshold: 1,
                timeout: Duration::from_secs(5),
                half_open_requests: 1,
                success_threshold: 1,
            })
        );
    }

    #[test]
    fn a_step_retry_policy_has_its_schedule_and_compiled_matchers() {
        let written = RetryConfig {
            attempts: 3,
            jitter: true,
            jitter_factor: 0.5,
            retry_on: vec![
                vocab::Matcher::Network,
                vocab::Matcher::Pattern(
                    Pattern::compile(Spanned::new("busy|locked".into(), Span::default())).unwrap(),
                ),
            ],
            on_failure: vocab::RetryExhausted::Continue,
            ..RetryConfig::defaults(Span::default())
        };
        let policy = RetryPolicy::resolve(&written);
        assert_eq!(policy.attempts, 3);
        assert_eq!(policy.delays, schedule(&written));
        assert_eq!(policy.jitter, Some(0.5));
        assert_eq!(policy.exhausted, Exhausted::Continue);
        assert!(matches!(policy.retry_on[0], Matcher::Network));
        match &policy.retry_on[1] {
            Matcher::Pattern(re) => assert!(re.is_match("database is locked")),
            other => panic!("{other:?}"),
        }
        let zero = RetryConfig {
            attempts: 0,
            ..RetryConfig::defaults(Span::default())
        };
        assert_eq!(RetryPolicy::resolve(&zero).attempts, 1, "at least one run");
    }
}

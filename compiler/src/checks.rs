//! Graph checks: steps that can never run, retries that can never fire or cannot finish in
//! the time allowed, circuit breakers that can never trip, and item retries without a policy.

use std::time::Duration;

use crate::ast::{ItemFailure, Matcher, Strategy};
use crate::diagnostics::{Code, Diagnostic};
use crate::emit::duration;
use crate::ir::{Graph, Node};
use crate::plan::{Plan, PlanStep, StepId};
use crate::source::Span;

/// Runs every graph check.
pub fn check(plan: &Plan, graph: &Graph) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    unreachable(plan, graph, &mut out);
    for step in &plan.steps {
        retries(step, &mut out);
        recovery(step, &mut out);
        if let Some(when) = &step.when
            && matches!(
                &when.parsed,
                prodigy_grammar::expr::Expr::Literal {
                    value: serde_json::Value::Bool(false),
                    ..
                }
            )
        {
            out.push(
                Diagnostic::new(Code::Unreachable, "this step can never run")
                    .with_primary(when.span, "`when` is always false")
                    .with_help("remove the step, or give `when` a condition that can be true"),
            );
        }
    }
    if let Some(map) = &plan.map
        && let Some(limit) = map.agent_timeout
    {
        for id in subtree(plan, &map.steps) {
            if let Some(step) = plan.step(id) {
                outlasts(step, limit, "the map's `agent_timeout_secs`", &mut out);
            }
        }
    }
    if let Some(setup) = &plan.setup
        && let Some(limit) = setup.timeout
    {
        for id in subtree(plan, &setup.steps) {
            if let Some(step) = plan.step(id) {
                outlasts(step, limit, "`setup.timeout`", &mut out);
            }
        }
    }
    if let Some(policy) = &plan.error_policy
        && let Some(action) = &policy.on_item_failure
        && action.value == ItemFailure::Retry
        && policy.retry_config.is_none()
    {
        out.push(
            Diagnostic::new(Code::RetryWithoutPolicy, "`on_item_failure: retry` has no retry policy")
                .with_primary(action.span, "failed items are retried with the default policy")
                .with_help("add `error_policy.retry_config` (for example `{max_attempts: 3, backoff: exponential}`) to say how often and how fast"),
        );
    }
    out
}

/// Every step of some lists and of everything nested under them.
pub fn subtree(plan: &Plan, roots: &[StepId]) -> Vec<StepId> {
    let mut out = Vec::new();
    let mut seen = vec![false; plan.steps.len()];
    let mut stack: Vec<StepId> = roots.iter().rev().copied().collect();
    while let Some(id) = stack.pop() {
        match seen.get_mut(id.index()) {
            Some(seen) if !*seen => *seen = true,
            _ => continue,
        }
        out.push(id);
        if let Some(step) = plan.step(id) {
            stack.extend(step.children());
        }
    }
    out
}

fn unreachable(plan: &Plan, graph: &Graph, out: &mut Vec<Diagnostic>) {
    let unreached: Vec<StepId> = graph
        .unreachable()
        .into_iter()
        .filter_map(|n| match graph.graph[n] {
            Node::Step { step } => Some(step),
            _ => None,
        })
        .collect();
    for (name, steps) in &plan.handlers {
        let Some(first) = steps.first() else { continue };
        if !unreached.contains(first) {
            continue;
        }
        let Some(step) = plan.step(*first) else {
            continue;
        };
        let (message, help) = if plan.map.is_some() {
            (
                format!("handler `{name}` is never used"),
                format!(
                    "run it for failed items with `on_item_failure: custom:{name}`, or remove it"
                ),
            )
        } else {
            (
                format!("handler `{name}` can never run"),
                "named handlers run for failed map items; a standard workflow uses `on_failure:` on the step".to_owned(),
            )
        };
        out.push(
            Diagnostic::new(Code::Unreachable, message)
                .with_primary(step.origin, "nothing runs this")
                .with_help(help),
        );
    }
}

fn worst_case(step: &PlanStep) -> Option<(Duration, Duration)> {
    step.retry_cost().map(|c| (c.delays, c.worst()))
}

/// `strategy: recovery` says "fix the problem and retry", but the command runs again after
/// the handler only when `max_attempts` is more than 1.
fn recovery(step: &PlanStep, out: &mut Vec<Diagnostic>) {
    let Some(on_failure) = &step.on_failure else {
        return;
    };
    if let (Strategy::Recovery, Some(at)) = (on_failure.strategy, on_failure.strategy_span)
        && on_failure.max_attempts <= 1
        && !on_failure.handler.is_empty()
    {
        out.push(
            Diagnostic::new(
                Code::RecoveryNeverRetries,
                "`strategy: recovery` retries nothing here",
            )
            .with_primary(
                at,
                "`max_attempts` is 1: the handler runs once, the command never again",
            )
            .with_help(
                "set `max_attempts` to 2 or more to run the command again after the handler",
            ),
        );
    }
}

fn retries(step: &PlanStep, out: &mut Vec<Diagnostic>) {
    let Some(retry) = &step.retry else { return };
    let config = &retry.config;
    let at = config.span;
    if config.attempts == 1 {
        out.push(
            Diagnostic::new(Code::RetryNeverFires, "this retry policy never retries")
                .with_primary(at, "`attempts: 1` runs the command once")
                .with_help("set `attempts` to 2 or more, or remove `retry_config`"),
        );
        return;
    }
    let only_timeouts = !config.retry_on.is_empty()
        && config
            .retry_on
            .iter()
            .all(|m| matches!(m, Matcher::Timeout));
    if only_timeouts && step.timeout.is_none() {
        out.push(
            Diagnostic::new(Code::RetryNeverFires, "this retry policy can never fire")
                .with_primary(at, "`retry_on: [timeout]` needs a step `timeout`")
                .with_help("give the step a `timeout`, or retry on other failures too"),
        );
    }
    let only_stalls = !config.retry_on.is_empty()
        && config
            .retry_on
            .iter()
            .all(|m| matches!(m, Matcher::Stalled));
    if only_stalls && step.claude.as_ref().and_then(|c| c.stall_timeout).is_none() {
        out.push(
            Diagnostic::new(Code::RetryNeverFires, "this retry policy can never fire")
                .with_primary(at, "`retry_on: [stalled]` needs a `stall_timeout`")
                .with_help(
                    "give the call a `stall_timeout` (`claude: {prompt, stall_timeout: 10m}` or the workflow's `claude:`), or retry on other failures too",
                ),
        );
    }
    if let (Some(budget), Some(first)) = (config.retry_budget, retry.policy.delays.first())
        && budget < *first
    {
        out.push(
            Diagnostic::new(Code::RetryNeverFires, "this retry policy can never fire")
                .with_primary(
                    at,
                    format!(
                        "the first retry waits {}, past the `retry_budget` of {}",
                        duration(*first),
                        duration(budget)
                    ),
                )
                .with_help("raise `retry_budget` or lower `initial_delay`"),
        );
        return;
    }
    if let (Some(budget), Some((_, worst))) = (config.retry_budget, worst_case(step))
        && worst > budget
    {
        out.push(
            Diagnostic::new(Code::RetryOutlastsTimeout, "the retries may not all fit in `retry_budget`")
                .with_primary(at, format!("worst case {}, budget {}", duration(worst), duration(budget)))
                .with_help("the last retries will not start; lower `attempts` or the delays, or raise `retry_budget`"),
        );
    }
}

fn outlasts(step: &PlanStep, limit: Duration, what: &str, out: &mut Vec<Diagnostic>) {
    let Some((delays, worst)) = worst_case(step) else {
        return;
    };
    let Some(retry) = &step.retry else { return };
    if worst > limit {
        let at: Span = retry.config.span;
        let detail = if worst == delays {
            format!("the retries wait {} in all", duration(delays))
        } else {
            format!(
                "worst case {} ({} of delays)",
                duration(worst),
                duration(delays)
            )
        };
        out.push(
            Diagnostic::new(
                Code::RetryOutlastsTimeout,
                format!("this retry schedule outlasts {what}"),
            )
            .with_primary(at, format!("{detail}; the limit is {}", duration(limit)))
            .with_help("lower `attempts` or the delays, or raise the timeout"),
        );
    }
}

/// Reports a circuit breaker that needs more failures than there are items.
pub fn breaker(plan: &Plan, items: usize) -> Option<Diagnostic> {
    let breaker = plan.error_policy.as_ref()?.circuit_breaker.as_ref()?;
    let threshold = usize::try_from(breaker.failure_threshold).unwrap_or(usize::MAX);
    (threshold > items).then(|| {
        Diagnostic::new(
            Code::BreakerNeverTrips,
            "this circuit breaker can never open",
        )
        .with_primary(
            breaker.span,
            format!(
                "it opens after {threshold} failures in a row, but the input has {items} items"
            ),
        )
        .with_help(format!(
            "lower `failure_threshold` to at most {items}, or remove the breaker"
        ))
    })
}

#[cfg(test)]
mod tests {
    use crate::diagnostics::Code;
    use crate::source::SourceFile;

    fn recovery_warnings(on_failure: &str) -> usize {
        let text = format!("- shell: deploy\n  on_failure:\n{on_failure}");
        crate::check(&SourceFile::new("t.yml", text))
            .diagnostics
            .iter()
            .filter(|d| d.code == Code::RecoveryNeverRetries)
            .count()
    }

    #[test]
    fn a_recovery_strategy_needs_a_retry() {
        let handler = "    commands:\n      - shell: repair\n";
        assert_eq!(
            recovery_warnings(&format!("    strategy: recovery\n{handler}")),
            1
        );
        assert_eq!(
            recovery_warnings(&format!(
                "    strategy: recovery\n    max_attempts: 1\n{handler}"
            )),
            1
        );
        assert_eq!(
            recovery_warnings(&format!(
                "    strategy: recovery\n    max_attempts: 3\n{handler}"
            )),
            0
        );
        assert_eq!(
            recovery_warnings(&format!(
                "    strategy: recovery\n    max_retries: 2\n{handler}"
            )),
            0
        );
        // The default strategy is not a promise the author made; other strategies never retry.
        assert_eq!(recovery_warnings(handler), 0);
        assert_eq!(
            recovery_warnings(&format!("    strategy: cleanup\n{handler}")),
            0
        );
        // `max_attempts` written beside `on_failure` configures the handler too.
        let text = format!(
            "- shell: deploy\n  max_attempts: 2\n  on_failure:\n    strategy: recovery\n{handler}"
        );
        assert!(
            crate::check(&SourceFile::new("t.yml", text))
                .diagnostics
                .is_empty()
        );
    }
}

//! The Claude budget of a run or job (`claude: {max_cost_usd, on_budget}`,
//! `--max-cost-usd`; docs/language.md, "Claude budgets"): whether one more Claude call (a
//! map item's agent, a standard run's Claude step) may start, as a pure machine.
//!
//! Before a call starts, the dispatcher hands [`Budget::admit`] what has been spent (by this
//! job across resumes, the running calls' finished parts included), how many calls are
//! running, what the running calls have cost so far (the usage their streams reported,
//! priced) and what a call has cost on average. The call starts only when the spent amount,
//! the running calls (each at least the average, or what it has already cost when more)
//! and an average for the new one stay within the limit.
//! Once the budget is reached it stays reached: no call starts for the rest of the process.

use prodigy_plan::{OnBudget, Plan};
use serde::{Deserialize, Serialize};

/// What the dispatcher knows when a call is about to start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spend {
    /// US dollars spent so far by the job (or run), earlier processes included.
    pub spent: f64,
    /// Calls (or agents) running now.
    pub running: u64,
    /// What the calls running now have cost so far.
    pub running_cost: f64,
    /// What one finished call (or item) cost on average; `None` before any finished.
    pub average: Option<f64>,
}

impl Spend {
    /// The spent amount once the running calls and one more end: each running call at the
    /// average, or all of them at what they have cost so far when that is more, and the new
    /// one at the average.
    #[must_use]
    pub fn projected(&self) -> f64 {
        let average = self.average.unwrap_or(0.0).max(0.0);
        let running = (average * amount(self.running)).max(self.running_cost.max(0.0));
        self.spent + running + average
    }

    /// What REMAINING calls (or items) not finished yet will cost at the average; `None`
    /// before any finished.
    #[must_use]
    pub fn forecast(&self, remaining: u64) -> Option<f64> {
        self.average.map(|a| a.max(0.0) * amount(remaining))
    }
}

/// The budget's answer for one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Admit {
    /// The call starts.
    Start,
    /// The budget has just been reached: the call does not start, and the driver records
    /// `claude_budget_reached`, says so and (under `on_budget: stop`) stops the running
    /// calls.
    Reached(Reached),
    /// The budget was reached before: the call does not start.
    Refused,
}

/// How the budget was reached, for the event, the message and the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reached {
    /// US dollars spent when it was reached.
    pub spent: f64,
    /// The limit.
    pub limit: f64,
}

/// The budget of one process's share of a run or job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    limit: f64,
    /// `on_budget`.
    then: OnBudget,
    reached: Option<Reached>,
}

impl Budget {
    /// A budget of LIMIT US dollars.
    #[must_use]
    pub fn new(limit: f64, on_budget: OnBudget) -> Self {
        Budget {
            limit,
            then: on_budget,
            reached: None,
        }
    }

    /// The budget of PLAN, with OVER (`--max-cost-usd`) in place of its `max_cost_usd`;
    /// `None` when neither sets an amount.
    #[must_use]
    pub fn of(plan: &Plan, over: Option<f64>) -> Option<Self> {
        let set = plan.claude_budget;
        let limit = over.or(set.and_then(|b| b.max_cost_usd))?;
        Some(Budget::new(
            limit,
            set.map_or(OnBudget::Finish, |b| b.on_budget),
        ))
    }

    /// The limit in US dollars.
    #[must_use]
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// Whether the running calls are stopped once the budget is reached.
    #[must_use]
    pub fn stops_running(&self) -> bool {
        match self.then {
            OnBudget::Finish => false,
            OnBudget::Stop => true,
        }
    }

    /// When the budget was reached, if it was.
    #[must_use]
    pub fn reached(&self) -> Option<Reached> {
        self.reached
    }

    /// Whether one more call may start after SPEND.
    pub fn admit(&mut self, spend: Spend) -> Admit {
        match self.reached {
            Some(_) => Admit::Refused,
            None if spend.spent >= self.limit || spend.projected() > self.limit => {
                let reached = Reached {
                    spent: spend.spent,
                    limit: self.limit,
                };
                self.reached = Some(reached);
                Admit::Reached(reached)
            }
            None => Admit::Start,
        }
    }
}

/// Whether a job whose budget was reached as EARLIER says (its checkpoint's) is still out of
/// money under BUDGET, the resumed job's: a limit no higher than the one reached pays for
/// nothing more, and no agent is to start only to be stopped.
#[must_use]
pub fn still_reached(earlier: Option<Reached>, budget: Option<&Budget>) -> Option<Reached> {
    let earlier = earlier?;
    (budget?.limit() <= earlier.limit).then_some(earlier)
}

/// N calls or items as a factor of an amount.
#[expect(
    clippy::cast_precision_loss,
    reason = "counts of calls and items stay far below 2^52"
)]
#[must_use]
pub fn amount(n: u64) -> f64 {
    n as f64
}

/// Whether an amount is nothing, for serde's `skip_serializing_if`.
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
pub(crate) fn is_zero(usd: &f64) -> bool {
    *usd == 0.0
}

/// `Claude budget reached ($25.03 of $25.00)`.
#[must_use]
pub fn describe(reached: &Reached) -> String {
    format!(
        "Claude budget reached ({} of {})",
        usd(reached.spent),
        usd(reached.limit)
    )
}

/// AMOUNT in US dollars: `$25.03`; below ten cents, to four decimals without trailing
/// zeros (`$0.0008`, `$0.001`), so that small budgets do not read `$0.00`.
#[must_use]
pub fn usd(amount: f64) -> String {
    if amount.abs() >= 0.1 || amount == 0.0 {
        return format!("${amount:.2}");
    }
    let text = format!("{amount:.4}");
    let text = text.trim_end_matches('0');
    format!("${text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(spent: f64, running: u64, average: Option<f64>) -> Spend {
        Spend {
            spent,
            running,
            running_cost: 0.0,
            average,
        }
    }

    #[test]
    fn a_running_call_that_already_cost_more_than_the_average_counts_at_its_cost() {
        let mut b = Budget::new(1.0, OnBudget::Finish);
        // 0.2 spent, one call running at 0.2 on average, one more: 0.6 starts...
        assert_eq!(b.admit(spend(0.2, 1, Some(0.2))), Admit::Start);
        // ...but not when the running call has already cost 0.7 (0.2 + 0.7 + 0.2 > 1).
        let runaway = Spend {
            running_cost: 0.7,
            ..spend(0.2, 1, Some(0.2))
        };
        assert!(matches!(b.admit(runaway), Admit::Reached(_)));
    }

    #[test]
    fn calls_start_while_the_projection_stays_within_the_limit() {
        let mut b = Budget::new(1.0, OnBudget::Finish);
        // Nothing known yet: only what was spent counts.
        assert_eq!(b.admit(spend(0.0, 3, None)), Admit::Start);
        // 0.4 spent, 2 running at 0.2 and one more at 0.2: exactly 1.0 still starts.
        assert_eq!(b.admit(spend(0.4, 2, Some(0.2))), Admit::Start);
        assert_eq!(b.reached(), None);
    }

    #[test]
    fn a_call_that_would_pass_the_limit_does_not_start_and_the_budget_stays_reached() {
        let mut b = Budget::new(1.0, OnBudget::Finish);
        let reached = Reached {
            spent: 0.5,
            limit: 1.0,
        };
        // 0.5 + 2 running × 0.2 + 0.2 = 1.1 > 1.0.
        assert_eq!(b.admit(spend(0.5, 2, Some(0.2))), Admit::Reached(reached));
        // Even when the running calls end cheaper, nothing starts any more.
        assert_eq!(b.admit(spend(0.5, 0, Some(0.01))), Admit::Refused);
        assert_eq!(b.reached(), Some(reached));
    }

    #[test]
    fn spending_the_whole_limit_reaches_it_even_with_no_average() {
        let mut b = Budget::new(0.25, OnBudget::Stop);
        assert!(matches!(b.admit(spend(0.25, 0, None)), Admit::Reached(_)));
        assert!(b.stops_running());
        assert!(!Budget::new(1.0, OnBudget::Finish).stops_running());
    }

    #[test]
    fn a_budget_reached_before_stays_reached_until_it_is_raised() {
        let earlier = Reached {
            spent: 0.5,
            limit: 1.0,
        };
        let same = Budget::new(1.0, OnBudget::Stop);
        assert_eq!(still_reached(Some(earlier), Some(&same)), Some(earlier));
        let lower = Budget::new(0.75, OnBudget::Stop);
        assert_eq!(still_reached(Some(earlier), Some(&lower)), Some(earlier));
        let raised = Budget::new(2.0, OnBudget::Stop);
        assert_eq!(still_reached(Some(earlier), Some(&raised)), None);
        assert_eq!(still_reached(None, Some(&same)), None);
        assert_eq!(still_reached(Some(earlier), None), None);
    }

    #[test]
    fn the_forecast_is_the_average_times_what_remains() {
        assert_eq!(spend(1.0, 0, Some(0.5)).forecast(4), Some(2.0));
        assert_eq!(spend(1.0, 0, None).forecast(4), None);
    }

    #[test]
    fn the_message_names_the_spent_amount_and_the_limit() {
        let r = Reached {
            spent: 25.031,
            limit: 25.0,
        };
        assert_eq!(describe(&r), "Claude budget reached ($25.03 of $25.00)");
        assert_eq!(usd(0.00078), "$0.0008");
        assert_eq!(usd(0.001), "$0.001");
        assert_eq!(usd(0.0), "$0.00");
    }
}

//! The reduce phase, with `${map.*}` built from the items' outcomes.

use crate::message::{Message, StepList};
use serde_json::{Value, json};

use crate::jobstore::ItemRecord;
use crate::machine::Outcome;
use crate::mapreduce::{JobOutcome, MapJob, error_metrics, stopped_by_write};
use crate::vars::Vars;

impl MapJob<'_> {
    /// `reduce`, from the checkpoint's next step, with `${map.*}`.
    pub(crate) async fn reduce(&mut self, vars: &mut Vars) -> JobOutcome {
        // `${map.*}` holds every item's record: built only when a step can read it.
        let readers = self
            .plan
            .merge
            .as_ref()
            .map_or(0, |m| m.steps.len() + m.on_conflict.len());
        if !self.plan.reduce.is_empty() || readers > 0 {
            let records = self.files.load_results().unwrap_or_default();
            let dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
            vars.set(
                "map",
                map_vars(
                    &records,
                    self.cp.items_total,
                    dlq_count,
                    builds_map_results(self.plan.reads_map_results, self.cp.items_total),
                ),
            );
        }
        let total = self.plan.reduce.len();
        if self.cp.reduce_next_step == 0 {
            self.runner
                .record(&crate::events::Event::ReduceStarted { steps: total });
        }
        for (index, &id) in self
            .plan
            .reduce
            .iter()
            .enumerate()
            .skip(self.cp.reduce_next_step)
        {
            if self.runner.cancelled() {
                return JobOutcome::Interrupted;
            }
            let label = self
                .plan
                .step(id)
                .map(|s| s.label.clone())
                .unwrap_or_default();
            self.say(Message::StepStarted {
                phase: StepList::Reduce,
                number: index + 1,
                total,
                label: label.clone(),
            });
            match self.runner.run_step(id, vars, Some(index)).await {
                Outcome::Cancelled => return JobOutcome::Interrupted,
                o if o.continues() => {}
                _ => {
                    return JobOutcome::Failed {
                        phase: "reduce",
                        what: format!("step `{label}` failed"),
                    };
                }
            }
            self.cp.reduce_next_step = index + 1;
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("reduce", why);
            }
            if let Some(why) = self.write_failure() {
                return stopped_by_write("reduce", why);
            }
        }
        self.runner.record(&crate::events::Event::ReduceFinished {});
        JobOutcome::Completed
    }
}

/// Whether a job of TOTAL items builds `${map.results}`: when its workflow mentions it
/// (READ, [`prodigy_plan::Plan::reads_map_results`]), and for a job small enough
/// that the list costs little, so that a script run by a step still finds it exported as
/// `MAP__RESULTS…` (docs/linting.md, "Expressions and variables").
pub(crate) fn builds_map_results(read: bool, total: u64) -> bool {
    read || total <= 10_000
}

/// `${map.*}` (docs/language.md §5); `results`, every item's record, only `with_results`
/// (when a step can read it: [`prodigy_plan::Plan::reads_map_results`]).
pub(crate) fn map_vars(
    records: &[ItemRecord],
    total: u64,
    dlq_count: u64,
    with_results: bool,
) -> Value {
    // Only the counts are read here, never a pattern's advice (which names the job).
    let metrics = error_metrics(records, total, "");
    let finished = metrics.successful + metrics.failed + metrics.skipped;
    #[expect(
        clippy::cast_precision_loss,
        reason = "item counts stay far below 2^52"
    )]
    let success_rate = if finished > 0 {
        metrics.successful as f64 / finished as f64
    } else {
        0.0
    };
    let mut map = serde_json::Map::new();
    map.extend([
        ("successful".to_owned(), json!(metrics.successful)),
        ("failed".to_owned(), json!(metrics.failed)),
        ("skipped".to_owned(), json!(metrics.skipped)),
        ("total".to_owned(), json!(total)),
        ("failure_rate".to_owned(), json!(metrics.failure_rate)),
        ("success_rate".to_owned(), json!(success_rate)),
        ("dlq_count".to_owned(), json!(dlq_count)),
    ]);
    if with_results {
        // First, as the variable has always listed it.
        map.shift_insert(0, "results".to_owned(), json!(records));
    }
    Value::Object(map)
}

//! `foreach`: the body once per item, `parallel` at a time.

use futures::StreamExt;
use prodigy_plan as plan;
use prodigy_plan::{PlanStep, StepId};
use serde_json::{Value, json};

use crate::exec::{self, Output};
use crate::runner::Runner;
use crate::vars::Vars;

impl Runner {
    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of a foreach, unpacked"
    )]
    pub(crate) async fn foreach(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        input: &plan::ForeachInput,
        parallel: u32,
        steps: &[StepId],
        continue_on_error: bool,
        max_items: Option<u64>,
    ) -> Output {
        let mut items: Vec<String> = match input {
            plan::ForeachInput::Command(t) => {
                let out = self.run_command(&exec::shell, t, step, vars, false).await;
                if out.code != Some(0) {
                    return out;
                }
                out.stdout
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect()
            }
            plan::ForeachInput::List(list) => match list
                .iter()
                .map(|t| t.parsed.render(vars))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(items) => items,
                Err(e) => return Output::error(e.to_string()),
            },
        };
        if let Some(max) = max_items.and_then(|m| usize::try_from(m).ok()) {
            items.truncate(max);
        }
        let total = items.len();
        let failed = std::sync::atomic::AtomicUsize::new(0);
        let halted = std::sync::atomic::AtomicBool::new(false);
        let base = vars.clone();
        let results = futures::stream::iter(items.into_iter().enumerate())
            .map(|(index, item)| {
                let mut item_vars = base.clone();
                let failed = &failed;
                let halted = &halted;
                async move {
                    if halted.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    item_vars.set("item", Value::String(item));
                    item_vars.set("index", json!(index));
                    item_vars.set("total", json!(total));
                    if !self.run_list(steps, &mut item_vars).await.continues() {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if !continue_on_error {
                            halted.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            })
            .buffer_unordered(usize::try_from(parallel.max(1)).unwrap_or(1));
        results.collect::<Vec<()>>().await;
        let failed = failed.into_inner();
        let summary = format!(
            "foreach: {total} items, {} succeeded, {failed} failed\n",
            total.saturating_sub(failed)
        );
        Output {
            stdout: summary,
            code: Some(i32::from(failed > 0)),
            cancelled: self.cancelled(),
            ..Output::default()
        }
    }
}

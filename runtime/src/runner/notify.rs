//! Notifications (`notify:`, docs/language.md §2 "Notifications"): when the run or job
//! records an event a `notify` entry fires on, the event is queued with its `${event.*}`
//! fields; the driver runs the queued notifications at its next await point through the
//! same executor and masking as steps, each bounded by its `timeout`. A notification that
//! fails is recorded and said, and never changes how the run ends.

use prodigy_plan::{EVENT_FIELDS, Mode, NotifyEvent, PlanCommand};
use serde_json::{Map, Value, json};

use crate::events::Event;
use crate::lock;
use crate::message::Message;
use crate::runner::Runner;
use crate::vars::Vars;

/// An event a notification fires on, with its `${event.*}` fields.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fired {
    /// Which event.
    pub kind: NotifyEvent,
    /// `${event.*}`: every field of [`EVENT_FIELDS`], empty when the event has none.
    pub fields: Map<String, Value>,
}

/// The notification event EVENT is, if any, with the fields it carries.
pub(crate) fn of_event(event: &Event) -> Option<(NotifyEvent, Map<String, Value>)> {
    let mut f = Map::new();
    let mut set = |name: &str, value: Value| {
        f.insert(name.to_owned(), value);
    };
    let kind = match event {
        Event::WorkflowFinished {
            outcome,
            failed_step,
            duration_secs,
            claude,
            ..
        } => {
            let kind = match outcome {
                crate::store::SessionStatus::Completed => NotifyEvent::Finished,
                crate::store::SessionStatus::Failed => NotifyEvent::Failed,
                crate::store::SessionStatus::Running | crate::store::SessionStatus::Interrupted => {
                    return None;
                }
            };
            set("status", serde_json::to_value(outcome).ok()?);
            set(
                "failed_step",
                json!(failed_step.clone().unwrap_or_default()),
            );
            set("duration_secs", json!(round(*duration_secs)));
            set("cost_usd", json!(claude.map_or(0.0, |c| c.cost_usd)));
            kind
        }
        Event::JobFinished {
            status,
            metrics,
            dlq_count,
            duration_secs,
            claude,
        } => {
            let kind = match status {
                crate::jobstore::Status::Completed => NotifyEvent::Finished,
                crate::jobstore::Status::Failed | crate::jobstore::Status::Stopped => {
                    NotifyEvent::Failed
                }
                crate::jobstore::Status::Running | crate::jobstore::Status::Interrupted => {
                    return None;
                }
            };
            set("status", serde_json::to_value(status).ok()?);
            set("duration_secs", json!(round(*duration_secs)));
            set("cost_usd", json!(claude.map_or(0.0, |c| c.cost_usd)));
            set("items_total", json!(metrics.total_items));
            set("items_succeeded", json!(metrics.successful));
            set("items_failed", json!(metrics.failed));
            set("items_dlq", json!(dlq_count));
            kind
        }
        Event::ClaudeLimitReached {
            limit_type,
            resets_at,
            action,
            ..
        } => {
            set("status", json!(action));
            set("limit_type", json!(limit_type));
            set("reset_at", json!(resets_at));
            NotifyEvent::Paused
        }
        Event::ClaudeBudgetReached { spent, limit, .. } => {
            set("spent_usd", json!(spent));
            set("limit_usd", json!(limit));
            NotifyEvent::BudgetReached
        }
        Event::DlqItemAdded {
            item_id,
            error_signature,
            ..
        } => {
            set("item_id", json!(item_id));
            set("error", json!(error_signature));
            NotifyEvent::ItemDeadLettered
        }
        _ => return None,
    };
    Some((kind, f))
}

fn round(secs: f64) -> f64 {
    (secs * 1000.0).round() / 1000.0
}

impl Runner {
    /// Queues the notifications EVENT fires, if the workflow has any that listen to it.
    pub(crate) fn queue_notifications(&self, event: &Event) {
        if self.plan.notify.is_empty() {
            return;
        }
        let Some((kind, mut fields)) = of_event(event) else {
            return;
        };
        if !self.plan.notify.iter().any(|n| n.on.contains(&kind)) {
            return;
        }
        for name in EVENT_FIELDS {
            fields.entry(*name).or_insert_with(|| json!(""));
        }
        fields.insert("name".into(), json!(kind.name()));
        fields.insert("id".into(), json!(self.session));
        fields.insert(
            "workflow".into(),
            json!(self.plan.name.clone().unwrap_or_default()),
        );
        let mode = match self.plan.mode {
            Mode::Standard => "standard",
            Mode::MapReduce => "mapreduce",
        };
        fields.insert("mode".into(), json!(mode));
        lock(&self.notify_queue).push(Fired { kind, fields });
    }

    /// Runs the notifications queued so far, in order, with VARS (the run's variables: its
    /// env and secrets) and `${event.*}`. Each is bounded by its `timeout`; one that fails
    /// is recorded and said, and the run goes on.
    pub(crate) async fn notify_pending(&self, vars: &Vars) {
        loop {
            let queued = std::mem::take(&mut *lock(&self.notify_queue));
            if queued.is_empty() {
                return;
            }
            for fired in queued {
                for entry in self
                    .plan
                    .notify
                    .iter()
                    .filter(|n| n.on.contains(&fired.kind))
                {
                    let Some(step) = self.plan.step(entry.step) else {
                        continue;
                    };
                    let mut vars = vars.clone();
                    vars.set("event", Value::Object(fired.fields.clone()));
                    // Its output is kept as a step's is, among the run's logs (`notify`).
                    let mut log = self.step_log(step, None);
                    if let Some(log) = log.as_mut() {
                        log.place(Some("notify"), None);
                    }
                    let out = match &step.command {
                        PlanCommand::Shell(t) => {
                            self.run_command_for(
                                &crate::exec::shell,
                                t,
                                step,
                                &vars,
                                step.timeout,
                                true,
                            )
                            .await
                        }
                        // Not through the usage-limit gate: a notification of `paused`
                        // would wait for the reset it tells of.
                        PlanCommand::Claude(t) => {
                            self.run_claude_call(t, step, &vars, step.timeout, false, None)
                                .await
                        }
                        PlanCommand::WriteFile(_) | PlanCommand::Foreach { .. } => continue,
                    };
                    let success = out.success();
                    let output = log.and_then(|mut log| {
                        self.keep_output(&mut log, "", &out);
                        let path = log.output_path();
                        let outcome = if success { "succeeded" } else { "failed" };
                        let written =
                            log.error.is_none() && log.finish(outcome, out.duration).is_ok();
                        (written && path.exists()).then_some(path)
                    });
                    self.record(&Event::NotificationFinished {
                        event: fired.kind.name().to_owned(),
                        command: step.label.clone(),
                        success,
                        exit_code: out.code,
                        timed_out: out.timed_out,
                        duration_secs: out.duration.as_secs_f64(),
                        output: output.clone(),
                    });
                    if !success {
                        let why = if out.timed_out {
                            format!(
                                "timed out after {}",
                                humantime::format_duration(step.timeout.unwrap_or_default())
                            )
                        } else {
                            let message = out.failure_message().trim_end();
                            let last = message.lines().last().unwrap_or_default();
                            match (out.code, last.is_empty()) {
                                (Some(code), true) => format!("exit code {code}"),
                                (Some(code), false) => format!("exit code {code}: {last}"),
                                (None, _) => last.to_owned(),
                            }
                        };
                        self.say_for_run(Message::NotificationFailed {
                            event: fired.kind.name(),
                            command: step.label.clone(),
                            why,
                            output,
                        });
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_ends_that_mean_finished_or_failed_fire() {
        use crate::store::SessionStatus::{Completed, Failed, Interrupted};
        let finished = |outcome| Event::WorkflowFinished {
            outcome,
            failed_step: None,
            failed_continued: 0,
            duration_secs: 1.0,
            claude: None,
        };
        assert_eq!(
            of_event(&finished(Completed)).map(|e| e.0),
            Some(NotifyEvent::Finished)
        );
        assert_eq!(
            of_event(&finished(Failed)).map(|e| e.0),
            Some(NotifyEvent::Failed)
        );
        assert_eq!(of_event(&finished(Interrupted)), None);
    }

    #[test]
    fn a_dead_lettered_item_names_the_item_and_its_error() {
        let (kind, fields) = of_event(&Event::DlqItemAdded {
            item_id: "item_3".into(),
            error_signature: "exit 1".into(),
            failure_count: 2,
        })
        .unwrap();
        assert_eq!(kind, NotifyEvent::ItemDeadLettered);
        assert_eq!(fields["item_id"], "item_3");
        assert_eq!(fields["error"], "exit 1");
    }
}

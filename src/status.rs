//! `prodigy status [ID]`: the live picture of a run or job in the terminal (running agents
//! and what they do, counts, a usage-limit pause, spend), once, refreshed in place
//! (`--watch`), or as JSON.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use prodigy_runtime::layout::{Layout, RunKind, namespace};
use prodigy_runtime::live::{Live, Picture, default_id};

use crate::{err, exit_code, out};

/// `prodigy status`.
#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// The run or job; without it, the newest running one of this repository (else its
    /// newest).
    #[arg(value_name = "ID")]
    id: Option<String>,
    /// Refresh in place every second until the run ends (Ctrl-C stops watching, not the
    /// run).
    #[arg(long)]
    watch: bool,
    /// The picture as one JSON object (one a refresh under `--watch`), for scripts.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) quiet: crate::Quiet,
}

/// `prodigy status`.
pub(crate) fn status(args: &StatusArgs) -> u8 {
    let home = Layout::home();
    let id = if let Some(id) = &args.id {
        id.clone()
    } else {
        let repo = match std::env::current_dir() {
            Ok(dir) => namespace(&dir),
            Err(e) => {
                err(&format!("error: cannot read the current directory: {e}\n"));
                return exit_code::USAGE;
            }
        };
        let Some(id) = default_id(&home, Some(&repo)) else {
            err(&format!(
                "error: no runs or jobs of this repository under {}; `prodigy ls --all` lists the others\n",
                home.display()
            ));
            return exit_code::USAGE;
        };
        id
    };
    let mut live = match Live::open(&home, &id) {
        Ok(live) => live,
        Err(e) => {
            err(&format!(
                "error: {e}; `prodigy ls --all` lists the runs and jobs\n"
            ));
            return exit_code::USAGE;
        }
    };
    loop {
        let changed = live.refresh();
        let picture = live.picture(SystemTime::now());
        if args.json {
            if changed || !args.watch {
                out(&format!(
                    "{}\n",
                    serde_json::to_string(&picture).unwrap_or_default()
                ));
            }
        } else if args.watch {
            // Home, draw, clear what the last drawing left below.
            out(&format!(
                "\x1b[H{}\x1b[J",
                render(&picture).replace('\n', "\x1b[K\n")
            ));
        } else {
            out(&render(&picture));
        }
        if !args.watch || !live.is_running() {
            return exit_code::OK;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The picture for people.
pub(crate) fn render(p: &Picture) -> String {
    let mut text = String::new();
    let s = &p.summary;
    let kind = match s.kind {
        RunKind::Run => "run",
        RunKind::Job => "job",
    };
    let _ = write!(text, "{kind} {} {}", s.id, p.state.word());
    if let Some(phase) = &p.phase {
        let _ = write!(text, ", {phase} phase");
    }
    let _ = writeln!(
        text,
        ", {} ({})",
        secs(p.duration_secs),
        s.workflow.display()
    );
    if let Some(pause) = &p.pause {
        let _ = writeln!(
            text,
            "paused: the Claude usage limit ({}) resets at {}",
            pause.limit_type, pause.resets_at
        );
    }
    if let Some(slots) = p.claude_slots {
        let _ = writeln!(text, "{}", slots.text());
    }
    if let Some(queue) = &p.queue {
        let _ = writeln!(text, "{}", queue.counts.text());
        if let Some(failure) = &queue.last_failure {
            let first = failure.output.lines().next().unwrap_or_default();
            let _ = writeln!(
                text,
                "last failed verification ({}): {first}",
                failure.item_ids.join(", ")
            );
        }
    }
    let c = &p.counts;
    let done = c.succeeded + c.failed + c.skipped;
    let noun = if s.kind == RunKind::Job {
        "items"
    } else {
        "steps"
    };
    let _ = write!(
        text,
        "{noun}: {done}/{} done ({} succeeded, {} failed, {} skipped), {} running, {} pending",
        c.total, c.succeeded, c.failed, c.skipped, c.running, c.pending
    );
    if s.kind == RunKind::Job {
        let _ = write!(text, ", {} in DLQ", c.dlq);
    }
    if c.retries > 0 {
        let _ = write!(text, ", {} retries", c.retries);
    }
    if let Some(breaker) = p.breaker {
        let _ = write!(text, ", breaker {}", breaker.replace('_', "-"));
    }
    text.push('\n');
    if let Some(rate) = p.items_per_min {
        let _ = write!(text, "rate: {rate:.1} items/min");
        if let Some(eta) = p.eta_secs {
            let _ = write!(text, ", ETA {}", secs(eta));
        }
        text.push('\n');
    }
    let sp = &p.spend;
    if sp.calls > 0 || p.agents.iter().any(|a| a.turns.is_some()) {
        let _ = write!(
            text,
            "Claude: {} calls, {} turns, ${} spent",
            sp.calls,
            sp.turns,
            prodigy_runtime::claude::pricing::usd(sp.cost_usd)
        );
        if let Some(more) = sp.forecast_usd {
            let _ = write!(
                text,
                ", ~${} more for the items left",
                prodigy_runtime::claude::pricing::usd(more)
            );
        }
        text.push('\n');
    }
    if let Some(why) = &p.stopping {
        let _ = writeln!(text, "stopping: {why}");
    }
    if !p.agents.is_empty() {
        let rows: Vec<[String; 5]> = p.agents.iter().map(agent_row).collect();
        text.push_str(&crate::output::table(
            &["AGENT", "ITEM", "STEP", "ELAPSED", "ACTIVITY"],
            &rows,
        ));
    }
    text
}

/// An agent's row in the picture's table: its item, step, time and what it does now.
fn agent_row(a: &prodigy_runtime::live::Agent) -> [String; 5] {
    let activity = match (&a.tool, a.turns) {
        (Some(tool), Some(turns)) => format!("{tool} (turn {turns})"),
        (None, Some(turns)) => format!("claude, turn {turns}"),
        (Some(tool), None) => tool.clone(),
        (None, None) => a.task.as_ref().map_or_else(String::new, |t| {
            let node = t
                .node
                .as_deref()
                .map_or_else(String::new, |n| format!(" on {n}"));
            format!("{} task {}{node}", t.backend, t.id)
        }),
    };
    [
        a.agent_id.clone(),
        a.item_id.clone().unwrap_or_else(|| "-".to_owned()),
        shorten(a.step.as_deref().unwrap_or("-"), 40),
        secs(a.elapsed_secs),
        shorten(&activity, 60),
    ]
}

/// SECONDS as `1h 2m 3s`.
fn secs(seconds: f64) -> String {
    // Whole seconds: the tenths would make the line flicker.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a duration's whole seconds, never negative"
    )]
    let whole = seconds.max(0.0) as u64;
    humantime::format_duration(Duration::from_secs(whole)).to_string()
}

/// TEXT cut to WIDTH characters on one line.
fn shorten(text: &str, width: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > width || text.contains('\n') {
        let mut cut: String = line.chars().take(width - 1).collect();
        cut.push('…');
        cut
    } else {
        line.to_owned()
    }
}

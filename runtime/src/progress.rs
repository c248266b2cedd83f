//! Progress of a map phase (SPEC §10): a live bar on a terminal (`indicatif`) with items
//! done, running, failed, dead-lettered, the breaker's state, the rate and the ETA; plain
//! lines when stderr is not a terminal, at most one per 10 % of the items or per 10 s.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

/// The bar being drawn, so that other output goes above it instead of through it.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn bar_slot() -> std::sync::MutexGuard<'static, Option<ProgressBar>> {
    crate::lock(&BAR)
}

/// Prints a line to stderr, above the bar when one is drawn.
pub fn println(text: &str) {
    match bar_slot().as_ref() {
        Some(bar) => bar.println(text),
        None => {
            let _ = writeln!(std::io::stderr().lock(), "{text}");
        }
    }
}

/// What the map phase has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Items with an outcome.
    pub done: u64,
    /// Agents running.
    pub running: u64,
    /// Items that failed (dead-lettered, skipped or failed).
    pub failed: u64,
    /// Items in the DLQ.
    pub dlq: u64,
}

/// The display.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    started: Instant,
    /// Done count and time of the last plain line.
    last_line: (u64, Instant),
    /// Done count when this process started (resumed jobs).
    done_at_start: u64,
    /// Whether anything is shown.
    shown: bool,
}

impl Progress {
    /// Starts showing a map phase of TOTAL items, DONE of them already finished; nothing is
    /// shown unless SHOWN.
    pub fn start(total: u64, done: u64, shown: bool) -> Self {
        let terminal = shown && std::io::stderr().is_terminal() && std::env::var_os("CI").is_none();
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} map [{bar:30}] {pos}/{len} {msg} {per_sec} ETA {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_position(done);
            bar.enable_steady_tick(Duration::from_millis(200));
            *bar_slot() = Some(bar.clone());
            bar
        });
        let now = Instant::now();
        Progress {
            bar,
            total,
            started: now,
            last_line: (done, now),
            done_at_start: done,
            shown,
        }
    }

    /// Shows the latest counts.
    pub fn update(&mut self, tally: Tally, breaker: &str) {
        let summary = format!(
            "{} running, {} failed, {} in DLQ, breaker {breaker}",
            tally.running, tally.failed, tally.dlq
        );
        if let Some(bar) = &self.bar {
            bar.set_position(tally.done);
            bar.set_message(summary);
            return;
        }
        if !self.shown {
            return;
        }
        let now = Instant::now();
        let step = (self.total / 10).max(1);
        let due = tally.done >= self.last_line.0 + step
            || now.duration_since(self.last_line.1) >= Duration::from_secs(10)
            || (tally.done == self.total && self.last_line.0 != self.total);
        if !due {
            return;
        }
        self.last_line = (tally.done, now);
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let new = tally.done.saturating_sub(self.done_at_start);
        #[expect(
            clippy::cast_precision_loss,
            reason = "item counts stay far below 2^52"
        )]
        let rate = if elapsed > 0.0 {
            new as f64 / elapsed
        } else {
            0.0
        };
        let eta = if rate > 0.0 && tally.done < self.total {
            #[expect(
                clippy::cast_precision_loss,
                reason = "item counts stay far below 2^52"
            )]
            let left = (self.total - tally.done) as f64 / rate;
            format!(
                ", ETA {}",
                humantime::format_duration(Duration::from_secs_f64(left.ceil()))
            )
        } else {
            String::new()
        };
        println(&format!(
            "map: {}/{} done, {summary}, {rate:.1} items/s{eta}",
            tally.done, self.total
        ));
    }

    /// Removes the bar.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
            *bar_slot() = None;
        }
    }
}

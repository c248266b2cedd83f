//! Progress of a map phase (docs/language.md §10): a live bar on a terminal (`indicatif`) with items
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

/// Prints a line to stderr, above the bar when one is drawn; control characters in it are
/// shown, not sent to the terminal ([`visible`]).
pub fn println(text: &str) {
    let text = visible(text);
    match bar_slot().as_ref() {
        Some(bar) => bar.println(text),
        None => {
            let _ = writeln!(std::io::stderr().lock(), "{text}");
        }
    }
}

/// TEXT as prodigy echoes it to a terminal: every control character but newline and tab
/// (ESC, which starts colour and cursor sequences, carriage return, backspace, the C1
/// controls, DEL) is written as a visible escape such as `\x1b`, so that what a command
/// printed cannot move the cursor, clear the screen or retitle the window. A carriage return
/// just before a newline (Windows line ends) is dropped. Files prodigy writes (logs,
/// `output_file`, events) keep the bytes as they were.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    let shown = |c: char| c == '\n' || c == '\t' || !c.is_control();
    if text.chars().all(shown) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if shown(c) {
            out.push(c);
        } else if c == '\r' && chars.peek() == Some(&'\n') {
            // A Windows line end: the newline follows.
        } else {
            let code = u32::from(c);
            if code < 0x100 {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\x{code:02x}"));
            } else {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\u{{{code:x}}}"));
            }
        }
    }
    std::borrow::Cow::Owned(out)
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
            let bar = new_bar(total, done, ProgressDrawTarget::stderr());
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
        let speed = Speed::of(
            self.total,
            tally.done,
            self.done_at_start,
            now.duration_since(self.started),
        );
        let eta = speed
            .eta
            .map(|left| format!(", ETA {}", eta_text(left)))
            .unwrap_or_default();
        println(&format!(
            "map: {}/{} done, {summary}, {}{eta}",
            tally.done,
            self.total,
            speed.rate_text()
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

/// The bar of a map phase of TOTAL items, DONE of them finished before it starts (a resumed
/// job), drawn to TARGET. Its rate and ETA count only the items this process finished, so
/// that a resumed job does not look faster than it is.
fn new_bar(total: u64, done: u64, target: ProgressDrawTarget) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let speed = move |state: &indicatif::ProgressState| {
        Speed::of(state.len().unwrap_or(0), state.pos(), done, state.elapsed())
    };
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} map [{bar:30}] {pos}/{len} {msg} {rate} ETA {left}")
    {
        let style = style
            .progress_chars("=> ")
            .with_key(
                "rate",
                move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&speed(state).rate_text());
                },
            )
            .with_key(
                "left",
                move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let text = speed(state).eta.map_or_else(|| "-".to_owned(), eta_text);
                    let _ = w.write_str(&text);
                },
            );
        bar.set_style(style);
    }
    bar.set_position(done);
    bar
}

/// How fast a map phase goes: items per second over the items finished since this process
/// started the phase, and the time left at that rate.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Speed {
    rate: f64,
    eta: Option<Duration>,
}

impl Speed {
    /// Of TOTAL items, DONE are finished, `done_at_start` of them before ELAPSED began.
    fn of(total: u64, done: u64, done_at_start: u64, elapsed: Duration) -> Self {
        let new = done.saturating_sub(done_at_start);
        let secs = elapsed.as_secs_f64();
        #[expect(
            clippy::cast_precision_loss,
            reason = "item counts stay far below 2^52"
        )]
        let rate = if secs > 0.0 { new as f64 / secs } else { 0.0 };
        let eta = (rate > 0.0 && done < total).then(|| {
            #[expect(
                clippy::cast_precision_loss,
                reason = "item counts stay far below 2^52"
            )]
            let left = (total - done) as f64 / rate;
            Duration::from_secs_f64(left.ceil().min(1e9))
        });
        Speed { rate, eta }
    }

    /// `12.3 items/s`: one decimal at most.
    fn rate_text(self) -> String {
        format!("{:.1} items/s", self.rate)
    }
}

/// A time left in whole seconds, as `1m 5s`.
fn eta_text(left: Duration) -> String {
    humantime::format_duration(Duration::from_secs(left.as_secs())).to_string()
}

/// `1 item`, `2 items`: N and NOUN, made plural (with an `s`) unless N is 1.
pub fn count<N: Copy + std::fmt::Display + PartialEq + From<u8>>(n: N, noun: &str) -> String {
    if n == N::from(1) {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `6 selected, 5 after filter, 3 after distinct`: how many items each stage of PIPELINE
/// that the workflow has kept (`filter` and `distinct` only when it has them).
pub fn stage_counts(
    pipeline: &prodigy_grammar::pipeline::Pipeline,
    counts: &prodigy_grammar::pipeline::StageCounts,
) -> String {
    use std::fmt::Write as _;
    let mut text = format!("{} selected", counts.selected);
    if pipeline.filter.is_some() {
        let _ = write!(text, ", {} after filter", counts.filtered);
    }
    if pipeline.distinct.is_some() {
        let _ = write!(text, ", {} after distinct", counts.distinct);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Escape sequences a command prints reach the terminal as visible text.
    #[test]
    fn control_characters_are_shown_not_sent() {
        assert_eq!(visible("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            visible("\u{1b}[31mred\u{1b}[0m \u{1b}]0;title\u{7}"),
            "\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07"
        );
        assert_eq!(
            visible("a\r\nb\rc\u{8}\u{7f}\u{9b}2J"),
            "a\nb\\x0dc\\x08\\x7f\\x9b2J"
        );
    }

    #[test]
    fn a_resumed_phase_counts_only_the_items_it_finished() {
        // 90 of 100 items were done before the resume; 5 more in 10 s is 0.5 items/s, and
        // the last 5 take 10 s more (not 95 items in 10 s, which would say 1 s).
        let speed = Speed::of(100, 95, 90, Duration::from_secs(10));
        assert_eq!(speed.rate_text(), "0.5 items/s");
        assert_eq!(speed.eta, Some(Duration::from_secs(10)));
        let fresh = Speed::of(100, 0, 0, Duration::from_secs(3));
        assert_eq!(
            (fresh.rate_text().as_str(), fresh.eta),
            ("0.0 items/s", None)
        );
    }

    #[test]
    fn rates_have_one_decimal_at_most() {
        let speed = Speed::of(1000, 7, 0, Duration::from_secs(3));
        assert_eq!(speed.rate_text(), "2.3 items/s");
        assert_eq!(eta_text(Duration::from_millis(65_700)), "1m 5s");
    }

    /// A terminal that keeps what is drawn on it.
    #[derive(Debug, Default, Clone)]
    struct Screen(std::sync::Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            200
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, line: &str) -> std::io::Result<()> {
            crate::lock(&self.0).push_str(line);
            crate::lock(&self.0).push('\n');
            Ok(())
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            crate::lock(&self.0).push_str(text);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_the_rate_with_one_decimal_and_counts_only_new_items() {
        let screen = Screen::default();
        let bar = new_bar(
            100_000,
            90_000,
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        );
        std::thread::sleep(Duration::from_millis(60));
        bar.set_position(90_001);
        bar.tick();
        let drawn = crate::lock(&screen.0).clone();
        assert!(drawn.contains("90001/100000"), "{drawn:?}");
        let rate = regex::Regex::new(r"([0-9]+)(\.[0-9]+)? items/s").unwrap();
        let found = rate
            .captures_iter(&drawn)
            .last()
            .unwrap_or_else(|| panic!("no rate in {drawn:?}"));
        assert!(
            found.get(2).is_none_or(|d| d.as_str().len() == 2),
            "more than one decimal: {drawn:?}"
        );
        // One new item in 60 ms or more: at most 17 items/s, where counting the 90 000
        // items done before would make thousands.
        let whole: u64 = found[1].parse().unwrap();
        assert!(whole < 1000, "the items done before count: {drawn:?}");
        assert!(
            !regex::Regex::new(r"[0-9]/s").unwrap().is_match(&drawn),
            "indicatif's own rate (4 decimals) is shown: {drawn:?}"
        );
    }

    #[test]
    fn counts_are_plural_unless_one() {
        assert_eq!(count(1u64, "item"), "1 item");
        assert_eq!(count(0usize, "item"), "0 items");
        assert_eq!(count(2u32, "ignored path"), "2 ignored paths");
    }
}

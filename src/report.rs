//! The terminal reporter: how a run looks to a person. The runtime hands it lines and the
//! progress of map phases ([`prodigy_runtime::events::Reporter`]); it applies `-q`, `-v` and
//! `-vv`, prefixes a map agent's lines with its item, and draws the progress of a map phase
//! (docs/language.md §10): a live bar on a terminal (`indicatif`) with items done, running,
//! failed, dead-lettered, the breaker's state, the rate and the ETA; plain lines when stderr
//! is not a terminal, at most one per 10 % of the items or per 10 s.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prodigy_runtime::events::{Level, Line, ProgressUpdate, Reporter};
use prodigy_runtime::progress::{Tally, count, visible};
use tokio::time::Instant;

/// Shows a run on stderr.
pub(crate) struct Terminal {
    /// `-v` (1) or `-vv` (2).
    verbose: u8,
    /// `-q`: errors only, and no progress display.
    quiet: bool,
    /// The map phase being shown.
    display: Mutex<Option<Display>>,
}

impl Terminal {
    /// A reporter for `-v` VERBOSE times, or `-q` when QUIET.
    pub(crate) fn new(verbose: u8, quiet: bool) -> Self {
        Terminal {
            verbose,
            quiet,
            display: Mutex::new(None),
        }
    }

    /// LINE as it is shown, if it is: `-q` shows only errors, a line that needs `-v` or
    /// `-vv` shows only with it, and a map agent's line starts with its item.
    fn render(&self, line: &Line) -> Option<String> {
        if line.verbosity > self.verbose || (self.quiet && line.level != Level::Error) {
            return None;
        }
        Some(match &line.item {
            Some(item) => format!("[{item}] {}", line.text),
            None => line.text.clone(),
        })
    }
}

impl Reporter for Terminal {
    fn line(&self, line: &Line) {
        let Some(text) = self.render(line) else {
            return;
        };
        let display = lock(&self.display);
        println(display.as_ref().and_then(|d| d.bar.as_ref()), &text);
    }

    fn progress(&self, update: &ProgressUpdate) {
        let mut display = lock(&self.display);
        match update {
            ProgressUpdate::Started { total, done, shown } => {
                if let Some(old) = display.take() {
                    old.finish();
                }
                *display = Some(Display::start(*total, *done, *shown && !self.quiet));
            }
            ProgressUpdate::Counts { tally, breaker } => {
                if let Some(d) = display.as_mut() {
                    d.update(*tally, breaker);
                }
            }
            ProgressUpdate::Finished => {
                if let Some(d) = display.take() {
                    d.finish();
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Prints a line to stderr, above BAR when one is drawn; control characters in it are
/// shown, not sent to the terminal ([`visible`]).
fn println(bar: Option<&ProgressBar>, text: &str) {
    let text = visible(text);
    if let Some(bar) = bar {
        bar.println(text);
    } else {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{text}");
        let _ = stderr.flush();
    }
}

/// The display of one map phase.
struct Display {
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

impl Display {
    /// Starts showing a map phase of TOTAL items, DONE of them already finished; nothing is
    /// shown unless SHOWN.
    fn start(total: u64, done: u64, shown: bool) -> Self {
        let terminal = shown
            && std::io::stderr().is_terminal()
            && !under_ci(std::env::var_os("CI").as_deref());
        let bar = terminal.then(|| {
            let bar = new_bar(total, done, ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let now = Instant::now();
        Display {
            bar,
            total,
            started: now,
            last_line: (done, now),
            done_at_start: done,
            shown,
        }
    }

    /// Shows the latest counts.
    fn update(&mut self, tally: Tally, breaker: &str) {
        let summary = format!(
            "{} running, {} failed, {} in DLQ, breaker {breaker}",
            tally.running, tally.failed, tally.dlq
        );
        if let Some(bar) = &self.bar {
            bar.set_position(tally.done);
            if tally.claude_turns > 0 {
                bar.set_message(format!(
                    "{summary}, {} in running Claude calls",
                    count(tally.claude_turns, "turn")
                ));
            } else {
                bar.set_message(summary);
            }
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
        println(
            None,
            &format!(
                "map: {}/{} done, {summary}, {}{eta}",
                tally.done,
                self.total,
                speed.rate_text()
            ),
        );
    }

    /// Removes the bar.
    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
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

/// Whether `CI` (its value, `None` when unset) says the run is under CI, where no live bar is
/// drawn even on a terminal: set to anything but empty, `false` or `0` (README "MapReduce
/// jobs"; the test binaries apply the same rule).
fn under_ci(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| {
        let v = v.to_string_lossy();
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(level: Level, verbosity: u8, item: Option<&str>, text: &str) -> Line {
        Line {
            level,
            verbosity,
            item: item.map(str::to_owned),
            text: text.to_owned(),
        }
    }

    /// `CI=false` or `CI=` on a terminal still gets the live bar; `CI=true` does not.
    #[test]
    fn ci_set_to_false_zero_or_empty_is_not_ci() {
        use std::ffi::OsStr;
        for on in ["true", "1", "github"] {
            assert!(under_ci(Some(OsStr::new(on))), "CI={on}");
        }
        for off in ["", "false", "False", "0"] {
            assert!(!under_ci(Some(OsStr::new(off))), "CI={off}");
        }
        assert!(!under_ci(None));
    }

    /// `-q` keeps errors only; `-v` and `-vv` add their lines; an agent's line names its item.
    #[test]
    fn quiet_and_verbose_decide_which_lines_show() {
        let step = line(Level::Info, 0, None, "[1/2] build");
        let error = line(Level::Error, 0, None, "error: no such file");
        let output = line(Level::Info, 1, None, "  │ compiled");
        let command = line(Level::Info, 2, None, "  $ make");
        let agent = line(Level::Info, 1, Some("item_3"), "[1/1] fix");
        let normal = Terminal::new(0, false);
        let quiet = Terminal::new(0, true);
        let verbose = Terminal::new(1, false);
        let very = Terminal::new(2, false);
        assert_eq!(normal.render(&step).as_deref(), Some("[1/2] build"));
        assert_eq!(normal.render(&output), None);
        assert_eq!(normal.render(&agent), None);
        assert_eq!(quiet.render(&step), None);
        assert_eq!(quiet.render(&error).as_deref(), Some("error: no such file"));
        assert_eq!(verbose.render(&output).as_deref(), Some("  │ compiled"));
        assert_eq!(verbose.render(&command), None);
        assert_eq!(
            verbose.render(&agent).as_deref(),
            Some("[item_3] [1/1] fix")
        );
        assert_eq!(very.render(&command).as_deref(), Some("  $ make"));
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
            lock(&self.0).push_str(line);
            lock(&self.0).push('\n');
            Ok(())
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            lock(&self.0).push_str(text);
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
        let drawn = lock(&screen.0).clone();
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
}

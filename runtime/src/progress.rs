//! Text helpers for what a run shows ([`visible`], [`count`], [`stage_counts`]) and the
//! handle through which a map phase tells its [`Reporter`](crate::events::Reporter) how it
//! goes (the binary draws the bar or the plain lines).

use std::sync::Arc;

pub use crate::events::Tally;
use crate::events::{ProgressUpdate, Reporter};
pub use crate::text::{count, visible};

/// US dollars in whole millionths, rounded (negative and non-finite amounts are 0).
#[must_use]
pub fn micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a positive finite amount, rounded to whole millionths"
        )]
        let micros = (usd * 1e6).round() as u64;
        micros
    } else {
        0
    }
}

/// A map phase's progress, as its reporter is told it.
pub struct Progress {
    reporter: Arc<dyn Reporter>,
}

impl Progress {
    /// Starts showing a map phase of TOTAL items, DONE of them already finished; nothing is
    /// shown unless SHOWN.
    pub fn start(reporter: Arc<dyn Reporter>, total: u64, done: u64, shown: bool) -> Self {
        reporter.progress(&ProgressUpdate::Started { total, done, shown });
        Progress { reporter }
    }

    /// Shows the latest counts.
    pub fn update(&mut self, tally: Tally, breaker: &str) {
        self.reporter.progress(&ProgressUpdate::Counts {
            tally,
            breaker: breaker.to_owned(),
        });
    }

    /// Ends the display.
    pub fn finish(self) {
        self.reporter.progress(&ProgressUpdate::Finished);
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
        // A field the filter reads that items lack: all of them, when it is misspelt.
        for (field, lacking) in &counts.filter_missing {
            let _ = write!(
                text,
                " ({lacking} of {} without `{}`)",
                counts.selected,
                field.strip_prefix("item.").unwrap_or(field)
            );
        }
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
    fn spending_shows_dollars_and_the_forecast_only_once_something_was_spent() {
        let mut tally = Tally::default();
        assert_eq!(tally.spending(), "");
        tally.claude_micros = micros(1.2);
        assert_eq!(tally.spending(), ", Claude $1.20 spent");
        tally.forecast_micros = Some(micros(3.604));
        assert_eq!(
            tally.spending(),
            ", Claude $1.20 spent, ~$3.60 more for the items left"
        );
        tally.claude_micros = micros(0.00078);
        assert_eq!(
            tally.spending(),
            ", Claude $0.0008 spent, ~$3.60 more for the items left"
        );
        assert_eq!(micros(-1.0), 0);
        assert_eq!(micros(f64::NAN), 0);
    }

    #[test]
    fn counts_are_plural_unless_one() {
        assert_eq!(count(1u64, "item"), "1 item");
        assert_eq!(count(0usize, "item"), "0 items");
        assert_eq!(count(2u32, "ignored path"), "2 ignored paths");
        assert_eq!(count(0u32, "branch"), "0 branches");
    }
}

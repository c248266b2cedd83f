//! What Claude models cost, to estimate the cost of a call that ended without the CLI's
//! `result` event (a timeout, a stall, a signal), which is the only event that states a
//! call's cost (docs/claude.md). The estimate prices the tokens the call's
//! `assistant` messages reported, their output at least what their streamed content takes
//! (`claude::BYTES_PER_TOKEN`); records mark it as estimated.
//!
//! The table is Anthropic's list price in US dollars per million tokens, for input and
//! output; reading from the prompt cache costs a tenth of the input price and writing to it
//! 1.25 times the input price (the 5-minute cache). It is deliberately small: a model is
//! found by the first row whose name part its name contains, and a model no row names is
//! priced as the current Opus, the dearest current family, so that an estimate errs high.

use crate::claude::kinds::Tokens;

/// One row: a part of the model's name, then the input and output prices per million tokens.
type Row = (&'static str, f64, f64);

/// First match wins: the older, dearer Opus and Haiku generations before their families.
const PRICES: &[Row] = &[
    ("opus-4-0", 15.0, 75.0),
    ("opus-4-1", 15.0, 75.0),
    ("opus-4-2025", 15.0, 75.0),
    ("3-opus", 15.0, 75.0),
    ("opus", 5.0, 25.0),
    ("sonnet", 3.0, 15.0),
    ("3-5-haiku", 0.8, 4.0),
    ("3-haiku", 0.25, 1.25),
    ("haiku", 1.0, 5.0),
];

/// The price of the current Opus, for a model the table does not name.
const UNKNOWN: Row = ("", 5.0, 25.0);

/// What TOKENS cost on MODEL (none: priced as an unknown model), in US dollars.
pub fn estimate(model: Option<&str>, tokens: &Tokens) -> f64 {
    let name = model.unwrap_or("").to_ascii_lowercase();
    let (_, input, output) = PRICES
        .iter()
        .find(|(part, _, _)| name.contains(part))
        .copied()
        .unwrap_or(UNKNOWN);
    #[expect(
        clippy::cast_precision_loss,
        reason = "token counts far below 2^52 are exact in an f64"
    )]
    let cost = (tokens.input as f64 * input
        + tokens.output as f64 * output
        + tokens.cache_read as f64 * input * 0.1
        + tokens.cache_creation as f64 * input * 1.25)
        / 1_000_000.0;
    usd(cost)
}

pub use super::kinds::usd;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_priced_by_its_family_and_generation() {
        let tokens = Tokens {
            input: 12,
            output: 8,
            ..Tokens::default()
        };
        // What the CLI itself reported for these tokens on this model.
        assert_eq!(
            estimate(Some("claude-opus-4-8"), &tokens).to_string(),
            "0.00026"
        );
        let million = Tokens {
            input: 1_000_000,
            output: 1_000_000,
            cache_read: 1_000_000,
            cache_creation: 1_000_000,
        };
        assert_eq!(
            estimate(Some("claude-sonnet-4-5"), &million).to_string(),
            "22.05"
        );
        assert_eq!(
            estimate(Some("claude-opus-4-1-20250805"), &million).to_string(),
            "110.25"
        );
        assert_eq!(
            estimate(Some("claude-haiku-4-5"), &million).to_string(),
            "7.35"
        );
        assert_eq!(estimate(None, &million).to_string(), "36.75");
        assert_eq!(
            estimate(Some("some-new-model"), &million).to_string(),
            "36.75"
        );
    }

    #[test]
    fn dollars_are_written_as_decimals() {
        assert_eq!((0.0002 + 0.0079).to_string(), "0.008100000000000001");
        assert_eq!(usd(0.0002 + 0.0079).to_string(), "0.0081");
        assert_eq!(usd(0.006_449_999_999_999_999).to_string(), "0.00645");
        assert_eq!(usd(0.1 + 0.2).to_string(), "0.3");
        assert_eq!(usd(f64::NAN).to_string(), "0");
    }
}

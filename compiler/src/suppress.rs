//! Inline suppression: `# prodigy: ignore[CODE, ...] reason`.
//!
//! A suppression comment at the end of a line silences the listed codes on that line; on a
//! line of its own it silences them on the next line. When that line starts a step, it
//! silences them in the whole step.
//! It needs a reason, so that the file says why a warning is accepted; one that silences
//! nothing (or gives no reason) is itself reported, so suppressions do not outlive their cause.

use crate::diagnostics::{Code, Diagnostic, Severity};
use crate::source::{SourceFile, Span};

struct Suppression {
    /// The 1-based lines whose diagnostics it silences.
    target: std::ops::RangeInclusive<usize>,
    codes: Vec<(String, Span)>,
    comment: Span,
    reason: bool,
    used: Vec<bool>,
}

/// Removes suppressed diagnostics (warnings only: errors cannot be silenced) and reports
/// useless suppressions. `steps` are the spans of every step, for step-wide suppressions.
/// The codes `unchecked` were not looked for (ShellCheck's, when it did not run): a
/// suppression of one of them is not reported as useless.
pub fn apply_unchecked(
    file: &SourceFile,
    steps: &[Span],
    diagnostics: &mut Vec<Diagnostic>,
    unchecked: &[Code],
) {
    let mut suppressions = parse(file);
    if suppressions.is_empty() {
        return;
    }
    // A suppression on the line where a step starts covers the whole step.
    for s in &mut suppressions {
        let line = *s.target.start();
        let widest = steps
            .iter()
            .filter(|span| file.line_col(span.start).line == line)
            .map(|span| {
                file.line_col(span.end.saturating_sub(1).max(span.start))
                    .line
            })
            .max();
        if let Some(end) = widest {
            s.target = line..=end.max(line);
        }
    }
    diagnostics.retain(|d| {
        let Some(primary) = &d.primary else {
            return true;
        };
        if d.severity == Severity::Error {
            return true;
        }
        let line = file.line_col(primary.span.start).line;
        for s in suppressions
            .iter_mut()
            .filter(|s| s.target.contains(&line) && s.reason)
        {
            if let Some(i) = s
                .codes
                .iter()
                .position(|(c, _)| c.eq_ignore_ascii_case(d.code.as_str()))
            {
                s.used[i] = true;
                return false;
            }
        }
        true
    });
    for s in &suppressions {
        if !s.reason {
            diagnostics.push(
                Diagnostic::new(Code::UselessSuppression, "a suppression needs a reason")
                    .with_primary(s.comment, "no reason given")
                    .with_help(
                        "say why after the brackets: `# prodigy: ignore[W006] ids are numeric`",
                    ),
            );
            continue;
        }
        for ((code, span), used) in s.codes.iter().zip(&s.used) {
            if !used && !Code::parse(code).is_some_and(|c| unchecked.contains(&c)) {
                let message = if Code::parse(code).is_some() {
                    format!("`{code}` is not reported on this line")
                } else {
                    format!("`{code}` is not a diagnostic code")
                };
                diagnostics.push(
                    Diagnostic::new(Code::UselessSuppression, message)
                        .with_primary(*span, "suppresses nothing")
                        .with_help("remove it; suppressions only silence warnings on their own line (or the next one)"),
                );
            }
        }
    }
}

fn parse(file: &SourceFile) -> Vec<Suppression> {
    const MARK: &str = "# prodigy: ignore[";
    let mut out = Vec::new();
    let mut offset = 0usize;
    for (i, line) in file.text.split_inclusive('\n').enumerate() {
        let line_start = offset;
        offset += line.len();
        let Some(at) = line.find(MARK) else { continue };
        let Some(close) = line[at..].find(']').map(|c| at + c) else {
            continue;
        };
        let own_line = line[..at].trim().is_empty();
        let mut codes = Vec::new();
        let mut pos = at + MARK.len();
        for code in line[at + MARK.len()..close].split(',') {
            let trimmed = code.trim();
            let start = line_start + pos + (code.len() - code.trim_start().len());
            if !trimmed.is_empty() {
                codes.push((trimmed.to_owned(), Span::new(start, start + trimmed.len())));
            }
            pos += code.len() + 1;
        }
        let reason = !line[close + 1..].trim().is_empty();
        let used = vec![false; codes.len()];
        out.push(Suppression {
            target: if own_line {
                (i + 2)..=(i + 2)
            } else {
                (i + 1)..=(i + 1)
            },
            codes,
            comment: Span::new(line_start + at, line_start + line.trim_end().len()),
            reason,
            used,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Vec<Code> {
        let file = SourceFile::new("t.yml", text);
        crate::check(&file)
            .diagnostics
            .iter()
            .map(|d| d.code)
            .collect()
    }

    #[test]
    fn suppressions_silence_warnings_on_their_line_and_report_themselves_when_useless() {
        let base = "name: x\nmode: mapreduce\nmap:\n  input: i.json\n  agent_template:\n    - shell: \"echo ${item}\"";
        assert_eq!(check(&format!("{base}\n")), [Code::UnquotedInterpolation]);
        assert_eq!(
            check(&format!(
                "{base}  # prodigy: ignore[W006] items are file names\n"
            )),
            []
        );
        assert_eq!(
            check(&format!("{base}  # prodigy: ignore[W006]\n")),
            [Code::UnquotedInterpolation, Code::UselessSuppression]
        );
        assert_eq!(
            check(&format!("{base}  # prodigy: ignore[W002] wrong code\n")),
            [Code::UnquotedInterpolation, Code::UselessSuppression]
        );
        let above = "name: x\nmode: mapreduce\nmap:\n  input: i.json\n  agent_template:\n    # prodigy: ignore[W006] ids are numeric\n    - shell: \"echo ${item}\"\n";
        assert_eq!(check(above), []);
        let step_wide = "name: x\nmode: mapreduce\nmap:\n  input: i.json\n  agent_template:\n    # prodigy: ignore[W006] trusted input\n    - shell: \"echo ${item}\"\n      on_failure:\n        shell: \"echo ${item.id} failed\"\n";
        assert_eq!(check(step_wide), []);
    }
}

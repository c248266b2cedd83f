//! Applying the fixes diagnostics carry (`prodigy check --fix`).
//!
//! A fix is a list of edits of the source text at exact spans, so comments, quoting and
//! formatting outside the edited bytes stay as they were: the YAML is never re-serialised.
//! Fixes are applied in rounds: each round applies every fix that does not overlap one applied
//! before it in the same round, then the file is checked again, so that a fix that had to wait
//! (or one the first round made possible) gets its turn. Rounds stop when no fix is left, when
//! a round changes nothing, or after [`MAX_ROUNDS`]. A round after which the file has more
//! errors than before is undone, so `--fix` never makes a file worse.

use crate::diagnostics::{Diagnostic, Fix};
use crate::source::SourceFile;

/// The most rounds of fixes applied to one file.
pub const MAX_ROUNDS: usize = 10;

/// What fixing one file did.
#[derive(Debug)]
pub struct Fixed {
    /// The text after every round.
    pub text: String,
    /// How many fixes were applied.
    pub applied: usize,
    /// The diagnostics of the fixed text.
    pub diagnostics: Vec<Diagnostic>,
    /// Fixes left unapplied because they overlapped another fix in the last round, or a round
    /// that applied them made the file worse, or the rounds ran out.
    pub refused: usize,
}

/// Whether a fix can be applied to `text`: its edits lie inside the text, on character
/// boundaries, and do not overlap one another.
fn valid(text: &str, fix: &Fix) -> bool {
    let mut spans: Vec<_> = fix.edits.iter().map(|e| e.span).collect();
    spans.sort();
    spans.windows(2).all(|w| w[0].end <= w[1].start)
        && spans.iter().all(|s| {
            text.is_char_boundary(s.start as usize) && text.is_char_boundary(s.end as usize)
        })
}

/// Whether two edits' spans conflict: they share a byte, or one is an insertion inside or at
/// an edge of the other (two insertions at one point: their order would be a guess).
fn conflict(a: crate::source::Span, b: crate::source::Span) -> bool {
    if a.is_empty() || b.is_empty() {
        a.start <= b.end && b.start <= a.end
    } else {
        a.start < b.end && b.start < a.end
    }
}

/// Applies, in order of position, every fix among `diagnostics` that does not overlap a fix
/// applied before it. Returns the new text, how many fixes were applied and how many were
/// refused for overlapping.
pub fn apply_once(text: &str, diagnostics: &[Diagnostic]) -> (String, usize, usize) {
    let mut fixes: Vec<&Fix> = diagnostics
        .iter()
        .filter_map(|d| d.fix.as_ref())
        .filter(|f| !f.edits.is_empty() && valid(text, f))
        .collect();
    fixes.sort_by_key(|f| f.edits.iter().map(|e| e.span.start).min());
    fixes.dedup();
    let mut taken: Vec<crate::source::Span> = Vec::new();
    let mut edits = Vec::new();
    let (mut applied, mut refused) = (0, 0);
    for fix in fixes {
        let overlaps = fix
            .edits
            .iter()
            .any(|e| taken.iter().any(|t| conflict(e.span, *t)));
        if overlaps {
            refused += 1;
            continue;
        }
        taken.extend(fix.edits.iter().map(|e| e.span));
        edits.extend(fix.edits.iter());
        applied += 1;
    }
    edits.sort_by_key(|e| (e.span.start, e.span.end));
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for edit in edits {
        out.push_str(&text[at..edit.span.start as usize]);
        out.push_str(&edit.replacement);
        at = edit.span.end as usize;
    }
    out.push_str(&text[at..]);
    (out, applied, refused)
}

/// Fixes `file` in rounds, checking it again with `check` after each.
pub fn fix_all(file: &SourceFile, check: impl Fn(&SourceFile) -> Vec<Diagnostic>) -> Fixed {
    let errors = |d: &[Diagnostic]| d.iter().filter(|d| d.is_error()).count();
    let mut text = file.text.to_string();
    let mut diagnostics = check(file);
    let mut applied = 0;
    for _ in 0..MAX_ROUNDS {
        let (next, done, _) = apply_once(&text, &diagnostics);
        if done == 0 || next == text {
            break;
        }
        let again = check(&SourceFile::new(file.name.clone(), next.clone()));
        if errors(&again) > errors(&diagnostics) {
            // The round made the file worse: keep the text before it.
            break;
        }
        text = next;
        diagnostics = again;
        applied += done;
    }
    // Every fix still offered on the text kept was not applied: overlapping, or undone.
    let refused = diagnostics.iter().filter(|d| d.fix.is_some()).count();
    Fixed {
        text,
        applied,
        diagnostics,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::{Code, Edit};
    use crate::source::Span;

    fn fixing(span: Span, replacement: &str) -> Diagnostic {
        Diagnostic::new(Code::UnknownKey, "x").with_fix(Fix {
            description: "x".into(),
            edits: vec![Edit {
                span,
                replacement: replacement.into(),
            }],
        })
    }

    #[test]
    fn edits_apply_at_their_spans_and_keep_the_rest() {
        let text = "a: 1  # keep\nbb: 2\n";
        let (out, applied, refused) = apply_once(
            text,
            &[
                fixing(Span::new(13, 15), "b"),
                fixing(Span::new(0, 1), "aa"),
            ],
        );
        assert_eq!(out, "aa: 1  # keep\nb: 2\n");
        assert_eq!((applied, refused), (2, 0));
    }

    #[test]
    fn overlapping_fixes_are_refused_in_the_same_round() {
        let text = "abcdef";
        let (out, applied, refused) = apply_once(
            text,
            &[fixing(Span::new(0, 3), "X"), fixing(Span::new(2, 4), "Y")],
        );
        assert_eq!(out, "Xdef");
        assert_eq!((applied, refused), (1, 1));
        // Two insertions at one point: the second waits.
        let (out, applied, refused) = apply_once(
            text,
            &[fixing(Span::new(1, 1), "X"), fixing(Span::new(1, 1), "Y")],
        );
        assert_eq!((out.as_str(), applied, refused), ("aXbcdef", 1, 1));
    }

    #[test]
    fn a_fix_off_a_character_boundary_is_not_applied() {
        let (out, applied, _) = apply_once("é", &[fixing(Span::new(1, 2), "x")]);
        assert_eq!((out.as_str(), applied), ("é", 0));
    }

    #[test]
    fn rounds_continue_until_no_fix_is_left() {
        let file = SourceFile::new(
            "w.yml",
            "commands:\n  - shell: make  # build\n    retry_config:\n      max_attemps: 3\n      initial_dely: 1s\n",
        );
        let fixed = fix_all(&file, |f| crate::check(f).diagnostics);
        assert_eq!(
            fixed.text,
            "commands:\n  - shell: make  # build\n    retry_config:\n      max_attempts: 3\n      initial_delay: 1s\n"
        );
        assert_eq!(fixed.applied, 2);
        assert!(fixed.diagnostics.is_empty(), "{:?}", fixed.diagnostics);
    }

    fn fixed(text: &str) -> Fixed {
        fix_all(&SourceFile::new("w.yml", text), |f| {
            crate::check(f).diagnostics
        })
    }

    #[test]
    fn unquoted_splices_get_the_shell_filter_and_quoted_ones_leave_their_quotes() {
        let text = "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: process ${item.id} --name ${item.name|trim}  # note\n    - shell: echo \"${item.id}\" \"id=${item.id|shell}.\" 'at ${item.id}'\n";
        let out = fixed(text);
        assert_eq!(
            out.text,
            "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: process ${item.id|shell} --name ${item.name|trim|shell}  # note\n    - shell: echo ${item.id|shell} \"id=\"${item.id|shell}\".\" 'at '${item.id|shell}\n"
        );
        assert_eq!(out.applied, 5);
        assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
    }

    #[test]
    fn quotes_are_written_as_the_yaml_scalar_needs_them() {
        let agent = |cmd: &str| {
            format!(
                "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: {cmd}\n"
            )
        };
        for (before, after) in [
            (r#"'echo "a ${item.id}"'"#, r#"'echo "a "${item.id|shell}'"#),
            (
                r"'echo ''a ${item.id} b'''",
                r"'echo ''a ''${item.id|shell}'' b'''",
            ),
            (
                r#""echo 'a ${item.id} b'""#,
                r#""echo 'a '${item.id|shell}' b'""#,
            ),
        ] {
            let out = fixed(&agent(before));
            assert_eq!(out.text, agent(after));
            assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
        }
    }

    #[test]
    fn a_here_document_reads_the_exported_variable() {
        let text = "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: |\n        touch out-${item.id}\n        cat <<EOF\n        id: ${item.id|shell}\n        EOF\n        cat <<'EOF'\n        name: ${item.name}\n        EOF\n";
        let out = fixed(text);
        assert_eq!(out.applied, 2);
        assert!(out.text.contains("touch out-${item.id|shell}\n"));
        assert!(out.text.contains("id: $${ITEM__ID}\n"));
        // A literal body expands nothing: no sure fix.
        assert!(out.text.contains("name: ${item.name}\n"));
        assert_eq!(out.diagnostics.len(), 1);
        assert!(out.diagnostics[0].fix.is_none());
    }

    #[test]
    fn deprecated_forms_are_rewritten() {
        let out = fixed(
            "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    commands:\n      # each item\n      - command: /review ${item|shell}\n        on_failure:\n          claude: /fix\n          retry_original: true\nreduce:\n  commands:\n    - shell: echo done\n",
        );
        assert_eq!(
            out.text,
            "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n      # each item\n      - claude: /review ${item|shell}\n        on_failure:\n          claude: /fix\n          max_attempts: 2\nreduce:\n    - shell: echo done\n"
        );
        assert_eq!(out.applied, 4);
        assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
    }

    #[test]
    fn durations_with_units_spelled_out_get_short_units() {
        let out = fixed(
            "- shell: make\n  retry_config:\n    attempts: 3\n    initial_delay: \"1 second\"\n    max_delay: 2 minutes\n",
        );
        assert_eq!(
            out.text,
            "- shell: make\n  retry_config:\n    attempts: 3\n    initial_delay: 1s\n    max_delay: 2m\n"
        );
        assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
    }

    #[test]
    fn a_rename_onto_an_existing_key_is_not_offered() {
        let out = fixed("- shell: make\n  timout: 5\n  timeout: 10\n");
        assert_eq!(out.applied, 0);
        assert_eq!(out.diagnostics.len(), 1);
        assert!(out.diagnostics[0].fix.is_none());
    }
}

/// `--fix` of W006 against a real shell: wherever a splice of untrusted text sits in a shell
/// word, the fixed command prints the text as it is.
#[cfg(test)]
mod w006_fixes {
    use crate::ast::Command;
    use crate::diagnostics::Code;
    use crate::source::SourceFile;
    use proptest::prelude::*;

    /// Commands with `X` where the splice goes, and what they print with `X` as the text.
    const FORMS: &[(&str, &str)] = &[
        ("printf %s X", "X"),
        ("printf %s aXb", "aXb"),
        ("printf %s \"X\"", "X"),
        ("printf %s \"a X b\"", "a X b"),
        ("printf %s 'X'", "X"),
        ("printf %s 'a X b'", "a X b"),
        ("printf %s \"a\"'b'X\"c\"", "abXc"),
        ("printf %s \"$(printf %s X)\"", "X"),
        ("sh -c 'printf %s \"a X b\"'", "a X b"),
        ("sh -c 'printf %s X'", "X"),
        ("sh -ec \"printf %s 'a X b'\"", "a X b"),
        ("sh -c \"printf %s X\"", "X"),
        ("sh -c 'printf %s \"$1\"' sh X", "X"),
        ("eval 'printf %s X'", "X"),
        ("eval printf %s \"a X\"", "aX"),
        ("cat <<EOF\na X b\nEOF", "a X b\n"),
    ];

    const HOSTILE: &str = "$(echo pwned) `echo pwned` ' \" \\ ; echo pwned # $HOME ${HOME} */ !";

    /// Fixes FORM with `${item.x}` (or `${item.x|shell}`) at its `X`, checks that no W006 is
    /// left, and runs the fixed command with TEXT as the item; returns what it printed.
    fn run_fixed(form: &str, shell_filter: bool, text: &str) -> String {
        let splice = if shell_filter {
            "${item.x|shell}"
        } else {
            "${item.x}"
        };
        let command = form.replace('X', splice).replace('\n', "\n        ");
        let yaml = format!(
            "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: |\n        {command}\n"
        );
        let fixed = crate::fix::fix_all(&SourceFile::new("w.yml", yaml.as_str()), |f| {
            crate::check(f).diagnostics
        });
        let left: Vec<_> = fixed
            .diagnostics
            .iter()
            .filter(|d| d.code == Code::UnquotedInterpolation)
            .collect();
        assert!(left.is_empty(), "{form}: {left:?}\n{}", fixed.text);
        let checked = crate::check(&SourceFile::new("w.yml", fixed.text.as_str()));
        let workflow = checked.workflow.expect("a workflow");
        let Some(Command::Shell(template)) = crate::all_steps(&workflow)
            .into_iter()
            .map(|s| s.command.clone())
            .next()
        else {
            panic!("no shell step in {}", fixed.text);
        };
        let rendered = template
            .parsed
            .render(&serde_json::json!({"item": {"x": text}}))
            .expect("renders");
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::process::Command::new("sh")
            .args(["-c", &rendered])
            .env("ITEM__X", text)
            .current_dir(dir.path())
            .output()
            .expect("sh runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn every_form_prints_hostile_text_literally() {
        for (form, prints) in FORMS {
            for shell_filter in [false, true] {
                assert_eq!(
                    run_fixed(form, shell_filter, HOSTILE),
                    prints.replace('X', HOSTILE),
                    "{form} with |shell: {shell_filter}"
                );
            }
        }
    }

    #[test]
    fn double_quotes_make_shell_filter_quotes_literal() {
        // `|shell` inside double quotes: the item's `$(...)` runs (the issue's report).
        let yaml = "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: echo \"processing ${item.x|shell}\"\n";
        let found = crate::check(&SourceFile::new("w.yml", yaml)).diagnostics;
        assert_eq!(
            found.iter().map(|d| d.code).collect::<Vec<_>>(),
            [Code::UnquotedInterpolation]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_text_in_any_position_prints_literally(
            form in 0..FORMS.len(),
            shell_filter in any::<bool>(),
            text in "[a-c $'\"\\\\`;&|(){}*?#~=%!<>-]{0,16}",
        ) {
            let (form, prints) = FORMS[form];
            prop_assert_eq!(run_fixed(form, shell_filter, &text), prints.replace('X', &text));
        }
    }
}

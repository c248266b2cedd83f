//! `shell:` commands as scripts for an external shell linter (ShellCheck), and its findings
//! as diagnostics at their place inside the YAML string.
//!
//! The compiler runs no process: [`scripts`] turns every `shell:` command into a script the
//! linter can read, the caller runs the linter on them (`prodigy check` runs one ShellCheck
//! process per file) and hands back [`Finding`]s, and [`diagnostics`] maps each finding back
//! onto the file.
//!
//! In a script, each `${...}` template is stood in for by a placeholder that the shell reads
//! as one quoted word, so the linter sees the command as the shell will after interpolation:
//! `"$PRODIGY_T1"` outside quotes, `$PRODIGY_T1` inside double quotes, and a plain word inside
//! single quotes (where the shell expands nothing). `$${` is a literal `${`; any other `$$`
//! is the shell's own.

use crate::ast::{Command, Step, Template, Workflow};
use crate::diagnostics::{Code, Diagnostic};
use crate::source::{SourceFile, Span};
use prodigy_grammar::template::Part;

/// ShellCheck rules that templating makes noise of, turned off: variables come from the
/// environment prodigy exports (SC2154, SC2153), placeholders are constant words to the
/// linter (SC2050, SC2078, SC2157, SC2193, SC2194, SC2043), and sourced files are not
/// followed (SC1090, SC1091).
pub const EXCLUDED_RULES: &[&str] = &[
    "SC1090", "SC1091", "SC2043", "SC2050", "SC2078", "SC2153", "SC2154", "SC2157", "SC2193",
    "SC2194",
];

/// One `shell:` command as a script.
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    /// The script text: the command with placeholders for templates.
    pub text: String,
    /// Pieces of the script in order, each with where it came from.
    pieces: Vec<Piece>,
    /// The command's template (its value, span and exactness).
    template: Template,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Piece {
    /// Start of the piece in the script.
    script: usize,
    /// Its length in the script.
    len: usize,
    /// Where it comes from in the template's value: a literal piece maps byte for byte, a
    /// placeholder to the whole `${...}`.
    value: prodigy_grammar::Span,
    literal: bool,
}

/// What a linter found in one script. Lines and columns are 1-based and count characters;
/// the end is exclusive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The index of the script in the list given to the linter.
    pub script: usize,
    /// Start line.
    pub line: usize,
    /// Start column.
    pub column: usize,
    /// End line.
    pub end_line: usize,
    /// End column.
    pub end_column: usize,
    /// The linter's code, such as `SC2086`.
    pub code: String,
    /// The linter's message.
    pub message: String,
    /// Where to read more.
    pub link: String,
}

/// Every `shell:` command of the workflow, in file order, as scripts.
pub fn scripts(workflow: &Workflow) -> Vec<Script> {
    let mut out: Vec<Script> = crate::all_steps(workflow)
        .into_iter()
        .filter_map(|step: &Step| match &step.command {
            Command::Shell(template) => Some(script(template)),
            _ => None,
        })
        .collect();
    out.sort_by_key(|s| s.template.span.start);
    out.dedup_by_key(|s| s.template.span);
    out
}

/// Where the shell stands while reading a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Context {
    Single,
    Double,
    /// `$( ... )` with its open parentheses.
    Subst(u32),
    Backtick,
}

/// A here-document: its delimiter word, whether `<<-` strips leading tabs, whether the word
/// was quoted (then the body is literal), and the body line read so far.
#[derive(Clone, Debug, Default)]
struct Heredoc {
    delimiter: String,
    strip_tabs: bool,
    quoted: bool,
    line: String,
}

/// The words of one simple command read so far: those complete, and the one being read.
#[derive(Clone, Debug, Default)]
struct Words {
    done: Vec<String>,
    current: Option<String>,
}

impl Words {
    fn push(&mut self, c: char) {
        self.current.get_or_insert_with(String::new).push(c);
    }

    fn start(&mut self) {
        self.current.get_or_insert_with(String::new);
    }

    fn end_word(&mut self) {
        if let Some(word) = self.current.take() {
            self.done.push(word);
        }
    }

    fn end_command(&mut self) {
        self.current = None;
        self.done.clear();
    }

    /// Whether the word being read (or the next one) is text a shell reads again as a script:
    /// any argument of `eval`, or the script after `-c` of `sh`, `bash` and the like.
    fn reparsed(&self) -> bool {
        let words = &self.done;
        let first = words
            .iter()
            .position(|w| !is_assignment(w))
            .and_then(|i| words.get(i..));
        if let Some([command, ..]) = first
            && command == "eval"
        {
            return true;
        }
        match words.split_last() {
            Some((option, before)) => {
                let is_c = option.len() > 1
                    && option.starts_with('-')
                    && option[1..].chars().all(|c| c.is_ascii_alphabetic())
                    && option.contains('c');
                is_c && before.iter().any(|w| {
                    let name = w.rsplit('/').next().unwrap_or(w);
                    SHELLS.contains(&name)
                })
            }
            None => false,
        }
    }
}

/// Shells whose `-c` takes a script.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "busybox"];

/// Whether a word is a variable assignment before a command (`X=1`).
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Where a `${...}` of a `shell:` command lands, as the shell reads the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quoting {
    /// Outside quotes.
    Unquoted,
    /// Inside `'...'`.
    Single,
    /// Inside `"..."`.
    Double,
    /// In the body of a here-document; `quoted` when its delimiter was quoted (a literal body).
    Heredoc {
        /// Whether the body is literal.
        quoted: bool,
    },
    /// In a comment.
    Comment,
}

/// One `${...}` of a `shell:` command and where it lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Splice {
    /// The whole `${...}` in the template's value.
    pub span: prodigy_grammar::Span,
    /// The quoting around it.
    pub quoting: Quoting,
    /// When the word it is part of is read again as a script (`eval`, `sh -c`), so that
    /// quotes around the spliced text are removed before that second reading: the quoting
    /// the second reading finds it in.
    pub reparsed: Option<Quoting>,
}

/// Every top-level `${...}` of a `shell:` command, in order, with where it lands.
pub fn splices(template: &Template) -> Vec<Splice> {
    let mut out = Vec::new();
    walk(template, |event| {
        if let Event::Splice(lexer, span) = event {
            out.push(Splice {
                span,
                quoting: lexer.splice_quoting(),
                reparsed: lexer
                    .words
                    .last()
                    .filter(|words| words.reparsed())
                    .map(|words| {
                        let mut inner = Lexer::default();
                        inner.feed(words.current.as_deref().unwrap_or(""));
                        inner.splice_quoting()
                    }),
            });
        }
    });
    out
}

/// A small shell lexer: enough to know whether a position is inside quotes, a comment or a
/// here-document, and which words of which command came before it.
#[derive(Default)]
struct Lexer {
    stack: Vec<Context>,
    /// The command being read at each level of `$( )` and backticks (the first is the
    /// script's own).
    words: Vec<Words>,
    escaped: bool,
    dollar: bool,
    previous: Option<char>,
    comment: bool,
    /// The delimiter after `<<`, while it is read.
    reading: Option<Heredoc>,
    /// Here-documents whose bodies start at the next newline.
    queued: Vec<Heredoc>,
    /// The body being read.
    body: Option<Heredoc>,
}

impl Lexer {
    fn feed(&mut self, text: &str) {
        for c in text.chars() {
            self.step(c);
            self.previous = Some(c);
        }
    }

    fn unquoted(&self) -> bool {
        !matches!(self.stack.last(), Some(Context::Single | Context::Double))
    }

    fn command(&mut self) -> &mut Words {
        if self.words.is_empty() {
            self.words.push(Words::default());
        }
        let last = self.words.len() - 1;
        &mut self.words[last]
    }

    /// A `${...}` was read: it is part of the current word.
    fn spliced(&mut self) {
        if self.body.is_none() && !self.comment {
            // A word, to a shell that reads this one's words again.
            self.command().push('x');
        }
        self.previous = Some('}');
        self.dollar = false;
    }

    fn splice_quoting(&self) -> Quoting {
        if let Some(body) = &self.body {
            return Quoting::Heredoc {
                quoted: body.quoted,
            };
        }
        if self.comment {
            return Quoting::Comment;
        }
        match self.stack.last() {
            Some(Context::Single) => Quoting::Single,
            Some(Context::Double) => Quoting::Double,
            Some(Context::Subst(_) | Context::Backtick) | None => Quoting::Unquoted,
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: the shell lexer's transition table, one arm per state"
    )]
    fn step(&mut self, c: char) {
        if let Some(body) = &mut self.body {
            if c == '\n' {
                let line = if body.strip_tabs {
                    body.line.trim_start_matches('\t')
                } else {
                    body.line.as_str()
                };
                if line == body.delimiter {
                    self.body = self.queued.pop();
                } else {
                    body.line.clear();
                }
            } else {
                body.line.push(c);
            }
            return;
        }
        if self.comment {
            if c == '\n' {
                self.comment = false;
                self.command().end_command();
                self.newline();
            }
            return;
        }
        if let Some(doc) = &mut self.reading {
            match c {
                '-' if doc.delimiter.is_empty() && !doc.strip_tabs => {
                    doc.strip_tabs = true;
                    return;
                }
                '<' if doc.delimiter.is_empty() => {
                    // `<<<`: a here-string, not a here-document.
                    self.reading = None;
                    return;
                }
                ' ' | '\t' if doc.delimiter.is_empty() => return,
                '\'' | '"' | '\\' => {
                    doc.quoted = true;
                    return;
                }
                c if !c.is_whitespace() && !";|&<>()".contains(c) => {
                    doc.delimiter.push(c);
                    return;
                }
                _ => {
                    if let Some(doc) = self.reading.take()
                        && !doc.delimiter.is_empty()
                    {
                        self.queued.insert(0, doc);
                    }
                }
            }
        }
        let dollar = std::mem::replace(&mut self.dollar, c == '$');
        if self.escaped {
            self.escaped = false;
            // Inside double quotes a backslash escapes only these; before a newline it
            // joins the lines.
            if matches!(self.stack.last(), Some(Context::Double)) && !"$`\"\\\n".contains(c) {
                self.command().push('\\');
            }
            if c != '\n' {
                self.command().push(c);
            }
            return;
        }
        let word_start = self
            .previous
            .is_none_or(|p| p.is_whitespace() || ";&|(".contains(p));
        match (self.stack.last().copied(), c) {
            (Some(Context::Single), '\'') | (Some(Context::Double), '"') => {
                self.stack.pop();
            }
            (Some(Context::Backtick), '`') => {
                self.stack.pop();
                self.words.pop();
            }
            (Some(Context::Single), _) => self.command().push(c),
            (_, '\\') => self.escaped = true,
            (_, '(') if dollar => {
                self.command().push(c);
                self.stack.push(Context::Subst(1));
                self.command();
                self.words.push(Words::default());
            }
            (Some(Context::Subst(n)), '(') => {
                self.stack.pop();
                self.stack.push(Context::Subst(n + 1));
                self.command().end_command();
            }
            (Some(Context::Subst(n)), ')') => {
                self.stack.pop();
                if n > 1 {
                    self.stack.push(Context::Subst(n - 1));
                    self.command().end_command();
                } else {
                    self.words.pop();
                    self.command().push(c);
                }
            }
            (_, '`') => {
                self.command().push(c);
                self.stack.push(Context::Backtick);
                self.words.push(Words::default());
            }
            (Some(Context::Double), _) => self.command().push(c),
            (_, '\'') => {
                self.command().start();
                self.stack.push(Context::Single);
            }
            (_, '"') => {
                self.command().start();
                self.stack.push(Context::Double);
            }
            (_, '#') if word_start => self.comment = true,
            (_, '<') if self.previous == Some('<') && self.unquoted() => {
                self.reading = Some(Heredoc::default());
            }
            (_, '\n') => {
                self.command().end_command();
                self.newline();
            }
            (_, ';' | '&' | '|' | '(' | ')') => self.command().end_command(),
            (_, '<' | '>') => self.command().end_word(),
            (_, c) if c.is_whitespace() => self.command().end_word(),
            (_, c) => self.command().push(c),
        }
    }

    /// At a newline outside quotes, the first queued here-document's body starts.
    fn newline(&mut self) {
        if self.unquoted() && self.body.is_none() {
            self.body = self.queued.pop();
        }
    }

    fn quoting(&self) -> Option<Context> {
        if let Some(body) = &self.body {
            return Some(if body.quoted {
                Context::Single
            } else {
                Context::Double
            });
        }
        if self.comment {
            return Some(Context::Single);
        }
        self.stack
            .last()
            .copied()
            .filter(|c| matches!(c, Context::Single | Context::Double))
    }
}

/// What [`walk`] meets in a command, in order.
enum Event<'a> {
    /// A top-level `${...}`, with the lexer as it stands before it.
    Splice(&'a Lexer, prodigy_grammar::Span),
    /// Literal text: a span of the value and the text the shell reads there.
    Literal(prodigy_grammar::Span, &'a str),
}

/// Feeds a command's text to a lexer, telling ON of each splice and piece of literal text;
/// the lexer takes a splice as part of the current word.
fn walk(template: &Template, mut on: impl FnMut(Event<'_>)) {
    let value = template.value.as_str();
    let mut vars: Vec<prodigy_grammar::Span> = template
        .parsed
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Var(v) => Some(v.span),
            _ => None,
        })
        .collect();
    vars.sort_by_key(|s| s.start);
    let mut lexer = Lexer::default();
    let mut at = 0;
    let text = |lexer: &mut Lexer, on: &mut dyn FnMut(Event<'_>), from: usize, to: usize| {
        // `$${` is a literal `${`: its `$$` stands for one `$`.
        let chunk = value.get(from..to).unwrap_or("");
        let mut i = 0;
        while i < chunk.len() {
            let next = chunk[i..].find(ESCAPE).map_or(chunk.len(), |j| i + j);
            let piece = &chunk[i..next];
            if !piece.is_empty() {
                let span = prodigy_grammar::Span {
                    start: from + i,
                    end: from + next,
                };
                on(Event::Literal(span, piece));
                lexer.feed(piece);
            }
            if next < chunk.len() {
                let span = prodigy_grammar::Span {
                    start: from + next,
                    end: from + next + 2,
                };
                on(Event::Literal(span, "$"));
                lexer.feed("$");
                i = next + 2;
            } else {
                i = next;
            }
        }
    };
    for span in vars {
        if span.start < at {
            continue;
        }
        text(&mut lexer, &mut on, at, span.start);
        on(Event::Splice(&lexer, span));
        lexer.spliced();
        at = span.end;
    }
    text(&mut lexer, &mut on, at, value.len());
}

/// The escape whose first two bytes stand for one `$` in a template.
const ESCAPE: &str = "$${";

/// One command as a script.
fn script(template: &Template) -> Script {
    let mut text = String::new();
    let mut pieces = Vec::new();
    let mut n = 0;
    walk(template, |event| match event {
        Event::Splice(lexer, span) => {
            n += 1;
            let name = format!("PRODIGY_T{n}");
            let placeholder = match lexer.quoting() {
                Some(Context::Single) => name,
                Some(Context::Double) => format!("${name}"),
                _ => format!("\"${name}\""),
            };
            pieces.push(Piece {
                script: text.len(),
                len: placeholder.len(),
                value: span,
                literal: false,
            });
            text.push_str(&placeholder);
        }
        Event::Literal(span, piece) => {
            pieces.push(Piece {
                script: text.len(),
                len: piece.len(),
                value: span,
                literal: span.end - span.start == piece.len(),
            });
            text.push_str(piece);
        }
    });
    Script {
        text,
        pieces,
        template: template.clone(),
    }
}

impl Script {
    /// The byte offset in the script of a 1-based line and character column.
    fn offset(&self, line: usize, column: usize) -> usize {
        let mut start = 0;
        for _ in 1..line {
            match self.text[start..].find('\n') {
                Some(i) => start += i + 1,
                None => return self.text.len(),
            }
        }
        let rest = &self.text[start..];
        let end = rest.find('\n').unwrap_or(rest.len());
        rest[..end]
            .char_indices()
            .nth(column.saturating_sub(1))
            .map_or(start + end, |(i, _)| start + i)
    }

    /// The value offset of a script offset; `end` picks the end of a placeholder.
    fn value_offset(&self, offset: usize, end: bool) -> usize {
        let piece = self
            .pieces
            .iter()
            .rev()
            .find(|p| p.script <= offset && (offset < p.script + p.len || end));
        match piece {
            Some(p) if p.literal => p.value.start + (offset - p.script).min(p.len),
            Some(p) if end && offset > p.script => p.value.end,
            Some(p) => p.value.start,
            None => 0,
        }
    }

    /// The file span of a range of the script, given as lines and columns.
    pub fn file_span(
        &self,
        source: &str,
        (line, column): (usize, usize),
        (end_line, end_column): (usize, usize),
    ) -> Span {
        let start = self.value_offset(self.offset(line, column), false);
        let end = self
            .value_offset(self.offset(end_line, end_column), true)
            .max(start);
        self.template
            .rebase(source, prodigy_grammar::Span { start, end })
    }
}

/// The findings of the linter as warnings of the file, each at its place in the command.
pub fn diagnostics(file: &SourceFile, scripts: &[Script], findings: &[Finding]) -> Vec<Diagnostic> {
    findings
        .iter()
        .filter_map(|f| {
            let script = scripts.get(f.script)?;
            let span = script.file_span(&file.text, (f.line, f.column), (f.end_line, f.end_column));
            let message = f.message.trim_end_matches('.');
            let mut chars = message.chars();
            let message: String = chars
                .next()
                .map(|c| c.to_lowercase().chain(chars).collect())
                .unwrap_or_default();
            Some(
                Diagnostic::new(Code::Shellcheck, format!("{}: {message}", f.code))
                    .with_primary(span, format!("ShellCheck {}", f.code))
                    .with_help(format!("see {}", f.link)),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scripts_of(yaml: &str) -> (SourceFile, Vec<Script>) {
        let file = SourceFile::new("w.yml", yaml);
        let checked = crate::check(&file);
        let workflow = checked.workflow.expect("a workflow");
        let scripts = scripts(&workflow);
        (file, scripts)
    }

    #[test]
    fn templates_become_quoted_words_for_the_context() {
        let (_, scripts) =
            scripts_of("- shell: echo ${a} \"x ${b}\" '${c}' $${HOME} $$ $(cat \"${d}\")\n");
        assert_eq!(
            scripts[0].text,
            r#"echo "$PRODIGY_T1" "x $PRODIGY_T2" 'PRODIGY_T3' ${HOME} $$ $(cat "$PRODIGY_T4")"#
        );
    }

    #[test]
    fn comments_and_here_documents_are_not_quotes() {
        let (_, scripts) = scripts_of(
            "- shell: |\n    # don't worry\n    cat <<EOF > out-${a}\n    it's ${b}\n    EOF\n    cat <<-'END'\n    ${c}\n    END\n    echo ${d}\n",
        );
        assert_eq!(
            scripts[0].text,
            "# don't worry\ncat <<EOF > out-\"$PRODIGY_T1\"\nit's $PRODIGY_T2\nEOF\ncat <<-'END'\nPRODIGY_T3\nEND\necho \"$PRODIGY_T4\"\n"
        );
    }

    #[test]
    fn positions_map_back_into_the_yaml_string() {
        let yaml = "commands:\n  - shell: |\n      echo ${item} $${x}\n      ls $y\n";
        let (file, scripts) = scripts_of(yaml);
        let script = &scripts[0];
        assert_eq!(script.text, "echo \"$PRODIGY_T1\" ${x}\nls $y\n");
        // `$y` on the script's line 2, columns 4..6.
        let span = script.file_span(&file.text, (2, 4), (2, 6));
        assert_eq!(file.slice(span), "$y");
        // `${x}` after a placeholder and an escaped dollar: `$${x}` in the file.
        let span = script.file_span(&file.text, (1, 20), (1, 24));
        assert_eq!(file.slice(span), "$${x}");
        // The placeholder maps to the whole template.
        let span = script.file_span(&file.text, (1, 6), (1, 19));
        assert_eq!(file.slice(span), "${item}");
    }

    #[test]
    fn findings_become_warnings_with_the_code_and_link() {
        let yaml = "- shell: ls $y\n";
        let (file, scripts) = scripts_of(yaml);
        let found = diagnostics(
            &file,
            &scripts,
            &[Finding {
                script: 0,
                line: 1,
                column: 4,
                end_line: 1,
                end_column: 6,
                code: "SC2086".into(),
                message: "Double quote to prevent globbing and word splitting.".into(),
                link: "https://www.shellcheck.net/wiki/SC2086".into(),
            }],
        );
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].message,
            "SC2086: double quote to prevent globbing and word splitting"
        );
        assert_eq!(file.slice(found[0].primary.as_ref().unwrap().span), "$y");
        assert_eq!(
            found[0].help.as_deref(),
            Some("see https://www.shellcheck.net/wiki/SC2086")
        );
    }
}

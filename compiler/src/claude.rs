//! Slash commands in Claude prompts: which command a prompt starts with, where Claude Code
//! looks for it, and warning W008 when the project defines no such command
//! (docs/claude.md).
//!
//! The lookup itself is the caller's ([`crate::Surroundings::slash_command`]): the compiler
//! does no I/O. [`find_command`] is the rule, over any file system the caller gives it.

use crate::ast::{self, Command, Template};
use crate::diagnostics::{Code, Diagnostic};

/// The commands built into the Claude Code CLI, which no file defines.
pub const BUILTIN_COMMANDS: &[&str] = &[
    "add-dir",
    "agents",
    "bug",
    "clear",
    "compact",
    "config",
    "context",
    "cost",
    "doctor",
    "exit",
    "export",
    "help",
    "hooks",
    "ide",
    "init",
    "install-github-app",
    "login",
    "logout",
    "mcp",
    "memory",
    "model",
    "output-style",
    "permissions",
    "plugin",
    "pr-comments",
    "privacy-settings",
    "release-notes",
    "resume",
    "review",
    "rewind",
    "sandbox",
    "security-review",
    "status",
    "statusline",
    "terminal-setup",
    "todos",
    "upgrade",
    "usage",
    "vim",
];

/// What the caller found for a slash command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandLookup {
    /// A command file or a skill defines it.
    Found,
    /// No file defines it, though the project or the user has commands or skills.
    Missing,
    /// Neither the project nor the user has a `commands` or `skills` directory: whether the
    /// command exists cannot be told (the commands may be installed elsewhere, such as on
    /// the machine that runs the workflow), so nothing is said.
    Unknown,
}

/// The slash command a prompt starts with, and where its name lies in the prompt:
/// `/prodigy-lint src` is `prodigy-lint`. A first word that is a path (`/usr/bin/x`), a
/// template (`/${cmd}`) or anything but letters, digits, `-`, `_`, `.` and `:` is not a
/// command.
pub fn command_name(prompt: &str) -> Option<(&str, prodigy_grammar::Span)> {
    let start = prompt.len() - prompt.trim_start().len();
    let rest = prompt.get(start..)?.strip_prefix('/')?;
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let name = rest.get(..end)?;
    let valid = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    valid.then_some((
        name,
        prodigy_grammar::Span {
            start,
            end: start + 1 + end,
        },
    ))
}

/// The files that define command NAME, relative to a `.claude` directory: the command file
/// (`a:b` is `commands/a/b.md`) and the skill (`skills/NAME/SKILL.md`).
pub fn command_files(name: &str) -> Vec<String> {
    let mut files = vec![format!("commands/{}.md", name.replace(':', "/"))];
    if !name.contains(':') {
        files.push(format!("skills/{name}/SKILL.md"));
    }
    files
}

/// Looks for command NAME in the `.claude` directories `claude_dirs`, nearest first (the
/// workflow's directory upward to its repository's root, then the user's home), with
/// `is_file` and `is_dir` answering for paths under them.
pub fn find_command(
    name: &str,
    claude_dirs: &[std::path::PathBuf],
    is_file: &dyn Fn(&std::path::Path) -> bool,
    is_dir: &dyn Fn(&std::path::Path) -> bool,
) -> CommandLookup {
    let files = command_files(name);
    if claude_dirs
        .iter()
        .any(|dir| files.iter().any(|f| is_file(&dir.join(f))))
    {
        return CommandLookup::Found;
    }
    let has_commands = claude_dirs
        .iter()
        .any(|dir| is_dir(&dir.join("commands")) || is_dir(&dir.join("skills")));
    if has_commands {
        CommandLookup::Missing
    } else {
        CommandLookup::Unknown
    }
}

/// W008 for every Claude prompt that starts with a command that is not built in and that
/// LOOKUP does not find.
pub(crate) fn unknown_commands(
    workflow: &ast::Workflow,
    source: &str,
    lookup: &dyn Fn(&str) -> CommandLookup,
) -> Vec<Diagnostic> {
    let mut prompts: Vec<&Template> = Vec::new();
    for step in crate::all_steps(workflow) {
        if let Command::Claude(t) = &step.command {
            prompts.push(t);
        }
        for check in step.step_validate.iter().flat_map(|v| &v.checks) {
            if check.claude {
                prompts.push(&check.command);
            }
        }
    }
    let mut out = Vec::new();
    for prompt in prompts {
        let Some((name, local)) = command_name(&prompt.value) else {
            continue;
        };
        if BUILTIN_COMMANDS.contains(&name) || lookup(name) != CommandLookup::Missing {
            continue;
        }
        let file = format!(".claude/commands/{}.md", name.replace(':', "/"));
        out.push(
            Diagnostic::new(
                Code::UnknownSlashCommand,
                format!("no command `/{name}` in the project or in `~/.claude`"),
            )
            .with_primary(
                prompt.rebase(source, local),
                format!("Claude Code will answer `Unknown command: /{name}`"),
            )
            .with_help(format!(
                "create `{file}` in the repository, or fix the command's name"
            )),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{CommandLookup, command_files, command_name, find_command};
    use std::path::{Path, PathBuf};

    #[test]
    fn the_first_word_names_the_command() {
        let name = |p: &str| command_name(p).map(|(n, s)| (n.to_owned(), s.start, s.end));
        assert_eq!(
            name("/prodigy-lint src"),
            Some(("prodigy-lint".to_owned(), 0, 13))
        );
        assert_eq!(name("  /a:b"), Some(("a:b".to_owned(), 2, 6)));
        for not_a_command in ["/usr/bin/env x", "/${cmd} x", "fix it", "/", "/ x", "/-x"] {
            assert_eq!(name(not_a_command), None, "{not_a_command}");
        }
    }

    #[test]
    fn a_namespaced_command_is_a_file_in_a_subdirectory() {
        assert_eq!(command_files("a:b"), ["commands/a/b.md".to_owned()]);
        assert_eq!(
            command_files("lint"),
            [
                "commands/lint.md".to_owned(),
                "skills/lint/SKILL.md".to_owned()
            ]
        );
    }

    #[test]
    fn a_command_is_missing_only_where_commands_are_kept() {
        let dirs = [PathBuf::from("/p/.claude"), PathBuf::from("/home/.claude")];
        let files = [
            "/home/.claude/skills/review-all/SKILL.md",
            "/p/.claude/commands/x/y.md",
        ];
        let is_file = |p: &Path| files.iter().any(|f| Path::new(f) == p);
        let find = |name: &str, dirs_exist: &[&str]| {
            let is_dir = |p: &Path| dirs_exist.iter().any(|d| Path::new(d) == p);
            find_command(name, &dirs, &is_file, &is_dir)
        };
        assert_eq!(find("review-all", &[]), CommandLookup::Found);
        assert_eq!(find("x:y", &[]), CommandLookup::Found);
        assert_eq!(find("nope", &[]), CommandLookup::Unknown);
        assert_eq!(
            find("nope", &["/p/.claude/commands"]),
            CommandLookup::Missing
        );
        assert_eq!(
            find("nope", &["/home/.claude/skills"]),
            CommandLookup::Missing
        );
    }
}

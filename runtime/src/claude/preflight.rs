//! The Claude CLI, checked before anything is made when a step the run can reach needs it
//! ([`crate::session::preflight`] calls it with the rest of what a run needs).

use prodigy_plan::{Plan, PlanCommand, StepId};

use crate::exec;

/// Why the Claude CLI a run needs cannot be used (a run's `StartError::Claude`).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ClaudeUnusable {
    /// `PRODIGY_CLAUDE_COMMAND` cannot be split into words.
    #[error("{0}")]
    ClaudeCommand(String),
    /// The Claude program does not answer `--version`.
    #[error(
        "`{program} --version` failed: {why}; check the Claude Code CLI installation (or PRODIGY_CLAUDE_COMMAND)"
    )]
    ClaudeVersion {
        /// The program.
        program: String,
        /// What went wrong.
        why: crate::claude::VersionError,
    },
    /// Running as root without `IS_SANDBOX=1`.
    #[error(
        "running as root, the Claude Code CLI refuses `--dangerously-skip-permissions`; set `IS_SANDBOX=1` when this machine or container is a sandbox, or run as another user"
    )]
    ClaudeAsRoot,
    /// The Claude program is missing.
    #[error(
        "the workflow has `claude` steps but `{program}` is not installed (or not executable); install the Claude Code CLI or set PRODIGY_CLAUDE_COMMAND to another agent CLI"
    )]
    ClaudeMissing {
        /// The program looked for.
        program: String,
    },
}

/// Checks, before anything is made (a worktree, a branch, a lock), that the programs that
/// running ROOTS needs work: when one of them, or a step they can lead to, is a `claude`
/// step or `claude` check, the Claude CLI (`claude_command`, else `claude`) is installed,
/// answers `--version` (remembered for the events), and, as root, `IS_SANDBOX=1` is set.
///
/// # Errors
///
/// [`ClaudeUnusable::ClaudeMissing`], [`ClaudeUnusable::ClaudeVersion`],
/// [`ClaudeUnusable::ClaudeAsRoot`], [`ClaudeUnusable::ClaudeCommand`].
pub fn check_claude(
    plan: &Plan,
    roots: &[StepId],
    claude_command: Option<&str>,
) -> Result<(), ClaudeUnusable> {
    if !needs_claude(plan, roots) {
        return Ok(());
    }
    let (program, leading) = crate::claude::program(claude_command)
        .map_err(|e| ClaudeUnusable::ClaudeCommand(e.to_string()))?;
    if exec::find_executable(&program).is_none() {
        return Err(ClaudeUnusable::ClaudeMissing { program });
    }
    let version = crate::claude::ask_version(&program, &leading).map_err(|why| {
        ClaudeUnusable::ClaudeVersion {
            program: program.clone(),
            why,
        }
    })?;
    crate::claude::remember_version(&version);
    // As root, the CLI refuses `--dangerously-skip-permissions` unless told it runs in a
    // sandbox; every call would fail the same way.
    if version.contains("Claude Code")
        && nix::unistd::geteuid().is_root()
        && std::env::var("IS_SANDBOX").as_deref() != Ok("1")
    {
        return Err(ClaudeUnusable::ClaudeAsRoot);
    }
    Ok(())
}

/// Whether running ROOTS runs the Claude CLI: one of them, or a step it can lead to
/// (`on_success`, `on_failure`, `on_exit_code`, `validate` and `on_incomplete` commands,
/// `foreach` bodies), is a `claude` step or has a `claude` check.
pub fn needs_claude(plan: &Plan, roots: &[StepId]) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut stack = roots.to_vec();
    while let Some(id) = stack.pop() {
        let Some(step) = plan.step(id) else { continue };
        if !seen.insert(id) {
            continue;
        }
        let checks_with_claude = step
            .step_validate
            .as_ref()
            .is_some_and(|v| v.checks.iter().any(|c| c.claude));
        if matches!(step.command, PlanCommand::Claude(_)) || checks_with_claude {
            return true;
        }
        stack.extend(&step.on_success);
        if let Some(handler) = &step.on_failure {
            stack.extend(&handler.handler);
        }
        for (_, steps) in &step.on_exit_code {
            stack.extend(steps);
        }
        if let Some(validate) = &step.validate {
            stack.extend(&validate.commands);
            if let Some(incomplete) = &validate.on_incomplete {
                stack.extend(&incomplete.commands);
            }
        }
        if let PlanCommand::Foreach { steps, .. } = &step.command {
            stack.extend(steps);
        }
    }
    false
}

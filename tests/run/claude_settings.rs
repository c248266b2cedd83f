//! The settings of Claude calls (`claude: {prompt, ...}` and the workflow's `claude:`
//! defaults) reach the CLI as its options.

use super::{Scratch, root, stderr};

/// A CLI that appends its arguments, each in brackets, then its standard input (the prompt)
/// in angle brackets, one call a line, to `args.log` in the scratch directory, then answers
/// as the stub does.
fn recording_cli(scratch: &Scratch) -> (std::path::PathBuf, std::path::PathBuf) {
    let cli = scratch.dir.path().join("bin/recording-claude");
    let log = scratch.dir.path().join("args.log");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && exec {stub} \"$@\"\nprompt=$(cat)\nprintf '[%s]' \"$@\" >> '{log}'\nprintf ' <%s>\\n' \"$prompt\" >> '{log}'\nprintf '%s' \"$prompt\" | exec {stub} \"$@\"\n",
            log = log.display(),
            stub = root().join("tests/run/bin/claude").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (cli, log)
}

#[test]
fn claude_settings_become_the_cli_options_with_the_workflow_defaults_underneath() {
    let scratch = Scratch::new();
    let (cli, log) = recording_cli(&scratch);
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "\
claude:
  model: sonnet
  max_turns: 20
  allowed_tools: [Read, \"Bash(git:*)\"]
commands:
  - claude: /prodigy-lint src
  - claude:
      prompt: /prodigy-review src
      model: opus
      permission_mode: plan
      max_budget_usd: 2.5
      disallowed_tools: WebFetch
      append_system_prompt: Be brief.
      fallback_model: sonnet
      mcp_config: [a.json, b.json]
      add_dirs: ../docs
      allowed_tools: []
  - shell: exit 1
    on_failure:
      claude:
        prompt: /prodigy-fix
        max_turns: 3
",
    )
    .unwrap();
    let output = scratch.run(
        &["run", file.to_str().unwrap()],
        &[
            ("PRODIGY_CLAUDE_COMMAND", cli.to_str().unwrap()),
            ("IS_SANDBOX", "1"),
        ],
    );
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let calls = std::fs::read_to_string(&log).unwrap();
    let base = "[-p][--output-format][stream-json][--verbose]";
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            format!(
                "{base}[--dangerously-skip-permissions][--model][sonnet][--max-turns][20][--allowedTools][Read,Bash(git:*)] </prodigy-lint src>"
            ),
            format!(
                "{base}[--permission-mode][plan][--model][opus][--max-turns][20][--disallowedTools][WebFetch][--append-system-prompt][Be brief.][--max-budget-usd][2.5][--fallback-model][sonnet][--mcp-config][a.json][--mcp-config][b.json][--add-dir][../docs] </prodigy-review src>"
            ),
            format!(
                "{base}[--dangerously-skip-permissions][--model][sonnet][--max-turns][3][--allowedTools][Read,Bash(git:*)] </prodigy-fix>"
            ),
        ],
        "{text}"
    );
}

//! Variables as `check` promises them: captures made in `on_success` reach later steps, and
//! the exported variable W006 suggests holds exactly the text of the reference it replaces.

use super::{Scratch, stderr};

/// The user documentation: a capture in `on_success` "creates a ${metrics} variable ... which
/// can be used in later workflow steps".
#[test]
fn an_on_success_capture_is_there_for_later_steps() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- shell: \"echo built\"\n  on_success:\n    shell: \"echo 'p95=42ms'\"\n    capture: metrics\n    on_success:\n      shell: \"echo nested\"\n      capture: deeper\n- shell: \"echo metrics: ${metrics|shell} and ${deeper|shell}\"\n",
    )
    .unwrap();
    let check = scratch.run(&["check", file.to_str().unwrap()], &[]);
    assert!(check.status.success(), "{}", stderr(&check));
    let output = scratch.run(&["run", "-v", "--no-worktree", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("metrics: p95=42ms and nested"), "{text}");

    // In a map agent, for the agent's later steps.
    let job = scratch.project().join("job.yml");
    std::fs::write(
        &job,
        "mode: mapreduce\nmap:\n  input: \"printf 'a\\\\nb\\\\n'\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"true\"\n      on_success:\n        shell: \"echo seen-${item}\"\n        capture: seen\n    - shell: \"echo agent says ${seen|shell}\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", "-v", "--no-worktree", job.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("agent says seen-a"), "{text}");
    assert!(text.contains("agent says seen-b"), "{text}");
}

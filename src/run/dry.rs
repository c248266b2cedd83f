//! `prodigy run --dry-run`: the steps with their commands rendered; nothing runs.

use std::fmt::Write as _;
use std::sync::Arc;

use prodigy_compiler::plan::PlanCommand;
use prodigy_runtime::progress::count;
use prodigy_runtime::runner::{Options, Runner};
use prodigy_runtime::vars::Vars;

use super::block_on;
use crate::{exit_code, out};

/// Prints the steps with their commands rendered as far as the starting variables allow
/// (env files, env, the profile, params and args; secrets as `***`; nothing is run).
pub(super) fn dry_run(plan: prodigy_compiler::plan::Plan, opts: Options) -> u8 {
    let plan = Arc::new(plan);
    let reporter = Arc::new(crate::report::Terminal::for_flags());
    let runner = Runner::dry(plan.clone(), opts).report_to(reporter);
    let vars = match block_on(runner.preview_vars()) {
        Ok(Ok(vars)) => vars,
        Ok(Err(e)) => {
            crate::err_diagnostic(&e);
            return exit_code::PROBLEMS;
        }
        Err(code) => return code,
    };
    let mut text = String::new();
    if let Some(map) = &plan.map {
        let _ = writeln!(
            text,
            "dry run of MapReduce workflow {}; nothing is executed",
            plan.name.as_deref().unwrap_or(&plan.source)
        );
        if let Some(setup) = &plan.setup {
            text.push_str("setup:\n");
            dry_steps(&mut text, &plan, &setup.steps, &runner, &vars);
        }
        let parallel = match &map.max_parallel {
            prodigy_compiler::ast::MaxParallel::Fixed(n) => n.value.to_string(),
            prodigy_compiler::ast::MaxParallel::Variable(t) => runner.preview(&t.parsed, &vars),
        };
        let _ = writeln!(
            text,
            "map: input {}, {parallel} agents at a time (`prodigy items` lists the items)",
            runner.preview(&map.input.parsed, &vars)
        );
        dry_steps(&mut text, &plan, &map.steps, &runner, &vars);
        if !plan.reduce.is_empty() {
            text.push_str("reduce:\n");
            dry_steps(&mut text, &plan, &plan.reduce, &runner, &vars);
        }
    } else {
        let _ = writeln!(
            text,
            "dry run of {} ({}); nothing is executed",
            plan.name.as_deref().unwrap_or(&plan.source),
            count(plan.commands.len(), "step")
        );
        dry_steps(&mut text, &plan, &plan.commands, &runner, &vars);
    }
    out(&text);
    exit_code::OK
}

/// One numbered entry per step, with its command rendered as far as VARS allow.
fn dry_steps(
    text: &mut String,
    plan: &prodigy_compiler::plan::Plan,
    steps: &[prodigy_compiler::plan::StepId],
    runner: &Runner,
    vars: &Vars,
) {
    for (i, id) in steps.iter().enumerate() {
        let Some(step) = plan.step(*id) else { continue };
        let command = match &step.command {
            PlanCommand::Shell(t) => format!("shell: {}", runner.preview(&t.parsed, vars)),
            PlanCommand::Claude(t) => format!("claude: {}", runner.preview(&t.parsed, vars)),
            PlanCommand::WriteFile(w) => {
                format!("write_file: {}", runner.preview(&w.path.parsed, vars))
            }
            PlanCommand::Foreach { .. } => "foreach".to_owned(),
        };
        let _ = writeln!(
            text,
            "{:>3}. {}\n     {}",
            i + 1,
            step.label,
            command.replace('\n', "\n     ")
        );
        if let Some(when) = &step.when {
            let _ = writeln!(text, "     when: {}", when.value);
        }
        if let Some(retry) = &step.retry {
            let _ = writeln!(text, "     retry: {} attempts", retry.config.attempts);
        }
        if step.on_failure.is_some() {
            text.push_str("     on_failure: handled\n");
        }
    }
}

//! Lowering, one behaviour per test.

use std::time::Duration;

use crate::ast::{
    Backoff, Command, ErrorCollection, ItemFailure, MaxParallel, OnFailureForm, RetryExhausted,
    Step, Strategy, Workflow,
};
use crate::diagnostics::Code;
use crate::source::SourceFile;

#[track_caller]
fn lower_ok(text: &str) -> Workflow {
    let checked = crate::check(&SourceFile::new("t.yml", text));
    let codes: Vec<_> = checked
        .diagnostics
        .iter()
        .map(|d| (d.code, d.message.clone()))
        .collect();
    assert!(codes.is_empty(), "unexpected diagnostics: {codes:?}");
    checked.workflow.unwrap()
}

#[track_caller]
fn codes(text: &str) -> Vec<Code> {
    crate::check(&SourceFile::new("t.yml", text))
        .diagnostics
        .iter()
        .map(|d| d.code)
        .collect()
}

#[track_caller]
fn first_step(text: &str) -> Step {
    lower_ok(text).commands.into_iter().next().unwrap()
}

#[test]
fn every_backoff_spelling_means_the_same() {
    let expected = Backoff::Exponential {
        initial: None,
        base: 3.0,
    };
    for spelling in [
        "{exponential: {base: 3}}",
        "{type: exponential, base: 3}",
        "!exponential {base: 3}",
        "{exponential: {multiplier: 3}}",
    ] {
        let step = first_step(&format!(
            "- shell: x\n  retry_config:\n    backoff: {spelling}\n"
        ));
        assert_eq!(step.retry.unwrap().backoff, expected, "{spelling}");
    }
    let plain = first_step("- shell: x\n  retry: {backoff: fibonacci}\n");
    assert_eq!(
        plain.retry.unwrap().backoff,
        Backoff::Fibonacci { initial: None }
    );
}

#[test]
fn retry_config_defaults_follow_the_spec() {
    let retry = first_step("- shell: x\n  retry_config: {}\n")
        .retry
        .unwrap();
    assert_eq!(retry.attempts, 3);
    assert_eq!(retry.initial_delay, Duration::from_secs(1));
    assert_eq!(retry.max_delay, Duration::from_secs(30));
    assert!(!retry.jitter);
    assert_eq!(retry.on_failure, RetryExhausted::Stop);
}

#[test]
fn durations_accept_humantime_and_seconds() {
    for (text, secs) in [
        ("30", 30.0),
        ("1.5", 1.5),
        ("\"1m 30s\"", 90.0),
        ("500ms", 0.5),
        ("{secs: 2, nanos: 0}", 2.0),
    ] {
        let step = first_step(&format!("- shell: x\n  timeout: {text}\n"));
        assert_eq!(
            step.timeout.unwrap().value,
            Duration::from_secs_f64(secs),
            "{text}"
        );
    }
    assert_eq!(
        codes("- shell: x\n  timeout: soon\n"),
        [Code::InvalidDuration]
    );
    assert_eq!(
        codes("- shell: x\n  timeout: -3\n"),
        [Code::InvalidDuration]
    );
}

/// The user documentation lists `500` among the invalid formats of the fields read the
/// humantime way; fields that count seconds by definition keep taking plain numbers.
#[test]
fn delays_need_a_unit_where_timeouts_take_seconds() {
    let diagnostics = |text: &str| crate::check(&SourceFile::new("t.yml", text)).diagnostics;
    let job = |policy: &str| {
        format!(
            "mode: mapreduce\nmap:\n  input: x.json\n  agent_timeout_secs: 300\n  agent_template:\n    - shell: \"true\"\nerror_policy:\n  {policy}\n"
        )
    };
    for (text, field, written) in [
        (
            "- shell: x\n  retry_config: {initial_delay: 500}\n",
            "`initial_delay`",
            "500",
        ),
        (
            "- shell: x\n  retry_config: {max_delay: 30}\n",
            "`max_delay`",
            "30",
        ),
        (
            "- shell: x\n  retry_config: {retry_budget: \"600\"}\n",
            "`retry_budget`",
            "600",
        ),
        (
            "- shell: x\n  retry_config: {backoff: {linear: {increment: 2}}}\n",
            "`increment`",
            "2",
        ),
        (
            "- shell: x\n  retry_config: {backoff: {fixed: {delay: 1.5}}}\n",
            "`delay`",
            "1.5",
        ),
        (
            "- shell: x\n  retry_config: {backoff: {custom: {delays: [1s, 2]}}}\n",
            "a custom delay",
            "2",
        ),
        (
            &job("circuit_breaker: {timeout: 30}"),
            "`circuit_breaker.timeout`",
            "30",
        ),
        (&job("retry_config: {max_delay: 10}"), "`max_delay`", "10"),
        (
            &job("retry_config: {backoff: {exponential: {initial: 1}}}"),
            "`initial`",
            "1",
        ),
    ] {
        let found = diagnostics(text);
        assert_eq!(found.len(), 1, "{text}: {found:?}");
        let d = &found[0];
        assert_eq!(d.code, Code::InvalidDuration, "{text}");
        assert_eq!(d.message, format!("{field} needs a unit"), "{text}");
        assert_eq!(
            d.help.as_deref(),
            Some(format!("write `{written}ms` or `{written}s`").as_str())
        );
        let label = d.primary.as_ref().unwrap();
        assert_eq!(
            &text[label.span.start as usize..label.span.end as usize].trim_matches('"'),
            &written
        );
    }
    // A unit spelled out is refused (the backoff documentation calls it invalid), with the
    // short form as the fix.
    let spelled = diagnostics("- shell: x\n  retry_config: {max_delay: \"2 minutes\"}\n");
    assert_eq!(spelled.len(), 1, "{spelled:?}");
    assert_eq!(spelled[0].code, Code::InvalidDuration);
    assert_eq!(spelled[0].fix.as_ref().unwrap().edits[0].replacement, "2m");
    // Short units, zero and `{secs, nanos}` are fine; seconds fields take numbers.
    let retry = first_step(
        "- shell: x\n  timeout: 300\n  retry_config: {initial_delay: 0, max_delay: 2m, retry_budget: {secs: 3600}, backoff: {custom: {delays: [500ms, 1s]}}}\n",
    );
    assert_eq!(retry.timeout.unwrap().value, Duration::from_mins(5));
    let config = retry.retry.unwrap();
    assert_eq!(config.initial_delay, Duration::ZERO);
    assert_eq!(config.max_delay, Duration::from_mins(2));
    assert_eq!(config.retry_budget, Some(Duration::from_hours(1)));
    assert!(
        diagnostics(&job(
            "circuit_breaker: {timeout: 1m}\nmerge:\n  commands: []\n  timeout: 60"
        ))
        .is_empty()
    );
    assert!(diagnostics(&job("retry_config: {max_delay: 10s}")).is_empty());
}

#[test]
fn on_failure_forms() {
    let form = |text: &str| {
        first_step(&format!("- shell: x\n  on_failure: {text}\n"))
            .on_failure
            .unwrap()
    };
    let ignore = form("true");
    assert!(!ignore.fail_workflow && ignore.handler.is_empty());
    assert!(form("false").fail_workflow);
    let single = form("\"/fix\"");
    assert_eq!(single.form, OnFailureForm::Single);
    assert!(matches!(single.handler[0].command, Command::Claude(_)));
    let list = form("[\"a\", \"/b\", {shell: c}]");
    assert_eq!(list.handler.len(), 3);
    assert!(matches!(list.handler[0].command, Command::Shell(_)));
    let advanced = form("{shell: a, claude: b, max_retries: 3}");
    assert_eq!(
        (advanced.form, advanced.handler.len(), advanced.max_attempts),
        (OnFailureForm::Advanced, 2, 3)
    );
    assert!(
        !advanced.fail_workflow,
        "a handler defaults to fail_workflow: false"
    );
    let detailed = form(
        "{commands: [{shell: a, continue_on_error: true}], strategy: cleanup, handler_failure_fatal: true}",
    );
    assert_eq!(detailed.form, OnFailureForm::Detailed);
    assert_eq!(detailed.strategy, Strategy::Cleanup);
    assert!(detailed.handler_failure_fatal && detailed.handler[0].continue_on_error);
}

#[test]
fn legacy_keys_have_their_documented_meaning() {
    let allow = first_step("- shell: x\n  allow_failure: true\n");
    assert!(!allow.on_failure.unwrap().fail_workflow);
    let named =
        first_step("- name: prodigy-lint\n  args: [src]\n  options: {fix: true, level: 2}\n");
    match &named.command {
        Command::Claude(text) => assert_eq!(text.value, "/prodigy-lint src --fix --level 2"),
        other => panic!("expected a claude command, got {other:?}"),
    }
    let meta =
        first_step("- shell: x\n  metadata: {retries: 2, continue_on_error: true, timeout: 5}\n");
    assert_eq!(meta.retry.unwrap().attempts, 3);
    assert!(!meta.on_failure.unwrap().fail_workflow);
    assert_eq!(meta.timeout.unwrap().value, Duration::from_secs(5));
    let display = first_step("- name: Build\n  shell: make\n");
    assert!(
        matches!(display.command, Command::Shell(_)),
        "`name` beside `shell` is a display name"
    );
    assert_eq!(display.name.unwrap().value, "Build");
}

#[test]
fn test_steps_become_shell_with_a_handler() {
    let text = "- test:\n    command: cargo test\n    on_failure:\n      claude: /fix\n";
    let checked = crate::check(&SourceFile::new("t.yml", text));
    assert_eq!(
        checked
            .diagnostics
            .iter()
            .map(|d| d.code)
            .collect::<Vec<_>>(),
        [Code::Deprecated]
    );
    let step = checked.workflow.unwrap().commands.remove(0);
    assert!(matches!(step.command, Command::Shell(_)));
    assert_eq!(step.on_failure.unwrap().max_attempts, 3);
}

#[test]
fn on_success_with_shell_and_claude_runs_both() {
    let step = first_step("- shell: x\n  on_success:\n    shell: a\n    claude: /b\n");
    let kinds: Vec<bool> = step
        .on_success
        .iter()
        .map(|s| matches!(s.command, Command::Shell(_)))
        .collect();
    assert_eq!(kinds, [true, false]);
}

#[test]
fn error_policy_and_convenience_keys_merge() {
    let wf = lower_ok(
        "name: x\nmode: mapreduce\nmap: {input: i.json, agent_template: [{shell: a}], max_parallel: \"${N}\"}\n\
         on_item_failure: skip\nerror_collection: batched:5\nerror_policy:\n  max_failures: 3\n  circuit_breaker: {failure_threshold: 2}\n",
    );
    let policy = wf.error_policy.unwrap();
    assert_eq!(policy.on_item_failure.unwrap().value, ItemFailure::Skip);
    assert_eq!(
        policy.error_collection.unwrap().value,
        ErrorCollection::Batched(5)
    );
    assert_eq!(policy.max_failures.unwrap().value, 3);
    let breaker = policy.circuit_breaker.unwrap();
    assert_eq!(
        (
            breaker.failure_threshold,
            breaker.success_threshold,
            breaker.half_open_requests
        ),
        (2, 3, 3)
    );
    assert!(matches!(
        wf.map.unwrap().max_parallel,
        MaxParallel::Variable(_)
    ));
}

#[test]
fn custom_item_failure_needs_a_handler() {
    let base = "name: x\nmode: mapreduce\nmap: {input: i.json, agent_template: [{shell: a}]}\non_item_failure: custom:fixer\n";
    assert_eq!(codes(base), [Code::UnknownHandler]);
    let with_handler = format!("{base}handlers:\n  fixer:\n    - shell: echo fix\n");
    let policy = lower_ok(&with_handler).error_policy.unwrap();
    assert_eq!(
        policy.on_item_failure.unwrap().value,
        ItemFailure::Custom("fixer".into())
    );
}

#[test]
fn mode_mistakes_have_one_diagnostic_each() {
    assert_eq!(
        codes("name: x\nmap: {input: a, agent_template: [{shell: b}]}\nreduce: [{shell: c}]\n"),
        [Code::MapWithoutMapReduce]
    );
    assert_eq!(
        codes("name: x\nmode: mapreduce\n"),
        [Code::MapReduceWithoutMap]
    );
    assert_eq!(
        codes("name: x\ncommands: [{shell: a}]\nsetup: [{shell: b}]\n"),
        [Code::WrongMode]
    );
    assert_eq!(
        codes("name: x\ncommands: [{shell: a}]\nerror_policy: {max_failures: 2}\n"),
        [Code::NoEffect]
    );
}

#[test]
fn anchors_and_merge_keys_work_in_workflows() {
    let wf =
        lower_ok("env: &d {A: b}\ncommands:\n  - shell: x\n    env:\n      <<: *d\n      C: d\n");
    let names: Vec<&str> = wf.commands[0]
        .env
        .iter()
        .map(|v| v.name.value.as_str())
        .collect();
    assert_eq!(names, ["C", "A"]);
}

#[test]
fn an_alias_and_its_key_together_are_an_error() {
    for text in [
        "steps: [{shell: a}]\ncommands: [{shell: b}]\n",
        "- shell: x\n  retry: {}\n  retry_config: {}\n",
        "- shell: x\n  output: a\n  output_file: b\n",
        "- shell: x\n  retry_config: {attempts: 2, max_attempts: 3}\n",
        "- shell: x\n  retry_config: {backoff: {exponential: {base: 2, multiplier: 3}}}\n",
        "- shell: x\n  on_failure: {shell: y, max_attempts: 2, max_retries: 3}\n",
    ] {
        assert_eq!(codes(text), [Code::DuplicateKey], "{text}");
    }
}

#[test]
fn overridden_settings_are_reported() {
    assert_eq!(
        codes("- shell: x\n  timeout: 5\n  metadata: {timeout: 9}\n"),
        [Code::NoEffect]
    );
    assert_eq!(
        codes("- shell: x\n  on_failure: {shell: y, max_attempts: 2}\n  max_attempts: 3\n"),
        [Code::NoEffect]
    );
    assert_eq!(codes("- shell: x\n  temporary: false\n"), [Code::NoEffect]);
    assert_eq!(
        codes("- shell: x\n  retry_config: {max_delay: 5s, backoff: {fixed: {max_delay: 9s}}}\n"),
        [Code::DuplicateKey]
    );
}

#[test]
fn secrets_name_environment_variables() {
    let wf = lower_ok("secrets:\n  A: TOKEN\n  B: \"${env:OTHER}\"\ncommands: [{shell: x}]\n");
    let vars: Vec<String> = wf
        .secrets
        .iter()
        .map(|s| match &s.source {
            crate::ast::SecretSource::Env(v) | crate::ast::SecretSource::File(v) => v.value.clone(),
        })
        .collect();
    assert_eq!(vars, ["TOKEN", "OTHER"]);
    assert_eq!(
        codes("secrets:\n  A: \"a literal value\"\ncommands: [{shell: x}]\n"),
        [Code::WrongType]
    );
}

#[test]
fn foreach_keys_outside_a_flat_foreach_are_reported() {
    assert_eq!(codes("- shell: x\n  parallel: 2\n"), [Code::NoEffect]);
    assert_eq!(
        codes("- foreach:\n    foreach: [a]\n    do: [{shell: echo}]\n  max_items: 3\n"),
        [Code::NoEffect]
    );
    assert_eq!(
        codes("- foreach: [a, b]\n  parallel: 2\n  do:\n    - shell: echo\n"),
        []
    );
    assert_eq!(
        codes("- foreach:\n    foreach: [a]\n    items: [b]\n    do: [{shell: echo}]\n"),
        [Code::DuplicateKey]
    );
    assert_eq!(
        codes(
            "- shell: x\n  validate:\n    shell: check\n    on_incomplete:\n      command: fix\n"
        ),
        [Code::Deprecated]
    );
}

#[test]
fn a_shell_and_claude_handler_mapping_is_lowered_once() {
    let step = first_step(
        "- shell: x\n  on_success:\n    id: both\n    shell: \"echo s\"\n    claude: /c\n    capture: out\n",
    );
    let [shell, claude] = step.on_success.as_slice() else {
        panic!("two steps: {:?}", step.on_success);
    };
    assert!(matches!(shell.command, Command::Shell(_)));
    assert_eq!(shell.id.as_ref().map(|i| i.value.as_str()), Some("both"));
    assert!(shell.capture.is_some());
    assert!(matches!(claude.command, Command::Claude(_)));
    assert!(claude.id.is_none() && claude.capture.is_none());
    // A mistake in the mapping is reported once, not once per step.
    assert_eq!(
        codes("- shell: x\n  on_success:\n    shell: a\n    claude: /c\n    bogus: 1\n"),
        vec![Code::UnknownKey]
    );
}

#[test]
fn retry_on_names_claude_failures() {
    use crate::ast::Matcher;
    let step =
        first_step("- claude: /a\n  retry_config:\n    retry_on: [overloaded, auth, Rate_Limit]\n");
    assert_eq!(
        step.retry.unwrap().retry_on,
        [Matcher::Overloaded, Matcher::Auth, Matcher::RateLimit]
    );
    assert_eq!(
        codes("- claude: /a\n  retry_config:\n    retry_on: overload\n"),
        [Code::UnknownVariant]
    );
}

#[test]
fn claude_mapping_carries_the_settings_of_the_call() {
    let step = first_step(
        "- claude:\n    prompt: /fix ${workflow.name}\n    model: opus\n    max_turns: 3\n    allowed_tools: Read\n    permission_mode: accept_edits\n    add_dirs: [a, b]\n",
    );
    let Command::Claude(prompt) = &step.command else {
        panic!("expected a claude command, got {:?}", step.command);
    };
    assert_eq!(prompt.value, "/fix ${workflow.name}");
    let settings = step.claude.unwrap();
    assert_eq!(settings.model.as_deref(), Some("opus"));
    assert_eq!(settings.max_turns, Some(3));
    // A single string is a list of one; the mode is spelled as the CLI wants it.
    assert_eq!(settings.allowed_tools, Some(vec!["Read".to_owned()]));
    assert_eq!(settings.permission_mode.as_deref(), Some("acceptEdits"));
    assert_eq!(
        settings.add_dirs,
        Some(vec!["a".to_owned(), "b".to_owned()])
    );
    assert_eq!(settings.disallowed_tools, None);
    // The string form has no settings of its own.
    assert!(first_step("- claude: /fix\n").claude.is_none());
}

#[test]
fn claude_settings_are_checked_like_other_fields() {
    assert_eq!(
        codes("- claude:\n    prompt: /a\n    modle: opus\n"),
        [Code::UnknownKey]
    );
    assert_eq!(codes("- claude:\n    model: opus\n"), [Code::MissingKey]);
    assert_eq!(
        codes("- claude:\n    prompt: /a\n    max_budget_usd: -1\n    max_turns: 0\n"),
        [Code::OutOfRange, Code::OutOfRange]
    );
    assert_eq!(
        codes("claude:\n  prompt: /a\ncommands:\n  - claude: /a\n"),
        [Code::UnknownKey]
    );
    // A stall timeout is a duration above 0, in a step and among the defaults.
    assert_eq!(
        codes(
            "claude:\n  stall_timeout: 0s\ncommands:\n  - claude: {prompt: /a, stall_timeout: 10m}\n"
        ),
        [Code::OutOfRange]
    );
    assert_eq!(
        codes(
            "- claude: {prompt: /a, stall_timeout: soon}\n  retry_config: {attempts: 2, retry_on: [stalled]}\n"
        ),
        [Code::InvalidDuration]
    );
    // `retry_on: [stalled]` fires only where a stall timeout applies.
    assert_eq!(
        codes("- claude: /a\n  retry_config: {attempts: 2, retry_on: [stalled]}\n"),
        [Code::RetryNeverFires]
    );
    assert_eq!(
        codes(
            "claude: {stall_timeout: 5m}\ncommands:\n  - claude: /a\n    retry_config: {attempts: 2, retry_on: [stalled]}\n"
        ),
        []
    );
    assert_eq!(
        codes("- shell: x\n  on_failure:\n    claude: {prompt: /fix, max_turns: 2}\n"),
        []
    );
}

#[test]
fn the_claude_budget_is_read_from_the_workflow_defaults_only() {
    let checked = crate::check(&SourceFile::new(
        "t.yml",
        "claude:\n  max_cost_usd: 25\n  on_budget: stop\n  model: opus\ncommands:\n  - claude: /a\n",
    ));
    let plan = checked.plan.unwrap();
    assert_eq!(
        plan.claude_budget,
        Some(crate::plan::ClaudeBudget {
            max_cost_usd: Some(25.0),
            on_budget: crate::plan::OnBudget::Stop,
        })
    );
    // Not a setting of the calls themselves.
    assert_eq!(
        plan.steps[0].claude.as_ref().unwrap().model.as_deref(),
        Some("opus")
    );
    let default = crate::check(&SourceFile::new(
        "t.yml",
        "claude:\n  max_cost_usd: 2\ncommands:\n  - shell: x\n",
    ));
    assert_eq!(
        default.plan.unwrap().claude_budget.map(|b| b.on_budget),
        Some(crate::plan::OnBudget::Finish)
    );
    // In a step, it is an unknown key that says where it goes.
    let step = crate::check(&SourceFile::new(
        "t.yml",
        "- claude:\n    prompt: /a\n    max_cost_usd: 5\n",
    ));
    let [d] = step.diagnostics.as_slice() else {
        panic!("{:#?}", step.diagnostics);
    };
    assert_eq!(d.code, Code::UnknownKey);
    assert!(
        d.help
            .as_deref()
            .unwrap_or_default()
            .contains("top-level `claude:`"),
        "{d:?}"
    );
    assert_eq!(
        codes("claude:\n  max_cost_usd: 0\n  on_budget: later\ncommands:\n  - shell: x\n"),
        [Code::OutOfRange, Code::UnknownVariant]
    );
}

#[test]
fn a_step_overrides_the_workflow_claude_defaults_field_by_field() {
    let checked = crate::check(&SourceFile::new(
        "t.yml",
        "claude:\n  model: sonnet\n  max_turns: 9\n  allowed_tools: [Read]\ncommands:\n  - claude: /a\n  - claude: {prompt: /b, model: opus, allowed_tools: []}\n  - shell: x\n",
    ));
    let plan = checked.plan.unwrap();
    let [a, b, shell] = plan.steps.as_slice() else {
        panic!("three steps expected");
    };
    let a = a.claude.as_ref().unwrap();
    assert_eq!((a.model.as_deref(), a.max_turns), (Some("sonnet"), Some(9)));
    let b = b.claude.as_ref().unwrap();
    assert_eq!((b.model.as_deref(), b.max_turns), (Some("opus"), Some(9)));
    // An empty list given by the step clears the default's.
    assert_eq!(b.allowed_tools, Some(Vec::new()));
    assert!(shell.claude.is_none());
    assert_eq!(plan.claude.unwrap().model.as_deref(), Some("sonnet"));
}

#[test]
fn slurm_options_become_sbatch_options() {
    let wf = lower_ok(
        "mode: mapreduce\nslurm:\n  partition: gpu\n  account: team\n  time: \"1-02:00:00\"\n  cpus_per_task: 4\n  mem: 8G\n  sbatch_args: [\"--qos=long\"]\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    assert_eq!(
        wf.slurm.unwrap().sbatch_options(),
        [
            "--partition=gpu",
            "--account=team",
            "--time=1-02:00:00",
            "--cpus-per-task=4",
            "--mem=8G",
            "--qos=long"
        ]
    );
}

#[test]
fn slurm_no_shared_fs_and_serve_are_read_and_serve_must_be_an_address() {
    let wf = lower_ok(
        "mode: mapreduce\nexecutor:\n  slurm:\n    no_shared_fs: true\n    serve: \"10.0.0.5:7841\"\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    let slurm = wf.slurm.unwrap();
    assert!(slurm.no_shared_fs);
    assert_eq!(slurm.serve.as_ref().unwrap().value, "10.0.0.5:7841");
    assert!(slurm.sbatch_options().is_empty());
    let text = "mode: mapreduce\nexecutor:\n  slurm:\n    serve: head-node\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n";
    assert_eq!(codes(text), [Code::WrongType]);
}

#[test]
fn slurm_time_and_mem_must_be_forms_slurm_takes() {
    for good in [
        "30",
        "30:00",
        "1:30:00",
        "2-0",
        "2-01:00",
        "2-01:00:00",
        "UNLIMITED",
    ] {
        assert!(crate::ast::is_slurm_time(good), "{good}");
    }
    for bad in ["", "1h", "an hour", "1:2:3:4", "-1", "2-", "1.5"] {
        assert!(!crate::ast::is_slurm_time(bad), "{bad}");
    }
    for good in ["4096", "4G", "512M", "1T"] {
        assert!(crate::ast::is_slurm_mem(good), "{good}");
    }
    for bad in ["", "G", "4GB", "lots", "1.5G"] {
        assert!(!crate::ast::is_slurm_mem(bad), "{bad}");
    }
    let text = "mode: mapreduce\nslurm:\n  time: \"an hour\"\n  mem: lots\n  cpus_per_task: 0\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n";
    assert_eq!(
        codes(text),
        [Code::InvalidDuration, Code::WrongType, Code::OutOfRange]
    );
}

#[test]
fn slurm_in_a_standard_workflow_has_no_effect() {
    assert_eq!(
        codes("slurm:\n  partition: debug\ncommands:\n  - shell: \"true\"\n"),
        [Code::NoEffect]
    );
}

#[test]
fn a_max_delay_set_twice_names_the_retry_mapping_it_is_in() {
    let labels = |text: &str| -> Vec<String> {
        crate::check(&SourceFile::new("t.yml", text))
            .diagnostics
            .iter()
            .filter(|d| d.code == Code::DuplicateKey)
            .flat_map(|d| d.labels.iter().map(|l| l.text.clone()))
            .collect()
    };
    let step = "- shell: \"true\"\n  retry_config:\n    attempts: 2\n    max_delay: 1s\n    backoff:\n      exponential:\n        base: 2\n        max_delay: 2s\n";
    assert_eq!(labels(step), ["and in `retry_config`"]);
    let policy = "mode: mapreduce\nmap:\n  input: x.json\n  agent_template:\n    - shell: \"true\"\nerror_policy:\n  retry_config:\n    max_attempts: 2\n    max_delay: 1s\n    backoff:\n      exponential:\n        base: 2\n        max_delay: 2s\n";
    assert_eq!(labels(policy), ["and in `error_policy.retry_config`"]);
}

/// V001 lists the keys written today: no removed (`analyze`, `goal_seek`) or deprecated
/// (`test`, `command`) key, and suggests none of them.
#[test]
fn unknown_key_help_names_only_current_keys() {
    let checked = crate::check(&SourceFile::new("t.yml", "- shell: x\n  zzzzzzzzzz: 1\n"));
    let help = checked.diagnostics[0].help.clone().unwrap();
    assert!(
        help.contains("`shell`") && help.contains("`timeout`"),
        "{help}"
    );
    for old in [
        "`analyze`",
        "`goal_seek`",
        "`test`",
        "`command`",
        "`analysis`",
    ] {
        assert!(!help.contains(old), "{old}: {help}");
    }
    let checked = crate::check(&SourceFile::new("t.yml", "- shell: x\n  analyse: 1\n"));
    let help = checked.diagnostics[0].help.clone().unwrap();
    assert!(
        !help.contains("`analyze`") && !help.contains("`analysis`"),
        "{help}"
    );
}

#[test]
fn on_retry_is_a_call_setting_with_a_workflow_default() {
    let checked = crate::check(&SourceFile::new(
        "t.yml",
        "claude:\n  on_retry: continue\ncommands:\n  - claude: /a\n  - claude: {prompt: /b, on_retry: fresh}\n",
    ));
    assert!(checked.diagnostics.is_empty(), "{:#?}", checked.diagnostics);
    let plan = checked.plan.unwrap();
    let on_retry = |i: usize| plan.steps[i].claude.as_ref().and_then(|c| c.on_retry);
    assert_eq!(on_retry(0), Some(crate::plan::OnRetry::Continue));
    assert_eq!(on_retry(1), Some(crate::plan::OnRetry::Fresh));
    assert_eq!(
        codes("- claude: {prompt: /a, on_retry: resume}\n"),
        [Code::UnknownVariant]
    );
}

#[test]
fn worktree_paths_stay_in_the_repository_and_sparse_is_for_agents() {
    let wf = lower_ok(
        "worktree:\n  copy: [.env, \"config/*.local\"]\n  link: [node_modules]\n  setup:\n    - shell: \"npm ci\"\ncommands:\n  - shell: \"true\"\n",
    );
    let prep = wf.worktree.unwrap();
    assert_eq!(prep.copy.len(), 2);
    assert_eq!(prep.setup.len(), 1);
    for bad in ["/abs", "a/../../b", "..", "~/x", "\"\""] {
        assert_eq!(
            codes(&format!(
                "worktree:\n  link: [{bad}]\ncommands:\n  - shell: \"true\"\n"
            )),
            [Code::WorktreePathEscapes],
            "{bad}"
        );
    }
    // Only map agents are sparse, cleaned between items or kept for the next job.
    assert_eq!(
        codes(
            "worktree:\n  sparse: [src]\n  keep: [target]\n  persist: true\ncommands:\n  - shell: \"true\"\n"
        ),
        [Code::NoEffect, Code::NoEffect, Code::NoEffect]
    );
    // Spares are whole checkouts: a sparse agent's worktree is not kept.
    assert_eq!(
        codes(
            "mode: mapreduce\nworktree:\n  sparse: [src]\n  persist: true\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"true\"\n"
        ),
        [Code::NoEffect]
    );
    assert!(
        codes(
            "mode: mapreduce\nworktree:\n  persist: true\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"true\"\n"
        )
        .is_empty()
    );
}

#[test]
fn notify_entries_lower_with_their_events_and_a_bounded_timeout() {
    use crate::ast::NotifyEvent::{Failed, Finished, Paused};
    let wf = lower_ok(
        "commands:\n  - shell: make\nnotify:\n  - on: [finished, failed]\n    shell: \"echo done\"\n  - on: paused\n    claude: \"/tell\"\n    timeout: 5s\n",
    );
    let on: Vec<Vec<crate::ast::NotifyEvent>> = wf
        .notify
        .iter()
        .map(|n| n.on.iter().map(|e| e.value).collect())
        .collect();
    assert_eq!(on, [vec![Finished, Failed], vec![Paused]]);
    let timeouts: Vec<_> = wf
        .notify
        .iter()
        .map(|n| n.step.timeout.as_ref().map(|t| t.value))
        .collect();
    assert_eq!(
        timeouts,
        [
            Some(crate::plan::DEFAULT_NOTIFY_TIMEOUT),
            Some(std::time::Duration::from_secs(5))
        ]
    );
}

#[test]
fn a_notify_entry_needs_known_events_and_one_command() {
    assert_eq!(
        codes("commands:\n  - shell: make\nnotify:\n  - on: [finishd]\n    shell: \"echo\"\n"),
        [Code::UnknownNotifyEvent]
    );
    assert_eq!(
        codes("commands:\n  - shell: make\nnotify:\n  - on: [failed]\n"),
        [Code::NoCommand]
    );
    assert_eq!(
        codes(
            "commands:\n  - shell: make\nnotify:\n  - on: [failed]\n    shell: a\n    claude: b\n"
        ),
        [Code::MultipleCommands]
    );
    assert_eq!(
        codes("commands:\n  - shell: make\nnotify:\n  - shell: a\n"),
        [Code::MissingKey]
    );
}

#[test]
fn the_executor_section_names_the_container_and_slurm_options() {
    let wf = lower_ok(
        "mode: mapreduce\nexecutor:\n  slurm:\n    partition: gpu\n  container:\n    image: localhost/agent:1\n    network: true\n    cpus: 1.5\n    memory: 2g\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    assert_eq!(wf.slurm.unwrap().sbatch_options(), ["--partition=gpu"]);
    let c = wf.container.unwrap();
    assert_eq!(c.image.unwrap().value, "localhost/agent:1");
    assert!(c.network);
    assert!((c.cpus.unwrap().value - 1.5).abs() < f64::EPSILON);
    assert_eq!(c.memory.unwrap().value, "2g");
}

#[test]
fn a_top_level_slurm_beside_executor_slurm_has_no_effect() {
    assert_eq!(
        codes(
            "mode: mapreduce\nslurm:\n  partition: a\nexecutor:\n  slurm:\n    partition: b\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n"
        ),
        [Code::NoEffect]
    );
    assert_eq!(
        codes(
            "mode: mapreduce\nexecutor:\n  container:\n    imagee: x\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n"
        ),
        [Code::UnknownKey]
    );
}

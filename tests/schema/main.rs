//! `prodigy schema` with a real JSON Schema validator: every valid workflow passes, wrong
//! types and unknown keys fail.

#![expect(
    clippy::unwrap_used,
    clippy::disallowed_methods,
    reason = "a test reads fixtures and fails loudly"
)]

use std::path::PathBuf;

use prodigy_compiler::source::SourceFile;
use serde_json::Value;

fn validator() -> jsonschema::Validator {
    let schema = prodigy_compiler::schema::schema();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn as_json(text: &str) -> Value {
    let file = SourceFile::new("x.yml", text);
    prodigy_compiler::syntax::parse(&file)
        .root
        .unwrap()
        .to_json()
}

fn files(dir: &str) -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no workflows in {dir}");
    files
}

#[test]
fn every_valid_workflow_passes() {
    let validator = validator();
    for path in files("workflows/ok")
        .into_iter()
        .chain(files("workflows/examples"))
    {
        let value = as_json(&std::fs::read_to_string(&path).unwrap());
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }
}

#[test]
fn wrong_types_and_unknown_keys_fail() {
    let validator = validator();
    for text in [
        "commands: \"echo hi\"\n",
        "commands:\n  - shell: make\n    timeout: [1]\n",
        "commands:\n  - shell: make\n    retry_config:\n      attempts: many\n",
        "commands:\n  - shell: make\n    retry_config:\n      max_attemps: 3\n",
        "comands:\n  - shell: make\n",
        "name: x\nmode: mapreduce\nmap:\n  input: i.json\n  agent_template: [{shell: a}]\nerror_policy:\n  failure_threshold: 1.5\n",
        "- shell: make\n  capture_format: jsn\n",
        "- shell: make\n  retry_config:\n    initial_delay: 500\n",
        "- shell: make\n  retry_config:\n    max_delay: \"30\"\n",
    ] {
        assert!(
            !validator.is_valid(&as_json(text)),
            "the schema accepts:\n{text}"
        );
    }
}

#[test]
fn the_command_prints_the_schema() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_prodigy"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(output.status.success());
    let schema: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(jsonschema::draft202012::meta::is_valid(&schema));
}

#[test]
fn claude_settings_and_defaults_are_in_the_schema() {
    let validator = validator();
    for text in [
        "claude:\n  model: sonnet\n  max_turns: 5\n  allowed_tools: Read\ncommands:\n  - claude: {prompt: /a, permission_mode: plan, add_dirs: [x, y], max_budget_usd: 1.5}\n",
        "- shell: make\n  retry_config:\n    retry_on: [overloaded, auth]\n",
        "- shell: make\n  on_failure:\n    claude: {prompt: /fix, model: opus}\n",
    ] {
        let errors: Vec<String> = validator
            .iter_errors(&as_json(text))
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{text}: {errors:?}");
    }
    for text in [
        "- claude: {prompt: /a, max_turn: 5}\n",
        "- claude: {prompt: /a, permission_mode: yolo}\n",
        "- claude: {prompt: /a, max_turns: 0}\n",
        "claude:\n  prompt: /a\ncommands:\n  - claude: /a\n",
        "- shell: make\n  retry_config:\n    retry_on: overload\n",
    ] {
        assert!(
            !validator.is_valid(&as_json(text)),
            "the schema accepts:\n{text}"
        );
    }
}

/// The `err` fixtures whose error JSON Schema can express: the schema refuses each, as
/// `check` does.
const REFUSED: &[&str] = &[
    "V001-unknown-claude-setting",
    "V001-unknown-key",
    "V002-claude-without-prompt",
    "V002-missing-key",
    "V003-no-command",
    "V004-multiple-commands",
    "V009-removed-feature",
    "V101-wrong-type",
    "V102-delay-without-unit",
    "V103-claude-budget",
    "V103-out-of-range",
    "V104-permission-mode",
    "V104-unknown-variant",
    "V105-invalid-exit-code",
    "V107-invalid-file-mode",
];

#[test]
fn the_err_fixtures_it_can_express_fail() {
    let validator = validator();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("workflows/err");
    for stem in REFUSED {
        let text = std::fs::read_to_string(dir.join(format!("{stem}.yml"))).unwrap();
        assert!(
            !validator.is_valid(&as_json(&text)),
            "the schema accepts workflows/err/{stem}.yml"
        );
    }
}

#[test]
fn removed_required_and_patterned_keys_agree_with_check() {
    let validator = validator();
    for text in [
        "- shell: make\n  on_exit_code:\n    1: {shell: a}\n    \"255\": [{shell: b}]\n",
        "- shell: make\n  on_success:\n    shell: a\n    claude: /b\n",
        "- write_file: {path: a.txt, content: x, mode: \"0755\"}\n",
        "- name: legacy-command\n",
    ] {
        let errors: Vec<String> = validator
            .iter_errors(&as_json(text))
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{text}: {errors:?}");
    }
    for text in [
        "- goal_seek: {goal: x}\n",
        "- shell: make\n  on_exit_code:\n    256: {shell: a}\n",
        "- write_file: {content: x}\n",
        "- write_file: {path: a.txt, content: x, mode: \"0o8\"}\n",
        "- shell: make\n  write_file: {path: a.txt, content: x}\n",
        "- test: {on_failure: true}\n",
    ] {
        assert!(
            !validator.is_valid(&as_json(text)),
            "the schema accepts:\n{text}"
        );
    }
    // A removed key carries the message that says what replaces it; a deprecated one is marked.
    let schema = prodigy_compiler::schema::schema();
    let analyze = &schema["$defs"]["step_mapping"]["properties"]["analyze"];
    assert_eq!(analyze["not"], serde_json::json!({}));
    assert!(
        analyze["errorMessage"]
            .as_str()
            .unwrap()
            .contains("run an analysis tool with `shell:`")
    );
    assert_eq!(
        schema["$defs"]["step_mapping"]["properties"]["test"]["deprecated"],
        true
    );
}

/// `docs/reference.md` is what `prodigy schema --markdown` prints from the shape tables.
#[test]
fn the_field_reference_is_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == prodigy_compiler::schema::markdown(),
        "docs/reference.md is stale: regenerate it with\n\n    cargo run -q -- schema --markdown > docs/reference.md\n"
    );
}

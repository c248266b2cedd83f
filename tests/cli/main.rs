//! The `prodigy` binary as users run it: exit codes, output formats, `explain`.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::fmt::Write as _;
use std::path::PathBuf;

use assert_cmd::Command;
use predicates::prelude::*;

fn prodigy() -> Command {
    let mut cmd = Command::cargo_bin("prodigy").unwrap();
    // A home without `~/.claude`: the user's own Claude commands do not change what
    // `check` says about the fixtures (W008).
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"));
    cmd
}

/// Runs `prodigy check --format json ARGS`, expects exit `code`, and parses stdout.
fn check_json<I, S>(args: I, code: i32) -> serde_json::Value
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let output = prodigy()
        .args(["check", "--format", "json"])
        .args(args)
        .assert()
        .code(code)
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&output).unwrap()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn clean_file_exits_zero() {
    prodigy()
        .args(["check", "workflows/ok/seed-000-on-failure-simple-forms.yml"])
        .assert()
        .code(0)
        .stderr(predicate::str::contains(
            "checked 1 file: no problems found",
        ));
}

#[test]
fn check_quiet_prints_only_problems() {
    prodigy()
        .args([
            "check",
            "-q",
            "workflows/ok/seed-000-on-failure-simple-forms.yml",
        ])
        .assert()
        .code(0)
        .stdout("")
        .stderr("");
    prodigy()
        .args(["check", "--quiet", "workflows/err/V001-unknown-key.yml"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("V001"))
        .stderr(predicate::str::contains("checked 1 file: 1 error"));
}

#[test]
fn errors_exit_one_with_the_place_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "w.yml",
        "commands:\n  - shell: make\n    retry_config:\n      max_attemps: 3\n",
    );
    prodigy()
        .arg("check")
        .arg(&path)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "unknown key `max_attemps` in `retry_config`",
        ))
        .stdout(predicate::str::contains("w.yml:4:7"))
        .stdout(predicate::str::contains("did you mean `max_attempts`?"))
        .stderr(predicate::str::contains("1 error"));
}

#[test]
fn warnings_pass_unless_denied() {
    let warn = "workflows/err/W003-empty-workflow.yml";
    prodigy()
        .args(["check", warn])
        .assert()
        .code(0)
        .stderr(predicate::str::contains("1 warning"));
    prodigy()
        .args(["check", "--deny", "warnings", warn])
        .assert()
        .code(1);
}

#[test]
fn unreadable_file_exits_two() {
    prodigy()
        .args(["check", "does/not/exist.yml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot read `does/not/exist.yml`"));
}

#[path = "../support/external.rs"]
mod external;
mod lint;

#[test]
fn usage_error_exits_two() {
    prodigy()
        .args(["check", "--no-such-flag", "x.yml"])
        .assert()
        .code(2);
    prodigy()
        .args(["check", "--format", "xml", "x.yml"])
        .assert()
        .code(2);
}

#[test]
fn json_output_follows_the_contract() {
    let json = check_json(
        [
            "workflows/err/V001-unknown-key.yml",
            "workflows/ok/seed-002-setup-simple-array.yml",
        ],
        1,
    );
    assert_eq!(json["version"], 1);
    let diagnostics = json["diagnostics"].as_array().unwrap();
    assert!(!diagnostics.is_empty());
    let first = &diagnostics[0];
    for key in [
        "file",
        "code",
        "severity",
        "message",
        "help",
        "line",
        "column",
        "end_line",
        "end_column",
        "labels",
    ] {
        assert!(first.get(key).is_some(), "missing `{key}` in {first}");
    }
    assert_eq!(first["file"], "workflows/err/V001-unknown-key.yml");
    assert_eq!(first["code"], "V001");
    assert_eq!(first["severity"], "error");
    assert!(first["line"].as_u64().unwrap() >= 1);
    assert!(first["labels"][0]["primary"].as_bool().unwrap());
}

#[test]
fn json_positions_are_one_based_lines_and_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "w.yml", "name: x\ncomands:\n  - shell: make\n");
    let json = check_json([&path], 1);
    let d = &json["diagnostics"][0];
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (d["end_line"].as_u64(), d["end_column"].as_u64()),
        (Some(2), Some(8))
    );
    assert_eq!(d["help"], "did you mean `commands`?");
}

#[test]
fn explain_prints_the_long_explanation() {
    prodigy()
        .args(["explain", "v001"])
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with("# V001"));
    prodigy()
        .args(["explain"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("W002"));
    prodigy()
        .args(["explain", "X999"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown code `X999`"));
}

#[test]
fn every_problem_is_reported_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let text = "commands:\n  - shell: a\n    claude: b\n    timeout: soon\n  - shell: c\n    capture_format: jsn\n    capture: x\n";
    let path = write(&dir, "w.yml", text);
    let json = check_json([&path], 1);
    let codes: Vec<&str> = json["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["V004", "V102", "V104"]);
}

#[test]
fn billion_laughs_is_rejected() {
    let mut text = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..12 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        writeln!(text, "a{i}: &a{i} [{refs}]").unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "bomb.yml", &text);
    prodigy()
        .arg("check")
        .arg(&path)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("P002"));
}

#[test]
fn absurd_retry_settings_are_diagnosed_not_crashed_on() {
    let dir = tempfile::tempdir().unwrap();
    let many = write(
        &dir,
        "many.yml",
        "- shell: \"true\"\n  retry_config:\n    attempts: 4000000000\n- shell: \"true\"\n  metadata:\n    retries: 4000000000\n- shell: \"true\"\n  timeout: 1e30\n",
    );
    let codes: Vec<String> = check_json([many.to_str().unwrap()], 1)["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(codes, ["V103", "V103", "V102"]);
    // Delays that overflow any clock saturate in the schedule and the worst case.
    let long = write(
        &dir,
        "long.yml",
        "- shell: \"true\"\n  timeout: 500000000000y\n  retry_config:\n    attempts: 1000\n    max_delay: 500000000000y\n    backoff:\n      linear:\n        increment: 500000000000y\n",
    );
    prodigy()
        .args(["check", "--explain-retries"])
        .arg(&long)
        .assert()
        .code(0);
    prodigy().arg("graph").arg(&long).assert().code(0);
}

#[test]
fn items_prints_what_the_map_phase_would_process() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir,
        "wf.yml",
        "mode: mapreduce\nmap:\n  input: items.json\n  json_path: \"$.items[*]\"\n  filter: \"score > 1\"\n  sort_by: \"score DESC\"\n  max_items: 2\n  agent_template:\n    - shell: \"true\"\n",
    );
    write(
        &dir,
        "items.json",
        r#"{"items": [{"id": "a", "score": 1}, {"id": "b", "score": 5}, {"id": "c", "score": 3}, {"id": "d", "score": 4}]}"#,
    );
    let output = prodigy()
        .current_dir(dir.path())
        .args(["items", "wf.yml"])
        .assert()
        .code(0)
        .get_output()
        .clone();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "{\"id\":\"b\",\"score\":5}\n{\"id\":\"d\",\"score\":4}\n"
    );
    let counts = String::from_utf8_lossy(&output.stderr);
    assert!(counts.contains("4 selected, 3 after filter"), "{counts}");
    // A workflow with errors prints them on stderr and nothing on stdout.
    write(
        &dir,
        "bad.yml",
        "mode: mapreduce\nmap:\n  input: items.json\n  filter: \"score >\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    prodigy()
        .current_dir(dir.path())
        .args(["items", "bad.yml"])
        .assert()
        .code(1)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("P10"));
}

/// A command as the map input is run as `run` runs it, in the project, and its output goes
/// through the pipeline; a command that fails says so; a missing file is still a missing
/// file.
#[test]
fn items_runs_an_input_command() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir,
        "wf.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_items: 2\n  agent_template:\n    - shell: \"true\"\n",
    );
    let output = prodigy()
        .current_dir(dir.path())
        .args(["items", "wf.yml"])
        .assert()
        .code(0)
        .get_output()
        .clone();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "\"1\"\n\"2\"\n");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("the output of the map input command `seq 1 3`"),
        "{said}"
    );
    assert!(!said.contains("cannot read"), "{said}");
    write(
        &dir,
        "fails.yml",
        "mode: mapreduce\nmap:\n  input: \"echo no items here >&2; exit 3\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    prodigy()
        .current_dir(dir.path())
        .args(["items", "fails.yml"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("no items here"));
    write(
        &dir,
        "missing.yml",
        "mode: mapreduce\nmap:\n  input: gone.json\n  agent_template:\n    - shell: \"true\"\n",
    );
    prodigy()
        .current_dir(dir.path())
        .args(["items", "missing.yml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gone.json"));
}

#[test]
fn items_counts_only_the_stages_the_workflow_has() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir, "items.json", r#"[{"k": 1}, {"k": 1}, {"k": 2}]"#);
    let counts = |workflow: &str| {
        write(&dir, "wf.yml", workflow);
        let output = prodigy()
            .current_dir(dir.path())
            .args(["items", "wf.yml"])
            .assert()
            .code(0)
            .get_output()
            .clone();
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let plain = counts(
        "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"true\"\n",
    );
    assert_eq!(plain, "items: 3 selected, 3 kept\n");
    let distinct = counts(
        "mode: mapreduce\nmap:\n  input: items.json\n  distinct: k\n  agent_template:\n    - shell: \"true\"\n",
    );
    assert_eq!(distinct, "items: 3 selected, 2 after distinct, 2 kept\n");
}

#[test]
fn graph_draws_dot_mermaid_and_json() {
    let example = "workflows/examples/build-and-test.yml";
    prodigy()
        .args(["graph", example])
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with("digraph workflow {"))
        .stdout(predicate::str::contains("retry ×2: 100ms, 200ms"));
    prodigy()
        .args(["graph", "--format", "mermaid", example])
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with("flowchart TD"));
    let output = prodigy()
        .args(["graph", "--format", "json", example])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let json: serde_json::Value = serde_json::from_slice(&output).unwrap();
    assert!(
        json["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "retry")
    );
    prodigy()
        .args(["graph", "workflows/err/V001-unknown-key.yml"])
        .assert()
        .code(1);
}

/// Every step node says where it was written: DOT in a tooltip, Mermaid in a comment after
/// the node, JSON in its origin; a handler points at its own line, a fallback at its command's.
#[test]
fn graph_nodes_point_at_the_lines_their_steps_were_written_on() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir,
        "w.yml",
        "name: lines\ncommands:\n  - shell: make\n\n  - name: deploy\n    shell: ./deploy.sh\n    \
         retry_config:\n      attempts: 3\n      on_failure:\n        fallback: ./rollback.sh\n    \
         on_failure:\n      shell: echo deploy failed\n",
    );
    let graph = |format: &str| {
        let output = prodigy()
            .current_dir(dir.path())
            .args(["graph", "--format", format, "w.yml"])
            .assert()
            .code(0)
            .get_output()
            .stdout
            .clone();
        String::from_utf8(output).unwrap()
    };
    let dot = graph("dot");
    for node in [
        r#"[label="shell: make", tooltip="w.yml:3\nmake"]"#,
        r#"[label="shell: deploy", tooltip="w.yml:5\n./deploy.sh"]"#,
        r#"[label="fallback of shell: deploy", tooltip="w.yml:10"]"#,
        r#"[label="shell: echo deploy failed", tooltip="w.yml:12\necho deploy failed"]"#,
        r#"[label="retry ×2: 1s, 2s", tooltip="w.yml:5","#,
    ] {
        assert!(dot.contains(node), "{node} not in\n{dot}");
    }
    let mermaid = graph("mermaid");
    for node in [
        "  n4[\"shell: deploy\"]\n  %% n4: w.yml:5\n",
        "  n5[\"fallback of shell: deploy\"]\n  %% n5: w.yml:10\n",
        "  n6[\"shell: echo deploy failed\"]\n  %% n6: w.yml:12\n",
    ] {
        assert!(mermaid.contains(node), "{node} not in\n{mermaid}");
    }
    let json: serde_json::Value = serde_json::from_str(&graph("json")).unwrap();
    let origins: Vec<(&str, &serde_json::Value)> = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["kind"] == "step" || n["kind"] == "fallback")
        .map(|n| (n["label"].as_str().unwrap(), &n["origin"]))
        .collect();
    assert_eq!(
        origins,
        [
            (
                "shell: make",
                &serde_json::json!({"file": "w.yml", "line": 3, "column": 5})
            ),
            (
                "shell: deploy",
                &serde_json::json!({"file": "w.yml", "line": 5, "column": 5})
            ),
            (
                "fallback of shell: deploy",
                &serde_json::json!({"file": "w.yml", "line": 10, "column": 19})
            ),
            (
                "shell: echo deploy failed",
                &serde_json::json!({"file": "w.yml", "line": 12, "column": 7})
            ),
        ]
    );
}

/// `--explain-costs`: a Claude step's worst case is its `max_budget_usd` times its runs,
/// per item in a map agent (times the item's runs), with the workflow's `max_cost_usd`.
#[test]
fn check_explains_the_worst_case_cost_of_claude_steps() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(
        &dir,
        "job.yml",
        "mode: mapreduce\nclaude:\n  max_budget_usd: 2\n  max_cost_usd: 25\nsetup:\n  - claude: /plan\n    retry_config:\n      attempts: 3\nmap:\n  input: items.json\n  agent_template:\n    - claude: \"/fix ${item}\"\n      on_failure:\n        claude: \"/repair ${item}\"\n        max_attempts: 2\nerror_policy:\n  retry_config:\n    max_attempts: 2\n",
    );
    let out = prodigy()
        .args(["check", "--explain-costs"])
        .arg(&job)
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let row = |label: &str| {
        text.lines()
            .find(|l| l.contains(label))
            .and_then(|l| l.split_once(label))
            .unwrap_or_else(|| panic!("no {label} in:\n{text}"))
            .1
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Setup: $2 × 3 attempts, once.
    assert_eq!(row("/plan"), "$2.00 3 $6.00");
    // The agent's step: $2 × 2 runs of `on_failure` × 2 runs of the item, per item.
    assert_eq!(row("/fix ${item}"), "$2.00 4 $8.00 per item");
    assert_eq!(row("/repair ${item}"), "$2.00 2 $4.00 per item");
    assert!(
        text.contains("worst case outside the map agents: $6.00"),
        "{text}"
    );
    assert!(
        text.contains("`max_cost_usd` caps the whole run at $25.00"),
        "{text}"
    );
}

#[test]
fn check_emits_the_plan_and_explains_retries() {
    let example = "workflows/examples/build-and-test.yml";
    let output = prodigy()
        .args(["check", "--emit", "plan", example])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let plan: serde_json::Value = serde_json::from_slice(&output).unwrap();
    assert_eq!(plan["version"], 1);
    assert_eq!(plan["commands"].as_array().unwrap().len(), 5);
    prodigy()
        .args(["check", "--explain-retries", example])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("100ms, 200ms"))
        .stdout(predicate::str::contains("worst case"));
    // A warning denied is an error: the report is shown, not the plan.
    let dir = tempfile::tempdir().unwrap();
    let warned = write(&dir, "w.yml", "- shell: \"true\"\n  when: \"false\"\n");
    prodigy()
        .args(["check", "--deny", "warnings", "--emit", "plan"])
        .arg(&warned)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("G001"))
        .stdout(predicate::str::contains("\"version\"").not());
}

#[test]
fn circuit_breakers_are_checked_against_the_real_input() {
    prodigy()
        .args([
            "check",
            "--format",
            "json",
            "workflows/err/G004-breaker-never-opens.yml",
        ])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("\"G004\""));
}

#[test]
fn sarif_output_has_rules_and_results() {
    let output = prodigy()
        .args([
            "check",
            "--format",
            "sarif",
            "workflows/err/V004-multiple-commands.yml",
            "workflows/err/W006-unquoted-item.yml",
        ])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let sarif: serde_json::Value = serde_json::from_slice(&output).unwrap();
    assert_official_sarif(&sarif);
    assert_eq!(sarif["version"], "2.1.0");
    let run = &sarif["runs"][0];
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    assert!(rules.iter().any(|r| r["id"] == "W006"));
    // The W006 fixture's map input file is not in the repository (W012).
    let results: Vec<&serde_json::Value> = run["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ruleId"] != "W012")
        .collect();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["ruleId"], "V004");
    assert_eq!(results[0]["level"], "error");
    assert_eq!(
        results[0]["locations"][0]["physicalLocation"]["region"]["startLine"],
        3
    );
    assert_eq!(results[1]["level"], "warning");
    // Every result points at a rule by its index.
    for r in results {
        let index = usize::try_from(r["ruleIndex"].as_u64().unwrap()).unwrap();
        assert_eq!(rules[index]["id"], r["ruleId"]);
    }
}

/// The structure SARIF 2.1.0 requires of what `check` writes (the required properties and
/// value forms of the OASIS schema for the objects it uses), as a JSON Schema.
fn sarif_structure() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "required": ["version", "runs"],
        "properties": {
            "version": {"enum": ["2.1.0"]},
            "runs": {"type": "array", "items": {"$ref": "#/$defs/run"}},
        },
        "$defs": {
            "run": {
                "type": "object",
                "required": ["tool"],
                "properties": {
                    "tool": {
                        "type": "object",
                        "required": ["driver"],
                        "properties": {"driver": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"rules": {"type": "array", "items": {
                                "type": "object", "required": ["id"],
                            }}},
                        }},
                    },
                    "columnKind": {"enum": ["utf16CodeUnits", "unicodeCodePoints"]},
                    "results": {"type": "array", "items": {"$ref": "#/$defs/result"}},
                },
            },
            "result": {
                "type": "object",
                "required": ["message"],
                "properties": {
                    "message": {"type": "object", "required": ["text"]},
                    "ruleIndex": {"type": "integer", "minimum": -1},
                    "level": {"enum": ["none", "note", "warning", "error"]},
                    "locations": {"type": "array", "items": {"$ref": "#/$defs/location"}},
                    "relatedLocations": {"type": "array", "items": {"$ref": "#/$defs/location"}},
                },
            },
            "location": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": -1},
                    "physicalLocation": {
                        "type": "object",
                        "properties": {
                            "artifactLocation": {"$ref": "#/$defs/artifactLocation"},
                            "region": {"$ref": "#/$defs/region"},
                        },
                    },
                },
            },
            "artifactLocation": {
                "type": "object",
                "properties": {"uri": {"type": "string", "format": "uri-reference"}},
            },
            "region": {
                "type": "object",
                "properties": {
                    "startLine": {"type": "integer", "minimum": 1},
                    "startColumn": {"type": "integer", "minimum": 1},
                    "endLine": {"type": "integer", "minimum": 1},
                    "endColumn": {"type": "integer", "minimum": 1},
                },
            },
        },
    })
}

/// The official SARIF 2.1.0 JSON Schema (OASIS), as the `serde-sarif` dev-dependency ships it
/// in its source: found through `cargo metadata`, so that no copy of it lives here.
#[expect(clippy::disallowed_methods, reason = "a test reads the schema file")]
fn official_sarif_schema() -> serde_json::Value {
    // This platform's packages only: the others may never have been downloaded.
    let rustc = std::path::Path::new(env!("CARGO")).with_file_name("rustc");
    let version = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let host = version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap();
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let manifest = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "serde-sarif")
        .and_then(|p| p["manifest_path"].as_str())
        .unwrap();
    let schema = std::path::Path::new(manifest).with_file_name("src/schema.json");
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&schema).unwrap()).unwrap();
    assert_eq!(
        schema["title"],
        "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    );
    schema
}

/// `sarif` is valid by the official schema, and reads as the `serde-sarif` crate's typed log.
fn assert_official_sarif(sarif: &serde_json::Value) {
    let official = jsonschema::options()
        .should_validate_formats(true)
        .build(&official_sarif_schema())
        .unwrap();
    let errors: Vec<String> = official.iter_errors(sarif).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "the official SARIF 2.1.0 schema: {errors:?}"
    );
    serde_json::from_value::<serde_sarif::sarif::Sarif>(sarif.clone()).unwrap();
    // The schema has teeth: the file name as it is (not percent-encoded) is no URI reference.
    let mut raw = sarif.clone();
    if let Some(location) = raw.pointer_mut("/runs/0/results/0/locations/0/physicalLocation") {
        location["artifactLocation"]["uri"] = "my file%20#1.yml".into();
        assert!(!official.is_valid(&raw));
    }
}

/// A file whose name needs percent-encoding, with an error after emoji on its line: SARIF's
/// URI is RFC 3986, its columns are of the kind it declares and equal to `--format json`'s,
/// and the human report's `file:line:column` counts characters too.
#[test]
fn sarif_uris_are_encoded_and_every_format_counts_columns_alike() {
    let dir = tempfile::tempdir().unwrap();
    let name = "my file%20#1.yml";
    let text = "- {shell: \"echo 🎉🎉🎉\", bogus: 1}\n";
    std::fs::write(dir.path().join(name), text).unwrap();
    let column = text[..text.find("bogus").unwrap()].chars().count() + 1;
    let run = |format: &str| {
        prodigy()
            .current_dir(dir.path())
            .args(["check", "--format", format, name])
            .assert()
            .code(1)
            .get_output()
            .clone()
    };
    let sarif: serde_json::Value = serde_json::from_slice(&run("sarif").stdout).unwrap();
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&sarif_structure())
        .unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&sarif)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert_official_sarif(&sarif);
    let run0 = &sarif["runs"][0];
    assert_eq!(run0["columnKind"], "unicodeCodePoints");
    let location = &run0["results"][0]["locations"][0]["physicalLocation"];
    assert_eq!(
        location["artifactLocation"]["uri"],
        "my%20file%2520%231.yml"
    );
    assert_eq!(location["region"]["startColumn"], column);
    let json: serde_json::Value = serde_json::from_slice(&run("json").stdout).unwrap();
    assert_eq!(json["diagnostics"][0]["column"], column);
    let github = String::from_utf8(run("github").stdout).unwrap();
    assert!(github.contains(&format!(",col={column},")), "{github}");
    let human = run("human");
    let human = String::from_utf8_lossy(&human.stdout) + String::from_utf8_lossy(&human.stderr);
    assert!(human.contains(&format!("[{name}:1:{column}]")), "{human}");
}

#[test]
fn github_output_is_workflow_commands() {
    prodigy()
        .args(["check", "--format", "github", "workflows/err/V004-multiple-commands.yml"])
        .assert()
        .code(1)
        .stdout(predicate::str::starts_with(
            "::error file=workflows/err/V004-multiple-commands.yml,line=3,col=3,endLine=3,endColumn=9,title=V004 ",
        ));
}

#[test]
fn an_unknown_slash_command_warns_until_its_command_file_exists() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir(project.path().join(".git")).unwrap();
    let commands = project.path().join(".claude/commands");
    std::fs::create_dir_all(&commands).unwrap();
    std::fs::write(commands.join("prodigy-fix.md"), "Fix $ARGUMENTS.\n").unwrap();
    let sub = project.path().join("workflows");
    std::fs::create_dir(&sub).unwrap();
    let flow = sub.join("flow.yml");
    std::fs::write(
        &flow,
        "- claude: /prodigy-lint src\n- claude: /prodigy-fix src\n- claude: /help\n",
    )
    .unwrap();
    let check = || {
        let output = prodigy()
            .env("HOME", home.path())
            .args(["check", "--format", "json"])
            .arg(&flow)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "warnings alone exit 0");
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        json.to_string()
    };
    let before = check();
    assert!(before.contains("W008"), "{before}");
    assert!(before.contains("/prodigy-lint"), "{before}");
    assert!(!before.contains("/prodigy-fix`"), "{before}");
    assert!(!before.contains("/help`"), "{before}");
    // The command in the user's home counts as well as the project's.
    let home_commands = home.path().join(".claude/commands");
    std::fs::create_dir_all(&home_commands).unwrap();
    std::fs::write(home_commands.join("prodigy-lint.md"), "Lint $ARGUMENTS.\n").unwrap();
    let after = check();
    assert!(!after.contains("W008"), "{after}");
    // Without any commands directory there is nothing to compare with: no warning.
    std::fs::remove_dir_all(project.path().join(".claude")).unwrap();
    std::fs::remove_dir_all(home.path().join(".claude")).unwrap();
    let bare = check();
    assert!(!bare.contains("W008"), "{bare}");
}

/// `-q` is accepted by every command that prints results: it drops their informational
/// lines on stderr (`items`' stage counts, `ls`'s "no runs"), never the results on stdout.
#[test]
fn quiet_keeps_the_results_and_drops_the_informational_lines() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir,
        "wf.yml",
        "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"true\"\n",
    );
    write(&dir, "items.json", r#"[{"id": "a"}, {"id": "b"}]"#);
    let home = dir.path().join("home");
    let run = |args: &[&str]| {
        prodigy()
            .current_dir(dir.path())
            .env("PRODIGY_HOME", &home)
            .args(args)
            .output()
            .unwrap()
    };
    let loud = run(&["items", "wf.yml"]);
    assert!(String::from_utf8_lossy(&loud.stderr).contains("2 kept"));
    let quiet = run(&["items", "-q", "wf.yml"]);
    assert_eq!(quiet.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&quiet.stdout),
        "{\"id\":\"a\"}\n{\"id\":\"b\"}\n"
    );
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "");
    let graph = run(&["graph", "--quiet", "wf.yml"]);
    assert_eq!(graph.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&graph.stdout).starts_with("digraph"));
    assert!(String::from_utf8_lossy(&run(&["ls"]).stderr).contains("no runs"));
    let ls = run(&["ls", "-q"]);
    assert_eq!((ls.status.code(), &ls.stderr[..]), (Some(0), &b""[..]));
    // Each of the others accepts it: an unknown job is still an error, not a usage error
    // about `-q`.
    for args in [
        &["dlq", "list", "-q", "nope"][..],
        &["dlq", "show", "-q", "nope"],
        &["dlq", "clear", "-q", "nope"],
        &["dlq", "stats", "-q", "nope"],
        &["events", "-q", "nope"],
        &["logs", "-q", "nope"],
    ] {
        let out = run(args);
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!text.contains("unexpected argument"), "{args:?}: {text}");
        assert!(text.contains("nope"), "{args:?}: {text}");
    }
    for args in [&["worktree", "ls", "-q"][..], &["worktree", "clean", "-q"]] {
        let text = String::from_utf8_lossy(&run(args).stderr).into_owned();
        assert!(!text.contains("unexpected argument"), "{args:?}: {text}");
    }
}

/// `run --help` and `check --help` say where the examples to copy are.
#[test]
fn run_and_check_help_name_the_examples() {
    for command in ["run", "check"] {
        prodigy()
            .args([command, "--help"])
            .assert()
            .success()
            .stdout(predicate::str::contains("workflows/examples/"));
    }
}

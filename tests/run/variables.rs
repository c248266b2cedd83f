//! Variables as `check` promises them: captures made in `on_success` reach later steps, and
//! the exported variable W006 suggests holds exactly the text of the reference it replaces.

use super::{Scratch, shown, stderr};

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
    let text = shown(&output);
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
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("agent says seen-a"), "{text}");
    assert!(text.contains("agent says seen-b"), "{text}");
}

/// Map items with text that would break a command spliced in unquoted.
const ITEMS: &str = r#"[{"id": "it's \"q\" $(x); y", "location": {"file": "src/a b.rs"}, "files": ["a.rs", "b c.rs"]}, {"id": 7, "location": {"file": "x"}, "files": [1, 2]}]"#;

/// A step whose command is `slot(n, reference)`, as a block scalar.
fn slot_step(indent: &str, command: &str) -> String {
    format!("{indent}- shell: |\n{indent}    {command}\n")
}

/// A MapReduce job that reads every kind of text W006 flags, each at a numbered slot:
/// items (fields, nested, elements, whole), captures (text, metadata, JSON fields), the last
/// step's output, a handler's `${shell.*}` and `${error.message}`, and Claude's output.
fn job(slot: &dyn Fn(usize, &str) -> String) -> String {
    let mut n = 0;
    let mut slots = |indent: &str, refs: &[&str]| {
        let mut out = String::new();
        for r in refs {
            n += 1;
            out.push_str(&slot_step(indent, &slot(n, r)));
        }
        out
    };
    let mut text = String::from(
        "mode: mapreduce\nmap:\n  input: items.json\n  max_parallel: 1\n  agent_template:\n",
    );
    text.push_str("    - shell: |\n        printf '%s\\n' \"it's a \\\"text\\\" \\$(x)\"; echo \"warn: it's\" >&2\n      capture: text\n");
    text.push_str("    - shell: |\n        printf '{\"name\": \"a b'\\''c\", \"list\": [1, \"two words\"]}'\n      capture: data\n      capture_format: json\n");
    text.push_str(&slots(
        "    ",
        &[
            "${shell.output}",
            "${item}",
            "${item.id}",
            "${item.location.file}",
            "${item.files[1]}",
            "${item.files}",
            "${item_json}",
            "${text}",
            "${text.stderr}",
            "${data}",
            "${data.name}",
            "${data.list[1]}",
            "${data.list}",
        ],
    ));
    text.push_str("    - shell: |\n        test -f once-${item_index} || { touch once-${item_index}; echo \"out 'line'\"; echo 'err \"line\"' >&2; exit 3; }\n      on_failure:\n        max_attempts: 2\n        commands:\n");
    text.push_str(&slots(
        "          ",
        &["${shell.output}", "${shell.stderr}", "${error.message}"],
    ));
    text.push_str("    - claude: \"/say it's \\\"done\\\"\"\n");
    text.push_str(&slots("    ", &["${claude.output}"]));
    text
}

/// The same for `foreach` items in a standard workflow.
fn foreach(slot: &dyn Fn(usize, &str) -> String) -> String {
    format!(
        "- foreach:\n    foreach: [\"x y\", \"it's\"]\n    do:\n{}",
        slot_step("      ", &slot(100, "${item}"))
    )
}

/// W006 suggests an exported variable in place of each unquoted reference; each must hold
/// exactly the text the reference renders (`$ITEM_ID` held `item_0`, not `${item.id}`).
#[test]
fn every_exported_variable_w006_suggests_holds_the_reference_text() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("items.json"), ITEMS).unwrap();
    let out = scratch.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let help = regex::Regex::new(r#"use the exported variable: "\$([A-Z0-9_]+)""#).unwrap();
    for (name, workflow) in [
        ("job", job as fn(&dyn Fn(usize, &str) -> String) -> String),
        ("foreach", foreach),
    ] {
        // What `check` suggests for each reference.
        let probe = scratch.project().join(format!("{name}-probe.yml"));
        std::fs::write(
            &probe,
            workflow(&|_, r| format!("printf '%s' {r} >/dev/null")),
        )
        .unwrap();
        let checked = scratch.run(&["check", "--format", "json", probe.to_str().unwrap()], &[]);
        let json: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
        let mut suggested = std::collections::BTreeMap::new();
        for d in json["diagnostics"].as_array().unwrap() {
            assert_eq!(d["code"], "W006", "{d}");
            let message = d["message"].as_str().unwrap();
            let reference = &message[1..message.find("` is spliced").unwrap()];
            let variable = help
                .captures(d["help"].as_str().unwrap())
                .unwrap_or_else(|| panic!("no exported variable for {reference}: {d}"))[1]
                .to_owned();
            suggested.insert(reference.to_owned(), variable);
        }
        // Then the real run: each slot writes the variable and the reference's text.
        let slot = |n: usize, r: &str| {
            let variable = &suggested[r];
            let base = format!("{}/{name}-{n}-${{item_index:-0}}", out.display());
            format!(
                "printf '%s' \"${variable}\" > {base}.env && printf '%s' {}|shell}} > {base}.tpl",
                r.trim_end_matches('}')
            )
        };
        let file = scratch.project().join(format!("{name}.yml"));
        std::fs::write(&file, workflow(&slot)).unwrap();
        let output = scratch.run(&["run", "-v", "--no-worktree", file.to_str().unwrap()], &[]);
        assert!(output.status.success(), "{}", stderr(&output));
        let mut compared = 0;
        for entry in std::fs::read_dir(&out).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "tpl") {
                let expected = std::fs::read_to_string(&path).unwrap();
                let exported = std::fs::read_to_string(path.with_extension("env")).unwrap();
                assert_eq!(exported, expected, "{}", path.display());
                compared += 1;
            }
        }
        assert!(compared >= suggested.len(), "{compared} of {suggested:?}");
    }
    // Spot checks that the comparisons compared something.
    let read = |n: &str| std::fs::read_to_string(out.join(n)).unwrap();
    assert_eq!(read("job-3-0.env"), "it's \"q\" $(x); y");
    assert_eq!(read("job-3-1.env"), "7");
    assert_eq!(read("job-4-0.env"), "src/a b.rs");
    assert_eq!(read("job-6-0.env"), "a.rs b c.rs");
    assert_eq!(read("job-9-0.env"), "warn: it's");
    assert_eq!(read("job-11-0.env"), "a b'c");
    assert_eq!(read("foreach-100-0.env"), "it's");
}

/// A value over the export limit is not in a command's environment; a command that reads it
/// would see it empty, so prodigy warns without `-v`, once per step and variable, even
/// across map agents, and not for a variable it exported.
#[test]
fn a_command_reading_a_variable_left_out_of_its_environment_is_warned() {
    let scratch = Scratch::new();
    let items = scratch.project().join("items.json");
    let blob = "x".repeat(150_000);
    std::fs::write(
        &items,
        serde_json::json!([{"id": 1, "blob": blob}, {"id": 2, "blob": blob}, {"id": 3, "blob": blob}])
            .to_string(),
    )
    .unwrap();
    let job = scratch.project().join("job.yml");
    std::fs::write(
        &job,
        "mode: mapreduce\nmap:\n  input: items.json\n  max_parallel: 1\n  agent_template:\n    - shell: \"printf %s \\\"$ITEM__BLOB\\\" | wc -c; echo $ITEM__ID\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", "--no-worktree", job.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let warning =
        "reads `$ITEM__BLOB`, which prodigy left out of its environment: its value is over 100 kB";
    assert_eq!(text.matches(warning).count(), 1, "{text}");
    assert!(!text.contains("`$ITEM__ID`"), "{text}");
}

/// A misspelt variable (W005 at `check`) that neither `--param` nor the environment supplies
/// stops `run` before its first step, with the did-you-mean help; a supplied one does not,
/// dotted names included (`--param build.target=release` is `${build.target}`).
#[test]
fn a_variable_nothing_supplies_stops_the_run_before_it_starts() {
    let scratch = Scratch::new();
    let write = |name: &str, text: &str| {
        let file = scratch.project().join(name);
        std::fs::write(&file, text).unwrap();
        file.to_str().unwrap().to_owned()
    };
    let flat = write(
        "flow.yml",
        "- shell: \"echo hello\"\n  capture: greeting\n- shell: \"touch started\"\n- shell: \"echo ${greting}\"\n",
    );
    let dotted = write("dotted.yml", "- shell: \"echo target=${build.target}\"\n");
    let output = scratch.run(&["run", "--no-worktree", &flat], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("W005"), "{text}");
    assert!(text.contains("did you mean `${greeting}`?"), "{text}");
    assert!(!scratch.project().join("started").exists(), "{text}");
    let output = scratch.run(&["run", "--no-worktree", &dotted], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("W005"), "{text}");
    assert!(text.contains("--param build.target=..."), "{text}");

    // `check --param` knows what the run will be given; a dotted name is only a warning.
    for (file, param) in [(&flat, "greting=x"), (&dotted, "build.target=x")] {
        let check = scratch.run(&["check", file], &[]);
        let text = String::from_utf8_lossy(&check.stdout).into_owned() + &stderr(&check);
        assert!(check.status.success(), "{text}");
        assert!(text.contains("W005"), "{text}");
        let check = scratch.run(&["check", file, "--param", param], &[]);
        let text = String::from_utf8_lossy(&check.stdout).into_owned() + &stderr(&check);
        assert!(check.status.success(), "{text}");
        assert!(!text.contains("W005"), "{text}");
    }

    let output = scratch.run(
        &["run", "-v", "--no-worktree", &flat, "--param", "greting=hi"],
        &[],
    );
    // What the commands printed is on stdout.
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("hi"), "{text}");
    let output = scratch.run(
        &[
            "run",
            "-v",
            "--no-worktree",
            &dotted,
            "--param",
            "build.target=release",
        ],
        &[],
    );
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("target=release"), "{text}");
    // The environment supplies flat names too.
    let output = scratch.run(
        &["run", "-v", "--no-worktree", &flat],
        &[("greting", "from-env")],
    );
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("from-env"), "{text}");
}

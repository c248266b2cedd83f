//! The README and the task guides under `docs/`: each shows its example workflow as a file
//! under `workflows/examples/` (a `<!-- example: PATH -->` line before the fence), the fence
//! is that file byte for byte, and the example checks clean and runs as the guide says.

use super::mapreduce::only_job;
use super::{Scratch, resume_id, root, shown};

/// The documents with examples, and how many each must show at least.
const GUIDES: &[(&str, usize)] = &[
    ("README.md", 2),
    ("docs/running.md", 1),
    ("docs/mapreduce.md", 1),
    ("docs/claude.md", 1),
    ("docs/slurm.md", 1),
    ("docs/containers.md", 1),
    ("docs/linting.md", 1),
];

/// Each `<!-- example: PATH -->` of TEXT with the fenced block after it.
fn examples(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(path) = line
            .strip_prefix("<!-- example: ")
            .and_then(|rest| rest.strip_suffix(" -->"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "no fence after the marker of {path}"
        );
        let mut body = String::new();
        for line in lines.by_ref() {
            if line == "```" {
                break;
            }
            body.push_str(line);
            body.push('\n');
        }
        found.push((path.to_owned(), body));
    }
    found
}

#[test]
fn every_guide_shows_its_examples_as_they_are_in_the_files() {
    for (guide, at_least) in GUIDES {
        let text = std::fs::read_to_string(root().join(guide)).unwrap();
        let found = examples(&text);
        assert!(
            found.len() >= *at_least,
            "{guide} shows {} examples, fewer than {at_least}",
            found.len()
        );
        for (path, body) in found {
            let file = std::fs::read_to_string(root().join(&path))
                .unwrap_or_else(|e| panic!("{guide} shows {path}, which cannot be read: {e}"));
            assert_eq!(
                body, file,
                "{guide}: the fenced example differs from {path}; copy the file into the guide"
            );
            let checked = Scratch::new().run(
                &[
                    "check",
                    "--deny",
                    "warnings",
                    &root().join(&path).display().to_string(),
                ],
                &[],
            );
            assert_eq!(
                checked.status.code(),
                Some(0),
                "{path}: {}",
                shown(&checked)
            );
        }
    }
}

fn example(name: &str) -> String {
    root()
        .join("workflows/examples")
        .join(name)
        .display()
        .to_string()
}

/// A scratch repository with Markdown files, one of them empty, committed.
fn markdown_project() -> Scratch {
    let scratch = Scratch::new();
    for (name, text) in [
        ("README.md", "# Demo\n\nSome text.\n"),
        ("docs/guide.md", "# Guide\nStep one.\n"),
        ("docs/empty.md", ""),
    ] {
        let path = scratch.project().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    scratch.commit();
    scratch
}

/// README: `hello.yml` captures, checks the capture and writes it to a file.
#[test]
fn readme_standard_example_runs() {
    let scratch = Scratch::new();
    let output = scratch.run(
        &["run", "-v", "-y", "--no-worktree", &example("hello.yml")],
        &[],
    );
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("hello from prodigy"), "{text}");
    let written = std::fs::read_to_string(scratch.project().join("target/hello.txt")).unwrap();
    assert_eq!(written.trim_end(), "hello from prodigy");
}

/// README: `mapreduce-hello.yml` runs an agent per Markdown file; the empty one is tried
/// twice, then dead-lettered, and reduce counts.
#[test]
fn readme_mapreduce_example_dead_letters_the_empty_file() {
    let scratch = markdown_project();
    let output = scratch.run(&["run", "-v", "-y", &example("mapreduce-hello.yml")], &[]);
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("2 of 3 files have lines"), "{text}");
    assert!(text.contains("1 failed, kept in the DLQ"), "{text}");
    let job = only_job(&scratch);
    let listed = scratch.run(&["dlq", "list", &job, "--format", "json"], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["failure_count"], 2, "{listed}");
}

/// docs/running.md: `resume.yml` fails until `ready` exists; `resume` goes on from the
/// failed step without running the first again, and with its capture.
#[test]
fn running_guide_example_fails_then_resumes() {
    let scratch = Scratch::new();
    let first = scratch.run(&["run", "--no-worktree", &example("resume.yml")], &[]);
    assert_eq!(first.status.code(), Some(1), "{}", shown(&first));
    std::fs::write(scratch.project().join("ready"), "").unwrap();
    let id = resume_id(&first);
    let resumed = scratch.run(&["resume", "-v", &id], &[]);
    let text = shown(&resumed);
    assert_eq!(resumed.status.code(), Some(0), "{text}");
    assert!(text.contains("ready; started at "), "{text}");
    let log = std::fs::read_to_string(scratch.project().join("prepare.log")).unwrap();
    assert_eq!(log, "prepared\n", "the first step ran once");
}

/// docs/slurm.md: `slurm-map.yml` runs its agents locally without `--executor slurm`.
#[test]
fn slurm_guide_example_runs_locally() {
    let scratch = Scratch::new();
    let output = scratch.run(&["run", "-v", "-y", &example("slurm-map.yml")], &[]);
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("6 squared is 36"), "{text}");
    assert!(text.contains("6 of 6 items done"), "{text}");
}

/// docs/containers.md: `container-map.yml` runs its agents locally without
/// `--executor container` (`tests/container` runs them in containers).
#[test]
fn containers_guide_example_runs_locally() {
    let scratch = Scratch::new();
    let output = scratch.run(&["run", "-v", "-y", &example("container-map.yml")], &[]);
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("4 squared is 16"), "{text}");
    assert!(text.contains("4 of 4 items done"), "{text}");
}

/// docs/linting.md: `lint-clean.yml` runs, and the shell's own `$${...}` reaches the shell
/// as `${...}`.
#[test]
fn linting_guide_example_runs() {
    let scratch = markdown_project();
    let output = scratch.run(&["run", "-v", "-y", &example("lint-clean.yml")], &[]);
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("first file: README.md"), "{text}");
    assert!(text.contains("\nsrc\ntest\n"), "{text}");
}

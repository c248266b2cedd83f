//! Where steps write: `output_file` and `write_file` never reach outside the project, however
//! the path is spelled or whatever link it passes; `write_file` honours the umask.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Output;

use super::secrets::under_umask;
use super::{Scratch, collect_files, shown, stderr};

fn run(scratch: &Scratch, args: &[&str], umask: &str) -> Output {
    under_umask(&scratch.command(args, &[]), umask)
        .output()
        .unwrap()
}

/// `output_file: "${item.name}.txt"` with an item named `../outside/x`, or an absolute path:
/// the item fails and nothing is written outside the project; an ordinary name is written.
#[test]
fn an_output_file_never_lands_outside_the_project() {
    let scratch = Scratch::new();
    let outside = scratch.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let absolute = scratch.dir.path().join("absolute");
    std::fs::write(
        scratch.project().join("items.json"),
        serde_json::json!([
            {"name": "../outside/x"},
            {"name": absolute.to_str().unwrap()},
            {"name": "kept"},
        ])
        .to_string(),
    )
    .unwrap();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"echo data\"\n      output_file: \"${item.name}.txt\"\n",
    )
    .unwrap();
    let output = run(
        &scratch,
        &["run", "--no-worktree", file.to_str().unwrap()],
        "022",
    );
    let text = stderr(&output);
    assert!(!outside.join("x.txt").exists(), "{text}");
    assert!(!absolute.with_extension("txt").exists(), "{text}");
    assert_eq!(
        std::fs::read_to_string(scratch.project().join("kept.txt")).unwrap(),
        "data\n",
        "{text}"
    );
    let mut dlq = Vec::new();
    collect_files(&scratch.home().join("dlq"), &mut dlq);
    let refused = dlq
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .filter(|t| t.contains("leads outside the project"))
        .count();
    assert_eq!(refused, 2, "both items fail and say why: {text}");
}

/// `write_file` through a link that points outside the project neither overwrites nor
/// `chmod`s the target, whether the link is the file or a directory on the way.
#[test]
fn write_file_follows_no_link_out_of_the_project() {
    let scratch = Scratch::new();
    let outside = scratch.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let target = outside.join("target.txt");
    std::fs::write(&target, "keep").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&target, scratch.project().join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, scratch.project().join("out")).unwrap();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- write_file:\n    path: link.txt\n    content: owned\n    mode: \"0777\"\n  on_failure: true\n- write_file:\n    path: out/new.txt\n    content: owned\n  on_failure: true\n",
    )
    .unwrap();
    let output = run(
        &scratch,
        &["run", "-v", "--no-worktree", file.to_str().unwrap()],
        "022",
    );
    let text = shown(&output);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep", "{text}");
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o644,
        "{text}"
    );
    assert!(!outside.join("new.txt").exists(), "{text}");
    assert_eq!(
        text.matches("leads outside the project").count(),
        2,
        "{text}"
    );
}

/// Without `mode`, a file `write_file` makes gets the umask's permissions (0600 under 077);
/// with it, exactly that mode.
#[test]
fn write_file_honours_the_umask_unless_mode_is_given() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- write_file:\n    path: private.txt\n    content: x\n- write_file:\n    path: shared.txt\n    content: x\n    mode: \"0640\"\n",
    )
    .unwrap();
    let output = run(
        &scratch,
        &["run", "--no-worktree", file.to_str().unwrap()],
        "077",
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let mode = |name: &str| {
        std::fs::metadata(scratch.project().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("private.txt"), 0o600);
    assert_eq!(mode("shared.txt"), 0o640);
}

/// A rendered `write_file` path is judged by where it really leads: `..` out of the project,
/// an absolute path elsewhere and a link out are refused alike, with nothing written, while
/// `..` that stays inside (from a `working_dir`) and an absolute path into the project write.
#[test]
fn write_file_paths_are_refused_only_when_they_lead_out_of_the_project() {
    let scratch = Scratch::new();
    let outside = scratch.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, scratch.project().join("out")).unwrap();
    std::fs::create_dir(scratch.project().join("sub")).unwrap();
    let inside = scratch.project().join("absolute.txt");
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- write_file:\n    path: \"${climb}/x.txt\"\n    content: no\n  on_failure: true\n\
         - write_file:\n    path: \"${elsewhere}\"\n    content: no\n  on_failure: true\n\
         - write_file:\n    path: \"${link}/x.txt\"\n    content: no\n  on_failure: true\n\
         - write_file:\n    path: \"${climb}/up.txt\"\n    content: yes\n  working_dir: sub\n\
         - write_file:\n    path: \"${here}\"\n    content: yes\n",
    )
    .unwrap();
    let elsewhere = outside.join("abs.txt");
    let args = [
        "run".to_owned(),
        "-v".to_owned(),
        "--no-worktree".to_owned(),
        file.display().to_string(),
        "--param".to_owned(),
        "climb=..".to_owned(),
        "--param".to_owned(),
        format!("elsewhere={}", elsewhere.display()),
        "--param".to_owned(),
        "link=out".to_owned(),
        "--param".to_owned(),
        format!("here={}", inside.display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(&scratch, &args, "022");
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    let root = std::fs::canonicalize(scratch.project()).unwrap();
    for refused in ["../x.txt", &elsewhere.display().to_string(), "out/x.txt"] {
        assert!(
            text.contains(&format!(
                "`write_file`: `{refused}` leads outside the project (`{}`)",
                root.display()
            )),
            "{refused}: {text}"
        );
    }
    assert!(!scratch.dir.path().join("x.txt").exists(), "{text}");
    assert!(!elsewhere.exists(), "{text}");
    assert!(!outside.join("x.txt").exists(), "{text}");
    assert_eq!(
        std::fs::read_to_string(scratch.project().join("up.txt")).unwrap(),
        "yes",
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "yes", "{text}");
}

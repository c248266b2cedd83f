//! Secrets and the files a run keeps: a value captured with a secret in it comes back whole
//! on resume, yet the secret never reaches the disk; multi-line secrets, secrets in JSON keys
//! and in kept worktrees are masked; the files under `PRODIGY_HOME` are the user's alone.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use super::{Scratch, collect_files, resume_id, shown, stderr};

const TOKEN: &str = "tok-9f8e7d6c5b4a";

/// CMD run through `sh` under UMASK, with the same directory and environment.
pub(super) fn under_umask(cmd: &Command, umask: &str) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("umask {umask}; exec \"$0\" \"$@\""))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        sh.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh
}

/// `prodigy ARGS` in the scratch project under the permissive umask 022, with the token
/// (and ENV) in the environment.
fn run(scratch: &Scratch, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = scratch.command(args, env);
    cmd.env("API_TOKEN", TOKEN);
    under_umask(&cmd, "022").output().unwrap()
}

/// Every file under the scratch home's state, events and DLQ, which must not hold NEEDLE.
fn assert_not_on_disk(scratch: &Scratch, needle: &str) {
    let mut files = Vec::new();
    for dir in ["state", "events", "dlq"] {
        collect_files(&scratch.home().join(dir), &mut files);
    }
    assert!(
        !files.is_empty(),
        "nothing under {}",
        scratch.home().display()
    );
    for f in files {
        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap()).into_owned();
        assert!(
            !text.contains(needle),
            "{} holds `{needle}`:\n{text}",
            f.display()
        );
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

/// Every file and directory prodigy made under the scratch home (worktree contents aside:
/// they are the project's checkout) is readable by the user only, under a umask of 022.
fn assert_private(scratch: &Scratch) {
    let checkouts = scratch.home().join("worktrees").join(scratch.repo());
    // The test made the home itself; prodigy makes what is inside.
    let mut dirs: Vec<_> = std::fs::read_dir(scratch.home())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let mut seen = 0;
    while let Some(dir) = dirs.pop() {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        if dir == checkouts {
            // Git checkouts of the project, made by git.
            continue;
        }
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            seen += 1;
            if path.is_dir() {
                dirs.push(path);
            } else {
                assert_eq!(mode(&path), 0o600, "{}", path.display());
            }
        }
    }
    assert!(seen > 3, "the run kept its files");
}

/// A step captures `Bearer $TOKEN`; the run fails later; after `prodigy resume` the later
/// steps get the header whole, not `Bearer ***`, and no file under `PRODIGY_HOME` holds the
/// token.
#[test]
fn a_captured_secret_comes_back_whole_on_resume_and_never_reaches_the_disk() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "secrets:\n  TOKEN: \"${env:API_TOKEN}\"\ncommands:\n  - shell: \"echo \\\"Bearer $TOKEN\\\"\"\n    capture: auth\n  - shell: \"test -f ready\"\n  - shell: \"if test ${auth|shell} = \\\"Bearer $TOKEN\\\" && test \\\"$AUTH\\\" = \\\"Bearer $TOKEN\\\"; then echo header-intact; else echo header-broken; exit 1; fi\"\n",
    )
    .unwrap();
    let output = run(
        &scratch,
        &["run", "--no-worktree", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let id = resume_id(&output);
    assert_not_on_disk(&scratch, TOKEN);
    std::fs::write(scratch.project().join("ready"), "").unwrap();
    let output = run(&scratch, &["resume", "-v", &id], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("header-intact"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    assert_not_on_disk(&scratch, TOKEN);
    assert_private(&scratch);
}

/// The same for a MapReduce job: setup captures the header, the job stops, and every item
/// that `resume-job` runs gets it whole.
#[test]
fn a_captured_secret_comes_back_whole_in_a_resumed_job() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        "mode: mapreduce\nsecrets:\n  TOKEN: \"${env:API_TOKEN}\"\nsetup:\n  - shell: \"echo \\\"Bearer $TOKEN\\\"\"\n    capture: auth\nmap:\n  input: \"seq 1 4\"\n  agent_template:\n    - shell: \"test $ITEM != 2 || test -f ready\"\n    - shell: \"if test \\\"$AUTH\\\" = \\\"Bearer $TOKEN\\\"; then echo item-$ITEM-intact; else echo item-$ITEM-broken; exit 1; fi\"\nerror_policy:\n  max_failures: 1\n",
    )
    .unwrap();
    let output = run(
        &scratch,
        &[
            "run",
            "--no-worktree",
            "--max-parallel",
            "1",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stderr(&output);
    let job = regex::Regex::new(r"mapreduce-[0-9]+-[0-9a-f]+")
        .unwrap()
        .find_iter(&text)
        .last()
        .unwrap_or_else(|| panic!("no job id in:\n{text}"))
        .as_str()
        .to_owned();
    assert_not_on_disk(&scratch, TOKEN);
    std::fs::write(scratch.project().join("ready"), "").unwrap();
    let output = run(&scratch, &["resume-job", "--force", "-v", &job], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    for item in [3, 4] {
        assert!(text.contains(&format!("item-{item}-intact")), "{text}");
    }
    assert!(!text.contains("broken"), "{text}");
    assert_not_on_disk(&scratch, TOKEN);
    assert_private(&scratch);
}

/// A multi-line secret: neither the whole value nor any of its lines shows at `-v` or on
/// the failure line, nor in the events; a secret as the key of a captured JSON value is
/// masked in the events too.
#[test]
fn multi_line_secrets_and_secret_json_keys_are_masked() {
    let scratch = Scratch::new();
    let pem = "-----BEGIN TEST KEY-----\nMIIBVwIBADANBgkqhkiG\n9w0BAQEFAASCAUEwggE9\n-----END TEST KEY-----";
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "secrets:\n  PEM: \"${env:PEM_KEY}\"\n  TOKEN: \"${env:API_TOKEN}\"\ncommands:\n  - shell: \"printf '{\\\"%s\\\": 1}' \\\"$TOKEN\\\"\"\n    capture: keyed\n    capture_format: json\n  - shell: \"echo \\\"$PEM\\\"\"\n  - shell: \"echo \\\"$PEM\\\" >&2; exit 3\"\n",
    )
    .unwrap();
    let output = run(
        &scratch,
        &["run", "-vv", "--no-worktree", file.to_str().unwrap()],
        &[("PEM_KEY", pem)],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    for line in pem.lines().chain([TOKEN]) {
        assert!(!text.contains(line), "`{line}` shows:\n{text}");
        assert_not_on_disk(&scratch, line);
    }
    assert!(text.contains("***"), "{text}");
}

/// A failed agent leaves a file whose name holds the token: the DLQ's `worktree_artifacts`
/// name it masked.
#[test]
fn kept_worktree_artifacts_mask_secrets() {
    let scratch = Scratch::new();
    let file = scratch.project().join("job.yml");
    std::fs::write(
        &file,
        "mode: mapreduce\nsecrets:\n  TOKEN: \"${env:API_TOKEN}\"\nmap:\n  input: \"seq 1 1\"\n  agent_template:\n    - shell: \"touch \\\"cache-$TOKEN.txt\\\"; exit 1\"\n",
    )
    .unwrap();
    scratch.commit();
    let output = run(&scratch, &["run", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(!text.contains(TOKEN), "{text}");
    let mut items = Vec::new();
    collect_files(&scratch.home().join("dlq"), &mut items);
    let dlq: Vec<String> = items
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .filter(|t| t.contains("worktree_artifacts"))
        .collect();
    assert_eq!(dlq.len(), 1, "one item kept its worktree: {text}");
    assert!(dlq[0].contains("cache-***.txt"), "{}", dlq[0]);
    assert_not_on_disk(&scratch, TOKEN);
}

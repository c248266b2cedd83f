//! ShellCheck on `shell:` commands: one `shellcheck` process per workflow file, over one
//! temporary script per command (`prodigy_compiler::shell` builds the scripts and maps the
//! findings back into the YAML).
//!
//! Self-contained (it uses only the compiler, `serde_json` and `tempfile`), so that the fixture
//! tests can include it too.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use prodigy_compiler::shell::{EXCLUDED_RULES, Finding, Script};

/// The most shell commands of one file that `check` hands to ShellCheck.
pub(crate) const MAX_SCRIPTS: usize = 2_000;

/// The `shellcheck` program found on `PATH`.
#[derive(Clone, Debug)]
pub(crate) struct ShellCheck {
    program: PathBuf,
}

impl ShellCheck {
    /// `shellcheck` on `PATH`, if there is one.
    pub(crate) fn find() -> Option<Self> {
        prodigy_runtime::exec::find_executable("shellcheck").map(|program| ShellCheck { program })
    }

    /// Runs ShellCheck once over every script; what it finds, or why it could not run.
    /// A file with more than [`MAX_SCRIPTS`] shell commands is not given to ShellCheck,
    /// which takes about 15 ms a script (a 60,000-step file would take a quarter of an hour).
    pub(crate) fn lint(&self, scripts: &[Script]) -> Result<Vec<Finding>, String> {
        if scripts.is_empty() {
            return Ok(Vec::new());
        }
        if scripts.len() > MAX_SCRIPTS {
            return Err(format!(
                "it has {} shell commands, more than the {MAX_SCRIPTS} ShellCheck is run on (pass --no-shellcheck to skip it quietly)",
                scripts.len()
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("prodigy-shellcheck-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let mut names = Vec::with_capacity(scripts.len());
        for (i, script) in scripts.iter().enumerate() {
            let name = format!("{i}.sh");
            std::fs::write(dir.path().join(&name), &script.text)
                .map_err(|e| format!("cannot write a temporary script: {e}"))?;
            names.push(name);
        }
        let output = Command::new(&self.program)
            .current_dir(dir.path())
            .args([
                "--format=json1",
                "--shell=sh",
                "--norc",
                "--color=never",
                "--wiki-link-count=0",
            ])
            .arg(format!("--exclude={}", EXCLUDED_RULES.join(",")))
            .arg("--")
            .args(&names)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.program.display()))?;
        // 0: nothing found; 1: findings; anything else: ShellCheck itself failed.
        if !matches!(output.status.code(), Some(0 | 1)) {
            return Err(format!(
                "{} failed ({}): {}",
                self.program.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        parse(&output.stdout)
    }
}

/// ShellCheck's `json1` output as findings; its columns count characters, tabs as one.
fn parse(json: &[u8]) -> Result<Vec<Finding>, String> {
    let value: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| format!("cannot read ShellCheck's output: {e}"))?;
    let comments = value
        .get("comments")
        .and_then(serde_json::Value::as_array)
        .ok_or("ShellCheck's output has no `comments`")?;
    let number = |c: &serde_json::Value, key: &str| {
        c.get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(1)
    };
    let mut findings: Vec<Finding> = comments
        .iter()
        .filter_map(|c| {
            let file = c.get("file")?.as_str()?;
            let script = file.strip_suffix(".sh")?.parse().ok()?;
            let code = c.get("code")?.as_u64()?;
            Some(Finding {
                script,
                line: number(c, "line"),
                column: number(c, "column"),
                end_line: number(c, "endLine"),
                end_column: number(c, "endColumn"),
                code: format!("SC{code}"),
                message: c.get("message")?.as_str()?.to_owned(),
                link: format!("https://www.shellcheck.net/wiki/SC{code}"),
            })
        })
        .collect();
    findings.sort_by(|a, b| {
        (a.script, a.line, a.column, &a.code).cmp(&(b.script, b.line, b.column, &b.code))
    });
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json1_output_becomes_findings_in_order() {
        let json = br#"{"comments":[
            {"file":"1.sh","line":1,"endLine":1,"column":4,"endColumn":6,"level":"info","code":2086,"message":"Double quote.","fix":null},
            {"file":"0.sh","line":2,"endLine":2,"column":1,"endColumn":3,"level":"warning","code":2164,"message":"Use cd ... || exit.","fix":null}
        ]}"#;
        let found = parse(json).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!((found[0].script, found[0].line), (0, 2));
        assert_eq!(found[0].code, "SC2164");
        assert_eq!(found[1].link, "https://www.shellcheck.net/wiki/SC2086");
        assert!(parse(b"not json").is_err());
    }
}

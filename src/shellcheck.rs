//! ShellCheck on `shell:` commands: one temporary script per command (`prodigy_compiler::shell`
//! builds the scripts and maps the findings back into the YAML), checked by a few `shellcheck`
//! processes in parallel (at most one per CPU), and remembered per script text: in memory for
//! the process (a `check` run, an LSP session) and, when given a directory, on disk, keyed by
//! a hash of ShellCheck's identity, its options and the text. An unchanged script is never
//! checked twice.
//!
//! Self-contained (it uses only the compiler, `serde`, `serde_json` and `tempfile`), so that
//! the fixture tests can include it too.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};

use prodigy_compiler::shell::{EXCLUDED_RULES, Finding, Script};

/// The most shell commands of one file, not yet checked, that `check` hands to ShellCheck.
pub(crate) const MAX_SCRIPTS: usize = 2_000;

/// The most script texts remembered in memory; past it the memory starts afresh.
const MAX_REMEMBERED: usize = 20_000;

/// The largest file of the disk cache read back (one script's text and findings).
const MAX_KEPT: u64 = 16 << 20;

/// The options ShellCheck runs with (besides `--exclude` and the file names).
const OPTIONS: [&str; 5] = [
    "--format=json1",
    "--shell=sh",
    "--norc",
    "--color=never",
    "--wiki-link-count=0",
];

/// The `shellcheck` program found on `PATH`, with what it found so far.
#[derive(Clone, Debug)]
pub(crate) struct ShellCheck {
    program: PathBuf,
    /// The program's path, size and modification time, and the options: part of every key,
    /// so that another ShellCheck (or other options) never reuses these findings.
    identity: String,
    /// Findings per script text (each with `script` 0).
    remembered: Arc<Mutex<HashMap<String, Vec<Finding>>>>,
    /// Where findings are kept across runs, if anywhere.
    disk: Option<PathBuf>,
    /// Free process slots, shared by every file checked at once.
    slots: Arc<(Mutex<usize>, Condvar)>,
}

impl ShellCheck {
    /// `shellcheck` on `PATH`, if there is one (remembering in memory only).
    pub(crate) fn find() -> Option<Self> {
        let program = prodigy_runtime::exec::find_executable("shellcheck")?;
        // The program's size and modification time stand for its version: asking it
        // (`shellcheck --version`) would cost a run even when every script is known.
        let (size, modified) = std::fs::metadata(&program).map_or((0, 0), |meta| {
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            (meta.len(), modified)
        });
        let identity = format!(
            "{}\n{size}\n{modified}\n{}\n{}",
            program.display(),
            OPTIONS.join(" "),
            EXCLUDED_RULES.join(",")
        );
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Some(ShellCheck {
            program,
            identity,
            remembered: Arc::default(),
            disk: None,
            slots: Arc::new((Mutex::new(cpus), Condvar::new())),
        })
    }

    /// Also keeps findings on disk, under [`cache_dir`] (made when first needed).
    pub(crate) fn cached_on_disk(mut self) -> Self {
        self.disk = cache_dir();
        self
    }

    /// Runs ShellCheck over every script it has not seen; what it finds, or why it could not
    /// run. More than [`MAX_SCRIPTS`] new scripts in one file are not given to ShellCheck,
    /// which takes about 15 ms a script (a 60,000-step file would take a quarter of an hour).
    pub(crate) fn lint(&self, scripts: &[Script]) -> Result<Vec<Finding>, String> {
        let mut known: Vec<Option<Vec<Finding>>> = Vec::with_capacity(scripts.len());
        {
            let remembered = self
                .remembered
                .lock()
                .map_err(|_| "ShellCheck's memory is lost")?;
            for script in scripts {
                known.push(remembered.get(&script.text).cloned());
            }
        }
        for (script, found) in scripts.iter().zip(&mut known) {
            if found.is_none() {
                *found = self.read_disk(&script.text);
            }
        }
        // Each text not known yet, once.
        let mut new: Vec<&str> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (script, found) in scripts.iter().zip(&known) {
            if found.is_none() && seen.insert(script.text.as_str()) {
                new.push(&script.text);
            }
        }
        if new.len() > MAX_SCRIPTS {
            return Err(format!(
                "it has {} shell commands, more than the {MAX_SCRIPTS} ShellCheck is run on (pass --no-shellcheck to skip it quietly)",
                new.len()
            ));
        }
        let fresh = self.run_parallel(&new)?;
        let mut fresh_by_text: HashMap<&str, &Vec<Finding>> = HashMap::new();
        for (text, found) in new.iter().zip(&fresh) {
            fresh_by_text.insert(text, found);
            self.write_disk(text, found);
        }
        let mut findings = Vec::new();
        for (i, (script, found)) in scripts.iter().zip(&known).enumerate() {
            let found = match found {
                Some(found) => found,
                None => fresh_by_text
                    .get(script.text.as_str())
                    .copied()
                    .ok_or("internal error: a script ShellCheck was to check is missing")?,
            };
            findings.extend(found.iter().cloned().map(|f| Finding { script: i, ..f }));
        }
        {
            let mut remembered = self
                .remembered
                .lock()
                .map_err(|_| "ShellCheck's memory is lost")?;
            if remembered.len() + new.len() > MAX_REMEMBERED {
                remembered.clear();
            }
            for (text, found) in new.iter().zip(fresh) {
                remembered.insert((*text).to_owned(), found);
            }
            for (script, found) in scripts.iter().zip(known) {
                if let Some(found) = found
                    && !remembered.contains_key(&script.text)
                {
                    remembered.insert(script.text.clone(), found);
                }
            }
        }
        sort(&mut findings);
        Ok(findings)
    }

    /// The findings of each text (each with `script` 0), from a few ShellCheck processes at
    /// once, at most one per free CPU.
    fn run_parallel(&self, texts: &[&str]) -> Result<Vec<Vec<Finding>>, String> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let chunk = texts.len().div_ceil(cpus.min(texts.len()));
        let results: Vec<Result<Vec<Vec<Finding>>, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = texts
                .chunks(chunk)
                .map(|part| scope.spawn(move || self.run_slotted(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut all = Vec::with_capacity(texts.len());
        for part in results {
            all.extend(part?);
        }
        Ok(all)
    }

    /// [`Self::run`] once a process slot is free.
    fn run_slotted(&self, texts: &[&str]) -> Result<Vec<Vec<Finding>>, String> {
        let (free, freed) = &*self.slots;
        {
            let mut n = free.lock().map_err(|_| "ShellCheck's slots are lost")?;
            while *n == 0 {
                n = freed.wait(n).map_err(|_| "ShellCheck's slots are lost")?;
            }
            *n -= 1;
        }
        let result = self.run(texts);
        if let Ok(mut n) = free.lock() {
            *n += 1;
        }
        freed.notify_one();
        result
    }

    /// One ShellCheck process over TEXTS: the findings of each.
    fn run(&self, texts: &[&str]) -> Result<Vec<Vec<Finding>>, String> {
        let dir = tempfile::Builder::new()
            .prefix("prodigy-shellcheck-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let mut names = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let name = format!("{i}.sh");
            std::fs::write(dir.path().join(&name), text)
                .map_err(|e| format!("cannot write a temporary script: {e}"))?;
            names.push(name);
        }
        let output = Command::new(&self.program)
            .current_dir(dir.path())
            .args(OPTIONS)
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
        let mut each = vec![Vec::new(); texts.len()];
        for f in parse(&output.stdout)? {
            if let Some(list) = each.get_mut(f.script) {
                list.push(Finding { script: 0, ..f });
            }
        }
        Ok(each)
    }

    /// The file on disk that holds TEXT's findings.
    fn disk_path(&self, text: &str) -> Option<PathBuf> {
        let dir = self.disk.as_ref()?;
        let key = prodigy_runtime::store::hash(&format!("{}\0{text}", self.identity));
        Some(dir.join(format!("{key}.json")))
    }

    /// TEXT's findings kept on disk by an earlier run, if any (for this very ShellCheck,
    /// options and text; anything else is a miss).
    fn read_disk(&self, text: &str) -> Option<Vec<Finding>> {
        let path = self.disk_path(text)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(std::fs::File::open(path).ok()?, MAX_KEPT),
            &mut bytes,
        )
        .ok()?;
        let kept: Kept = serde_json::from_slice(&bytes).ok()?;
        (kept.identity == self.identity && kept.text == text).then(|| {
            kept.findings
                .into_iter()
                .map(|k| Finding {
                    script: 0,
                    line: k.line,
                    column: k.column,
                    end_line: k.end_line,
                    end_column: k.end_column,
                    link: link(&k.code),
                    code: k.code,
                    message: k.message,
                })
                .collect()
        })
    }

    /// Keeps TEXT's findings on disk; quietly does nothing when it cannot (the cache only
    /// saves time).
    fn write_disk(&self, text: &str, findings: &[Finding]) {
        let Some(path) = self.disk_path(text) else {
            return;
        };
        let kept = Kept {
            identity: self.identity.clone(),
            text: text.to_owned(),
            findings: findings
                .iter()
                .map(|f| KeptFinding {
                    line: f.line,
                    column: f.column,
                    end_line: f.end_line,
                    end_column: f.end_column,
                    code: f.code.clone(),
                    message: f.message.clone(),
                })
                .collect(),
        };
        let Ok(json) = serde_json::to_vec(&kept) else {
            return;
        };
        let _ = prodigy_runtime::durable::write_atomic(&path, &json);
    }
}

/// Where the findings of `check` and the LSP are kept across runs:
/// `$XDG_CACHE_HOME/prodigy/shellcheck`, else `~/.cache/prodigy/shellcheck`.
fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
    Some(base.join("prodigy").join("shellcheck"))
}

/// What the disk cache holds for one script.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    identity: String,
    text: String,
    findings: Vec<KeptFinding>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KeptFinding {
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    code: String,
    message: String,
}

fn link(code: &str) -> String {
    format!("https://www.shellcheck.net/wiki/{code}")
}

fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        (a.script, a.line, a.column, &a.code).cmp(&(b.script, b.line, b.column, &b.code))
    });
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
                link: link(&format!("SC{code}")),
            })
        })
        .collect();
    sort(&mut findings);
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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

    fn at(dir: &Path, identity: &str) -> ShellCheck {
        ShellCheck {
            program: PathBuf::from("shellcheck"),
            identity: identity.to_owned(),
            remembered: Arc::default(),
            disk: Some(dir.to_path_buf()),
            slots: Arc::new((Mutex::new(1), Condvar::new())),
        }
    }

    #[test]
    fn findings_kept_on_disk_come_back_only_for_the_same_shellcheck_and_text() {
        let dir = tempfile::tempdir().unwrap();
        let finding = Finding {
            script: 0,
            line: 2,
            column: 3,
            end_line: 2,
            end_column: 5,
            code: "SC2086".to_owned(),
            message: "Double quote.".to_owned(),
            link: link("SC2086"),
        };
        let sc = at(dir.path(), "shellcheck 0.9");
        assert_eq!(sc.read_disk("ls $x"), None);
        sc.write_disk("ls $x", std::slice::from_ref(&finding));
        sc.write_disk("true", &[]);
        assert_eq!(sc.read_disk("ls $x"), Some(vec![finding]));
        assert_eq!(sc.read_disk("true"), Some(vec![]));
        assert_eq!(sc.read_disk("ls $y"), None);
        assert_eq!(at(dir.path(), "shellcheck 0.10").read_disk("ls $x"), None);
    }
}

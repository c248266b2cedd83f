//! Agents without a shared filesystem (`--no-shared-fs`, docs/slurm.md): the coordinator's
//! git server ([`GitServer`], git's smart HTTP through `git http-backend`, behind a per-job
//! secret) and what a task runs on its node ([`remote_agent`]). The protocol is
//! `prodigy_runtime::backend::noshare`'s.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prodigy_runtime::backend::noshare::{self, NodeClone};

use crate::{err, exit_code};

/// Serves a job's repository over git's smart HTTP.
#[derive(Debug)]
pub(crate) struct GitServer;

/// What a request is checked against and served from.
struct Served {
    git_dir: PathBuf,
    token: String,
}

/// Stops the server when dropped.
struct Stop(tokio::task::JoinHandle<()>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl noshare::Serve for GitServer {
    fn serve(
        &self,
        git_dir: &Path,
        token: &str,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<(std::net::SocketAddr, Box<dyn std::any::Any + Send + Sync>)> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let app = router(Arc::new(Served {
            git_dir: git_dir.to_owned(),
            token: token.to_owned(),
        }));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((bound, Box::new(Stop(task))))
    }
}

fn router(served: Arc<Served>) -> axum::Router {
    axum::Router::new()
        .route("/git/{*rest}", axum::routing::any(handle))
        .with_state(served)
}

/// Whether HEADERS carry `Authorization: Bearer TOKEN` (compared in constant time).
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether git's smart HTTP asks for PATH with QUERY by METHOD (nothing else is served).
fn smart_http(method: &Method, path: &str, query: Option<&str>) -> bool {
    match (method, path) {
        (&Method::GET, "info/refs") => matches!(
            query,
            Some("service=git-upload-pack" | "service=git-receive-pack")
        ),
        (&Method::POST, "git-upload-pack" | "git-receive-pack") => true,
        _ => false,
    }
}

async fn handle(
    State(served): State<Arc<Served>>,
    UrlPath(rest): UrlPath<String>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !authorized(&headers, &served.token) {
        return (
            StatusCode::UNAUTHORIZED,
            "this repository is served to the job's agents only\n",
        )
            .into_response();
    }
    if !smart_http(&method, &rest, query.as_deref()) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    match cgi(
        &served.git_dir,
        &method,
        &rest,
        query.as_deref(),
        &headers,
        body,
    )
    .await
    {
        Ok(response) => response,
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Runs `git http-backend` for one request and turns its CGI answer into a response.
async fn cgi(
    git_dir: &Path,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: axum::body::Bytes,
) -> std::io::Result<Response> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let header = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", git_dir)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{path}"))
        .env("REQUEST_METHOD", method.as_str())
        .env("QUERY_STRING", query.unwrap_or_default())
        .env("CONTENT_TYPE", header(header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header(header::CONTENT_ENCODING))
        .env(
            "GIT_PROTOCOL",
            headers
                .get("git-protocol")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        )
        // Pushes are refused unless someone authenticated: the secret was checked.
        .env("REMOTE_USER", "prodigy-agent")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let stdin = child.stdin.take();
    let writer = tokio::spawn(async move {
        if let Some(mut pipe) = stdin {
            let _ = pipe.write_all(&body).await;
        }
    });
    let Some(mut stdout) = child.stdout.take() else {
        return Ok(StatusCode::BAD_GATEWAY.into_response());
    };
    // The headers, then the body as it comes: a clone of a large repository is not held in
    // memory here.
    let mut head = Vec::new();
    let mut chunk = vec![0_u8; CHUNK];
    let (at, gap) = loop {
        if let Some(split) = header_end(&head) {
            break split;
        }
        let n = stdout.read(&mut chunk).await?;
        if n == 0 || head.len() > CHUNK {
            return Ok(StatusCode::BAD_GATEWAY.into_response());
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
    };
    let first = head.split_off(at + gap);
    let state = Some((stdout, child, writer, first));
    let stream = futures::stream::unfold(state, |state| async move {
        let (mut stdout, child, writer, first) = state?;
        if !first.is_empty() {
            let bytes = axum::body::Bytes::from(first);
            return Some((Ok(bytes), Some((stdout, child, writer, Vec::new()))));
        }
        let mut buf = vec![0_u8; CHUNK];
        match stdout.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                let bytes = axum::body::Bytes::from(buf);
                Some((Ok(bytes), Some((stdout, child, writer, Vec::new()))))
            }
            Err(e) => Some((Err::<axum::body::Bytes, _>(e), None)),
        }
    });
    Ok(response_head(head.get(..at).unwrap_or_default())
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()))
}

/// How much of a CGI answer is read at a time (and the most its headers may take).
const CHUNK: usize = 64 * 1024;

/// Where the headers of a CGI answer end: the blank line's offset and length.
fn header_end(out: &[u8]) -> Option<(usize, usize)> {
    out.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|at| (at, 2)))
}

/// A response with a CGI program's headers HEAD (`Status:` gives the status).
fn response_head(head: &[u8]) -> axum::http::response::Builder {
    let mut builder = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("500");
            builder = builder.status(code.parse::<u16>().unwrap_or(500));
        } else {
            builder = builder.header(name.trim(), value);
        }
    }
    builder
}

/// Whether a task of the job in `JOB_DIR` started anywhere (it left its `.started` mark in
/// the backend's directory: `slurm/`, `container/`, `noshare/`).
pub(crate) fn any_started(job_dir: &Path) -> bool {
    ["slurm", "container", "noshare"].iter().any(|sub| {
        std::fs::read_dir(job_dir.join(sub)).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "started"))
        })
    })
}

/// How long a node retries pushing an item's outcome while the coordinator is away
/// (`PRODIGY_NOSHARE_PUSH_WAIT`, seconds; ten minutes by default).
fn push_wait() -> std::time::Duration {
    std::env::var("PRODIGY_NOSHARE_PUSH_WAIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(
            std::time::Duration::from_mins(10),
            std::time::Duration::from_secs,
        )
}

/// `prodigy agent --serve URL`: on a node that sees nothing of the coordinator's disk, runs
/// item ITEM of JOB in a persistent clone of the served repository and pushes its commits
/// and outcome back. The secret comes on standard input. With `on_node`, its output goes to a file
/// under the node's private directory. An agent that cannot start says why
/// ([`noshare::NotStarted`]) on stderr and, in a Slurm task, in the task's job comment.
pub(crate) fn remote_agent(url: &str, job: &str, item: usize, repo_key: &str, on_node: bool) -> u8 {
    let not_started = |why: noshare::NotStarted| {
        err(&format!("error: the agent could not start: {why}\n"));
        why.tell_slurm();
        exit_code::USAGE
    };
    let mut token = String::new();
    let _ = std::io::stdin().lock().read_line(&mut token);
    let token = token.trim().to_owned();
    if token.is_empty() {
        return not_started(noshare::NotStarted::NoSecret);
    }
    let root = noshare::node_root();
    let clone = match NodeClone::take(&root, repo_key) {
        Ok(c) => c,
        Err(e) => {
            return not_started(noshare::NotStarted::NodeDir { why: e.to_string() });
        }
    };
    if on_node {
        let redirected = noshare::open_node_output(&root, job, item).and_then(|file| {
            nix::unistd::dup2_stdout(&file)
                .and_then(|()| nix::unistd::dup2_stderr(&file))
                .map_err(|e| noshare::NoShareError::Io {
                    path: noshare::node_output(&root, job, item),
                    source: e.into(),
                })
        });
        if let Err(e) = redirected {
            return not_started(noshare::NotStarted::NodeDir { why: e.to_string() });
        }
    }
    let files = match clone.prepare(url, &token, job, item) {
        Ok(f) => f,
        Err(e) => {
            // Git's own words (the command names only refs and the URL, said already).
            let why = match e {
                noshare::NoShareError::Git { message, .. } => message,
                other => other.to_string(),
            };
            return not_started(noshare::NotStarted::Fetch {
                url: url.to_owned(),
                why,
            });
        }
    };
    if let Err(e) = clone.push_started(url, &token, job, item) {
        err(&format!("warning: {e}\n"));
    }
    let result_path = clone.side.join("result.json");
    let _ = std::fs::remove_file(&result_path);
    let code = match node_job(&root, repo_key, job, &clone, &files) {
        Ok(home) => crate::agent::agent(&crate::agent::AgentArgs {
            home: Some(home),
            job: job.to_owned(),
            item,
            result: Some(result_path.clone()),
            workdir: Some(clone.dir.clone()),
            serve: None,
            repo_key: None,
            output_on_node: false,
        }),
        Err(why) => {
            err(&format!("error: {why}\n"));
            exit_code::USAGE
        }
    };
    let result = prodigy_runtime::backend::read_result(&result_path).unwrap_or_else(|| {
        noshare::not_started(&format!(
            "`prodigy agent` exited with {code} before writing its outcome (its own output is in the task's output on that node)"
        ))
    });
    match clone.push_result(url, &token, job, item, &result, push_wait()) {
        Ok(()) => exit_code::OK,
        Err(e) => {
            err(&format!(
                "error: the outcome of item {item} could not be pushed: {e}\n"
            ));
            exit_code::USAGE
        }
    }
}

/// Why the job's files could not be written into a node's own home.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
enum NodeJobError {
    /// The checkpoint the task commit carries does not read.
    #[error("the job's checkpoint in its task commit is damaged: {0}")]
    #[diagnostic(code(prodigy::noshare::checkpoint_damaged))]
    CheckpointDamaged(#[source] serde_json::Error),
    /// The checkpoint, pointed at the clone, could not be encoded again.
    #[error("cannot encode the job's checkpoint: {0}")]
    #[diagnostic(code(prodigy::noshare::checkpoint_encode))]
    CheckpointEncode(#[source] serde_json::Error),
    /// A file of the job could not be written.
    #[error("cannot write `{path}`: {source}")]
    #[diagnostic(code(prodigy::noshare::write))]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Writes the job's files from its task commit into the node's own `PRODIGY_HOME` (under
/// ROOT), pointing at the clone; that home.
fn node_job(
    root: &Path,
    repo_key: &str,
    job: &str,
    clone: &NodeClone,
    files: &noshare::TaskFiles,
) -> Result<PathBuf, NodeJobError> {
    let home = root.join("home");
    let dir = prodigy_runtime::layout::Layout {
        home: home.clone(),
        repo: repo_key.to_owned(),
    }
    .job_dir(job);
    let mut checkpoint: serde_json::Value =
        serde_json::from_str(&files.checkpoint).map_err(NodeJobError::CheckpointDamaged)?;
    let name = checkpoint
        .get("workflow_file")
        .and_then(|f| f.as_str())
        .and_then(|f| Path::new(f).file_name().map(std::borrow::ToOwned::to_owned))
        .unwrap_or_else(|| "workflow.yml".into());
    let workflow = clone.side.join(name);
    let write = |path: &Path, bytes: &[u8]| {
        prodigy_runtime::durable::write_atomic(path, bytes).map_err(|source| NodeJobError::Write {
            path: path.to_owned(),
            source,
        })
    };
    write(&workflow, files.workflow.as_bytes())?;
    if let Some(object) = checkpoint.as_object_mut() {
        object.insert(
            "workflow_file".into(),
            workflow.display().to_string().into(),
        );
        object.insert("project".into(), clone.dir.display().to_string().into());
        object.remove("worktree");
    }
    let text = serde_json::to_vec_pretty(&checkpoint).map_err(NodeJobError::CheckpointEncode)?;
    write(&prodigy_runtime::layout::checkpoint(&dir), &text)?;
    write(
        &prodigy_runtime::layout::items(&dir),
        files.items.as_bytes(),
    )?;
    Ok(home)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prodigy_runtime::backend::noshare::Serve as _;

    fn git(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .envs(env.iter().copied())
            .env("GIT_TERMINAL_PROMPT", "0")
            // Whatever the machine's git configuration (credential helpers, signing).
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap()
    }

    #[test]
    fn the_served_repository_refuses_requests_without_the_jobs_secret() {
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join("repo.git");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        assert!(
            git(dir.path(), &["init", "-q", "--bare", "repo.git"], &[])
                .status
                .success()
        );
        assert!(
            git(&bare, &["config", "http.receivepack", "true"], &[])
                .status
                .success()
        );
        assert!(git(&work, &["init", "-q"], &[]).status.success());
        let ident = [
            ("GIT_AUTHOR_NAME", "t"),
            ("GIT_AUTHOR_EMAIL", "t@t"),
            ("GIT_COMMITTER_NAME", "t"),
            ("GIT_COMMITTER_EMAIL", "t@t"),
        ];
        assert!(
            git(
                &work,
                &["commit", "-q", "--allow-empty", "-m", "one"],
                &ident
            )
            .status
            .success()
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let token = "s3cret-s3cret-s3cret-s3cret-s3cret";
        let (addr, handle) = rt
            .block_on(async {
                GitServer.serve(
                    &bare,
                    token,
                    std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                )
            })
            .unwrap();
        let url = format!("http://{addr}/git");
        let spec = "HEAD:refs/prodigy/j/results/0";
        let without = git(&work, &["push", "-q", &url, spec], &[]);
        assert!(!without.status.success());
        // Refused with 401: git then asks for credentials, which it may not.
        let said = String::from_utf8_lossy(&without.stderr);
        assert!(said.contains("could not read Username"), "{said}");
        let wrong = [
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "http.extraHeader"),
            (
                "GIT_CONFIG_VALUE_0",
                "Authorization: Bearer s3cret-s3cret-s3cret-s3cret-s3creT",
            ),
        ];
        assert!(!git(&work, &["ls-remote", &url], &wrong).status.success());
        let value = format!("Authorization: Bearer {token}");
        let right = [
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "http.extraHeader"),
            ("GIT_CONFIG_VALUE_0", value.as_str()),
        ];
        let pushed = git(&work, &["push", "-q", &url, spec], &right);
        assert!(
            pushed.status.success(),
            "{}",
            String::from_utf8_lossy(&pushed.stderr)
        );
        let listed = git(&work, &["ls-remote", &url], &right);
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains("refs/prodigy/j/results/0"),
            "{}",
            String::from_utf8_lossy(&listed.stdout)
        );
        drop(handle);
    }

    #[test]
    fn cgi_output_gives_status_headers_and_body() {
        let out = b"Status: 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nno";
        let (at, gap) = header_end(out).unwrap();
        assert_eq!(out.get(at + gap..).unwrap(), b"no");
        let r = response_head(out.get(..at).unwrap()).body(()).unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/plain");
        assert_eq!(header_end(b"Expires: 0\n\nok"), Some((10, 2)));
        let r = response_head(b"Expires: 0").body(()).unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
}

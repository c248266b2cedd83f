//! `prodigy ui` end to end: the server started by the binary over a scratch `PRODIGY_HOME`,
//! its handlers' JSON (snapshots), the token (in a header only) and the read-only default, the
//! actions under `--allow-actions`, connections that never finish a request, and a real browser
//! (headless Chromium through chromedriver) watching a slow job: the token off its address bar
//! and out of its cookies, counts and a node's state change without reloading, an item's Claude
//! call opens, and a screenshot is kept as `ui-dashboard.png` in cargo's directory for this
//! test binary's files (`tmp/` in the target directory: `target/tmp/ui-dashboard.png` unless
//! `CARGO_TARGET_DIR` says otherwise).

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read fixtures directly"
)]

use std::fmt::Write as _;
use std::io::{BufRead as _, Read as _, Write as _};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fantoccini::Locator;
use serde_json::Value;

#[path = "../support/external.rs"]
mod external;

#[path = "../support/scratch.rs"]
mod scratch;

#[path = "../support/slow_job.rs"]
mod slow_job;

#[path = "../support/watch.rs"]
mod watch;

use scratch::Scratch;
use slow_job::{job_id, slow_job};

/// A `prodigy ui` of the scratch home, stopped by its pid when dropped.
struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    address: String,
    token: String,
}

impl Server {
    fn start(scratch: &Scratch, args: &[&str]) -> Server {
        let mut all = vec!["ui"];
        all.extend(args);
        let mut child = scratch
            .command(&all, &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let re =
            regex::Regex::new(r"^prodigy ui: http://([0-9.:]+)/\?token=([0-9a-f]{32})\n$").unwrap();
        let caps = re
            .captures(&line)
            .unwrap_or_else(|| panic!("no URL in {line:?}"));
        Server {
            address: caps[1].to_owned(),
            token: caps[2].to_owned(),
            child,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/?token={}", self.address, self.token)
    }

    /// One HTTP/1.1 request; the status and the body.
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let (status, _, body) = self.exchange(method, path, headers);
        (status, body)
    }

    /// One HTTP/1.1 request; the status, the head (lowercase) and the body.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String, String) {
        let mut stream = std::net::TcpStream::connect(&self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut text = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n",
            self.address
        );
        for (k, v) in headers {
            let _ = write!(text, "{k}: {v}\r\n");
        }
        text.push_str("\r\n");
        stream.write_all(text.as_bytes()).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head.split(' ').nth(1).unwrap_or("0").parse().unwrap();
        // Chunked bodies: the JSON handlers answer with a length, so only SSE is chunked.
        (status, head.to_lowercase(), body.to_owned())
    }

    fn get(&self, path: &str) -> Value {
        let (status, body) = self.request("GET", path, &[("X-Prodigy-Token", &self.token)]);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A finished job in the scratch home: item 2 failed into the DLQ.
fn finished_job(scratch: &Scratch) -> String {
    let mut job = slow_job(scratch);
    let id = job_id(scratch, &mut job);
    let out = job.finish();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    id
}

/// VALUE with what changes from run to run replaced.
fn stable(scratch: &Scratch, value: &Value) -> Value {
    let text = value.to_string().replace(&scratch.repo(), "project");
    let text = regex::Regex::new(
        r#""(timestamp|started_at|updated_at|first_attempt|last_attempt)":"[^"]*""#,
    )
    .unwrap()
    .replace_all(&text, r#""$1":"[time]""#);
    let text =
        regex::Regex::new(r#""(duration_secs|elapsed_secs|items_per_min|duration_ms)":[0-9.e-]+"#)
            .unwrap()
            .replace_all(&text, r#""$1":"[secs]""#);
    let text = regex::Regex::new(r"mapreduce-[0-9]+-[0-9a-f]+")
        .unwrap()
        .replace_all(&text, "[job]");
    let text = regex::Regex::new(r#""session_id":"[^"]*""#)
        .unwrap()
        .replace_all(&text, r#""session_id":"[session]""#);
    let text = scratch.normalize(&text);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn every_request_needs_the_token_and_a_read_only_server_refuses_actions() {
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &[]);
    assert!(server.address.starts_with("127.0.0.1:"));
    assert_eq!(server.request("GET", "/api/runs", &[]).0, 401);
    assert_eq!(
        server
            .request(
                "GET",
                "/api/runs",
                &[("X-Prodigy-Token", "0".repeat(32).as_str())]
            )
            .0,
        401
    );
    assert_eq!(
        server
            .request("GET", "/api/runs", &[("X-Prodigy-Token", &server.token)])
            .0,
        200
    );
    // Without --allow-actions nothing changes, whatever the request carries.
    for action in ["stop", "dlq-retry"] {
        let (status, body) = server.request(
            "POST",
            &format!("/api/runs/{id}/{action}"),
            &[("X-Prodigy-Token", &server.token)],
        );
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("--allow-actions"), "{body}");
    }
}

/// The token opens the API only in its header: not in a cookie (which the browser sends to
/// every server on the host, whatever the port) nor in the address (kept in history). The
/// page, which holds no data, loads without it, so that a reload of `/` works, and sets no
/// cookie. A request without the token gets its answer and the connection is closed.
#[test]
fn the_token_opens_the_api_only_in_its_header_and_the_page_sets_no_cookie() {
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &[]);
    let cookie = format!("prodigy_token={}", server.token);
    let query = format!("token={}", server.token);
    for path in [
        "/api/runs".to_owned(),
        format!("/api/runs/{id}"),
        format!("/api/runs/{id}/updates"),
        format!("/api/runs/{id}/graph.svg"),
    ] {
        let (status, head, body) = server.exchange("GET", &path, &[("Cookie", &cookie)]);
        assert_eq!(status, 401, "{path} with the cookie: {body}");
        assert!(head.contains("connection: close"), "{path}: {head}");
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, body) = server.request("GET", &format!("{path}{sep}{query}"), &[]);
        assert_eq!(status, 401, "{path} with ?token=: {body}");
    }
    assert_eq!(server.get("/api/runs")["runs"][0]["id"], id.as_str());
    for path in [format!("/?{query}"), "/".to_owned()] {
        let (status, head, body) = server.exchange("GET", &path, &[]);
        assert_eq!(status, 200, "{path}: {body}");
        assert!(body.contains("<script src=\"/app.js\">"), "{body}");
        assert!(!head.contains("set-cookie"), "{path}: {head}");
        assert!(!body.contains(&server.token), "{path}: {body}");
    }
}

/// Connections that send the start of a request and nothing more, more of them than the
/// file descriptors a process has by default (1,024), do not keep the owner out: a request
/// with the token is answered at once, an open page's update stream goes on, and the server
/// closes each of the others, at once past its first few dozen, the rest when the time to
/// send a request's head has passed.
#[test]
fn idle_half_requests_neither_keep_the_owner_out_nor_cut_an_open_page() {
    const IDLE: usize = 1_100;
    // This process holds them all, and the server the file descriptors most systems give a
    // process (the soft limit of 1,024), whatever this machine's default.
    let hard = file_descriptors_at_least(u64::try_from(IDLE).unwrap() + 200);
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &[]);
    let pid = rustix::process::Pid::from_raw(i32::try_from(server.child.id()).unwrap()).unwrap();
    rustix::process::prlimit(
        Some(pid),
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(1_024),
            maximum: hard,
        },
    )
    .unwrap();

    // An open page: its update stream, which the limits must leave alone.
    let mut page = std::net::TcpStream::connect(&server.address).unwrap();
    let request = format!(
        "GET /api/runs/{id}/updates HTTP/1.1\r\nHost: {}\r\nX-Prodigy-Token: {}\r\n\r\n",
        server.address, server.token
    );
    page.write_all(request.as_bytes()).unwrap();
    page.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut first = [0u8; 4096];
    let n = page.read(&mut first).unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );

    let mut idle = Vec::with_capacity(IDLE);
    let address: std::net::SocketAddr = server.address.parse().unwrap();
    for _ in 0..IDLE {
        let mut stream =
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5)).unwrap();
        // The server may have closed it already.
        let _ = stream.write_all(b"GET / HTTP/1.1\r\n");
        idle.push(stream);
    }
    let asked = Instant::now();
    let mut stream =
        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5)).unwrap();
    // Within the 10 s an idle connection may hold the server: a locked-out owner waits for
    // that, an answered one does not (the margin is for two busy cores).
    stream
        .set_read_timeout(Some(Duration::from_secs(8)))
        .unwrap();
    let request = format!(
        "GET /api/runs HTTP/1.1\r\nHost: {}\r\nX-Prodigy-Token: {}\r\nConnection: close\r\n\r\n",
        server.address, server.token
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        read.is_ok() && answer.starts_with("HTTP/1.1 200") && answer.contains(&id),
        "no answer to the owner {:?} after {IDLE} idle connections: {read:?} {answer}",
        asked.elapsed()
    );

    // The server lets go of every idle one: at once but for its last few dozen, which it
    // closes once the time to send a head (10 s) has passed.
    let soon = Instant::now() + Duration::from_secs(5);
    let later = Instant::now() + Duration::from_secs(20);
    loop {
        let open = idle.iter().filter(|s| !closed(s)).count();
        if open == 0 {
            break;
        }
        assert!(
            open <= 64 || Instant::now() < soon,
            "{open} idle connections still held"
        );
        assert!(
            Instant::now() < later,
            "{open} idle connections still held 20 s on"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(idle);
    // The page's stream outlived the time for a head: still open.
    assert!(!closed(&page), "the open page's update stream was cut");
}

/// Raises this process's soft limit of open files to NEEDED when it is lower; the hard limit
/// (`None`: none).
fn file_descriptors_at_least(needed: u64) -> Option<u64> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if limit.current.is_some_and(|c| c < needed) {
        assert!(
            hard >= needed,
            "this test needs {needed} file descriptors, the hard limit is {hard}"
        );
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(needed),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
    limit.maximum
}

/// Whether the other end closed STREAM (or reset it), what it sent before read and dropped;
/// made non-blocking to ask.
fn closed(mut stream: &std::net::TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

/// Every answer, the page's and the API's and a refusal's, says that the page loads only
/// what this server serves, may not be framed, has no guessed types and sends no referrer.
#[test]
fn every_answer_carries_the_hardening_headers() {
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &[]);
    let token = [("X-Prodigy-Token", server.token.as_str())];
    for (path, headers) in [
        (format!("/?token={}", server.token), &[][..]),
        ("/app.js".to_owned(), &token[..]),
        ("/app.css".to_owned(), &token[..]),
        ("/api/runs".to_owned(), &token[..]),
        (format!("/api/runs/{id}/graph.svg"), &token[..]),
        ("/api/runs".to_owned(), &[][..]),
    ] {
        let (status, head, _) = server.exchange("GET", &path, headers);
        assert!(status == 200 || status == 401, "{path}: {status}");
        for line in [
            "content-security-policy: default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            "x-content-type-options: nosniff",
            "referrer-policy: no-referrer",
            "x-frame-options: deny",
        ] {
            assert!(head.contains(line), "{path}: no `{line}` in\n{head}");
        }
    }
    // The page has no inline script or style for the policy to block.
    let (_, _, page) = server.exchange("GET", &format!("/?token={}", server.token), &[]);
    assert!(!page.contains("<style"), "{page}");
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(page.contains("<script src=\"/app.js\"></script>"), "{page}");
}

/// Ctrl-C stops the server even while a page holds its update stream open (the stream
/// never ends by itself, so a graceful shutdown alone would wait for the page).
#[test]
fn ctrl_c_stops_the_server_while_a_page_listens_for_updates() {
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let mut server = Server::start(&scratch, &[]);
    let mut stream = std::net::TcpStream::connect(&server.address).unwrap();
    let request = format!(
        "GET /api/runs/{id}/updates HTTP/1.1\r\nHost: {}\r\nX-Prodigy-Token: {}\r\n\r\n",
        server.address, server.token
    );
    stream.write_all(request.as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut first = [0u8; 64];
    let n = stream.read(&mut first).unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = watch::exited_within(&mut server.child, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("still serving 15 s after Ctrl-C with a page open"));
    assert!(status.success(), "{status:?}");
    drop(stream);
}

#[test]
fn handlers_answer_with_the_runs_the_picture_the_items_and_an_item_in_full() {
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &[]);

    let runs = server.get("/api/runs");
    insta::assert_json_snapshot!("runs", stable(&scratch, &runs));
    let picture = server.get(&format!("/api/runs/{id}"));
    insta::assert_json_snapshot!("picture", stable(&scratch, &picture));
    let page = server.get(&format!(
        "/api/runs/{id}/items?sort=status&desc=true&limit=2"
    ));
    insta::assert_json_snapshot!("items-by-status", stable(&scratch, &page));
    let failed = server.get(&format!("/api/runs/{id}/items?status=failed"));
    assert_eq!(failed["matched"], 1);
    assert_eq!(failed["rows"][0]["item_id"], "item_1");
    let item = server.get(&format!("/api/runs/{id}/items/item_1"));
    insta::assert_json_snapshot!("item", stable(&scratch, &item));
    // A succeeded item shows each step's output too, with the attempt it ran in.
    let done = server.get(&format!("/api/runs/{id}/items/item_0"));
    assert_eq!(done["row"]["status"], "succeeded");
    insta::assert_json_snapshot!("item-succeeded-outputs", stable(&scratch, &done["outputs"]));

    let (status, svg) = server.request(
        "GET",
        &format!("/api/runs/{id}/graph.svg"),
        &[("X-Prodigy-Token", &server.token)],
    );
    assert_eq!(status, 200);
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains(r#"class="node dlq failed""#), "{svg}");
    assert!(svg.contains("1 items"), "{svg}");
    assert_eq!(
        server
            .request(
                "GET",
                "/api/runs/nope/items",
                &[("X-Prodigy-Token", &server.token)]
            )
            .0,
        404
    );
}

#[test]
fn with_allow_actions_the_page_retries_the_dlq_and_a_cookie_alone_is_refused() {
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &["--allow-actions"]);
    let cookie = format!("prodigy_token={}", server.token);
    // A cross-site form sends cookies, never the header; the token is never taken from one.
    let (status, _) = server.request(
        "POST",
        &format!("/api/runs/{id}/dlq-retry"),
        &[("Cookie", &cookie)],
    );
    assert_eq!(status, 401);
    let (status, body) = server.request(
        "POST",
        &format!("/api/runs/{id}/stop"),
        &[("X-Prodigy-Token", &server.token)],
    );
    assert_eq!(status, 409, "a finished job cannot be stopped: {body}");
    // From another origin, the header notwithstanding: the whole origin must be the page's
    // (scheme, host and port), not end like it.
    let own = format!("http://{}", server.address);
    let port = server.address.rsplit(':').next().unwrap();
    let other_port = format!("http://127.0.0.1:{}", port.parse::<u16>().unwrap() ^ 1);
    for origin in [
        format!("https://{}", server.address),
        format!("http://evil.example//{}", server.address),
        other_port,
        "null".to_owned(),
    ] {
        let (status, body) = server.request(
            "POST",
            &format!("/api/runs/{id}/stop"),
            &[("X-Prodigy-Token", &server.token), ("Origin", &origin)],
        );
        assert_eq!(status, 403, "{origin}: {body}");
    }
    let (status, body) = server.request(
        "POST",
        &format!("/api/runs/{id}/stop"),
        &[("X-Prodigy-Token", &server.token), ("Origin", &own)],
    );
    assert_eq!(status, 409, "its own origin passes: {body}");

    // A retry that cannot start says why, to the page that asked.
    let workflow = scratch.project().join("job.yml");
    let text = std::fs::read_to_string(&workflow).unwrap();
    std::fs::write(&workflow, "name: [unclosed\n").unwrap();
    let (status, body) = server.request(
        "POST",
        &format!("/api/runs/{id}/dlq-retry"),
        &[("X-Prodigy-Token", &server.token)],
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("could not start") && body.contains("job.yml"),
        "{body}"
    );
    std::fs::write(&workflow, text).unwrap();

    // The item can pass now; the retry runs it and the DLQ empties.
    std::fs::write(scratch.dir.path().join("pass"), "").unwrap();
    let (status, body) = server.request(
        "POST",
        &format!("/api/runs/{id}/dlq-retry"),
        &[("X-Prodigy-Token", &server.token)],
    );
    assert_eq!(status, 200, "{body}");
    // The server refreshes its picture on its own clock, after the files changed: asked
    // again until it shows the retry.
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let picture = server.get(&format!("/api/runs/{id}"));
        if picture["counts"]["dlq"] == 0 && picture["counts"]["succeeded"] == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the DLQ was not retried: {picture:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The page of run ID in a browser session through the chromedriver on PORT, opened from
/// the runs list of SERVER as a user would.
async fn open_run(port: u16, server: &Server, id: &str) -> fantoccini::Client {
    let client = browser(port).await;
    client.goto(&server.url()).await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(&format!("#runs tr[data-id='{id}']")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
}

/// Runs SCRIPT in the page until READY finds what it returned complete (the page is redrawn
/// with every update, so what is read is read whole, in one script); fails with MISSING
/// after 30 s.
async fn poll<T>(
    client: &fantoccini::Client,
    script: &str,
    missing: &str,
    ready: impl Fn(&Value) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = client.execute(script, vec![]).await.unwrap();
        if let Some(found) = ready(&got) {
            return found;
        }
        assert!(Instant::now() < deadline, "{missing}: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver, stopped by its pid when dropped.
struct Driver(Child);

/// chromedriver on a free port of loopback, stopped by its pid when dropped.
fn chromedriver() -> (Driver, u16) {
    let port = free_port();
    let driver = Driver(
        std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (driver, port)
}

/// A headless Chromium session through the chromedriver on PORT, once it listens.
async fn browser(port: u16) -> fantoccini::Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1000"]
        }),
    );
    // chromedriver takes a moment to listen.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match fantoccini::ClientBuilder::new(
            hyper_util::client::legacy::connect::HttpConnector::new(),
        )
        .capabilities(caps.clone())
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        {
            Ok(client) => return client,
            Err(e) => {
                assert!(Instant::now() < deadline, "chromedriver: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a test: one scenario read top to bottom"
)]
fn a_browser_sees_a_running_job_change_without_reloading_and_opens_an_item_s_claude_call() {
    const TEST: &str = "ui::a_browser_sees_a_running_job";
    if !external::tool_available(TEST, "chromedriver", "chromium-driver") {
        return;
    }
    let (driver, port) = chromedriver();
    let scratch = Scratch::new();
    let mut job = slow_job(&scratch);
    let id = job_id(&scratch, &mut job);
    let server = Server::start(&scratch, &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let shot = runtime.block_on(async {
        let client = browser(port).await;
        client.goto(&server.url()).await.unwrap();
        let row = Locator::Css(&format!("#runs tr[data-id='{id}']"));
        client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(row)
            .await
            .unwrap();
        // The token is off the address bar (and so out of the history) and in no cookie,
        // which other servers on this host would be sent; a reload still shows the runs.
        let href = client
            .execute("return location.href;", vec![])
            .await
            .unwrap();
        let href = href.as_str().unwrap_or_default().to_owned();
        assert_eq!(href, format!("http://{}/", server.address));
        let cookies = client.get_all_cookies().await.unwrap();
        assert!(cookies.is_empty(), "{cookies:?}");
        let jar = client
            .execute("return document.cookie;", vec![])
            .await
            .unwrap();
        assert_eq!(jar, Value::String(String::new()));
        client.refresh().await.unwrap();
        client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(row)
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let text = |sel: &'static str| {
            let client = client.clone();
            async move {
                match client.find(Locator::Css(sel)).await {
                    Ok(e) => e.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                }
            }
        };
        // The first picture, then a change pushed by the server: the page is never reloaded
        // (a mark left on the window survives).
        client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css("[data-stat='done']"))
            .await
            .unwrap();
        client
            .execute("window.stillTheSamePage = true;", vec![])
            .await
            .unwrap();
        let first = text("[data-stat='done'] b").await;
        let deadline = Instant::now() + Duration::from_mins(1);
        let mut saw_running_node = false;
        loop {
            saw_running_node |= client
                .find(Locator::Css("svg.plan g.node.step.running"))
                .await
                .is_ok();
            let now = text("[data-stat='done'] b").await;
            if now != first && saw_running_node {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the counts never moved from {first} (a running node seen: {saw_running_node})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let same = client
            .execute("return window.stillTheSamePage === true;", vec![])
            .await
            .unwrap();
        assert_eq!(same, Value::Bool(true), "the page was reloaded");
        // An item's Claude call, rendered as `prodigy logs --show` does.
        // The table is redrawn as updates arrive, so a row found may be gone by the click:
        // find it again until a click lands.
        let mut clicked = false;
        for _ in 0..50 {
            let row = client
                .find(Locator::Css("#items-table tr[data-item='item_0']"))
                .await;
            if let Ok(row) = row
                && row.click().await.is_ok()
            {
                clicked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(clicked, "the row of item_0 could not be clicked");
        let mut rendered = String::new();
        for _ in 0..300 {
            let call = client.find(Locator::Css("#detail .claude-call pre")).await;
            if let Ok(text) = match call {
                Ok(call) => call.text().await,
                Err(e) => Err(e),
            } {
                rendered = text;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(rendered.contains("→ Bash"), "{rendered}");
        let shot = client.screenshot().await.unwrap();
        client.close().await.unwrap();
        shot
    });
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-dashboard.png");
    std::fs::write(&path, &shot).unwrap();
    assert!(shot.starts_with(b"\x89PNG"));
    job.kill();
    job.finish();
    drop(driver);
}

#[test]
fn with_allow_actions_stop_interrupts_a_running_job_as_ctrl_c_does() {
    let scratch = Scratch::new();
    let mut job = slow_job(&scratch);
    let id = job_id(&scratch, &mut job);
    let server = Server::start(&scratch, &["--allow-actions"]);
    // Once it runs (its lock is held), stop it. The server refreshes its picture on its
    // own clock: asked again until it shows the job running.
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let picture = server.get(&format!("/api/runs/{id}"));
        if picture["state"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never running: {picture:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = server.request(
        "POST",
        &format!("/api/runs/{id}/stop"),
        &[("X-Prodigy-Token", &server.token)],
    );
    assert_eq!(status, 200, "{body}");
    let status = job.finish().status;
    assert_eq!(status.code(), Some(130), "it ends as an interrupted run");
    // The page sees it at its next refresh.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let picture = server.get(&format!("/api/runs/{id}"));
        if picture["state"] == "interrupted" {
            break;
        }
        assert!(Instant::now() < deadline, "not interrupted: {picture:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A finished job of the verified merge queue (issue 42): two changes green alone and red
/// together, the second sent back once with the failing output.
fn verified_job(scratch: &Scratch) -> String {
    let project = scratch.project();
    std::fs::create_dir_all(project.join("tests")).unwrap();
    std::fs::write(project.join("greet.sh"), "greet() { echo \"hello $1\"; }\n").unwrap();
    std::fs::write(
        project.join("test.sh"),
        "for t in tests/*.sh; do sh \"$t\" || { echo \"FAILED: $t\"; exit 1; }; done\n",
    )
    .unwrap();
    std::fs::write(
        project.join("tests/base.sh"),
        ". ./greet.sh\n[ \"$(greet x)\" = \"hello x\" ]\n",
    )
    .unwrap();
    scratch.commit();
    // Item a makes greet say "hi" (sent back, in every test); item b adds a test expecting
    // what greet says when it starts (sent back, what it says then).
    let agent = "if [ \\\"$ITEM\\\" = a ]; then sed -i s/hello/hi/ greet.sh tests/base.sh; if [ -n \\\"$VERIFY__REASON\\\" ]; then sed -i s/hello/hi/g tests/*.sh; fi; else want=$(. ./greet.sh; greet b); printf '. ./greet.sh\\\\n[ \\\"$(greet b)\\\" = \\\"%s\\\" ]\\\\n' \\\"$want\\\" > tests/b.sh; fi; sleep 0.3; git add -A && git commit -qm \\\"item $ITEM\\\"";
    let workflow = format!(
        "mode: mapreduce\nmap:\n  input: \"printf 'a\\\\nb\\\\n'\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"{agent}\"\nmerge:\n  verify:\n    - shell: \"sh test.sh\"\n  redispatch: 1\n"
    );
    let file = scratch.dir.path().join("verified.yml");
    std::fs::write(&file, workflow).unwrap();
    let output = scratch.run(&["run", "-y", &file.display().to_string()], &[]);
    let text = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{text}");
    let jobs = scratch.state().join("mapreduce/jobs");
    let mut ids: Vec<String> = std::fs::read_dir(jobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ids.pop().unwrap()
}

/// The dashboard's merge-queue lane: its counts and the last failed verification's output,
/// in a real browser.
#[test]
fn a_browser_shows_the_merge_queue_lane_with_the_failed_verification() {
    const TEST: &str = "ui::a_browser_shows_the_merge_queue_lane";
    if !external::tool_available(TEST, "chromedriver", "chromium-driver") {
        return;
    }
    let (driver, port) = chromedriver();
    let scratch = Scratch::new();
    let id = verified_job(&scratch);
    let server = Server::start(&scratch, &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (landed, sent_back, output) = runtime.block_on(async {
        let client = open_run(port, &server, &id).await;
        // The lane is redrawn with every update: read it whole, in the page, until it is there.
        let read = "const t = (s) => document.querySelector(s)?.textContent ?? null; \
            return [t(\"#queue-lane [data-stat='landed'] b\"), \
                    t(\"#queue-lane [data-stat='sent-back'] b\"), t('#queue-output')];";
        let (landed, sent_back, output) = poll(&client, read, "no merge-queue lane", |got| {
            let field = |i: usize| got[i].as_str().map(str::to_owned);
            Some((field(0)?, field(1)?, field(2)?))
        })
        .await;
        client.close().await.unwrap();
        (landed, sent_back, output)
    });
    assert_eq!((landed.as_str(), sent_back.as_str()), ("2", "1"));
    assert!(output.contains("FAILED: tests/"), "{output}");
    drop(driver);
}

/// A page watching a running job gets at most a few updates a second (four, as the server's
/// refresh allows), however fast the rate and the elapsed times move.
#[test]
fn a_running_job_streams_at_most_a_few_updates_a_second() {
    let scratch = Scratch::new();
    let mut job = slow_job(&scratch);
    let id = job_id(&scratch, &mut job);
    let server = Server::start(&scratch, &[]);
    let mut stream = std::net::TcpStream::connect(&server.address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let request = format!(
        "GET /api/runs/{id}/updates HTTP/1.1\r\nHost: {}\r\nX-Prodigy-Token: {}\r\nAccept: text/event-stream\r\n\r\n",
        server.address, server.token
    );
    stream.write_all(request.as_bytes()).unwrap();
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buf = [0u8; 16384];
    while started.elapsed() < Duration::from_secs(5) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let text = String::from_utf8_lossy(&received);
    let updates = text.matches("event: picture").count();
    assert!(updates >= 1, "no update: {text}");
    assert!(updates <= 22, "{updates} updates in 5 s");
    job.kill();
    job.finish();
}

/// A finished job's plan is coloured as `graph --status` colours it: the start, every phase
/// it went through and the success end are done, not left idle.
#[test]
fn a_finished_jobs_plan_colours_its_ends_and_phases() {
    let scratch = Scratch::new();
    let id = verified_job(&scratch);
    let server = Server::start(&scratch, &[]);
    let (status, svg) = server.request(
        "GET",
        &format!("/api/runs/{id}/graph.svg"),
        &[("X-Prodigy-Token", &server.token)],
    );
    assert_eq!(status, 200, "{svg}");
    for class in ["node start done", "node success done", "node phase done"] {
        assert!(
            svg.contains(&format!("class=\"{class}\"")),
            "no {class}: {svg}"
        );
    }
    assert!(!svg.contains("class=\"node phase idle\""), "{svg}");
}

/// An item's DLQ entry names its error type as `dlq show` does (`CommandFailed (exit 1)`),
/// never `[object Object]`.
#[test]
fn a_browser_shows_a_dlq_entrys_error_type_by_name() {
    const TEST: &str = "ui::a_browser_shows_a_dlq_entrys_error_type";
    if !external::tool_available(TEST, "chromedriver", "chromium-driver") {
        return;
    }
    let (driver, port) = chromedriver();
    let scratch = Scratch::new();
    let id = finished_job(&scratch);
    let server = Server::start(&scratch, &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let detail = runtime.block_on(async {
        let client = open_run(port, &server, &id).await;
        // Item 2 (`item_1`) failed into the DLQ. The table is redrawn with the updates: the
        // item is opened from the page itself.
        let open = "const r = document.querySelector(\"#items-table tr[data-item='item_1']\"); \
            if (r) r.click(); \
            return document.querySelector('#detail')?.textContent ?? '';";
        let text = poll(&client, open, "no DLQ entry", |got| {
            got.as_str()
                .filter(|t| t.contains("DLQ entry"))
                .map(str::to_owned)
        })
        .await;
        client.close().await.unwrap();
        text
    });
    assert!(detail.contains("CommandFailed (exit 1)"), "{detail}");
    assert!(!detail.contains("[object Object]"), "{detail}");
    drop(driver);
}

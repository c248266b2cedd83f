//! `prodigy ui`: a web dashboard of the runs and jobs under `$PRODIGY_HOME`, served by the
//! binary on 127.0.0.1 (another address only with `--bind`) behind a random access token.
//!
//! Everything it shows comes from [`prodigy_runtime::live`], which reads the runs' files as
//! they grow; pages get their updates as server-sent events, at most a few a second. The page
//! (HTML, script, style) is compiled in. Read-only unless `--allow-actions`: then a job page
//! can retry its DLQ and stop a running job.
//!
//! The token travels only in the `X-Prodigy-Token` header: the page takes it from the printed
//! URL, keeps it for its tab and sends it with each request. Never a cookie, which the browser
//! would send to every server on the host whatever its port, nor in the address of any request
//! but the first, which the page at once takes off the address bar and the tab's history.

mod door;
mod graph;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prodigy_runtime::layout::{Layout, RunKind};
use prodigy_runtime::live::{Live, Standing};
use prodigy_runtime::runs;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{err, exit_code, out};

/// Runs watched at once; the least recently used is dropped past it, so memory stays bounded
/// however many pages are opened.
const WATCHED: usize = 8;
/// How often a watched run's files are read again at most.
const REFRESH: Duration = Duration::from_millis(250);
/// The most a request spends reading a run's events (a large job's are read over several
/// requests at first, its page saying how far the reading got).
const FIRST_READ: Duration = Duration::from_millis(300);
/// The most rows of the items table in one page.
const PAGE_MAX: usize = 500;

/// `prodigy ui`.
#[derive(clap::Args)]
pub(crate) struct UiArgs {
    /// Listen on ADDR instead of 127.0.0.1 (other machines can then reach it; the token is
    /// still needed).
    #[arg(long, value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// The port; 0 (the default) takes a free one.
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    port: u16,
    /// Let the pages retry a job's DLQ items and stop a running job (what `dlq retry` and
    /// Ctrl-C do); without it every request that would change something is refused.
    #[arg(long)]
    allow_actions: bool,
    #[command(flatten)]
    pub(crate) quiet: crate::Quiet,
}

/// What every request shares.
struct App {
    home: PathBuf,
    token: String,
    allow_actions: bool,
    watched: Mutex<BTreeMap<String, Watched>>,
    graphs: Mutex<BTreeMap<PathBuf, Option<Value>>>,
    clock: Mutex<u64>,
}

/// A watched run, and when its files were last read.
type Watching = Arc<Mutex<(Live, Option<tokio::time::Instant>)>>;

/// A run being watched.
struct Watched {
    live: Watching,
    used: u64,
}

type Shared = Arc<App>;

/// `prodigy ui`.
pub(crate) fn ui(args: &UiArgs) -> u8 {
    let token = match token() {
        Ok(token) => token,
        Err(e) => {
            err(&format!("error: cannot make an access token: {e}\n"));
            return exit_code::USAGE;
        }
    };
    let app = Arc::new(App {
        home: Layout::home(),
        token,
        allow_actions: args.allow_actions,
        watched: Mutex::new(BTreeMap::new()),
        graphs: Mutex::new(BTreeMap::new()),
        clock: Mutex::new(0),
    });
    let address = SocketAddr::new(
        args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        args.port,
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            err(&format!("error: cannot start the server: {e}\n"));
            return exit_code::USAGE;
        }
    };
    runtime.block_on(serve(app, address))
}

async fn serve(app: Shared, address: SocketAddr) -> u8 {
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(e) => {
            err(&format!("error: cannot listen on {address}: {e}\n"));
            return exit_code::USAGE;
        }
    };
    let bound = listener.local_addr().unwrap_or(address);
    let host = match bound.ip() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    out(&format!(
        "prodigy ui: http://{host}:{}/?token={}\n",
        bound.port(),
        app.token
    ));
    crate::note(&format!(
        "serving the runs under {}{}; Ctrl-C stops it\n",
        app.home.display(),
        if app.allow_actions {
            " (actions allowed)"
        } else {
            ", read-only"
        }
    ));
    if !bound.ip().is_loopback() {
        err(&format!(
            "warning: serving on {host} over plain HTTP: the token and every page cross the network unencrypted\n  help: on a network you do not trust, keep the default 127.0.0.1 and reach it through an SSH tunnel (`ssh -L {port}:127.0.0.1:{port} HOST`)\n",
            port = bound.port()
        ));
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    door::serve(
        listener,
        router(app),
        door::Strangers::new(door::STRANGERS),
        door::HEAD_TIME,
        stop,
    )
    .await;
    exit_code::OK
}

/// The routes, behind the token check.
fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/app.js", get(script))
        .route("/app.css", get(style))
        .route("/api/runs", get(list))
        .route("/api/runs/{id}", get(run))
        .route("/api/runs/{id}/graph.svg", get(graph_svg))
        .route("/api/runs/{id}/items", get(items))
        .route("/api/runs/{id}/items/{item}", get(item))
        .route("/api/runs/{id}/updates", get(updates))
        .route("/api/runs/{id}/stop", post(stop))
        .route("/api/runs/{id}/dlq-retry", post(dlq_retry))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// A random token: 128 bits from the kernel, in hex.
fn token() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    }))
}

/// The token a request shows: its `X-Prodigy-Token` header (no cookie, no `?token=`).
fn presented(request: &Request) -> Option<&str> {
    request
        .headers()
        .get("x-prodigy-token")
        .and_then(|v| v.to_str().ok())
}

/// Equal in constant time.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// What every answer carries: everything the pages load comes from this server (no inline
/// script or style: the page is `page.html` with `app.js` and `app.css`), nothing may frame
/// them, no type is guessed, and no address (the first holds the token) is sent elsewhere.
const HARDENING: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
];

/// [`checked`], every answer with the [`HARDENING`] headers.
async fn guard(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let mut response = checked(&app, request, next).await;
    for (name, value) in HARDENING {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Whether ORIGIN (a request's `Origin` header) is this page's own: exactly `http://` and
/// the HOST the request was sent to (scheme, host and port; the server speaks plain HTTP).
fn own_origin(origin: &str, host: Option<&str>) -> bool {
    host.is_some_and(|host| origin.strip_prefix("http://") == Some(host))
}

/// What anyone may load: the page, its script and its style, which hold no data (the page
/// loads without the token so that a reload, whose address no longer has it, works; the script
/// then finds it in the tab's storage).
fn open_to_all(request: &Request) -> bool {
    matches!(*request.method(), Method::GET | Method::HEAD)
        && matches!(request.uri().path(), "/" | "/app.js" | "/app.css")
}

/// Every request but [`open_to_all`]'s needs the token; a request that changes something
/// needs `--allow-actions` too. A connection whose request shows the token is admitted
/// ([`door::Arrival::admit`]); any other is closed after its answer, so that a stranger holds a
/// connection for one request at most.
async fn checked(app: &Shared, request: Request, next: Next) -> Response {
    let known = presented(&request).is_some_and(|t| same(t, &app.token));
    if known && let Some(arrival) = request.extensions().get::<door::Arrival>() {
        arrival.admit();
    }
    let mut response = if known {
        allowed(app, request, next).await
    } else if open_to_all(&request) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "the access token is missing or wrong: open the URL `prodigy ui` printed\n",
        )
            .into_response()
    };
    if !known {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request that showed the token: one that changes something needs `--allow-actions` and,
/// when the browser names its origin, the page's own.
async fn allowed(app: &Shared, request: Request, next: Next) -> Response {
    let changes = !matches!(*request.method(), Method::GET | Method::HEAD);
    if changes {
        if !app.allow_actions {
            return (
                StatusCode::FORBIDDEN,
                "read-only: start `prodigy ui --allow-actions` to retry or stop from the page\n",
            )
                .into_response();
        }
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let origin_ok = request
            .headers()
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .is_none_or(|o| own_origin(o, host));
        if !origin_ok {
            return (
                StatusCode::FORBIDDEN,
                "a request that changes something must come from this page\n",
            )
                .into_response();
        }
    }
    next.run(request).await
}

async fn page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("page.html"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("app.js"),
    )
        .into_response()
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("app.css"),
    )
        .into_response()
}

/// Runs F on the watched run ID, its files read again when REFRESH has passed; `None` when
/// there is no such run.
async fn with_live<T: Send + 'static>(
    app: &Shared,
    id: &str,
    f: impl FnOnce(&mut Live, bool) -> T + Send + 'static,
) -> Option<T> {
    let app = app.clone();
    let id = id.to_owned();
    tokio::task::spawn_blocking(move || {
        let live = watch(&app, &id)?;
        let mut guard = live.lock().ok()?;
        let (live, last) = &mut *guard;
        let now = tokio::time::Instant::now();
        let mut changed = false;
        if live.behind() || last.is_none_or(|l| now.duration_since(l) >= REFRESH) {
            changed = live.refresh_within(Some(FIRST_READ));
            *last = Some(now);
        }
        Some(f(live, changed))
    })
    .await
    .ok()
    .flatten()
}

/// The watched run ID, opened when it is not watched yet (dropping the least recently used).
fn watch(app: &App, id: &str) -> Option<Watching> {
    let tick = {
        let mut clock = app.clock.lock().ok()?;
        *clock += 1;
        *clock
    };
    let mut watched = app.watched.lock().ok()?;
    if let Some(w) = watched.get_mut(id) {
        w.used = tick;
        return Some(w.live.clone());
    }
    let live = Live::open(&app.home, id).ok()?;
    if watched.len() >= WATCHED
        && let Some(oldest) = watched
            .iter()
            .min_by_key(|(_, w)| w.used)
            .map(|(k, _)| k.clone())
    {
        watched.remove(&oldest);
    }
    let live = Arc::new(Mutex::new((live, None)));
    watched.insert(
        id.to_owned(),
        Watched {
            live: live.clone(),
            used: tick,
        },
    );
    Some(live)
}

fn not_found(what: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("no {what}\n")).into_response()
}

/// `GET /api/runs`: every run and job, newest first, with its state, counts, cost and
/// duration.
async fn list(State(app): State<Shared>) -> Response {
    let home = app.home.clone();
    let listing = tokio::task::spawn_blocking(move || runs::list(&home, None))
        .await
        .unwrap_or_default();
    let now = SystemTime::now();
    let mut rows = Vec::with_capacity(listing.runs.len());
    for summary in listing.runs {
        // A running one's pause and spend come from its files; the others' from the
        // checkpoint.
        let live = if summary.state == runs::State::Running {
            with_live(&app, &summary.id, move |live, _| live.picture(now)).await
        } else {
            None
        };
        let (state, cost) = match &live {
            Some(p) => (
                serde_json::to_value(p.state).unwrap_or(Value::Null),
                Some(p.spend.cost_usd),
            ),
            None => (
                serde_json::to_value(summary.state).unwrap_or(Value::Null),
                job_cost(&app.home, &summary),
            ),
        };
        let duration = duration(
            &summary.started_at,
            &summary.updated_at,
            live.is_some(),
            now,
        );
        rows.push(json!({
            "id": summary.id,
            "kind": summary.kind,
            "state": state,
            "repo": summary.repo,
            "project": summary.project,
            "workflow": summary.workflow,
            "started_at": summary.started_at,
            "items": summary.items,
            "cost_usd": cost,
            "duration_secs": duration,
        }));
    }
    axum::Json(json!({ "runs": rows })).into_response()
}

/// What a finished job's Claude calls cost, from its checkpoint.
fn job_cost(home: &std::path::Path, summary: &runs::Summary) -> Option<f64> {
    if summary.kind != RunKind::Job {
        return None;
    }
    let layout = Layout {
        home: home.to_owned(),
        repo: summary.repo.clone(),
    };
    prodigy_runtime::jobstore::JobFiles::new(layout.job_dir(&summary.id))
        .load_checkpoint()
        .ok()
        .map(|c| c.claude_cost_usd)
}

/// Seconds from START to END (to NOW while it runs).
fn duration(start: &str, end: &str, running: bool, now: SystemTime) -> Option<f64> {
    let parse = |t: &str| humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok();
    let start = parse(start)?;
    let end = if running { now } else { parse(end)? };
    end.duration_since(start).ok().map(|d| d.as_secs_f64())
}

/// `GET /api/runs/{id}`: the picture.
async fn run(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    let now = SystemTime::now();
    match with_live(&app, &id, move |live, _| live.picture(now)).await {
        Some(picture) => {
            let mut value = serde_json::to_value(&picture).unwrap_or(Value::Null);
            value["actions"] = Value::Bool(app.allow_actions);
            axum::Json(value).into_response()
        }
        None => not_found("such run or job"),
    }
}

/// `GET /api/runs/{id}/graph.svg`: the plan with each node's live state.
async fn graph_svg(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    let now = SystemTime::now();
    let Some(picture) = with_live(&app, &id, move |live, _| live.picture(now)).await else {
        return not_found("such run or job");
    };
    let path = picture.summary.workflow.clone();
    let cached = app.graphs.lock().ok().and_then(|g| g.get(&path).cloned());
    let graph = if let Some(graph) = cached {
        graph
    } else {
        let p = path.clone();
        let graph = tokio::task::spawn_blocking(move || graph::plan_graph(&p))
            .await
            .ok()
            .flatten();
        if let Ok(mut graphs) = app.graphs.lock() {
            graphs.insert(path, graph.clone());
        }
        graph
    };
    let svg = graph.map_or_else(
        || {
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="400" height="30"><text x="4" y="20">the workflow file cannot be read or has errors now</text></svg>"#
                .to_owned()
        },
        |g| graph::svg(&g, &picture),
    );
    ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response()
}

/// The items table's query.
#[derive(Deserialize)]
struct Page {
    status: Option<String>,
    sort: Option<String>,
    #[serde(default)]
    desc: bool,
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
}

/// `GET /api/runs/{id}/items`: a page of item rows, filtered and sorted here.
async fn items(
    State(app): State<Shared>,
    Path(id): Path<String>,
    Query(page): Query<Page>,
) -> Response {
    let filter = match page.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match serde_json::from_value::<Standing>(Value::String(s.to_owned())) {
            Ok(status) => Some(status),
            Err(_) => {
                return (StatusCode::BAD_REQUEST, format!("no item status `{s}`\n"))
                    .into_response();
            }
        },
    };
    let sort = page.sort.unwrap_or_else(|| "index".to_owned());
    let limit = page.limit.unwrap_or(50).min(PAGE_MAX);
    let result = with_live(&app, &id, move |live, _| {
        live.rows(filter, &sort, page.desc, page.offset, limit)
    })
    .await;
    match result {
        Some((rows, matched)) => {
            axum::Json(json!({ "rows": rows, "matched": matched })).into_response()
        }
        None => not_found("such run or job"),
    }
}

/// `GET /api/runs/{id}/items/{item}`: one item in full.
async fn item(State(app): State<Shared>, Path((id, item)): Path<(String, String)>) -> Response {
    match with_live(&app, &id, move |live, _| live.item(&item)).await {
        Some(Some(detail)) => axum::Json(detail).into_response(),
        Some(None) => not_found("such item"),
        None => not_found("such run or job"),
    }
}

/// `GET /api/runs/{id}/updates`: the picture again each time it changes, as server-sent
/// events, at most four a second.
async fn updates(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    if watch(&app, &id).is_none() {
        return not_found("such run or job");
    }
    let stream = futures::stream::unfold((app, id, None), |(app, id, last)| async move {
        // After an update, the next waits REFRESH at least: at most four a second.
        if last.is_some() {
            tokio::time::sleep(REFRESH).await;
        }
        let last: String = last.unwrap_or_default();
        loop {
            let now = SystemTime::now();
            let picture = with_live(&app, &id, move |live, _| live.picture(now)).await?;
            let mut value = serde_json::to_value(&picture).ok()?;
            // Elapsed times and the rate change every tick; they alone do not make an update.
            let mut same_as = value.clone();
            same_as["duration_secs"] = Value::Null;
            same_as["eta_secs"] = Value::Null;
            same_as["items_per_min"] = Value::Null;
            if let Some(agents) = same_as["agents"].as_array_mut() {
                for a in agents {
                    a["elapsed_secs"] = Value::Null;
                }
            }
            let key = same_as.to_string();
            if key != last {
                value["actions"] = Value::Bool(app.allow_actions);
                let event = Event::default().event("picture").data(value.to_string());
                return Some((
                    Ok::<_, std::convert::Infallible>(event),
                    (app, id, Some(key)),
                ));
            }
            tokio::time::sleep(REFRESH).await;
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `POST /api/runs/{id}/stop`: what Ctrl-C does to the process that runs it (SIGINT); it
/// stops as an interrupted run, resumable.
async fn stop(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(Ok(summary)) = runs::find(&app.home, &id) else {
        return not_found("such run or job");
    };
    let layout = Layout {
        home: app.home.clone(),
        repo: summary.repo.clone(),
    };
    let dir = layout.state_dir(summary.kind, &id);
    // The lock holds its holder's pid; only a held lock names a live process.
    let pid = std::fs::File::open(prodigy_runtime::layout::lock(&dir))
        .and_then(|mut f| {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut f, &mut s).map(|_| s)
        })
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let Some(pid) = pid.filter(|_| prodigy_runtime::store::is_locked(&dir)) else {
        return (StatusCode::CONFLICT, "it is not running\n").into_response();
    };
    match nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGINT,
    ) {
        Ok(()) => axum::Json(json!({ "stopping": id, "pid": pid })).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot signal {pid}: {e}\n"),
        )
            .into_response(),
    }
}

/// `POST /api/runs/{id}/dlq-retry`: `prodigy dlq retry ID -y` in the job's project, in the
/// background; its events show on the page as it goes.
async fn dlq_retry(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(Ok(summary)) = runs::find(&app.home, &id) else {
        return not_found("such run or job");
    };
    if summary.kind != RunKind::Job {
        return (StatusCode::BAD_REQUEST, "only a MapReduce job has a DLQ\n").into_response();
    }
    let Ok(exe) = std::env::current_exe() else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot find the prodigy binary\n",
        )
            .into_response();
    };
    let child = std::process::Command::new(exe)
        .args(["dlq", "retry", &id, "-y"])
        .current_dir(&summary.project)
        .env("PRODIGY_HOME", &app.home)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot start `dlq retry`: {e}\n"),
            )
                .into_response();
        }
    };
    let pid = child.id();
    // A retry that cannot start (a missing secret, no Claude CLI, a workflow that no longer
    // compiles) ends at once, before it records anything the page could show: what it said
    // is the answer then. One still going after RETRY_START has started.
    let stderr = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut said = String::new();
        if let Some(mut pipe) = stderr {
            use std::io::Read as _;
            let _ = (&mut pipe).take(64 * 1024).read_to_string(&mut said);
            let _ = std::io::copy(&mut pipe, &mut std::io::sink());
        }
        // Reaped when it ends.
        let _ = tx.send((child.wait(), said));
    });
    let ended = tokio::task::spawn_blocking(move || rx.recv_timeout(RETRY_START)).await;
    match ended {
        Ok(Ok((Ok(status), said))) if !status.success() => (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "`prodigy dlq retry {id}` could not start ({status}): {}\n",
                said.trim()
            ),
        )
            .into_response(),
        // It ended already: what it said is the answer (the items that failed again).
        Ok(Ok((Ok(_), said))) => {
            axum::Json(json!({ "retrying": id, "pid": pid, "finished": true, "said": said.trim() }))
                .into_response()
        }
        _ => axum::Json(json!({ "retrying": id, "pid": pid })).into_response(),
    }
}

/// How long the answer to a DLQ retry waits for the retry to fail to start.
const RETRY_START: std::time::Duration = std::time::Duration::from_secs(2);

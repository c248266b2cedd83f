//! Test support: a scripted [`FakeExecutor`] and a harness that runs a workflow's plan with
//! it, so that whole orchestrations (retries, handlers, the map phase's scheduler) run with
//! no process, on tokio's paused clock, and their event traces can be snapshotted.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use tokio::time::Instant;

use crate::exec::Output;
use crate::executor::{Executor, Request};
use crate::lock;

/// What a scripted command does: how long it "takes" on the (paused) clock, then how it
/// exits and what it wrote.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) takes: Duration,
    /// Each line of standard output comes this long after the one before (the first this
    /// long after the start), before `takes`; `None`: all of them at the end.
    pub(crate) paced: Option<Duration>,
}

impl Reply {
    /// Exits 0 at once.
    pub(crate) fn ok() -> Self {
        Self::exit(0)
    }

    /// Exits with CODE at once.
    pub(crate) fn exit(code: i32) -> Self {
        Reply {
            code,
            stdout: String::new(),
            stderr: String::new(),
            takes: Duration::ZERO,
            paced: None,
        }
    }

    pub(crate) fn stdout(mut self, text: &str) -> Self {
        text.clone_into(&mut self.stdout);
        self
    }

    pub(crate) fn stderr(mut self, text: &str) -> Self {
        text.clone_into(&mut self.stderr);
        self
    }

    pub(crate) fn takes(mut self, duration: Duration) -> Self {
        self.takes = duration;
        self
    }

    /// Gives each line of standard output GAP after the one before, as it is written.
    pub(crate) fn paced(mut self, gap: Duration) -> Self {
        self.paced = Some(gap);
        self
    }
}

/// A command the fake ran: its text and when it started, since the fake was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) text: String,
    pub(crate) at: Duration,
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, VecDeque<Reply>>,
    calls: Vec<Call>,
    running: usize,
    max_running: usize,
}

/// An executor scripted per command text (a shell command's script, a Claude call's
/// prompt): each run takes the next reply of its script, and the last one repeats. A
/// command with no script fails as one that could not start, naming itself. It honours the
/// request's timeout and cancel signal on tokio's clock, gives its standard output to the
/// watcher line by line, and records what ran and how many ran at once.
pub(crate) struct FakeExecutor {
    state: Mutex<State>,
    started: Instant,
    /// Answers a command with no script, when set.
    rule: Option<Rule>,
}

/// How a [`FakeExecutor`] answers a command with no script, from its text.
type Rule = Box<dyn Fn(&str) -> Reply + Send + Sync>;

impl FakeExecutor {
    pub(crate) fn new() -> Self {
        FakeExecutor {
            state: Mutex::new(State::default()),
            started: Instant::now(),
            rule: None,
        }
    }

    /// A command with no script answers what RULE says from its text.
    pub(crate) fn rule(mut self, rule: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        self.rule = Some(Box::new(rule));
        self
    }

    /// TEXT answers with REPLIES, in order (the last one repeats).
    pub(crate) fn script(self, text: &str, replies: impl IntoIterator<Item = Reply>) -> Self {
        lock(&self.state)
            .scripts
            .insert(text.to_owned(), replies.into_iter().collect());
        self
    }

    /// What ran, in the order it started.
    pub(crate) fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    /// When each run of TEXT started.
    pub(crate) fn starts_of(&self, text: &str) -> Vec<Duration> {
        self.calls()
            .into_iter()
            .filter(|c| c.text == text)
            .map(|c| c.at)
            .collect()
    }

    /// The most commands that ran at once.
    pub(crate) fn max_running(&self) -> usize {
        lock(&self.state).max_running
    }

    fn begin(&self, text: &str) -> Option<Reply> {
        let mut state = lock(&self.state);
        state.calls.push(Call {
            text: text.to_owned(),
            at: self.started.elapsed(),
        });
        state.running += 1;
        state.max_running = state.max_running.max(state.running);
        let Some(script) = state.scripts.get_mut(text) else {
            return self.rule.as_ref().map(|rule| rule(text));
        };
        if script.len() > 1 {
            script.pop_front()
        } else {
            script.front().cloned()
        }
    }
}

impl Executor for FakeExecutor {
    fn run<'a, 'w: 'a>(&'a self, request: Request<'w>) -> LocalBoxFuture<'a, Output> {
        Box::pin(async move {
            let started = Instant::now();
            let text = request.text().to_owned();
            let Request {
                command,
                mut watch,
                mut cancel,
                ..
            } = request;
            let Some(reply) = self.begin(&text) else {
                lock(&self.state).running -= 1;
                return Output::error(format!("fake executor: no script for `{text}`"));
            };
            let deadline = async {
                match command.timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            let mut output = Output::default();
            let body = async {
                if let Some(gap) = reply.paced {
                    for line in reply.stdout.lines() {
                        tokio::time::sleep(gap).await;
                        if let Some(watch) = watch.as_deref_mut() {
                            watch(line);
                        }
                    }
                }
                tokio::time::sleep(reply.takes).await;
            };
            tokio::select! {
                () = body => output.code = Some(reply.code),
                () = deadline => {
                    output.timed_out = true;
                }
                () = crate::exec::cancelled(&mut cancel) => output.cancelled = true,
            }
            lock(&self.state).running -= 1;
            if let Some(watch) = watch.filter(|_| reply.paced.is_none()) {
                for line in reply.stdout.lines() {
                    watch(line);
                }
            }
            output.stdout = reply.stdout;
            output.stderr = reply.stderr;
            if output.timed_out
                && let Some(t) = command.timeout
            {
                let _ = write!(
                    output.stderr,
                    "prodigy: timed out after {}",
                    humantime::format_duration(t)
                );
            }
            output.interleaved = Some(format!("{}{}", output.stdout, output.stderr));
            output.duration = started.elapsed();
            output
        })
    }
}

/// A workflow run with a [`FakeExecutor`]: its state under a temporary `PRODIGY_HOME`, its
/// commands in a temporary project, no worktree (as `--no-worktree`).
pub(crate) struct Harness {
    pub(crate) home: tempfile::TempDir,
    pub(crate) project: tempfile::TempDir,
    pub(crate) fake: Arc<FakeExecutor>,
    /// Told what the run shows (none: nothing is shown).
    pub(crate) reporter: Option<Arc<dyn crate::events::Reporter>>,
}

/// The wall clock when a harness's run starts: 2026-11-26 06:00:00 UTC, so that what a
/// run reads against it (a usage limit's reset) is the same on every run.
pub(crate) const WALL_CLOCK: u64 = 1_795_672_800;

/// What a run left: its event trace, one line per event, ready to snapshot.
pub(crate) struct Trace {
    pub(crate) lines: Vec<String>,
}

impl Trace {
    /// The text to snapshot.
    pub(crate) fn text(&self) -> String {
        self.lines.join("\n")
    }

    /// The lines of the events of type KIND, in order.
    pub(crate) fn of_kind(&self, kind: &str) -> Vec<&String> {
        self.lines
            .iter()
            .filter(|l| l.split(' ').next() == Some(kind))
            .collect()
    }

    /// The event types, in order.
    pub(crate) fn events(&self) -> Vec<&str> {
        self.lines
            .iter()
            .map(|l| l.split(' ').next().unwrap_or_default())
            .collect()
    }
}

impl Harness {
    pub(crate) fn new(fake: FakeExecutor) -> Self {
        Harness {
            home: tempfile::tempdir().unwrap(),
            project: tempfile::tempdir().unwrap(),
            fake: Arc::new(fake),
            reporter: None,
        }
    }

    pub(crate) fn plan(yaml: &str) -> Arc<prodigy_plan::Plan> {
        let file = prodigy_compiler::source::SourceFile::new("workflow.yml", yaml);
        let checked = prodigy_compiler::check(&file);
        assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
        Arc::new(checked.plan.unwrap())
    }

    pub(crate) fn options(&self, yaml: &str) -> crate::runner::Options {
        crate::runner::Options {
            grace: Duration::from_secs(1),
            seed: 7,
            ..crate::runner::Options::new(
                self.project.path().join("workflow.yml"),
                yaml,
                self.project.path().to_owned(),
                crate::layout::Layout {
                    home: self.home.path().to_owned(),
                    repo: "demo".into(),
                },
                crate::runner::Inputs::default(),
            )
        }
    }

    fn runner(
        &self,
        yaml: &str,
        id: &str,
        cancel: tokio::sync::watch::Receiver<bool>,
    ) -> crate::runner::Runner {
        let executor: Arc<dyn Executor> = self.fake.clone();
        let runner = crate::runner::Runner::with_id(
            Self::plan(yaml),
            self.options(yaml),
            cancel,
            id.into(),
            None,
        )
        .unwrap()
        .with_executor(executor)
        .with_wall_clock(std::time::UNIX_EPOCH + Duration::from_secs(WALL_CLOCK));
        match &self.reporter {
            Some(reporter) => runner.report_to(reporter.clone()),
            None => runner,
        }
    }

    /// Runs YAML, a standard workflow, to its end.
    pub(crate) async fn run(&self, yaml: &str) -> (crate::runner::Report, Trace) {
        let (_tx, cancel) = tokio::sync::watch::channel(false);
        let runner = self.runner(yaml, "session-test", cancel);
        let vars = runner.initial_vars().await.unwrap();
        let report = runner.run(vars, 0).await;
        let trace = self.trace(&runner.events_path());
        (report, trace)
    }

    /// Runs YAML, a MapReduce workflow, as a new job with OPTS.
    pub(crate) async fn run_job(
        &self,
        yaml: &str,
        opts: crate::mapreduce::JobOptions,
    ) -> (crate::mapreduce::JobReport, Trace) {
        let (_tx, cancel) = tokio::sync::watch::channel(false);
        let id = "job-test";
        let runner = self.runner(yaml, id, cancel);
        let dir = runner.opts.layout.job_dir(id);
        crate::durable::private_dir(&dir).unwrap();
        let vars = runner.initial_vars().await.unwrap();
        let checkpoint = crate::session::new_job_checkpoint(id, &runner.opts);
        let job = crate::mapreduce::MapJob::new(
            &runner,
            crate::jobstore::JobFiles::new(dir),
            checkpoint,
            opts,
            false,
        );
        let report = job.run(vars).await;
        let trace = self.trace(&runner.events_path());
        (report, trace)
    }

    /// The events at PATH, one line each: the type, then the fields but the timestamp and
    /// the run's id, keys in order, with the temporary directories named `[home]` and
    /// `[project]`. Durations stay: on the paused clock they are exact.
    fn trace(&self, path: &std::path::Path) -> Trace {
        let text = std::fs::read_to_string(path).unwrap();
        let home = self.home.path().display().to_string();
        let project = self.project.path().display().to_string();
        let lines = text
            .lines()
            .map(|line| {
                // Sorted by key, so that the trace does not depend on how events are built.
                let mut event: std::collections::BTreeMap<String, serde_json::Value> =
                    serde_json::from_str(line).unwrap();
                event.remove("timestamp");
                event.remove("job_id");
                let kind = event
                    .remove("event_type")
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                // `log_number` ties a step to its log files (`live`'s tests show it).
                for key in ["last_checkpoint_at", "updated_at", "log_number"] {
                    event.remove(key);
                }
                let fields = serde_json::to_string(&event)
                    .unwrap()
                    .replace(&home, "[home]")
                    .replace(&project, "[project]");
                format!("{kind} {fields}")
            })
            .collect();
        Trace { lines }
    }
}

#[cfg(test)]
mod graph_paths;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod tests;

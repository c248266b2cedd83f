//! Running a step's command: a shell command, a Claude call or `write_file`, with its
//! working directory, environment, timeout, output limit and log.

use crate::message::Message;
use std::path::PathBuf;
use std::time::Duration;

use prodigy_plan as plan;
use prodigy_plan::{PlanCommand, PlanStep};

use crate::exec::{self, Command, Output};
use crate::lock;
use crate::runner::{Io, Runner};
use crate::vars::Vars;

/// Why a step's `output_file` was not written.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(crate) enum OutputFileError {
    /// Its path did not render.
    #[error("`output_file`: {0}")]
    Render(#[source] prodigy_grammar::template::RenderError),
    /// Its path leads outside the project.
    #[error("`output_file`: {0}")]
    Path(#[source] crate::confine::PathError),
    /// It could not be written.
    #[error("`output_file`: cannot write `{}`: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why a step's `working_dir` did not render.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("`working_dir`: {0}")]
pub(crate) struct WorkingDirError(#[source] prodigy_grammar::template::RenderError);

impl Runner {
    /// Renders and runs a step's command; `output_file` gets its (masked) stdout. RESUME:
    /// the failed attempt a Claude call continues (`on_retry: continue`).
    pub(crate) async fn execute(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        resume: Option<&crate::claude::Continuation>,
    ) -> Output {
        let output = self.execute_command(step, vars, resume).await;
        let Some(template) = &step.output_file else {
            return output;
        };
        // Failing to keep the output the workflow asked for fails the step.
        let written = template
            .parsed
            .render(vars)
            .map_err(OutputFileError::Render)
            .and_then(|file| {
                // Never outside the project, however the rendered path is spelled or
                // whatever links it passes.
                let root = self.workdir();
                let path =
                    crate::confine::inside(&root, &root, &file).map_err(OutputFileError::Path)?;
                std::fs::write(&path, self.mask(&output.stdout))
                    .map_err(|source| OutputFileError::Write { path, source })
            });
        match written {
            Ok(()) => output,
            Err(e) => Output::error(e.to_string()),
        }
    }

    pub(crate) async fn execute_command(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        resume: Option<&crate::claude::Continuation>,
    ) -> Output {
        match &step.command {
            PlanCommand::Shell(t) => self.run_command(&exec::shell, t, step, vars, true).await,
            PlanCommand::Claude(t) => {
                let timeout = self.step_timeout(step);
                self.run_claude(t, step, vars, timeout, true, resume).await
            }
            PlanCommand::WriteFile(w) => {
                let (path, content) =
                    match (w.path.parsed.render(vars), w.content.parsed.render(vars)) {
                        (Ok(p), Ok(c)) => (p, c),
                        (Err(e), _) | (_, Err(e)) => return Output::error(e.to_string()),
                    };
                match self.cwd(step, vars) {
                    Ok(cwd) => {
                        let root = self.workdir();
                        exec::write_file(
                            &root,
                            &cwd,
                            &path,
                            &content,
                            w.format,
                            self.plan.yaml,
                            w.mode,
                            w.create_dirs,
                        )
                    }
                    Err(e) => Output::error(e.to_string()),
                }
            }
            PlanCommand::Foreach {
                input,
                parallel,
                steps,
                continue_on_error,
                max_items,
            } => {
                self.foreach(
                    step,
                    vars,
                    input,
                    *parallel,
                    steps,
                    *continue_on_error,
                    *max_items,
                )
                .await
            }
        }
    }

    /// The step's directory: `working_dir` under the project, or the project.
    pub(crate) fn cwd(&self, step: &PlanStep, vars: &Vars) -> Result<PathBuf, WorkingDirError> {
        match &step.working_dir {
            Some(t) => t
                .parsed
                .render(vars)
                .map(|dir| self.workdir().join(dir))
                .map_err(WorkingDirError),
            None => Ok(self.workdir()),
        }
    }

    pub(crate) async fn run_command(
        &self,
        build: &dyn Fn(&str) -> (String, Vec<String>),
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        live: bool,
    ) -> Output {
        let timeout = self.step_timeout(step);
        self.run_command_for(build, template, step, vars, timeout, live)
            .await
    }

    /// The step's timeout: the agent's `command_timeouts`, else its own.
    pub(crate) fn step_timeout(&self, step: &PlanStep) -> Option<Duration> {
        self.agent()
            .and_then(|a| a.timeouts.get(&step.id).copied())
            .or(step.timeout)
    }

    /// Whose logs what runs now makes: its map item's (`item_3`), else `steps`.
    pub(crate) fn log_owner(&self) -> &str {
        self.agent()
            .map(|a| a.item_id.as_str())
            .filter(|i| !i.is_empty())
            .unwrap_or("steps")
    }

    /// The directory of the logs of what runs now: `logs/{repo}/{id}/{item or "steps"}`.
    pub(crate) fn log_dir(&self) -> PathBuf {
        self.opts
            .layout
            .logs_dir(&self.session)
            .join(self.log_owner())
    }

    /// Where a command's whole output goes once it outgrows the limit.
    pub(crate) fn spill_path(&self, step: &PlanStep) -> PathBuf {
        let n = self
            .log_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.log_dir().join(format!(
            "output-{n:04}-{}.log",
            crate::logs::file_part(&step.label)
        ))
    }

    /// Masks secrets as the run knows them now (nothing to do when it knows none).
    pub(crate) fn masker(&self) -> Option<crate::logs::Mask> {
        let secrets = self.sink.secrets().clone();
        (!secrets.is_empty())
            .then(|| std::sync::Arc::new(move |text: &str| secrets.mask(text)) as crate::logs::Mask)
    }

    /// A command's text, or why it cannot be rendered (secrets masked).
    pub(crate) fn command_text(
        &self,
        template: &plan::Template,
        vars: &Vars,
    ) -> Result<String, Output> {
        template
            .parsed
            .render(vars)
            .map_err(|e| Output::error(format!("{e} in `{}`", self.mask(&template.value))))
    }

    /// Runs TEMPLATE as a Claude call (docs/claude.md): the CLI's events are
    /// read as they arrive, written to the call's log, shown at `-v` when LIVE (a step's
    /// own command), and decide whether the call succeeded. Once: `run_claude` (the
    /// `limit` module) runs it under the run's usage-limit gate. RESUME (a step's own call
    /// only): the failed attempt's session, which the call resumes, told why it failed.
    pub(crate) async fn run_claude_call(
        &self,
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        live: bool,
        resume: Option<&crate::claude::Continuation>,
    ) -> Output {
        let mut text = match self.command_text(template, vars) {
            Ok(text) => text,
            Err(out) => return out,
        };
        let resume = resume.filter(|_| live);
        // A step's own command has its settings merged with the workflow's in the plan; a
        // check of `step_validate` runs with the workflow's defaults.
        let settings = if live {
            step.claude.as_ref()
        } else {
            self.plan.claude.as_ref()
        };
        let (program, mut args) =
            match crate::claude::invocation(self.opts.claude_command.as_deref(), settings) {
                Ok(invocation) => invocation,
                Err(e) => return Output::error(e.to_string()),
            };
        if let Some(resume) = resume {
            resume.resume(&mut args);
            text = resume.prompt(&text);
        }
        let mut log = (!self.session.is_empty()).then(|| {
            crate::logs::create_numbered(&self.log_dir(), &step.label, "jsonl", self.masker())
        });
        let log_path = log.as_ref().filter(|l| l.is_open()).map(|l| l.path.clone());
        self.record(&crate::events::Event::ClaudeStarted {
            step: step.label.clone(),
            program: program.clone(),
            args: args.clone(),
            cli_version: crate::claude::version().map(str::to_owned),
            log: log_path.clone(),
        });
        self.say_claude_command(&program, &args, &text);
        let mut stream = crate::claude::Stream::default();
        // What Claude does is shown (as the reporter decides) for the step's own call.
        let shown = live && self.shows_output();
        // When the CLI last reported an event, for `stall_timeout`.
        let heard = std::cell::Cell::new(tokio::time::Instant::now());
        // What this call has added to the running calls' cost, in millionths of a dollar.
        let counted = std::cell::Cell::new(0_u64);
        let mut watch = |line: &str| {
            heard.set(tokio::time::Instant::now());
            if let Some(log) = log.as_mut() {
                // Flushed a line at a time: `prodigy status` and `ui` read the call as it
                // streams (a call's events are few; a command's output is not flushed so).
                log.line_flushed(line);
            }
            let turns = stream.turns;
            let answers = stream.api_answers;
            let notes = stream.feed(line);
            // The CLI retrying a 429 or 529 itself tells the rate governor too, and so does
            // the API answering again.
            self.api_retries_seen(&notes);
            if stream.api_answers > answers {
                self.api_answered();
            }
            let so_far = crate::progress::micros(stream.cost().0);
            if so_far > counted.get() {
                self.live_cost_micros
                    .fetch_add(so_far - counted.get(), std::sync::atomic::Ordering::Relaxed);
                counted.set(so_far);
            }
            if stream.turns > turns {
                self.live_turns.fetch_add(
                    u64::from(stream.turns - turns),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            if shown {
                for note in notes {
                    self.say(Message::Claude(note));
                }
            }
        };
        // The call stops on its own signal, which the watchdog sets when the run stops or
        // the CLI goes silent.
        let (stop_call, stop_rx) = tokio::sync::watch::channel(false);
        // The raw stream is in the log; memory keeps only its end.
        let io = Io {
            watch: Some(&mut watch),
            keep: Some(64 << 10),
            cancel: Some(stop_rx),
        };
        let kind = crate::executor::RequestKind::Claude { prompt: text };
        let call = self.spawn_command(kind, program, args, step, vars, timeout, io);
        let stall = settings.and_then(|s| s.stall_timeout);
        let (out, stalled) = self.stall_watchdog(call, stall, &heard, &stop_call).await;
        if let Some(log) = log.as_mut() {
            self.end_claude_log(log, out.timed_out, stalled);
        }
        self.live_turns.fetch_sub(
            u64::from(stream.turns),
            std::sync::atomic::Ordering::Relaxed,
        );
        // Its cost now counts in the run's totals instead.
        self.live_cost_micros
            .fetch_sub(counted.get(), std::sync::atomic::Ordering::Relaxed);
        if out.spawn_error {
            // Nothing ran: the reason is the failure, not a missing `result`.
            return out;
        }
        self.claude_result(step, out, stream, (stalled, shown), log_path)
    }

    /// Ends a Claude call's LOG: with the line that says prodigy ended the call (`timed_out`,
    /// `stalled`), for `prodigy logs`, which reads only the log; a write that failed is said.
    fn end_claude_log(&self, log: &mut crate::logs::LineLog, timed_out: bool, stalled: bool) {
        let ended = if timed_out {
            crate::claude::End::TimedOut.log_line()
        } else if stalled {
            crate::claude::End::Stalled.log_line()
        } else {
            None
        };
        if let Some(line) = ended {
            log.line(&line);
        }
        log.finish();
        if let Some(e) = &log.error {
            self.say(Message::ClaudeLogNotWritten {
                path: log.path.clone(),
                why: e.to_string(),
            });
        }
    }

    /// Says the Claude call about to run: PROGRAM and ARGS quoted, and the prompt TEXT as
    /// a here-string would give it.
    fn say_claude_command(&self, program: &str, args: &[String], text: &str) {
        let shown: Vec<String> = std::iter::once(program)
            .chain(args.iter().map(String::as_str))
            .map(|word| {
                shlex::try_quote(word)
                    .map_or_else(|_| word.to_owned(), std::borrow::Cow::into_owned)
            })
            .collect();
        // The prompt goes to the CLI's standard input; it is shown as a here-string would
        // give it, masked before it is quoted (quoting could hide a secret from the mask).
        let masked = self.mask(text);
        let prompt =
            shlex::try_quote(&masked).map_or_else(|_| masked.clone(), std::borrow::Cow::into_owned);
        self.say(Message::Command(format!(
            "{} <<< {prompt}",
            shown.join(" ")
        )));
    }

    /// What a finished Claude call gives its step: OUT with the STREAM's verdict as its
    /// output, recorded and added to the run's (and the agent's) totals. STALLED: the
    /// watchdog stopped the call; SHOWN: its events were shown as they came.
    fn claude_result(
        &self,
        step: &PlanStep,
        mut out: Output,
        stream: crate::claude::Stream,
        (stalled, shown): (bool, bool),
        log_path: Option<PathBuf>,
    ) -> Output {
        let ended = match (out.code, out.timed_out, stalled) {
            (_, true, _) => crate::claude::End::TimedOut,
            (_, false, true) => crate::claude::End::Stalled,
            (Some(code), false, false) if !out.cancelled => crate::claude::End::Exited(code),
            (_, false, false) => crate::claude::End::Killed,
        };
        if stalled {
            // Stopped by prodigy as a failed call, not by the run stopping.
            out.cancelled = false;
        }
        // A call stopped after its `result` arrived (the job stopping under `on_budget:
        // stop` or `--cancel-running` while the CLI wound down) did its work, and it was
        // paid for: it ends as the result says, with the exit code the CLI gives it.
        let ended = match (&stream.result, ended) {
            (Some(result), crate::claude::End::Killed) if out.cancelled => {
                let code = i32::from(result.is_error);
                out.cancelled = false;
                out.code = Some(code);
                crate::claude::End::Exited(code)
            }
            (_, ended) => ended,
        };
        let limit = stream.usage_limit(ended.code(), self.wall_secs());
        let mut call = stream.finish(ended, log_path);
        call.usage_limit = limit;
        call.cancelled = out.cancelled;
        out.streamed = shown;
        // `${shell.output}`: the final text, then what the CLI wrote on standard error.
        out.interleaved = None;
        // What the step gives on: the final text, never the raw events.
        out.stdout = if call.verdict.message.is_empty() || call.verdict.message.ends_with('\n') {
            call.verdict.message.clone()
        } else {
            format!("{}\n", call.verdict.message)
        };
        self.record(&crate::events::Event::ClaudeFinished {
            step: step.label.clone(),
            success: call.verdict.kind.is_none() && !out.timed_out && !out.cancelled,
            error_kind: call.verdict.kind,
            message: (call.verdict.kind.is_some()).then(|| call.verdict.message.clone()),
            session_id: call.session_id.clone(),
            num_turns: call.num_turns,
            cost_usd: call.cost_usd,
            cost_estimated: call.cost_estimated,
            tokens: call.tokens,
            tool_calls: call.tool_calls,
            api_retries: call.api_retries,
            exit_code: out.code,
            log: call.log.clone(),
            duration_secs: out.duration.as_secs_f64(),
        });
        lock(&self.claude_totals).add(&call);
        if let Some(a) = self.agent() {
            a.claude.borrow_mut().add(&call);
            a.trail.borrow_mut().add_call(&call);
            if let Some(session) = call.session_id.clone().filter(|s| !s.is_empty()) {
                a.sessions.borrow_mut().insert(step.label.clone(), session);
            }
        }
        out.claude = Some(Box::new(call));
        out
    }

    /// Warns when the shell script TEXT of STEP reads a variable that prodigy left out of its
    /// environment ENV (too large, or past the budget): the script would read it as empty.
    /// Once per step and variable in a run, and shown without `-v`, also for a map agent.
    fn warn_left_out(
        &self,
        step: &PlanStep,
        text: &str,
        env: &[(String, String)],
        left_out: &crate::vars::LeftOut,
    ) {
        for name in crate::vars::env_references(text) {
            if let Some(why) = left_out.why(name, env)
                && lock(&self.env_warned).insert((step.label.clone(), name.to_owned()))
            {
                self.say_for_run(Message::NotExported {
                    step: step.label.clone(),
                    name: name.to_owned(),
                    why,
                });
            }
        }
    }

    /// Awaits CALL, a Claude call that stops when STOP is set: it is set when the run stops,
    /// and when STALL passes with no event from the CLI (HEARD: when the last came), as
    /// `stall_timeout` asks (docs/language.md §2). Says whether the call was stopped for
    /// being silent.
    async fn stall_watchdog(
        &self,
        call: impl std::future::Future<Output = Output>,
        stall: Option<Duration>,
        heard: &std::cell::Cell<tokio::time::Instant>,
        stop: &tokio::sync::watch::Sender<bool>,
    ) -> (Output, bool) {
        let mut cancel = self.cancel_rx();
        let watchdog = async {
            loop {
                let silent = async {
                    match stall {
                        Some(stall) => tokio::time::sleep_until(heard.get() + stall).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = exec::cancelled(&mut cancel) => return false,
                    () = silent => {
                        // An event may have come since the timer was set.
                        if stall.is_some_and(|s| heard.get() + s <= tokio::time::Instant::now()) {
                            return true;
                        }
                    }
                }
            }
        };
        tokio::pin!(call);
        let stalled = tokio::select! {
            out = &mut call => return (out, false),
            stalled = watchdog => stalled,
        };
        let _ = stop.send(true);
        (call.await, stalled)
    }

    /// Renders TEMPLATE and runs it with the step's directory and environment; a LIVE
    /// command's (a step's own) standard output goes to a reporter that shows output as it
    /// arrives.
    pub(crate) async fn run_command_for(
        &self,
        build: &dyn Fn(&str) -> (String, Vec<String>),
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        live: bool,
    ) -> Output {
        let text = match self.command_text(template, vars) {
            Ok(text) => text,
            Err(out) => return out,
        };
        self.say(Message::Command(text.clone()));
        let (program, args) = build(&text);
        let kind = crate::executor::RequestKind::Shell { text };
        let shown_as = if live {
            self.output_shown_as(step)
        } else {
            None
        };
        let streamed = shown_as.is_some();
        let mut watch = |line: &str| {
            if let Some(shown_as) = shown_as {
                self.say(shown_as(line.to_owned()));
            }
        };
        let mut out = self
            .spawn_command(
                kind,
                program,
                args,
                step,
                vars,
                timeout,
                Io {
                    watch: streamed.then_some(&mut watch as &mut dyn FnMut(&str)),
                    keep: None,
                    cancel: None,
                },
            )
            .await;
        out.streamed = streamed;
        out
    }

    /// Runs PROGRAM with ARGS (KIND, rendered) in the step's directory and environment, with
    /// the run's executor; WATCH sees each line of standard output as it arrives.
    #[expect(
        clippy::too_many_arguments,
        reason = "what a command is made of, each given by its caller"
    )]
    pub(crate) async fn spawn_command(
        &self,
        kind: crate::executor::RequestKind,
        program: String,
        args: Vec<String>,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        io: Io<'_>,
    ) -> Output {
        let mut step_env = Vec::new();
        for var in &step.env {
            match self
                .env_value(&var.name.value, &var.value, vars, false)
                .await
            {
                Ok(Some(v)) => {
                    step_env.push((var.name.value.clone(), prodigy_grammar::value::render(&v)));
                }
                Ok(None) => {}
                Err(e) => return Output::error(e.to_string()),
            }
        }
        for (name, value) in &step_env {
            let shown = if crate::vars::sensitive_name(name) {
                "***REDACTED***"
            } else {
                value.as_str()
            };
            self.say(Message::Env {
                name: name.clone(),
                value: shown.to_owned(),
            });
        }
        // `clear_env`: an empty environment plus the step's own `env` and `PATH` (docs/language.md §2).
        let (mut env, left_out) = if step.clear_env {
            (Vec::new(), crate::vars::LeftOut::default())
        } else {
            vars.environment_left_out()
        };
        env.extend(step_env);
        claude_env(&mut env, step, &kind);
        // Secrets win over step env.
        if !step.clear_env {
            for secret in &self.plan.secrets {
                let name = &secret.name.value;
                if let Some(value) = vars.values.get(name) {
                    env.push((name.clone(), prodigy_grammar::value::render(value)));
                }
            }
        }
        if let crate::executor::RequestKind::Shell { text } = &kind {
            self.warn_left_out(step, text, &env, &left_out);
        }
        let cwd = match self.cwd(step, vars) {
            Ok(cwd) => cwd,
            Err(e) => return Output::error(e.to_string()),
        };
        // A script holding a secret's value reaches `sh` through its environment, which
        // only its user can read, not as an argument every local user can read in
        // `/proc/PID/cmdline` (docs/language.md §2).
        let args = match &kind {
            crate::executor::RequestKind::Shell { text }
                if self.plan.secrets.iter().any(|secret| {
                    vars.values
                        .get(&secret.name.value)
                        .map(prodigy_grammar::value::render)
                        .is_some_and(|value| !value.is_empty() && text.contains(&value))
                }) =>
            {
                env.push((exec::SCRIPT_ENV.to_owned(), text.clone()));
                exec::shell_from_env().1
            }
            crate::executor::RequestKind::Shell { .. }
            | crate::executor::RequestKind::Claude { .. } => args,
        };
        let spill = (!self.session.is_empty() && io.keep.is_none()).then(|| self.spill_path(step));
        let command = Command {
            program,
            args,
            cwd,
            env,
            clear_env: step.clear_env,
            timeout,
            grace: self
                .agent()
                .and_then(|a| a.grace)
                .unwrap_or(self.opts.grace),
            output_limit: io.keep.unwrap_or(self.opts.output_limit),
            mask: if spill.is_some() { self.masker() } else { None },
            spill,
            // A Claude call's prompt is fed on standard input, never as an argument.
            stdin: match &kind {
                crate::executor::RequestKind::Claude { prompt } => Some(prompt.clone()),
                crate::executor::RequestKind::Shell { .. } => None,
            },
            agent: self
                .agent()
                .map(|a| a.agent_id.clone())
                .filter(|id| !id.is_empty()),
        };
        let request = crate::executor::Request {
            kind,
            command,
            watch: io.watch,
            cancel: io.cancel.unwrap_or_else(|| self.cancel_rx()),
        };
        self.executor.run(request).await
    }
}

/// What the environment ENV of STEP's command (KIND) gets for Claude: `PRODIGY_AUTOMATION` for
/// a `claude:` step, and the CLI's own retry budget for every Claude call, when the user set
/// none (docs/claude.md).
fn claude_env(
    env: &mut Vec<(String, String)>,
    step: &PlanStep,
    kind: &crate::executor::RequestKind,
) {
    if matches!(step.command, PlanCommand::Claude(_)) {
        env.push(("PRODIGY_AUTOMATION".into(), "true".into()));
    }
    match kind {
        crate::executor::RequestKind::Claude { .. } => {
            let inherited = std::env::var_os(crate::claude::RETRIES_ENV);
            let budget = crate::claude::retry_budget(env, !step.clear_env, inherited.as_deref());
            env.extend(budget);
        }
        crate::executor::RequestKind::Shell { .. } => {}
    }
}

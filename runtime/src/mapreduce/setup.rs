//! The setup phase, its `capture_outputs`, and loading the map input through its pipeline.

use crate::message::{Message, StepList};

use prodigy_grammar::pipeline::InputKind;
use prodigy_plan::{CaptureSource, Multiline, OutputCapture};
use serde_json::Value;

use crate::machine::Outcome;
use crate::mapreduce::{JobOutcome, MapJob, Stopped, guarded, scope_for};
use crate::step::CaptureError;
use crate::vars::{CommandOutput, Vars};

/// Why a job's items could not be loaded (`map.input` and its pipeline), or, for `prodigy
/// items --run-setup`, why its `setup` did not end well.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ItemsError {
    /// `map.input` did not render.
    #[error("`map.input`: {0}")]
    Render(#[source] prodigy_grammar::template::RenderError),
    /// `map.input` names a file that is not there.
    #[error("the map input file `{}` does not exist", path.display())]
    Missing {
        /// Where it was looked for.
        path: std::path::PathBuf,
    },
    /// The file or the command's output could not be read.
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    /// The input is not JSON (or JSON lines) as its kind says.
    #[error("the map input `{input}`: {why}")]
    Parse {
        /// `map.input`, rendered.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// `json_path` selected nothing, and `--strict` wants items.
    #[error(
        "`json_path: {json_path}` selected nothing from the map input `{input}` (with --strict, a job needs items)"
    )]
    NothingSelected {
        /// The `json_path`.
        json_path: String,
        /// `map.input`, rendered and trimmed.
        input: String,
    },
    /// `setup` failed; WHAT says how.
    #[error("{what}")]
    SetupFailed {
        /// What failed, as the job says it.
        what: String,
    },
    /// `setup` was interrupted.
    #[error("setup was interrupted")]
    SetupInterrupted,
    /// `setup` ended in another way.
    #[error("setup ended as {0:?}")]
    SetupEnded(JobOutcome),
}

impl MapJob<'_> {
    /// After `setup` in a session worktree: warns once, naming them, about the files setup
    /// left that no commit holds, since agents branch from commits only and will not see
    /// them (a `mkdir out` in setup, and every item fails). The map input file is left out:
    /// prodigy reads it itself, so setup may well leave it uncommitted.
    pub(crate) async fn warn_setup_leftovers(&self, vars: &Vars) {
        let (Some(session), Some(_)) = (self.runner.worktree(), &self.plan.setup) else {
            return;
        };
        let input = self
            .plan
            .map
            .as_ref()
            .and_then(|m| m.input.parsed.render(vars).ok())
            .map(|i| i.trim().trim_start_matches("./").to_owned());
        let mut left = crate::worktree::not_committed(&session.path).await;
        left.retain(|u| Some(u.path.as_str()) != input.as_deref());
        // What `worktree:` copies and links is in every agent's worktree too.
        left.retain(|u| !crate::worktree::bootstrap::is_prepared(&self.plan.worktree, &u.path));
        if left.is_empty() {
            return;
        }
        let paths: Vec<&str> = left.iter().map(|u| u.path.as_str()).collect();
        self.runner
            .record(&crate::events::Event::SetupLeftUncommitted {
                paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            });
        self.say(Message::SetupLeftovers {
            left,
            worktree: session.path.clone(),
        });
    }

    /// `setup`: its steps in order under the phase `timeout`, then `capture_outputs`.
    pub(crate) async fn setup(&mut self, vars: &mut Vars) -> Result<(), JobOutcome> {
        let Some(setup) = &self.plan.setup else {
            return Ok(());
        };
        self.runner.record(&crate::events::Event::SetupStarted {
            steps: setup.steps.len(),
        });
        let total = setup.steps.len();
        let plan = self.plan;
        let (scope, stop) = scope_for(None, None, None);
        // Under the setup's timeout, stopped like an agent.
        let runner = &self.runner.in_agent(scope);
        let body = async {
            let mut outputs = Vec::new();
            for (index, &id) in setup.steps.iter().enumerate() {
                let label = plan.step(id).map(|s| s.label.clone()).unwrap_or_default();
                runner.say(Message::StepStarted {
                    phase: StepList::Setup,
                    number: index + 1,
                    total,
                    label: label.clone(),
                });
                vars.commands.remove(&id.0);
                let outcome = runner.run_step(id, vars, Some(index)).await;
                outputs.push(vars.commands.get(&id.0).cloned());
                if !outcome.continues() {
                    return (outcome, Some(label), outputs);
                }
            }
            (Outcome::Succeeded, None, outputs)
        };
        let ((outcome, failed, outputs), why) =
            guarded(self.runner, stop, body, setup.timeout, None).await;
        match (why, outcome) {
            (Some(Stopped::Cancelled), _) | (None, Outcome::Cancelled) => {
                return Err(JobOutcome::Interrupted);
            }
            (Some(Stopped::TimedOut), _) => {
                let what = format!(
                    "setup timed out after {}",
                    humantime::format_duration(setup.timeout.unwrap_or_default())
                );
                self.say(Message::JobFailed(what.clone()));
                return Err(JobOutcome::Failed {
                    phase: "setup",
                    what,
                });
            }
            (None, o) if !o.continues() => {
                return Err(JobOutcome::Failed {
                    phase: "setup",
                    what: format!("step `{}` failed", failed.unwrap_or_default()),
                });
            }
            (None, _) => {}
        }
        for capture in &setup.capture_outputs {
            let index = usize::try_from(capture.command_index).unwrap_or(usize::MAX);
            // A step that ran no command (skipped by `when`, a `write_file`) has no output:
            // the `default` stands in, if there is one.
            let value = match (outputs.get(index), &capture.default) {
                (Some(Some(out)), _) => setup_value(capture, out),
                (_, Some(default)) => Ok(Value::String(default.clone())),
                (_, None) => Err(CaptureError::NoOutput {
                    name: capture.name.clone(),
                    index,
                }),
            };
            match value {
                Ok(value) => {
                    self.runner
                        .record(&crate::events::Event::SetupVariableCaptured {
                            name: capture.name.clone(),
                            phase: "setup".to_owned(),
                        });
                    vars.set(capture.name.clone(), value);
                }
                Err(why) => {
                    let why = why.to_string();
                    self.say(Message::JobFailed(why.clone()));
                    return Err(JobOutcome::Failed {
                        phase: "setup",
                        what: why,
                    });
                }
            }
        }
        self.runner.record(&crate::events::Event::SetupFinished {});
        Ok(())
    }

    /// The items: `map.input` as a file under the project (JSON, or one item per line), else
    /// as a shell command whose stdout is the input; then the pipeline of docs/language.md §7.
    pub(crate) async fn load_items(&self, vars: &Vars) -> Result<Vec<Value>, ItemsError> {
        let Some(map) = &self.plan.map else {
            return Ok(Vec::new());
        };
        let input = map.input.parsed.render(vars).map_err(ItemsError::Render)?;
        let mut path = self.runner.workdir().join(input.trim());
        let outside = self.runner.opts.project.join(input.trim());
        if !path.exists() && self.runner.worktree().is_some() && outside.exists() {
            // An input the user has not committed is not in the session worktree.
            self.say(Message::InputFromProject {
                input: input.trim().to_owned(),
                project: self.runner.opts.project.clone(),
            });
            path = outside;
        }
        // Anything at the path is the input file; only a regular file within the bound is
        // read, so a device or a FIFO is refused rather than read without end.
        let (text, kind) = if path.exists() {
            let text = crate::input::read_file(&path, crate::input::MAX_INPUT_SIZE)?;
            (text, InputKind::of_file(input.trim()))
        } else if crate::input::names_a_file(&input) {
            return Err(ItemsError::Missing { path });
        } else {
            let stdout = crate::input::run_command(
                &input,
                &self.runner.workdir(),
                vars.environment(),
                self.runner.opts.grace,
                &mut self.runner.cancel_rx(),
            )
            .await?;
            (stdout, InputKind::Text)
        };
        let parsed = prodigy_grammar::pipeline::parse_input(&text, kind).map_err(|why| {
            ItemsError::Parse {
                input: input.clone(),
                why,
            }
        })?;
        if let Some(first) = parsed.numbers_as_text.first() {
            self.say(Message::NumbersAsText {
                count: parsed.numbers_as_text.len(),
                first: first.clone(),
            });
        }
        let pipeline = map.pipeline();
        let (items, counts) = pipeline.apply(parsed.document);
        self.runner.record(&crate::events::Event::InputLoaded {
            input: input.clone(),
            selected: counts.selected,
            filtered: counts.filtered,
            distinct: counts.distinct,
            items: counts.kept,
            // Items without the `distinct` field, which it kept as one.
            distinct_missing: map.distinct.is_some().then_some(counts.distinct_missing),
        });
        if let Some(json_path) = map.json_path.as_ref().filter(|_| counts.selected == 0) {
            if self.opts.strict {
                return Err(ItemsError::NothingSelected {
                    json_path: json_path.value.clone(),
                    input: input.trim().to_owned(),
                });
            }
            self.say(Message::NothingSelected {
                json_path: json_path.value.clone(),
                input: input.trim().to_owned(),
            });
        }
        if let Some(distinct) = map
            .distinct
            .as_ref()
            .filter(|_| counts.distinct_missing > 1)
        {
            let field = distinct.value.trim();
            self.say(Message::DistinctMissing {
                field: field.to_owned(),
                missing: counts.distinct_missing,
            });
        }
        self.say(Message::ItemsLoaded {
            items: counts.kept,
            stages: crate::progress::stage_counts(&pipeline, &counts),
        });
        Ok(items)
    }
}

/// `prodigy items --run-setup`: RUNNER's job `setup` (its `capture_outputs` too) with VARS,
/// then the items its map input gives (docs/language.md §7). Nothing of a job is kept: give it
/// a runner that records nothing ([`Runner::unrecorded`]) in a place that is thrown away.
///
/// # Errors
///
/// Why setup failed, was interrupted, or the items could not be read.
pub async fn setup_and_items(
    runner: &crate::runner::Runner,
    mut vars: Vars,
) -> Result<Vec<Value>, ItemsError> {
    let checkpoint = crate::session::new_job_checkpoint("items-preview", &runner.opts);
    let mut job = MapJob::new(
        runner,
        crate::jobstore::JobFiles::new(std::path::PathBuf::new()),
        checkpoint,
        crate::mapreduce::JobOptions::default(),
        false,
    );
    match job.setup(&mut vars).await {
        Ok(()) => {}
        Err(JobOutcome::Failed { what, .. }) => return Err(ItemsError::SetupFailed { what }),
        Err(JobOutcome::Interrupted) => return Err(ItemsError::SetupInterrupted),
        Err(other) => return Err(ItemsError::SetupEnded(other)),
    }
    job.load_items(&vars).await
}

/// A setup `capture_outputs` entry from its step's output.
pub(crate) fn setup_value(
    capture: &OutputCapture,
    out: &CommandOutput,
) -> Result<Value, CaptureError> {
    let CommandOutput {
        stdout,
        stderr,
        success,
    } = out;
    let name = &capture.name;
    let mut text = match capture.source {
        CaptureSource::Stdout => stdout.clone(),
        CaptureSource::Stderr => stderr.clone(),
        CaptureSource::Both => format!("stdout:\n{stdout}\nstderr:\n{stderr}"),
        CaptureSource::Combined => format!("{stdout}{stderr}"),
    };
    if let Ok(max) = usize::try_from(capture.max_size)
        && max > 0
        && text.len() > max
    {
        text.truncate(text.floor_char_boundary(max));
    }
    let mut found = Some(text);
    if let (Some(pattern), Some(t)) = (&capture.pattern, &found) {
        found = pattern
            .regex()
            .captures(t)
            .and_then(|c| c.get(1).or_else(|| c.get(0)).map(|m| m.as_str().to_owned()));
    }
    if let (Some(path), Some(t)) = (&capture.json_path, &found) {
        found = serde_json::from_str::<Value>(t)
            .ok()
            .and_then(|doc| path.parsed.select(&doc).into_iter().next())
            .map(|v| match v {
                Value::String(s) => s,
                other => other.to_string(),
            });
    }
    let text = match (found, &capture.default) {
        (Some(t), _) => t,
        (None, Some(default)) => default.clone(),
        (None, None) => {
            return Err(CaptureError::NothingFound {
                name: name.clone(),
                index: capture.command_index,
            });
        }
    };
    let text = match capture.multiline {
        Multiline::Preserve => text,
        Multiline::Join => text.lines().collect::<Vec<_>>().join(" "),
        Multiline::FirstLine => text.lines().next().unwrap_or("").to_owned(),
        Multiline::LastLine => text.lines().last().unwrap_or("").to_owned(),
        Multiline::Array => {
            return Ok(Value::Array(
                text.lines().map(|l| Value::String(l.to_owned())).collect(),
            ));
        }
    };
    crate::step::typed_value(capture.format, name, &text, *success)
}

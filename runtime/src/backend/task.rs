//! What the state layer records of a backend's task (ARCHITECTURE.md, "Layers"): which
//! task ran an item ([`TaskRef`], with the Slurm ids of earlier records, [`SlurmIds`]), and
//! why a task's agent could not start ([`NotStarted`]). Records, the DLQ, events and
//! messages hold them; how a backend finds or says them is the backend's.

use serde::{Deserialize, Serialize};

/// The task that ran an item on a backend, as records, the DLQ and events name it. Reads
/// the `slurm_job_id`/`slurm_task_id` pair that records of earlier versions hold too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "TaskRefWire")]
pub struct TaskRef {
    /// The backend: `slurm`, `container`.
    pub backend: String,
    /// Its id there: `JOB_TASK` on Slurm, the container's name.
    pub id: String,
    /// The node (Slurm) or host (container) that ran it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TaskRefWire {
    Current {
        backend: String,
        id: String,
        #[serde(default)]
        node: Option<String>,
    },
    Slurm(SlurmIds),
}

impl From<TaskRefWire> for TaskRef {
    fn from(wire: TaskRefWire) -> Self {
        match wire {
            TaskRefWire::Current { backend, id, node } => TaskRef { backend, id, node },
            TaskRefWire::Slurm(ids) => TaskRef::from(&ids),
        }
    }
}

impl From<&SlurmIds> for TaskRef {
    fn from(ids: &SlurmIds) -> Self {
        TaskRef {
            backend: "slurm".to_owned(),
            id: ids.task(),
            node: None,
        }
    }
}

/// The Slurm ids of the task that ran an item, as `squeue -j` takes them together
/// (`JOB_TASK`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmIds {
    /// The array job's id.
    pub slurm_job_id: String,
    /// The array task's id (the item's index).
    pub slurm_task_id: usize,
}

impl SlurmIds {
    /// `JOB_TASK`, the form `squeue -j`, `scontrol` and `scancel` take.
    pub fn task(&self) -> String {
        format!("{}_{}", self.slurm_job_id, self.slurm_task_id)
    }
}

/// Why a task's agent could not start on its node, as the node tells it: in the task's
/// Slurm job comment (`prodigy-not-started:KIND DETAIL`, [`NotStarted::comment`]), which
/// the coordinator reads with `squeue` once the task has ended without an outcome. It
/// names nothing of the coordinator's disk and never the secret (every user of the cluster
/// can read a job's comment).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotStarted {
    /// The program the task runs is not there.
    #[error("{}", missing_program(program))]
    NoProgram {
        /// As the batch script names it.
        program: String,
    },
    /// The program is there but cannot be run.
    #[error("`{program}` is there but is not an executable file")]
    NotExecutable {
        /// As the batch script names it.
        program: String,
    },
    /// No secret came on the agent's standard input.
    #[error("no secret came on the standard input of `prodigy agent --serve`")]
    NoSecret,
    /// The node's directory for clones and output cannot be used.
    #[error("its node directory cannot be used: {why}")]
    NodeDir {
        /// Why.
        why: String,
    },
    /// The job's repository could not be fetched from the coordinator.
    #[error("it could not fetch the job's repository from {url}: {why}")]
    Fetch {
        /// The served repository.
        url: String,
        /// Why (git's first line).
        why: String,
    },
}

/// How [`NotStarted::NoProgram`] reads for PROGRAM.
fn missing_program(program: &str) -> String {
    if program.contains('/') {
        format!(
            "`{program}` does not exist there (install prodigy at that path on every node, or name the nodes' program with `PRODIGY_SLURM_PROGRAM`)"
        )
    } else {
        format!("`{program}` is not on its `PATH`")
    }
}

/// What starts a task's job comment that says why its agent could not start.
const NOT_STARTED: &str = "prodigy-not-started:";

/// The most of a reason's detail a job comment holds.
const DETAIL_MAX: usize = 300;

impl NotStarted {
    /// Its job comment: `prodigy-not-started:KIND DETAIL`, on one line.
    pub fn comment(&self) -> String {
        let (kind, detail) = match self {
            NotStarted::NoProgram { program } => ("program", program.clone()),
            NotStarted::NotExecutable { program } => ("not-executable", program.clone()),
            NotStarted::NoSecret => ("no-secret", String::new()),
            NotStarted::NodeDir { why } => ("node-dir", why.clone()),
            NotStarted::Fetch { url, why } => ("fetch", format!("{url} {why}")),
        };
        let detail: String = detail
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(DETAIL_MAX)
            .collect();
        format!("{NOT_STARTED}{kind} {detail}")
            .trim_end()
            .to_owned()
    }

    /// What the item of task TASK (Slurm's `JOB_TASK`), on NODE, failed with.
    pub fn on_task(&self, task: &str, node: &str) -> String {
        format!("the Slurm task {task} could not start its agent on {node}: {self}")
    }

    /// The reason a job comment TEXT gives, when it is one of [`NotStarted::comment`]'s.
    pub fn parse(text: &str) -> Option<NotStarted> {
        let rest = text.trim().strip_prefix(NOT_STARTED)?;
        let (kind, detail) = rest.split_once(' ').unwrap_or((rest, ""));
        let detail = detail.to_owned();
        Some(match kind {
            "program" => NotStarted::NoProgram { program: detail },
            "not-executable" => NotStarted::NotExecutable { program: detail },
            "no-secret" => NotStarted::NoSecret,
            "node-dir" => NotStarted::NodeDir { why: detail },
            "fetch" => {
                let (url, why) = detail.split_once(' ').unwrap_or((&detail, ""));
                NotStarted::Fetch {
                    url: url.to_owned(),
                    why: why.to_owned(),
                }
            }
            _ => return None,
        })
    }
}

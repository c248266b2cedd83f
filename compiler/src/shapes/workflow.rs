//! The workflow's own keys, and `slurm`.

use super::{
    CLAUDE_DEFAULTS, ENV_VALUE_TY, ERROR_COLLECTION_TY, ERROR_POLICY, ITEM_FAILURE_TY, MAP, MERGE,
    PHASE_COMMANDS, SECRET_PROVIDER, SETUP, Shape, TEMPLATES_TY, Ty, key, required,
};

/// A workflow written as a mapping.
pub static WORKFLOW: Shape = Shape {
    name: "workflow",
    doc: "A workflow: its steps, or for `mode: mapreduce` its setup, map and reduce phases.",
    keys: &[
        key(
            "name",
            Ty::Text,
            "Name of the workflow, shown in logs, events and the graph.",
        ),
        key(
            "description",
            Ty::Text,
            "What the workflow does, for its readers.",
        ),
        key(
            "mode",
            Ty::Enum(&["standard", "mapreduce"]),
            "Kind of workflow: `standard` (default) runs `commands`; `mapreduce` runs `setup`, `map` and `reduce`.",
        ),
        key(
            "commands",
            Ty::Steps,
            "Steps of a standard workflow, run in order.",
        ),
        key("steps", Ty::Steps, "Alias of `commands`."),
        key(
            "env",
            Ty::Map(&ENV_VALUE_TY),
            "Environment variables of every step: strings, numbers or booleans (templates), or masked, dynamic or conditional values.",
        ),
        key(
            "secrets",
            Ty::Map(&Ty::OneOf(&[Ty::Text, Ty::Object(&SECRET_PROVIDER)])),
            "Secrets by name: the process variable to read (`NAME` or `${env:NAME}`) or `{provider, key}`; their values are masked as `***`.",
        ),
        key(
            "env_files",
            TEMPLATES_TY,
            "Files of `KEY=VALUE` lines, loaded before `env`: a path or a list of paths.",
        ),
        key(
            "claude",
            Ty::Object(&CLAUDE_DEFAULTS),
            "Defaults of every Claude call (`model`, `max_turns`, ...); a step's own settings override them field by field.",
        ),
        key(
            "profiles",
            Ty::Map(&Ty::Map(&Ty::Template)),
            "Named sets of environment variables (with an optional `description`), chosen with `prodigy run --profile NAME`.",
        ),
        key(
            "handlers",
            Ty::Map(&Ty::Steps),
            "Named lists of steps; `on_item_failure: custom:NAME` runs one for each failed map item.",
        ),
        key(
            "merge",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&MERGE)]),
            "Steps run when the session worktree is merged back: a list, or `{commands, timeout}`.",
        ),
        key(
            "error_policy",
            Ty::Object(&ERROR_POLICY),
            "What a MapReduce job does when map items fail.",
        ),
        key(
            "setup",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&SETUP)]),
            "Steps run once before the map phase (MapReduce only): a list, or `{commands, timeout, capture_outputs}`.",
        ),
        key(
            "map",
            Ty::Object(&MAP),
            "The map phase (MapReduce only): the input items and the steps each item runs.",
        ),
        key(
            "reduce",
            Ty::OneOf(&[Ty::Steps, Ty::Object(&PHASE_COMMANDS)]),
            "Steps run once after the map phase (MapReduce only), with `${map.*}` set.",
        ),
        key(
            "on_item_failure",
            ITEM_FAILURE_TY,
            "What happens to a failed map item: `dlq` (default), `retry`, `skip`, `stop` or `custom:HANDLER`; shorthand for `error_policy.on_item_failure`.",
        ),
        key(
            "continue_on_failure",
            Ty::Bool,
            "Whether the map phase goes on after an item fails (default true); shorthand for `error_policy.continue_on_failure`.",
        ),
        key(
            "max_failures",
            Ty::Int { min: 1 },
            "Number of failed items at which the job stops; shorthand for `error_policy.max_failures`.",
        ),
        key(
            "failure_threshold",
            Ty::Number { min: 0.0, max: 1.0 },
            "Failure rate, from 0 to 1, above which the job stops once 10 items have finished; shorthand for `error_policy.failure_threshold`.",
        ),
        key(
            "error_collection",
            ERROR_COLLECTION_TY,
            "How item errors are reported: `aggregate` (default), `immediate`, `batched:N` or `{batched: {size: N}}`; shorthand for `error_policy.error_collection`.",
        ),
        key(
            "slurm",
            Ty::Object(&SLURM),
            "The `sbatch` options of the map agents when they run on Slurm (`prodigy run --executor slurm`); the same as `executor.slurm`.",
        ),
        key(
            "executor",
            Ty::Object(&EXECUTOR),
            "How each agent backend runs the map agents (`prodigy run --executor local|slurm|container`).",
        ),
        key(
            "worktree",
            Ty::Object(&WORKTREE),
            "How each worktree prodigy makes is prepared: untracked files copied in (`copy`), directories linked (`link`), `setup` steps run once per worktree, a `sparse` checkout for agents, ignored directories `keep`t between items.",
        ),
        key(
            "notify",
            Ty::List(&Ty::Object(&NOTIFY)),
            "Commands run when the run or job reaches an event (`finished`, `failed`, `paused`, `budget_reached`, `item_dead_lettered`), with `${event.*}` set; a failing one never fails the run.",
        ),
    ],
};

/// `executor`.
pub static EXECUTOR: Shape = Shape {
    name: "executor",
    doc: "How each agent backend runs the map agents; `--executor` chooses the backend.",
    keys: &[
        key(
            "slurm",
            Ty::Object(&SLURM),
            "The `sbatch` options of the map agents under `--executor slurm`.",
        ),
        key(
            "container",
            Ty::Object(&CONTAINER),
            "The image and limits of the map agents' containers under `--executor container`.",
        ),
    ],
};

/// `executor.container`.
pub static CONTAINER: Shape = Shape {
    name: "container",
    doc: "The map agents' containers under `--executor container`.",
    keys: &[
        key(
            "image",
            Ty::Text,
            "The image each agent's container is made from (it needs a shell, git, the C library prodigy was built against and, for Claude steps, the Claude CLI).",
        ),
        key(
            "network",
            Ty::Bool,
            "Whether the agents may use the network (the host's); `false` (the default) runs them with none.",
        ),
        key(
            "cpus",
            Ty::Number {
                min: 0.01,
                max: 1024.0,
            },
            "CPUs for each agent's container (`--cpus`).",
        ),
        key(
            "memory",
            Ty::Text,
            "Memory for each agent's container (`--memory`): bytes, or a number with `k`, `m` or `g`.",
        ),
    ],
};

/// `worktree`.
pub static WORKTREE: Shape = Shape {
    name: "worktree",
    doc: "How each worktree prodigy makes (the session's and every map agent's) is prepared before its first step.",
    keys: &[
        key(
            "copy",
            Ty::List(&Ty::Text),
            "Untracked files of your checkout (paths or globs relative to the repository's root, e.g. `.env`) copied into every worktree, modes kept, never committed.",
        ),
        key(
            "link",
            Ty::List(&Ty::Text),
            "Directories of your checkout (relative to the repository's root, e.g. a dependency cache) symlinked into every worktree, never committed.",
        ),
        key(
            "setup",
            Ty::Steps,
            "Steps run once in each new worktree before its first step or item (not once per item), e.g. installing dependencies.",
        ),
        key(
            "sparse",
            Ty::List(&Ty::Text),
            "Directories map agents check out (a cone-mode sparse checkout); their merges still carry the whole tree.",
        ),
        key(
            "keep",
            Ty::List(&Ty::Text),
            "Ignored directories (e.g. `node_modules`, `target`) that cleaning a reused agent worktree between items keeps.",
        ),
        key(
            "persist",
            Ty::Bool,
            "Keep the map agents' worktrees after the job, cleaned, for the next job in this repository to reuse instead of checking out the whole tree again (big repositories); `prodigy worktree clean` removes them.",
        ),
    ],
};

/// The events a `notify:` entry can name.
const NOTIFY_EVENTS_TY: Ty = Ty::Enum(&[
    "finished",
    "failed",
    "paused",
    "budget_reached",
    "item_dead_lettered",
]);

/// One `notify:` entry.
pub static NOTIFY: Shape = Shape {
    name: "notify",
    doc: "A notification: the events it fires on and the command it runs.",
    keys: &[
        required(
            "on",
            Ty::OneOf(&[NOTIFY_EVENTS_TY, Ty::List(&NOTIFY_EVENTS_TY)]),
            "The events it fires on: `finished`, `failed`, `paused` (a usage limit), `budget_reached`, `item_dead_lettered`; one or a list.",
        ),
        key(
            "shell",
            Ty::Template,
            "A shell command to run (`sh -c`), with `${event.*}` set; secrets in its output are masked.",
        ),
        key(
            "claude",
            Ty::Template,
            "A Claude Code prompt to run, with `${event.*}` set.",
        ),
        key(
            "timeout",
            Ty::Duration,
            "How long the command may run before it is stopped (default 60s); a stopped notification is reported and the run goes on.",
        ),
    ],
};

/// `slurm`.
pub static SLURM: Shape = Shape {
    name: "slurm",
    doc: "The `sbatch` options of the map agents under `--executor slurm`.",
    keys: &[
        key(
            "partition",
            Ty::Text,
            "The Slurm partition the agents run in (`--partition`).",
        ),
        key(
            "account",
            Ty::Text,
            "The Slurm account charged for the agents (`--account`).",
        ),
        key(
            "time",
            Ty::Text,
            "Slurm's time limit for each agent's task (`--time`): `MIN`, `H:MIN:SEC` or `D-H:MIN:SEC`.",
        ),
        key(
            "cpus_per_task",
            Ty::Int { min: 1 },
            "CPUs for each agent's task (`--cpus-per-task`).",
        ),
        key(
            "mem",
            Ty::Text,
            "Memory for each agent's task (`--mem`): megabytes, or a number with `K`, `M`, `G` or `T`.",
        ),
        key(
            "sbatch_args",
            Ty::List(&Ty::Text),
            "More `sbatch` options, passed as they are (`[\"--qos=long\", \"--constraint=avx2\"]`).",
        ),
        key(
            "no_shared_fs",
            Ty::Bool,
            "The nodes share no filesystem with this machine: it serves them the repository over HTTP with a per-job secret and they push their commits back (`--no-shared-fs`).",
        ),
        key(
            "serve",
            Ty::Text,
            "With `no_shared_fs`: the address `HOST:PORT` of this machine where the nodes reach the served repository (`--serve-addr`; by default its host name on a free port).",
        ),
    ],
};

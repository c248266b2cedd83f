//! `MapReduce` phases (`setup`, `map`, `reduce`), `merge`, and the error policy with its
//! top-level convenience keys.

use std::time::Duration;

use super::{Fields, Lowerer, handler_names, step::Ctx};
use crate::ast::{
    CaptureFormat, CaptureSource, CircuitBreaker, ErrorCollection, ErrorPolicy, ItemFailure,
    MapPhase, MaxParallel, Merge, Multiline, NamedSteps, PolicyRetry, Setup, SetupCapture,
    TimeoutAction, TimeoutConfig, TimeoutPolicy,
};
use crate::diagnostics::{Code, Diagnostic};
use crate::shapes;
use crate::source::Spanned;
use crate::syntax::{Node, Scalar};
use prodigy_grammar::{expr::Expr, jsonpath::JsonPath, sort::SortSpec};

/// The keys that may also stand at the top level of a `MapReduce` workflow.
const CONVENIENCE_KEYS: &[&str] = &[
    "on_item_failure",
    "continue_on_failure",
    "max_failures",
    "failure_threshold",
    "error_collection",
];

impl Lowerer<'_> {
    /// `setup`: a list of steps, or `{commands, timeout, capture_outputs}`.
    pub(crate) fn setup(&mut self, node: &Node) -> Option<Setup> {
        if node.as_map().is_none() {
            let commands = self.steps(node, "`setup`", Ctx::default());
            return Some(Setup {
                commands,
                timeout: None,
                capture_outputs: Vec::new(),
            });
        }
        let fields = self
            .fields(node, "`setup`", &shapes::SETUP)?
            .within("setup");
        let commands = fields
            .require(
                self,
                "commands",
                "list the setup steps under `commands:`",
                |lw, c, what| Some(lw.steps(c, what, Ctx::default())),
            )
            .unwrap_or_default();
        let timeout = fields.duration(self, "timeout");
        let capture_outputs = match fields.node("capture_outputs") {
            Some(n) => self.capture_outputs(n, commands.len()),
            None => Vec::new(),
        };
        Some(Setup {
            commands,
            timeout,
            capture_outputs,
        })
    }

    fn capture_outputs(&mut self, node: &Node, n_commands: usize) -> Vec<SetupCapture> {
        let Some(map) = node.as_map() else {
            self.wrong_type(
                node,
                "`capture_outputs`",
                "a mapping of variable names to command indexes",
            );
            return Vec::new();
        };
        let max_index = i64::try_from(n_commands.saturating_sub(1)).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        for entry in map {
            let Some(name) = self.string(&entry.key, "a variable name") else {
                continue;
            };
            let mut capture = SetupCapture {
                name,
                command_index: Spanned::new(0, entry.value.span),
                format: CaptureFormat::String,
                source: CaptureSource::Stdout,
                pattern: None,
                json_path: None,
                max_size: 1024 * 1024,
                default: None,
                multiline: Multiline::Preserve,
            };
            let index_node = if entry.value.as_map().is_some() {
                let Some(f) = self.fields(
                    &entry.value,
                    "a `capture_outputs` entry",
                    &shapes::CAPTURE_OUTPUT,
                ) else {
                    continue;
                };
                self.capture_output_fields(&f, &mut capture);
                let Some(index) = f.required(
                    self,
                    "command_index",
                    "add `command_index: 0` for the first setup step",
                ) else {
                    continue;
                };
                index
            } else {
                &entry.value
            };
            if n_commands == 0 {
                continue;
            }
            let what = format!(
                "the command index of `{}` (setup has {n_commands} steps)",
                capture.name.value
            );
            if let Some(i) = self.integer(index_node, &what, 0, max_index) {
                capture.command_index = Spanned::new(u64::try_from(i.value).unwrap_or(0), i.span);
                out.push(capture);
            }
        }
        out
    }

    fn capture_output_fields(&mut self, f: &Fields<'_>, capture: &mut SetupCapture) {
        let formats = [
            ("string", CaptureFormat::String),
            ("number", CaptureFormat::Number),
            ("json", CaptureFormat::Json),
            ("lines", CaptureFormat::Lines),
            ("boolean", CaptureFormat::Boolean),
        ];
        capture.format = f.choice_or(self, "format", &formats, capture.format);
        let sources = [
            ("stdout", CaptureSource::Stdout),
            ("stderr", CaptureSource::Stderr),
            ("both", CaptureSource::Both),
            ("combined", CaptureSource::Combined),
        ];
        capture.source = f.choice_or(self, "source", &sources, capture.source);
        capture.pattern = f.string(self, "pattern").and_then(|p| self.regex(p));
        capture.json_path = f.read(self, "json_path", |lw, n, what| {
            lw.parsed(n, what, JsonPath::parse)
        });
        if let Some(n) = f.u64(self, "max_size", 1) {
            capture.max_size = n.value;
        }
        capture.default = f.string(self, "default");
        let multilines = [
            ("preserve", Multiline::Preserve),
            ("join", Multiline::Join),
            ("first_line", Multiline::FirstLine),
            ("last_line", Multiline::LastLine),
            ("array", Multiline::Array),
        ];
        capture.multiline = f.choice_or(self, "multiline", &multilines, capture.multiline);
    }

    /// `map`.
    pub(crate) fn map_phase(&mut self, node: &Node) -> Option<MapPhase> {
        let fields = self.fields(node, "`map`", &shapes::MAP)?;
        let input = fields.within("map").require(
            self,
            "input",
            "add `input:` with a JSON file or a command that lists the items",
            Lowerer::template,
        );
        let agent_template = fields
            .require(
                self,
                "agent_template",
                "add `agent_template:` with the steps each item runs",
                |lw, n, what| Some(lw.phase_steps(n, what)),
            )
            .unwrap_or_default();
        let max_parallel = match fields.node("max_parallel") {
            None => MaxParallel::Fixed(Spanned::new(10, node.span)),
            Some(n) => self.max_parallel(n),
        };
        let timeout_config = fields
            .node("timeout_config")
            .and_then(|n| self.timeout_config(n));
        let agent_timeout = fields.duration(self, "agent_timeout_secs");
        if let (Some(e), Some(_)) = (
            fields.entry("agent_timeout_secs"),
            timeout_config
                .as_ref()
                .and_then(|t| t.agent_timeout.as_ref()),
        ) {
            self.no_effect(
                e,
                "`timeout_config.agent_timeout_secs` overrides it",
                "keep one of the two agent timeouts",
            );
        }
        // An empty `json_path` means the whole document.
        let json_path = fields
            .node("json_path")
            .filter(|n| n.text().is_some_and(|t| !t.trim().is_empty()))
            .and_then(|_| {
                fields.read(self, "json_path", |lw, n, what| {
                    lw.parsed(n, what, JsonPath::parse)
                })
            });
        let filter = fields.read(self, "filter", |lw, n, what| {
            lw.parsed(n, what, Expr::parse)
        });
        let sort_by = fields.read(self, "sort_by", |lw, n, what| {
            lw.parsed(n, what, SortSpec::parse)
        });
        let distinct = fields.read(self, "distinct", |lw, n, what| {
            lw.parsed(n, what, distinct_path)
        });
        let max_items = fields.u64(self, "max_items", 0);
        let offset = fields.u64(self, "offset", 0);
        Some(MapPhase {
            span: node.span,
            input: input?,
            json_path,
            filter,
            sort_by,
            max_items,
            offset,
            distinct,
            max_parallel,
            agent_timeout,
            timeout_config,
            agent_template,
        })
    }

    fn max_parallel(&mut self, node: &Node) -> MaxParallel {
        if let Some(Scalar::Str(text)) = node.scalar()
            && text.contains('$')
        {
            return match self.template(node, "`max_parallel`") {
                Some(t) => MaxParallel::Variable(t),
                None => MaxParallel::Fixed(Spanned::new(10, node.span)),
            };
        }
        let n = self
            .size(node, "`max_parallel`", 1)
            .unwrap_or(Spanned::new(10, node.span));
        MaxParallel::Fixed(n)
    }

    fn timeout_config(&mut self, node: &Node) -> Option<TimeoutConfig> {
        let f = self.fields(node, "`timeout_config`", &shapes::TIMEOUT_CONFIG)?;
        let mut command_timeouts = Vec::new();
        if let Some(map) = f.node("command_timeouts") {
            match map.as_map() {
                Some(entries) => {
                    for e in entries {
                        let Some(name) = self.string(&e.key, "a command name") else {
                            continue;
                        };
                        if let Some(d) = self.duration(&e.value, "a command timeout") {
                            command_timeouts.push((name, d.value));
                        }
                    }
                }
                None => self.wrong_type(
                    map,
                    "`command_timeouts`",
                    "a mapping of command names to seconds",
                ),
            }
        }
        let policy = f.choice_or(
            self,
            "timeout_policy",
            &[
                ("PerAgent", TimeoutPolicy::PerAgent),
                ("PerCommand", TimeoutPolicy::PerCommand),
                ("Hybrid", TimeoutPolicy::Hybrid),
            ],
            TimeoutPolicy::PerAgent,
        );
        let action = f.choice_or(
            self,
            "timeout_action",
            &[
                ("Dlq", TimeoutAction::Dlq),
                ("Skip", TimeoutAction::Skip),
                ("Fail", TimeoutAction::Fail),
                ("GracefulTerminate", TimeoutAction::GracefulTerminate),
            ],
            TimeoutAction::Dlq,
        );
        Some(TimeoutConfig {
            agent_timeout: f.duration(self, "agent_timeout_secs"),
            command_timeouts,
            policy,
            cleanup_grace_period: f
                .duration(self, "cleanup_grace_period_secs")
                .map_or(Duration::from_secs(30), |d| d.value),
            action,
            enable_monitoring: f.flag(self, "enable_monitoring", true),
        })
    }

    /// `merge`: a list of steps or `{commands, timeout, on_conflict, verify, batch,
    /// redispatch, protect}`. The merge queue's keys (`verify` and after) act on the map
    /// agents' merges: in a workflow without a map phase they have no effect.
    pub(crate) fn merge(&mut self, node: &Node, mapreduce: bool) -> Option<Merge> {
        if node.as_map().is_none() {
            let commands = self.steps(node, "`merge`", Ctx::default());
            return Some(Merge {
                commands,
                timeout: None,
                on_conflict: Vec::new(),
                verify: Vec::new(),
                batch: None,
                redispatch: None,
                protect: Vec::new(),
                integrity: None,
            });
        }
        let f = self
            .fields(node, "`merge`", &shapes::MERGE)?
            .within("merge");
        let steps = |lw: &mut Self, c: &Node, what: &str| Some(lw.steps(c, what, Ctx::default()));
        let on_conflict = f.read(self, "on_conflict", steps).unwrap_or_default();
        let verify = f.read(self, "verify", steps).unwrap_or_default();
        let batch = f.u32(self, "batch", 1);
        let redispatch = f.u32(self, "redispatch", 0);
        let protect = f.strings(self, "protect").unwrap_or_default();
        let integrity = f.choice(
            self,
            "integrity",
            &[
                ("off", prodigy_plan::Integrity::Off),
                ("warn", prodigy_plan::Integrity::Warn),
                ("fail", prodigy_plan::Integrity::Fail),
            ],
        );
        for glob in &protect {
            if let Err(e) = globset::Glob::new(&glob.value) {
                self.push(
                    Diagnostic::new(Code::InvalidGlob, format!("`{}` is not a glob", glob.value))
                        .with_primary(glob.span, e.kind().to_string())
                        .with_help("write a glob such as `tests/**` or `Cargo.lock`".to_owned()),
                );
            }
        }
        let queue = ["verify", "batch", "redispatch", "protect", "integrity"];
        if !mapreduce {
            for key in queue {
                if let Some(entry) = f.entry(key) {
                    self.no_effect(
                        entry,
                        "the merge queue holds map agents' work, and this workflow has no map phase",
                        "remove it, or add `mode: mapreduce` with a `map` phase",
                    );
                }
            }
        }
        // `on_conflict` or the queue's keys alone keep the default merge back.
        let commands = if on_conflict.is_empty() && !queue.iter().any(|k| f.has(k)) {
            f.require(
                self,
                "commands",
                "list the merge steps under `commands:`",
                steps,
            )
        } else {
            f.read(self, "commands", steps)
        }
        .unwrap_or_default();
        let timeout = f.duration(self, "timeout");
        Some(Merge {
            commands,
            timeout,
            on_conflict,
            verify,
            batch,
            redispatch,
            protect,
            integrity,
        })
    }

    /// `executor`: each backend's options. `executor.slurm` is the top-level `slurm`
    /// (`top_slurm`, which has no effect beside it).
    pub(crate) fn executor(
        &mut self,
        entry: &crate::syntax::Entry,
        wf: &mut crate::ast::Workflow,
        top_slurm: Option<&crate::syntax::Entry>,
    ) {
        let Some(f) = self.fields(&entry.value, "`executor`", &shapes::EXECUTOR) else {
            return;
        };
        let f = f.within("executor");
        if let Some(slurm) = f.node("slurm") {
            wf.slurm = self.slurm(slurm);
            if let Some(top) = top_slurm {
                self.no_effect(
                    top,
                    "`executor.slurm` is given too, and is what `--executor slurm` uses",
                    "keep one of `slurm:` and `executor.slurm`",
                );
            }
        }
        if let Some(node) = f.node("container")
            && let Some(c) = self.fields(node, "`executor.container`", &shapes::CONTAINER)
        {
            let c = c.within("executor.container");
            wf.container = Some(crate::ast::Container {
                image: c.string(self, "image"),
                network: c.boolean(self, "network").unwrap_or(false),
                cpus: c.number(self, "cpus", 0.01, 1024.0),
                memory: c.string(self, "memory"),
            });
        }
    }

    /// `slurm`: the `sbatch` options, with `time` and `mem` in forms Slurm takes.
    pub(crate) fn slurm(&mut self, node: &Node) -> Option<crate::ast::Slurm> {
        let f = self
            .fields(node, "`slurm`", &shapes::SLURM)?
            .within("slurm");
        let mut slurm = crate::ast::Slurm {
            partition: f.string(self, "partition"),
            account: f.string(self, "account"),
            cpus_per_task: f.u64(self, "cpus_per_task", 1),
            sbatch_args: f.strings(self, "sbatch_args").unwrap_or_default(),
            no_shared_fs: f.boolean(self, "no_shared_fs").unwrap_or(false),
            ..crate::ast::Slurm::default()
        };
        if let Some(serve) = f.string(self, "serve") {
            if serve.value.parse::<std::net::SocketAddr>().is_ok() {
                slurm.serve = Some(serve);
            } else {
                self.wrong_type_at(
                    serve.span,
                    "`slurm.serve`",
                    "an address `HOST:PORT` with an IP address, such as `10.0.0.5:7841`",
                    &format!("`{}`", serve.value),
                );
            }
        }
        if let Some(time) = f.string(self, "time") {
            if crate::ast::is_slurm_time(&time.value) {
                slurm.time = Some(time);
            } else {
                self.push(
                    Diagnostic::new(
                        Code::InvalidDuration,
                        "`slurm.time` is not a Slurm time limit",
                    )
                    .with_primary(time.span, format!("`{}` is not a form `sbatch --time` takes", time.value))
                    .with_help("write minutes (`30`), `H:MIN:SEC` (`1:30:00`) or `D-H:MIN:SEC` (`2-00:00:00`)"),
                );
            }
        }
        if let Some(mem) = f.string(self, "mem") {
            if crate::ast::is_slurm_mem(&mem.value) {
                slurm.mem = Some(mem);
            } else {
                self.wrong_type_at(
                    mem.span,
                    "`slurm.mem`",
                    "a size such as `4096` (megabytes) or `4G`",
                    &format!("`{}`", mem.value),
                );
            }
        }
        Some(slurm)
    }

    /// `error_policy` with the top-level convenience keys folded in.
    pub(crate) fn error_policy(
        &mut self,
        top: &Fields<'_>,
        mapreduce: bool,
        handlers: &[NamedSteps],
    ) -> Option<ErrorPolicy> {
        let policy_entry = top.entry("error_policy");
        let convenience: Vec<_> = CONVENIENCE_KEYS
            .iter()
            .filter_map(|k| top.entry(k).map(|e| (*k, e)))
            .collect();
        if policy_entry.is_none() && convenience.is_empty() {
            return None;
        }
        if !mapreduce {
            let entries = policy_entry
                .into_iter()
                .chain(convenience.iter().map(|(_, e)| *e));
            for e in entries {
                self.no_effect(
                    e,
                    "the error policy applies to MapReduce items only",
                    "use `on_failure` or `retry_config` on the steps of a standard workflow",
                );
            }
            return None;
        }
        let inner = match policy_entry {
            Some(e) => Some(self.fields(&e.value, "`error_policy`", &shapes::ERROR_POLICY)?),
            None => None,
        };
        let span = policy_entry.map_or_else(|| convenience[0].1.key.span, |e| e.value.span);
        let names: Vec<&str> = handler_names(handlers).collect();
        let mut policy = ErrorPolicy {
            span,
            ..ErrorPolicy::default()
        };
        let inner = inner.as_ref();
        policy.on_item_failure = self.convenience(inner, top, "on_item_failure", |lw, n, _| {
            lw.item_failure(n, &names)
        });
        if let Some(Spanned {
            value: ItemFailure::Custom(name),
            span,
        }) = &policy.on_item_failure
        {
            self.check_handler_name(&Spanned::new(name.clone(), *span), &names);
        }
        policy.continue_on_failure =
            self.convenience(inner, top, "continue_on_failure", |lw, n, what| {
                lw.boolean(n, what).map(|b| Spanned::new(b, n.span))
            });
        policy.max_failures = self.convenience(inner, top, "max_failures", |lw, n, what| {
            lw.size(n, what, 1)
        });
        policy.failure_threshold =
            self.convenience(inner, top, "failure_threshold", |lw, n, what| {
                lw.number(n, what, 0.0, 1.0)
            });
        policy.error_collection = self.convenience(inner, top, "error_collection", |lw, n, _| {
            lw.error_collection(n)
        });
        if let Some(f) = inner {
            policy.circuit_breaker = f
                .node("circuit_breaker")
                .and_then(|n| self.circuit_breaker(n));
            policy.retry_config = f.node("retry_config").and_then(|n| self.policy_retry(n));
        }
        Some(policy)
    }

    /// A key of the error policy, read from `error_policy` or from the top level where it is
    /// shorthand; set in both places is an error (the nested one wins).
    fn convenience<'n, T>(
        &mut self,
        inner: Option<&Fields<'n>>,
        top: &Fields<'n>,
        key: &str,
        convert: impl FnOnce(&mut Self, &'n Node, &str) -> Option<T>,
    ) -> Option<T> {
        let nested = inner.and_then(|f| f.entry(key));
        let outer = top.entry(key);
        if let (Some(n), Some(o)) = (nested, outer) {
            self.push(
                Diagnostic::new(Code::ConvenienceConflict, format!("`{key}` is set twice"))
                    .with_primary(o.key.span, "set at the top level")
                    .with_label(n.key.span, "and inside `error_policy`")
                    .with_help(format!("keep `{key}` in one place; the top-level key is shorthand for `error_policy.{key}`")),
            );
        }
        let from = inner.filter(|_| nested.is_some()).unwrap_or(top);
        from.read(self, key, convert)
    }

    fn item_failure(&mut self, node: &Node, handlers: &[&str]) -> Option<Spanned<ItemFailure>> {
        const CHOICES: &[&str] = &["dlq", "retry", "skip", "stop", "custom:<handler>"];
        let custom = |name: &str, node: &Node| {
            Some(Spanned::new(
                ItemFailure::Custom(name.trim().to_owned()),
                node.span,
            ))
        };
        if node.tag.as_deref() == Some("custom") {
            return custom(node.text()?, node);
        }
        if let Some(map) = node.as_map() {
            if let [_] = map
                && let Some(f) = self.peek(node, &shapes::ITEM_FAILURE_CUSTOM)
                && let Some(value) = f.node("custom")
            {
                return custom(f.string(self, "custom")?.value.as_str(), value);
            }
            self.wrong_type(
                node,
                "`on_item_failure`",
                "`dlq`, `retry`, `skip`, `stop` or `custom:<handler>`",
            );
            return None;
        }
        let text = self.string(node, "`on_item_failure`")?;
        let value = text.value.trim();
        if let Some(name) = value.strip_prefix("custom:") {
            return custom(name, node);
        }
        let simple = match value.to_ascii_lowercase().as_str() {
            "dlq" => ItemFailure::Dlq,
            "retry" => ItemFailure::Retry,
            "skip" => ItemFailure::Skip,
            "stop" => ItemFailure::Stop,
            _ if handlers.contains(&value) => {
                self.push(
                    Diagnostic::new(
                        Code::UnknownVariant,
                        format!("`{value}` is not a valid `on_item_failure`"),
                    )
                    .with_primary(node.span, format!("`{value}` names a handler"))
                    .with_help(format!(
                        "write `custom:{value}` to run the handler for failed items"
                    )),
                );
                return None;
            }
            _ => {
                self.unknown_variant(node, "`on_item_failure`", value, CHOICES);
                return None;
            }
        };
        Some(Spanned::new(simple, node.span))
    }

    fn error_collection(&mut self, node: &Node) -> Option<Spanned<ErrorCollection>> {
        const CHOICES: &[&str] = &["aggregate", "immediate", "batched"];
        let batched = |lw: &mut Self, params: &Node| -> Option<Spanned<ErrorCollection>> {
            let size_node = if params.as_map().is_some() {
                let f = lw.fields(params, "`batched`", &shapes::BATCHED)?;
                f.required(lw, "size", "write `batched: {size: 10}`")?
            } else {
                params
            };
            let size = lw.size(size_node, "the batch size", 1)?;
            Some(Spanned::new(
                ErrorCollection::Batched(size.value),
                node.span,
            ))
        };
        if node.tag.as_deref() == Some("batched") {
            return batched(self, node);
        }
        if let Some(map) = node.as_map() {
            if let [_] = map
                && let Some(params) = self
                    .peek(node, &shapes::ERROR_COLLECTION_BATCHED)
                    .and_then(|f| f.node("batched"))
            {
                return batched(self, params);
            }
            self.wrong_type(
                node,
                "`error_collection`",
                "`aggregate`, `immediate`, `batched:N` or `{batched: {size: N}}`",
            );
            return None;
        }
        let text = self.string(node, "`error_collection`")?;
        let value = text.value.trim().to_ascii_lowercase();
        if let Some(size) = value.strip_prefix("batched:") {
            return match size.trim().parse::<u64>() {
                Ok(n) if n >= 1 => Some(Spanned::new(ErrorCollection::Batched(n), node.span)),
                _ => {
                    self.push(
                        Diagnostic::new(
                            Code::OutOfRange,
                            "the batch size must be a whole number of at least 1",
                        )
                        .with_primary(node.span, format!("`{size}` is not a batch size"))
                        .with_help("write `batched:10` or `{batched: {size: 10}}`"),
                    );
                    None
                }
            };
        }
        match value.as_str() {
            "aggregate" => Some(Spanned::new(ErrorCollection::Aggregate, node.span)),
            "immediate" => Some(Spanned::new(ErrorCollection::Immediate, node.span)),
            "batched" => {
                self.missing(
                    node.span,
                    "`batched`",
                    "size",
                    "write `batched:10` or `{batched: {size: 10}}`",
                );
                None
            }
            _ => {
                self.unknown_variant(node, "`error_collection`", &value, CHOICES);
                None
            }
        }
    }

    fn circuit_breaker(&mut self, node: &Node) -> Option<CircuitBreaker> {
        let f = self.fields(node, "`circuit_breaker`", &shapes::CIRCUIT_BREAKER)?;
        let count =
            |lw: &mut Self, key: &str, default: u32| f.u32(lw, key, 1).map_or(default, |c| c.value);
        let failure_threshold = count(self, "failure_threshold", 5);
        let success_threshold = count(self, "success_threshold", 3);
        let half_open_requests = count(self, "half_open_requests", 3);
        let timeout = f
            .within("circuit_breaker")
            .delay(self, "timeout")
            .map_or(Duration::from_secs(30), |d| d.value);
        Some(CircuitBreaker {
            span: node.span,
            failure_threshold,
            success_threshold,
            timeout,
            half_open_requests,
        })
    }

    fn policy_retry(&mut self, node: &Node) -> Option<PolicyRetry> {
        let f = self.fields(node, "`error_policy.retry_config`", &shapes::POLICY_RETRY)?;
        let mut out = PolicyRetry::default_at(node.span);
        if let Some(n) = f.attempts(self, "max_attempts") {
            out.max_attempts = n.value;
        }
        out.max_delay = f.delay(self, "max_delay").map(|d| d.value);
        let timing = self.retry_timing(&f, "`error_policy.retry_config`");
        if let Some(backoff) = timing.backoff {
            out.backoff = backoff;
        }
        if let Some(d) = timing.max_delay {
            out.max_delay = Some(d);
        }
        out.jitter = timing.jitter;
        if let Some(v) = timing.jitter_factor {
            out.jitter_factor = v;
        }
        Some(out)
    }
}

/// `distinct`: one path, such as `id` or `item.location.file`.
fn distinct_path(text: &str) -> Result<prodigy_grammar::path::Path, prodigy_grammar::ParseError> {
    match Expr::parse(text)? {
        Expr::Path { path, .. } => Ok(path),
        other => Err(prodigy_grammar::ParseError {
            kind: prodigy_grammar::ParseErrorKind::Expression,
            message: "`distinct` takes one path".to_owned(),
            span: prodigy_grammar::Span::new(0, text.len()),
            label: format!("`{other}` is not a path"),
            help: Some("write the field to deduplicate on, such as `id` or `item.file`".to_owned()),
        }),
    }
}

//! `prodigy ls`: the runs and jobs of this repository (or of every one), newest first.

use std::path::Path;

use prodigy_runtime::layout::{Layout, RunKind, namespace};
use prodigy_runtime::runs::{Summary, list};

use crate::{err, exit_code, out};

#[derive(clap::Args)]
pub(crate) struct LsArgs {
    /// Every repository's runs and jobs under `$PRODIGY_HOME`, not only this one's.
    #[arg(long)]
    all: bool,
    /// Show at most N (the newest); 0 shows every one.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
    limit: usize,
    /// One JSON object per run or job (id, kind, state, repo, project, workflow, times,
    /// and a job's item counts), for scripts.
    #[arg(long, conflicts_with = "ids")]
    json: bool,
    /// Only the ids, one a line (what shell completion offers).
    #[arg(long, hide = true)]
    ids: bool,
    #[command(flatten)]
    pub(crate) quiet: crate::Quiet,
}

/// `prodigy ls`.
pub(crate) fn ls(args: &LsArgs) -> u8 {
    let home = Layout::home();
    let repo = if args.all {
        None
    } else {
        match std::env::current_dir() {
            Ok(dir) => Some(namespace(&dir)),
            Err(e) => {
                err(&format!("error: cannot read the current directory: {e}\n"));
                return exit_code::USAGE;
            }
        }
    };
    let listing = list(&home, repo.as_deref());
    for (path, why) in &listing.unreadable {
        err(&format!(
            "warning: skipped {}: it cannot be read ({why})\n",
            path.display()
        ));
    }
    let shown = if args.limit == 0 {
        &listing.runs[..]
    } else {
        &listing.runs[..listing.runs.len().min(args.limit)]
    };
    if args.ids {
        for run in shown {
            out(&format!("{}\n", run.id));
        }
    } else if args.json {
        for run in shown {
            out(&format!(
                "{}\n",
                serde_json::to_string(run).unwrap_or_default()
            ));
        }
    } else if listing.runs.is_empty() {
        crate::note(&format!(
            "no runs or jobs {} under {}\n",
            if args.all {
                "at all"
            } else {
                "of this repository"
            },
            home.display()
        ));
    } else {
        out(&table(shown, args.all));
        if shown.len() < listing.runs.len() {
            crate::note(&format!(
                "{} of {}; `prodigy ls -n 0` shows every one\n",
                shown.len(),
                listing.runs.len()
            ));
        }
    }
    exit_code::OK
}

/// The human table: id, kind, state, items, start and workflow (its whole path with
/// `--all`).
fn table(runs: &[Summary], all: bool) -> String {
    let rows: Vec<[String; 6]> = runs
        .iter()
        .map(|run| {
            let kind = match run.kind {
                RunKind::Run => "run",
                RunKind::Job => "job",
            };
            let items = run.items.map_or_else(
                || "-".to_owned(),
                |i| {
                    let mut parts = vec![format!("{}/{} ok", i.succeeded, i.total)];
                    if i.failed > 0 {
                        parts.push(format!("{} failed", i.failed));
                    }
                    if i.skipped > 0 {
                        parts.push(format!("{} skipped", i.skipped));
                    }
                    parts.join(", ")
                },
            );
            let workflow = if all {
                run.workflow.display().to_string()
            } else {
                relative(&run.workflow, &run.project)
            };
            [
                run.id.clone(),
                kind.to_owned(),
                run.state.word().to_owned(),
                items,
                started(&run.started_at),
                workflow,
            ]
        })
        .collect();
    crate::output::table(
        &["ID", "KIND", "STATE", "ITEMS", "STARTED", "WORKFLOW"],
        &rows,
    )
}

/// PATH relative to PROJECT where it is inside it.
fn relative(path: &Path, project: &Path) -> String {
    path.strip_prefix(project)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `2026-11-26T07:51:36.538Z` as `2026-11-26 07:51`.
fn started(at: &str) -> String {
    match (at.get(..10), at.get(11..16)) {
        (Some(day), Some(time)) => format!("{day} {time}"),
        _ => at.to_owned(),
    }
}

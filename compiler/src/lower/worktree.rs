//! `worktree`: how each worktree prodigy makes is prepared (docs/language.md §11).

use super::Lowerer;
use super::step::Ctx;
use crate::ast::WorktreePrep;
use crate::diagnostics::{Code, Diagnostic};
use crate::shapes;
use crate::source::Spanned;
use crate::syntax::{Entry, Node};

impl Lowerer<'_> {
    /// `worktree`: its path lists checked to stay inside the repository (V110), `sparse`,
    /// `keep` and `persist` only where they can act (W002).
    pub(crate) fn worktree_prep(&mut self, entry: &Entry, mapreduce: bool) -> Option<WorktreePrep> {
        let f = self
            .fields(&entry.value, "`worktree`", &shapes::WORKTREE)?
            .within("worktree");
        let paths = |lw: &mut Self, key: &str| {
            let list = f.strings(lw, key).unwrap_or_default();
            for path in &list {
                lw.repository_path(key, path);
            }
            list
        };
        let copy = paths(self, "copy");
        let link = paths(self, "link");
        let sparse = paths(self, "sparse");
        let keep = paths(self, "keep");
        let setup = f
            .read(self, "setup", |lw: &mut Self, n: &Node, what: &str| {
                Some(lw.steps(n, what, Ctx::default()))
            })
            .unwrap_or_default();
        let persist = f.boolean(self, "persist").unwrap_or(false);
        if !mapreduce {
            for key in ["sparse", "keep", "persist"] {
                if let Some(e) = f.entry(key) {
                    self.no_effect(
                        e,
                        "only map agents' worktrees are sparse, cleaned between items or kept for the next job",
                        &format!("remove `{key}:`, or add `mode: mapreduce` with a `map` phase"),
                    );
                }
            }
        }
        if mapreduce
            && persist
            && !sparse.is_empty()
            && let Some(e) = f.entry("persist")
        {
            self.no_effect(
                e,
                "sparse agent worktrees are not kept for the next job, whose agents may need the whole tree",
                "remove `persist:` or `sparse:`",
            );
        }
        Some(WorktreePrep {
            copy,
            link,
            setup,
            sparse,
            keep,
            // Only a MapReduce job keeps worktrees (W002 above otherwise).
            persist: persist && mapreduce,
            span: entry.key.span,
        })
    }

    /// V110 for a `worktree.KEY` path that is empty, absolute or climbs out with `..`.
    fn repository_path(&mut self, key: &str, path: &Spanned<String>) {
        let text = path.value.as_str();
        let escapes = text.is_empty()
            || text.starts_with(['/', '\\', '~'])
            || text.split(['/', '\\']).any(|part| part == "..");
        if escapes {
            self.push(
                Diagnostic::new(
                    Code::WorktreePathEscapes,
                    format!("`worktree.{key}` paths must be relative to the repository's root"),
                )
                .with_primary(
                    path.span,
                    if text.is_empty() {
                        "an empty path".to_owned()
                    } else {
                        "this path is absolute or leaves the repository".to_owned()
                    },
                )
                .with_help("write the path relative to the repository's root, without `..`, such as `.env`"),
            );
        }
    }
}

/// Whether a `worktree.copy` entry is a glob rather than a plain path.
pub(crate) fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '[', '{'])
}

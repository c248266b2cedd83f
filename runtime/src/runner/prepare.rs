//! The run's side of preparing worktrees (`worktree.copy`, `worktree.link`, `setup`): what
//! it says and where; the copying and linking are `worktree/bootstrap.rs`'s.

use crate::message::Message;
use crate::runner::Runner;
use crate::vars::Vars;
use crate::worktree::bootstrap::{PrepareError, mark_prepared, prepare};
use std::path::Path;

impl Runner {
    /// Prepares the run's session worktree, if it works in one, as [`Runner::prepare_worktree`]
    /// does, with the starting variables VARS; says why when it cannot (the run then does not
    /// start, and its worktree is kept).
    ///
    /// # Errors
    ///
    /// What failed: preparing the worktree, or a `setup` step.
    pub async fn prepare_session(&self, vars: &Vars) -> Result<(), PrepareError> {
        let Some(session) = self.worktree() else {
            return Ok(());
        };
        let root = session.path.clone();
        self.prepare_worktree(&root, false, &mut vars.clone())
            .await
            .inspect_err(|e| {
                self.say(Message::SessionNotPrepared(e.to_string()));
            })
    }

    /// Prepares the worktree at ROOT (a session's or, AGENT, a map agent's) as the workflow's
    /// `worktree:` says, and runs its `setup` steps there when they have not run in it yet,
    /// with VARS. The error names what failed: the worktree or its setup is unusable.
    pub(crate) async fn prepare_worktree(
        &self,
        root: &Path,
        agent: bool,
        vars: &mut Vars,
    ) -> Result<(), PrepareError> {
        let Some(session) = self.worktree() else {
            return Ok(());
        };
        let repo = session.repo.clone();
        self.prepare_worktree_of(&repo, root, agent, vars).await
    }

    /// [`Runner::prepare_worktree`] for a worktree of REPO that is not the run's own (the
    /// throwaway worktree of `prodigy items --run-setup`).
    ///
    /// # Errors
    ///
    /// The worktree or its `setup` is unusable: the message names what failed.
    pub async fn prepare_worktree_of(
        &self,
        repo: &Path,
        root: &Path,
        agent: bool,
        vars: &mut Vars,
    ) -> Result<(), PrepareError> {
        let prep = &self.plan.worktree;
        if prep.is_empty() {
            return Ok(());
        }
        let unusable = |source| PrepareError::Prepare {
            root: root.to_path_buf(),
            source,
        };
        let done = prepare(repo, root, prep, agent).await.map_err(unusable)?;
        // A reused worktree would only repeat them.
        if done.first {
            for note in &done.notes {
                self.say(Message::WorktreeNote(note.clone()));
            }
        }
        self.record(&crate::events::Event::WorktreePrepared {
            path: root.to_path_buf(),
            copied: done.copied.clone(),
            linked: done.linked.clone(),
            setup: done.needs_setup,
        });
        if !done.needs_setup {
            return Ok(());
        }
        let total = prep.setup.len();
        for (index, &id) in prep.setup.iter().enumerate() {
            let outcome = self.run_step(id, vars, Some(index)).await;
            if !outcome.continues() {
                let label = self
                    .plan
                    .step(id)
                    .map(|s| s.label.clone())
                    .unwrap_or_default();
                return Err(PrepareError::Setup {
                    number: index + 1,
                    total,
                    label,
                    root: root.to_path_buf(),
                });
            }
        }
        mark_prepared(root).await.map_err(unusable)
    }
}

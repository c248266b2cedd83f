//! Whether a YAML file looks like a Prodigy workflow, for `prodigy check DIR`, which checks
//! every workflow under a directory and leaves other YAML (CI configurations, compose files,
//! Ansible playbooks) alone.

use crate::shapes;
use crate::source::SourceFile;
use crate::syntax::{Node, NodeKind};

/// The keys that make a mapping in a list a step: the command kinds, and the removed
/// commands `check` still recognises (and reports).
fn is_command_key(key: &str) -> bool {
    crate::lower::step::COMMAND_KINDS.contains(&key) || matches!(key, "goal_seek" | "analyze")
}

/// Whether `file` looks like a workflow: a list of steps, or a mapping whose `commands`
/// (`steps`) is a list of steps, or a `mode: mapreduce` / `map.agent_template` workflow.
/// A file that is not valid YAML counts as one when its name says so (`.yml`/`.yaml` files
/// under a directory are only skipped when they clearly are something else).
pub fn looks_like_workflow(file: &SourceFile) -> bool {
    let document = crate::syntax::parse(file);
    let Some(root) = document.root else {
        // Broken YAML or an empty file: report it rather than skip it silently.
        return !file.text.trim().is_empty() || !document.diagnostics.is_empty();
    };
    match &root.kind {
        NodeKind::Seq(items) => steps(items),
        NodeKind::Map(_) => {
            let get = |key: &str| {
                root.as_map()
                    .and_then(|m| m.iter().find(|e| e.key.text() == Some(key)))
                    .map(|e| &e.value)
            };
            let listed = ["commands", "steps"]
                .iter()
                .filter_map(|k| get(k))
                .any(|v| v.as_seq().is_some_and(steps));
            let mapreduce = get("mode").and_then(Node::text) == Some("mapreduce")
                || get("map")
                    .and_then(Node::as_map)
                    .is_some_and(|m| m.iter().any(|e| e.key.text() == Some("agent_template")));
            listed || mapreduce
        }
        NodeKind::Scalar { .. } => false,
    }
}

/// Whether the items are steps: one of them is a `/command` string, or a mapping with a
/// command key whose keys are mostly step keys. One is enough, so that a file whose other
/// steps are misspelled is still checked (and its typos reported), not skipped.
fn steps(items: &[Node]) -> bool {
    let known = shapes::STEP.names();
    items.iter().any(|item| {
        if let Some(text) = item.text() {
            return text.starts_with('/');
        }
        let Some(map) = item.as_map() else {
            return false;
        };
        let keys: Vec<&str> = map.iter().filter_map(|e| e.key.text()).collect();
        let ours = keys.iter().filter(|k| known.contains(k)).count();
        keys.iter().any(|k| is_command_key(k)) && ours * 2 >= keys.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looks(text: &str) -> bool {
        looks_like_workflow(&SourceFile::new("x.yml", text))
    }

    #[test]
    fn workflows_are_recognised_and_other_yaml_is_not() {
        assert!(looks("- shell: make\n- claude: /review\n"));
        assert!(looks("- /prodigy-lint\n"));
        assert!(looks(
            "name: x\ncommands:\n  - shell: make\n    timeout: 5\n"
        ));
        assert!(looks(
            "mode: mapreduce\nmap:\n  input: x.json\n  agent_template: []\n"
        ));
        assert!(
            looks("commands: [\n"),
            "broken YAML is reported, not skipped"
        );
        // GitHub Actions, Azure Pipelines, docker compose, an Ansible task list.
        assert!(!looks(
            "on: push\njobs:\n  build:\n    steps:\n      - run: make\n"
        ));
        assert!(!looks("steps:\n  - script: make\n"));
        assert!(!looks("services:\n  db:\n    image: postgres\n"));
        assert!(!looks(
            "- name: install\n  apt: {name: git}\n  become: true\n  tags: [a]\n"
        ));
        assert!(!looks(""));
        // A misspelled step does not hide the workflow it is in.
        assert!(looks("- shel: make\n- shell: make test\n"));
        assert!(looks(
            "name: x\ncommands:\n  - shell: make\n  - shel: make test\n"
        ));
    }
}

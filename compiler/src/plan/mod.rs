//! The plan (the `prodigy-plan` crate, re-exported here) and the planner that builds it.
//!
//! The runtime depends on `prodigy-plan`, not on this crate; what the plan needs of the
//! compiler at run time (its YAML reader, for `write_file` with `format: yaml`) the planner
//! puts into the plan ([`Plan::yaml`]).

mod build;

pub use build::plan;
pub use prodigy_plan::*;

/// Parses YAML text (one document) into JSON with the reader that reads workflows
/// (anchors, merge keys, the same limits on aliases and nesting); `None` when the text
/// holds no document (empty, or only comments).
///
/// # Errors
///
/// The first problem the reader found, as a message.
pub fn yaml_to_json(text: &str) -> Result<Option<serde_json::Value>, String> {
    let file = crate::source::SourceFile::new("content.yml", text);
    let parsed = crate::syntax::parse(&file);
    if let Some(d) = parsed.diagnostics.first() {
        return Err(d.message.clone());
    }
    Ok(parsed.root.map(|root| root.to_json()))
}

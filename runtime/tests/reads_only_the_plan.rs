//! The runtime reads only the plan (ARCHITECTURE.md, invariant 3): it depends on
//! `prodigy-plan` and not on `prodigy-compiler`, so cargo refuses any use of the compiler's
//! internals. Only its tests (`src/testing`) compile YAML, through a dev-dependency.

/// The names of the dependencies under the `[dependencies]` table of a Cargo.toml.
fn dependencies(manifest: &str) -> Vec<&str> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && let Some((name, _)) = line.split_once('=') {
            out.push(name.trim().trim_end_matches(".workspace"));
        }
    }
    out
}

#[test]
fn the_runtime_depends_on_the_plan_and_not_on_the_compiler() {
    let manifest = include_str!("../Cargo.toml");
    let deps = dependencies(manifest);
    assert!(deps.contains(&"prodigy-plan"), "{deps:?}");
    assert!(!deps.contains(&"prodigy-compiler"), "{deps:?}");
}

#[test]
fn the_reading_finds_only_the_dependencies_table() {
    let manifest = "[package]\nname = \"x\"\n\n[dependencies]\nprodigy-plan.workspace = true\n\
                    serde = \"1\"\n\n[dev-dependencies]\nprodigy-compiler.workspace = true\n";
    assert_eq!(dependencies(manifest), ["prodigy-plan", "serde"]);
}

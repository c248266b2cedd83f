//! The environment names a shell step sees variables under: the runtime exports under them,
//! and the compiler's checks suggest them (W006).

use prodigy_grammar::path::{Path, Segment};

/// Environment names a variable is never exported under, so that `capture: path` cannot
/// replace `PATH` (the runtime also skips names prodigy inherited).
pub const RESERVED_ENV: &[&str] = &[
    "PATH", "HOME", "SHELL", "PWD", "OLDPWD", "IFS", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR",
    "PS1", "PS4", "ENV", "CDPATH",
];

/// What separates the parts of a path in an exported name: `${item.id}` is `ITEM__ID`,
/// never `ITEM_ID`, which is `${item_id}`.
pub const EXPORT_SEPARATOR: &str = "__";

/// The exported form of a variable's own name: a lowercase name of words joined by single
/// underscores (`item_id`, `build`) in upper case, and such a name written in upper case
/// (`BUILD_OUT`) as it is. Any other name (mixed case, a leading digit, a double or edge
/// underscore, other characters) has none, so that no two names can share one.
pub fn export_root(name: &str) -> Option<String> {
    let lower = words(name, |c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let upper = words(name, |c| c.is_ascii_uppercase() || c.is_ascii_digit());
    ((lower || upper) && !name.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| name.to_ascii_uppercase())
}

/// The exported form of a field of an object: a lowercase name of words joined by single
/// underscores, in upper case (`location` → `LOCATION`). Other keys (`fileName`, `a-b`,
/// `a__b`) have none: upper-casing them could make two keys one name.
pub fn export_field(key: &str) -> Option<String> {
    words(key, |c| c.is_ascii_lowercase() || c.is_ascii_digit()).then(|| key.to_ascii_uppercase())
}

/// Whether `text` is words of `letter`s joined by single underscores.
fn words(text: &str, letter: impl Fn(char) -> bool) -> bool {
    !text.is_empty()
        && text
            .split('_')
            .all(|w| !w.is_empty() && w.chars().all(&letter))
}

/// The environment variable a shell step sees a variable's value under (the runtime
/// exports under these names; W006 suggests them): the root and each field in their
/// exported forms, and each index as its number, joined by [`EXPORT_SEPARATOR`]:
/// `item.location.file` → `ITEM__LOCATION__FILE`, `item.files[0]` → `ITEM__FILES__0`,
/// `build.stderr` → `BUILD__STDERR`. A path with a part that has no exported form, or a
/// negative index, has none. No two paths share a name.
pub fn exported_name(path: &Path) -> Option<String> {
    let mut out = export_root(&path.root)?;
    for segment in &path.segments {
        out.push_str(EXPORT_SEPARATOR);
        match segment {
            Segment::Field(key) => out.push_str(&export_field(key)?),
            Segment::Index(i) => out.push_str(&u64::try_from(*i).ok()?.to_string()),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn exported_names_never_collide() {
        use prodigy_grammar::path::{Path, Segment};
        let path = |root: &str, segments: &[Segment]| Path {
            root: root.to_owned(),
            segments: segments.to_vec(),
        };
        let field = |f: &str| Segment::Field(f.to_owned());
        for (p, name) in [
            (path("item_id", &[]), Some("ITEM_ID")),
            (path("item", &[field("id")]), Some("ITEM__ID")),
            (
                path("item", &[field("location"), field("file")]),
                Some("ITEM__LOCATION__FILE"),
            ),
            (
                path("item", &[field("files"), Segment::Index(0)]),
                Some("ITEM__FILES__0"),
            ),
            (path("item", &[field("files"), Segment::Index(-1)]), None),
            (
                path("BUILD_OUT", &[field("stderr")]),
                Some("BUILD_OUT__STDERR"),
            ),
            (path("item", &[field("fileName")]), None),
            (path("item", &[field("a__b")]), None),
            (path("item", &[field("a-b")]), None),
            (path("Build", &[]), None),
            (path("_x", &[]), None),
        ] {
            assert_eq!(super::exported_name(&p).as_deref(), name, "{p}");
        }
    }
}

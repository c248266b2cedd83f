//! Where a step may write: `output_file` and `write_file` paths stay inside the project
//! (the session worktree when the run works in one), however they are spelled and whatever
//! links lie on the way.

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error, miette::Diagnostic, PartialEq, Eq)]
pub enum PathError {
    /// The path, spelled out or once its links are followed, leads outside ROOT.
    #[error("`{path}` leads outside the project (`{root}`)")]
    Escapes {
        /// The path as the step gave it.
        path: String,
        /// The project directory.
        root: String,
    },
    /// The path ends in a link to nothing: writing would create its target, wherever it is.
    #[error("`{path}` is a link to a file that does not exist")]
    DanglingLink {
        /// The path as the step gave it.
        path: String,
    },
    /// The project directory or a directory on the way cannot be read.
    #[error("cannot resolve `{path}`: {why}")]
    Unresolved {
        /// The path.
        path: String,
        /// Why.
        why: String,
    },
}

/// The real path that writing PATH (relative to BASE, or absolute) would write, provided it
/// lies inside ROOT: the longest part of it that exists is resolved with its links, and the
/// rest, which does not exist yet (so holds no link), is added as written, `..` included.
/// BASE is ROOT or a directory under it (a step's `working_dir`).
///
/// # Errors
///
/// [`PathError::Escapes`] when the real path is outside ROOT, [`PathError::DanglingLink`]
/// when PATH is a link to nothing, [`PathError::Unresolved`] when ROOT cannot be resolved.
pub fn inside(root: &Path, base: &Path, path: &str) -> Result<PathBuf, PathError> {
    let unresolved = |p: &Path, e: std::io::Error| PathError::Unresolved {
        path: p.display().to_string(),
        why: e.to_string(),
    };
    let escapes = || PathError::Escapes {
        path: path.to_owned(),
        root: root.display().to_string(),
    };
    let real_root = std::fs::canonicalize(root).map_err(|e| unresolved(root, e))?;
    let joined = base.join(path);
    if std::fs::symlink_metadata(&joined).is_ok_and(|m| m.file_type().is_symlink())
        && !joined.exists()
    {
        return Err(PathError::DanglingLink {
            path: path.to_owned(),
        });
    }
    // The longest prefix that exists, resolved; then the missing rest, lexically.
    let components: Vec<Component<'_>> = joined.components().collect();
    let mut split = components.len();
    let mut real = loop {
        let prefix: PathBuf = components[..split].iter().collect();
        if split == 0 {
            break PathBuf::from("/");
        }
        if prefix.exists() {
            break std::fs::canonicalize(&prefix).map_err(|e| unresolved(&prefix, e))?;
        }
        split -= 1;
    };
    for component in &components[split..] {
        match component {
            Component::ParentDir => {
                real.pop();
            }
            Component::Normal(part) => real.push(part),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if real.starts_with(&real_root) {
        Ok(real)
    } else {
        Err(escapes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        (dir, root, outside)
    }

    #[test]
    fn paths_inside_resolve_to_their_real_place() {
        let (_dir, root, _) = project();
        let real = std::fs::canonicalize(&root).unwrap();
        assert_eq!(inside(&root, &root, "a.txt").unwrap(), real.join("a.txt"));
        assert_eq!(
            inside(&root, &root, "new/dir/../b.txt").unwrap(),
            real.join("new/b.txt")
        );
        assert_eq!(
            inside(&root, &root.join("sub"), "../c.txt").unwrap(),
            real.join("c.txt")
        );
        let absolute = root.join("sub/d.txt");
        assert_eq!(
            inside(&root, &root, absolute.to_str().unwrap()).unwrap(),
            real.join("sub/d.txt")
        );
    }

    #[test]
    fn climbing_out_or_an_absolute_path_elsewhere_is_refused() {
        let (_dir, root, outside) = project();
        for path in [
            "../outside/x.txt",
            "sub/../../x.txt",
            "new/../../x.txt",
            outside.join("x.txt").to_str().unwrap(),
            "/etc/passwd",
        ] {
            assert!(
                matches!(inside(&root, &root, path), Err(PathError::Escapes { .. })),
                "{path}"
            );
        }
    }

    #[test]
    fn links_out_of_the_project_are_not_followed() {
        let (_dir, root, outside) = project();
        std::fs::write(outside.join("target.txt"), "keep").unwrap();
        std::os::unix::fs::symlink(outside.join("target.txt"), root.join("file-link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("dir-link")).unwrap();
        std::os::unix::fs::symlink(outside.join("missing"), root.join("dangling")).unwrap();
        std::os::unix::fs::symlink(root.join("sub"), root.join("inner-link")).unwrap();
        for path in ["file-link", "dir-link/x.txt", "dir-link/new/x.txt"] {
            assert!(
                matches!(inside(&root, &root, path), Err(PathError::Escapes { .. })),
                "{path}"
            );
        }
        assert!(matches!(
            inside(&root, &root, "dangling"),
            Err(PathError::DanglingLink { .. })
        ));
        // A link that stays inside is fine, and resolves to its target.
        assert_eq!(
            inside(&root, &root, "inner-link/y.txt").unwrap(),
            std::fs::canonicalize(&root).unwrap().join("sub/y.txt")
        );
    }
}

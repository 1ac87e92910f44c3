//! The workspace root and the one function that turns a path a model names into a real path
//! inside it. Both the path-guard hook and the tools go through [`Workspace::resolve`], so a
//! call that passed the guard operates on exactly the path the guard checked.
//!
//! Resolution follows symlinks: the longest existing prefix of the path is canonicalised by the
//! OS, and only plain names may follow it (a file or directories about to be created). A
//! dangling symlink is refused, since writing through it would create its target wherever it
//! points.
//!
//! The run's own transcript may sit in the workspace (`--transcript fix.jsonl` in the project
//! directory). It is refused like a path outside: a tool that overwrote it would destroy the
//! record of the run and the means to resume it.

use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug)]
pub(super) enum PathError {
    /// The path was empty.
    Empty,
    /// The resolved path lies outside the workspace.
    Outside { path: String },
    /// A symlink on the way points to nothing.
    DanglingSymlink { path: String },
    /// `..` after a part of the path that does not exist: nothing to resolve it against.
    Unresolvable { path: String },
    /// The file system refused to tell where the path leads.
    Io { path: String, source: io::Error },
    /// The path is the run's transcript.
    Transcript { path: String },
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::Empty => write!(f, "empty path"),
            PathError::Outside { path } => {
                write!(f, "{path}: resolves outside the workspace; access denied")
            }
            PathError::DanglingSymlink { path } => {
                write!(f, "{path}: is or passes through a symlink to nothing")
            }
            PathError::Unresolvable { path } => {
                write!(f, "{path}: `..` after a directory that does not exist")
            }
            PathError::Io { path, source } => write!(f, "{path}: {source}"),
            PathError::Transcript { path } => write!(
                f,
                "{path}: is this run's transcript, which the agent's tools may not touch"
            ),
        }
    }
}

impl std::error::Error for PathError {}

/// The directory the agent may touch, canonicalised once at start.
#[derive(Debug, Clone)]
pub(super) struct Workspace {
    root: PathBuf,
    /// The transcript's real path, when there is one.
    transcript: Option<PathBuf>,
}

impl Workspace {
    /// Opens a workspace; the directory must exist.
    pub(super) fn open(dir: &Path) -> io::Result<Workspace> {
        let root = std::fs::canonicalize(dir)?;
        if !root.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(Workspace {
            root,
            transcript: None,
        })
    }

    /// Makes the transcript at `path` (which exists) off limits to [`Workspace::resolve`].
    pub(super) fn protect_transcript(&mut self, path: &Path) -> io::Result<()> {
        self.transcript = Some(std::fs::canonicalize(path)?);
        Ok(())
    }

    /// The canonical root.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `path` (relative to the root, or absolute) to a real path inside the root.
    pub(super) fn resolve(&self, path: &str) -> Result<PathBuf, PathError> {
        if path.is_empty() {
            return Err(PathError::Empty);
        }
        let given = Path::new(path);
        let joined = if given.is_absolute() {
            given.to_path_buf()
        } else {
            self.root.join(given)
        };
        let resolved = resolve_existing_prefix(&joined, path)?;
        if !resolved.starts_with(&self.root) {
            return Err(PathError::Outside {
                path: path.to_owned(),
            });
        }
        // Compared after symlinks are resolved, so no other name for it gets through.
        if self.transcript.as_ref() == Some(&resolved) {
            return Err(PathError::Transcript {
                path: path.to_owned(),
            });
        }
        Ok(resolved)
    }

    /// Whether `path`, a real path (no symlink in it), is the run's transcript: for a walk
    /// over directories, whose files do not go through [`Workspace::resolve`].
    pub(super) fn is_transcript(&self, path: &Path) -> bool {
        self.transcript.as_deref() == Some(path)
    }

    /// `path` relative to the root, for messages and search results.
    pub(super) fn display<'a>(&self, path: &'a Path) -> std::borrow::Cow<'a, str> {
        match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
            Ok(rel) => rel.to_string_lossy(),
            Err(_) => path.to_string_lossy(),
        }
    }
}

/// Canonicalises the longest existing prefix of `joined` and appends the rest, which must be
/// plain names.
fn resolve_existing_prefix(joined: &Path, original: &str) -> Result<PathBuf, PathError> {
    let mut tail: Vec<&std::ffi::OsStr> = Vec::new();
    let mut prefix = joined;
    loop {
        match std::fs::canonicalize(prefix) {
            Ok(real) => {
                // Any tail name that is `..` would step over something that does not exist.
                let mut out = real;
                for name in tail.iter().rev() {
                    out.push(name);
                }
                return Ok(out);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(prefix).is_ok() {
                    // It exists as an entry but does not resolve: a dangling symlink.
                    return Err(PathError::DanglingSymlink {
                        path: original.to_owned(),
                    });
                }
                let Some(parent) = prefix.parent() else {
                    return Err(io_error(original, e));
                };
                match prefix.components().next_back() {
                    Some(Component::Normal(name)) => tail.push(name),
                    Some(Component::CurDir) => {}
                    _ => {
                        return Err(PathError::Unresolvable {
                            path: original.to_owned(),
                        });
                    }
                }
                prefix = parent;
            }
            Err(e) => return Err(io_error(original, e)),
        }
    }
}

fn io_error(path: &str, source: io::Error) -> PathError {
    PathError::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> io::Result<(tempfile::TempDir, Workspace, PathBuf)> {
        let dir = tempfile::tempdir()?;
        let ws_dir = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(ws_dir.join("sub"))?;
        std::fs::create_dir_all(&outside)?;
        std::fs::write(ws_dir.join("sub/file.txt"), "x")?;
        std::fs::write(outside.join("secret.txt"), "s")?;
        let ws = Workspace::open(&ws_dir)?;
        Ok((dir, ws, outside))
    }

    #[test]
    fn relative_paths_inside_resolve_to_real_paths() -> io::Result<()> {
        let (_d, ws, _o) = setup()?;
        let root = ws.root().to_path_buf();
        assert_eq!(
            ws.resolve("sub/file.txt").ok(),
            Some(root.join("sub/file.txt"))
        );
        assert_eq!(
            ws.resolve("./sub/../sub/new.txt").ok(),
            Some(root.join("sub/new.txt"))
        );
        assert_eq!(ws.resolve(".").ok(), Some(root.clone()));
        assert_eq!(
            ws.resolve("new/dir/file.txt").ok(),
            Some(root.join("new/dir/file.txt"))
        );
        let absolute = root.join("sub/file.txt");
        assert_eq!(
            ws.resolve(&absolute.to_string_lossy()).ok(),
            Some(absolute.clone())
        );
        Ok(())
    }

    #[test]
    fn escapes_are_refused() -> io::Result<()> {
        let (_d, ws, outside) = setup()?;
        for path in [
            "..",
            "../outside/secret.txt",
            "sub/../../outside/new.txt",
            "/etc/passwd",
            &outside.join("secret.txt").to_string_lossy(),
        ] {
            assert!(
                matches!(ws.resolve(path), Err(PathError::Outside { .. })),
                "{path}"
            );
        }
        assert!(matches!(ws.resolve(""), Err(PathError::Empty)));
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_followed_before_the_check() -> io::Result<()> {
        let (_d, ws, outside) = setup()?;
        let root = ws.root().to_path_buf();
        std::os::unix::fs::symlink(&outside, root.join("link"))?;
        std::os::unix::fs::symlink(outside.join("secret.txt"), root.join("file-link"))?;
        std::os::unix::fs::symlink(root.join("sub"), root.join("inner-link"))?;
        std::os::unix::fs::symlink(outside.join("nothing"), root.join("dangling"))?;
        assert!(matches!(
            ws.resolve("link/new.txt"),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            ws.resolve("file-link"),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            ws.resolve("dangling"),
            Err(PathError::DanglingSymlink { .. })
        ));
        assert_eq!(
            ws.resolve("inner-link/file.txt").ok(),
            Some(root.join("sub/file.txt"))
        );
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn the_transcript_is_refused_by_any_name() -> io::Result<()> {
        let (_d, mut ws, _o) = setup()?;
        let root = ws.root().to_path_buf();
        std::fs::write(root.join("run.jsonl"), "")?;
        ws.protect_transcript(&root.join("run.jsonl"))?;
        std::os::unix::fs::symlink(root.join("run.jsonl"), root.join("alias"))?;
        let absolute = root.join("run.jsonl").display().to_string();
        for path in ["run.jsonl", "./sub/../run.jsonl", "alias", &absolute] {
            assert!(
                matches!(ws.resolve(path), Err(PathError::Transcript { .. })),
                "{path}"
            );
        }
        assert!(ws.resolve("sub/file.txt").is_ok());
        assert!(ws.resolve("run.jsonl.bak").is_ok());
        Ok(())
    }

    #[test]
    fn dot_dot_over_a_missing_directory_is_unresolvable() -> io::Result<()> {
        let (_d, ws, _o) = setup()?;
        assert!(matches!(
            ws.resolve("missing/../sub/file.txt"),
            Err(PathError::Unresolvable { .. })
        ));
        Ok(())
    }

    #[test]
    fn display_is_relative_to_the_root() -> io::Result<()> {
        let (_d, ws, _o) = setup()?;
        let root = ws.root().to_path_buf();
        assert_eq!(ws.display(&root.join("sub/file.txt")), "sub/file.txt");
        assert_eq!(ws.display(&root), ".");
        Ok(())
    }
}

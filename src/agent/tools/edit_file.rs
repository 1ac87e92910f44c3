//! `edit_file`: replace an exact string in a file. The string must occur exactly once unless
//! `replace_all` is set, so an edit never lands somewhere the model did not mean.

use std::io::{Read, Seek, Write};
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use super::open::open_regular;
use super::{ToolError, ToolKind, ToolSpec, io_err, looks_binary};
use crate::agent::workspace::Workspace;

pub(crate) const SPEC: ToolSpec = ToolSpec {
    name: "edit_file",
    kind: ToolKind::Write,
    description: "Replace an exact string in a text file. `old_string` must occur exactly once \
                  (include surrounding lines to make it unique) unless `replace_all` is true.",
    input_schema: schema,
};

/// Files larger than this are not edited in memory.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace."},
            "old_string": {"type": "string", "description": "The exact text to replace."},
            "new_string": {"type": "string", "description": "The replacement text."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence.", "default": false}
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

impl Input {
    pub(super) fn check(&self) -> Result<(), String> {
        if self.old_string.is_empty() {
            return Err(ToolError::EmptyOldString.to_string());
        }
        Ok(())
    }
}

pub(crate) async fn run(input: &Input, ws: &Workspace) -> Result<String, ToolError> {
    let path = ws.resolve(&input.path)?;
    let (target, owned) = (path.clone(), input.clone());
    // File I/O runs off the async workers: a slow disk must not stall them.
    let count = tokio::task::spawn_blocking(move || edit_in_place(&target, &owned))
        .await
        .map_err(|e| io_err(&input.path)(std::io::Error::other(e)))??;
    Ok(format!(
        "replaced {count} occurrence{} in {}",
        if count == 1 { "" } else { "s" },
        ws.display(&path)
    ))
}

/// Reads, edits and rewrites the file through one handle, opened only if it is a regular
/// file, so the file checked is the file written.
fn edit_in_place(path: &Path, input: &Input) -> Result<usize, ToolError> {
    let shown = input.path.as_str();
    let (mut file, meta) = open_regular(
        std::fs::OpenOptions::new().read(true).write(true),
        path,
        shown,
    )?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(ToolError::TooLarge {
            path: shown.to_owned(),
            size: meta.len(),
            limit: MAX_FILE_BYTES,
        });
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io_err(shown))?;
    if looks_binary(&bytes) {
        return Err(ToolError::Binary {
            path: shown.to_owned(),
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| ToolError::Binary {
        path: shown.to_owned(),
    })?;
    let (edited, count) = replace(&text, input, shown)?;
    // The secret scan saw only the new text: an edit can still complete a key the file
    // held part of (a placeholder), or fill an empty private-key block.
    match crate::key_shapes::introduced(&text, &edited) {
        crate::key_shapes::Scan::Clean => {}
        crate::key_shapes::Scan::Found(kind) => {
            return Err(ToolError::KeyLike {
                path: shown.to_owned(),
                kind,
            });
        }
        crate::key_shapes::Scan::Unavailable => {
            return Err(ToolError::KeyLike {
                path: shown.to_owned(),
                kind: "text the secret scan cannot check (its patterns failed to load)",
            });
        }
    }
    let rewrite = |file: &mut std::fs::File| -> std::io::Result<()> {
        file.rewind()?;
        file.write_all(edited.as_bytes())?;
        file.set_len(edited.len() as u64)
    };
    rewrite(&mut file).map_err(io_err(shown))?;
    Ok(count)
}

/// The edited text and the number of replacements, or why nothing may change.
fn replace(text: &str, input: &Input, shown: &str) -> Result<(String, usize), ToolError> {
    if input.old_string.is_empty() {
        return Err(ToolError::EmptyOldString);
    }
    let count = text.matches(input.old_string.as_str()).count();
    // The edited size, known before the edit is made: `replace_all` of a short string by a
    // long one multiplies a file the size bound let in.
    let made = match count {
        1 => 1,
        n if input.replace_all => n as u64,
        _ => 0,
    };
    let size = (text.len() as u64)
        .saturating_sub(made * input.old_string.len() as u64)
        .saturating_add(made.saturating_mul(input.new_string.len() as u64));
    if size > MAX_FILE_BYTES {
        return Err(ToolError::EditTooLarge {
            path: shown.to_owned(),
            size,
            limit: MAX_FILE_BYTES,
        });
    }
    match count {
        0 if input.old_string.contains(" withheld]") => Err(ToolError::OldStringWithheld {
            path: shown.to_owned(),
        }),
        0 => Err(ToolError::OldStringMissing {
            path: shown.to_owned(),
        }),
        1 => Ok((text.replacen(&input.old_string, &input.new_string, 1), 1)),
        n if input.replace_all => Ok((text.replace(&input.old_string, &input.new_string), n)),
        n => Err(ToolError::OldStringNotUnique {
            path: shown.to_owned(),
            count: n,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(old: &str, new: &str, all: bool) -> Input {
        Input {
            path: "f.txt".to_owned(),
            old_string: old.to_owned(),
            new_string: new.to_owned(),
            replace_all: all,
        }
    }

    /// `replace_all` of a short string by a long one is refused before it is made when the
    /// file would pass the tool's bound.
    #[test]
    fn an_edit_past_the_size_bound_is_refused_before_it_is_made() {
        let text = "a".repeat(100_000);
        let long = "b".repeat(1000);
        let result = replace(&text, &input("a", &long, true), "f.txt");
        assert!(
            matches!(
                &result,
                Err(ToolError::EditTooLarge {
                    size: 100_000_000,
                    ..
                })
            ),
            "{:?}",
            result.map(|(_, n)| n)
        );
        let (edited, n) =
            replace(&text, &input("a", "bb", true), "f.txt").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((edited.len(), n), (200_000, 100_000));
    }

    #[test]
    fn replaces_a_unique_string_and_refuses_ambiguity() {
        let text = "a = 1\nb = 1\n";
        assert_eq!(
            replace(text, &input("a = 1", "a = 2", false), "f").ok(),
            Some(("a = 2\nb = 1\n".to_owned(), 1))
        );
        assert!(matches!(
            replace(text, &input("= 1", "= 2", false), "f"),
            Err(ToolError::OldStringNotUnique { count: 2, .. })
        ));
        assert_eq!(
            replace(text, &input("= 1", "= 2", true), "f").ok(),
            Some(("a = 2\nb = 2\n".to_owned(), 2))
        );
        assert!(matches!(
            replace(text, &input("c", "d", true), "f"),
            Err(ToolError::OldStringMissing { .. })
        ));
        assert!(matches!(
            replace(text, &input("", "d", true), "f"),
            Err(ToolError::EmptyOldString)
        ));
        // A note the model was shown for a key, copied into old_string, is not in the file.
        let withheld = input("k = [an Anthropic API key withheld]", "k = 1", false);
        assert!(matches!(
            replace("k = sk-ant-…\n", &withheld, "f"),
            Err(ToolError::OldStringWithheld { .. })
        ));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_fifo_is_refused_without_waiting_for_a_writer()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let fifo = dir.path().join("f.txt");
        let _fed = super::super::open::tests::fed_fifo(&fifo)?;
        let ws = Workspace::open(dir.path())?;
        let result = run(&input("absent", "y", false), &ws).await;
        assert!(
            matches!(&result, Err(ToolError::NotRegular { kind: "a FIFO", .. })),
            "{result:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn edits_the_file_on_disk_only_on_success() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("f.txt"), "x x\n")?;
        let ws = Workspace::open(dir.path())?;
        assert!(run(&input("x", "y", false), &ws).await.is_err());
        assert_eq!(std::fs::read_to_string(dir.path().join("f.txt"))?, "x x\n");
        let out = run(&input("x x", "y", false), &ws).await?;
        assert_eq!(out, "replaced 1 occurrence in f.txt");
        assert_eq!(std::fs::read_to_string(dir.path().join("f.txt"))?, "y\n");
        Ok(())
    }
}

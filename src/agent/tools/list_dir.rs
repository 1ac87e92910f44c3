//! `list_dir`: the entries of one directory, sorted, directories marked with `/` and symlinks
//! with `@`, capped in number.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolError, ToolKind, ToolSpec, io_err};
use crate::agent::workspace::Workspace;

pub(crate) const SPEC: ToolSpec = ToolSpec {
    name: "list_dir",
    kind: ToolKind::ReadOnly,
    description: "List a directory of the workspace (default: its root). Directories end with \
                  `/`, symlinks with `@`; files show their size.",
    input_schema: schema,
};

const MAX_ENTRIES: usize = 1000;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Directory path, relative to the workspace; default \".\"."}
        },
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    #[serde(default)]
    pub path: Option<String>,
}

impl Input {
    pub(crate) fn path(&self) -> &str {
        self.path.as_deref().unwrap_or(".")
    }
}

pub(crate) async fn run(input: &Input, ws: &Workspace) -> Result<String, ToolError> {
    let shown = input.path();
    let dir = ws.resolve(shown)?;
    let meta = tokio::fs::metadata(&dir).await.map_err(io_err(shown))?;
    if !meta.is_dir() {
        return Err(ToolError::NotDirectory {
            path: shown.to_owned(),
        });
    }
    let mut reader = tokio::fs::read_dir(&dir).await.map_err(io_err(shown))?;
    let mut entries = Vec::new();
    while let Some(entry) = reader.next_entry().await.map_err(io_err(shown))? {
        let name = entry.file_name().to_string_lossy().into_owned();
        // file_type does not follow symlinks, so a link shows as a link.
        let line = match entry.file_type().await {
            Ok(t) if t.is_symlink() => format!("{name}@"),
            Ok(t) if t.is_dir() => format!("{name}/"),
            Ok(_) => match entry.metadata().await {
                Ok(m) => format!("{name} ({} bytes)", m.len()),
                Err(_) => name,
            },
            Err(_) => name,
        };
        entries.push(line);
    }
    entries.sort();
    Ok(render(entries))
}

fn render(mut entries: Vec<String>) -> String {
    if entries.is_empty() {
        return "(empty directory)".to_owned();
    }
    let total = entries.len();
    entries.truncate(MAX_ENTRIES);
    let mut out = entries.join("\n");
    if total > MAX_ENTRIES {
        out.push_str(&format!(
            "\n[{} more entries not shown]",
            total - MAX_ENTRIES
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lists_sorted_entries_with_markers() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("b.txt"), "12345")?;
        std::fs::create_dir(dir.path().join("a"))?;
        #[cfg(unix)]
        std::os::unix::fs::symlink("b.txt", dir.path().join("c"))?;
        let ws = Workspace::open(dir.path())?;
        let out = run(&Input::default(), &ws).await?;
        #[cfg(unix)]
        assert_eq!(out, "a/\nb.txt (5 bytes)\nc@");
        let empty = run(
            &Input {
                path: Some("a".to_owned()),
            },
            &ws,
        )
        .await?;
        assert_eq!(empty, "(empty directory)");
        let file = run(
            &Input {
                path: Some("b.txt".to_owned()),
            },
            &ws,
        )
        .await;
        assert!(matches!(file, Err(ToolError::NotDirectory { .. })));
        Ok(())
    }

    #[test]
    fn long_listings_are_capped() {
        let entries: Vec<String> = (0..MAX_ENTRIES + 3).map(|i| format!("f{i}")).collect();
        let out = render(entries);
        assert!(out.ends_with("[3 more entries not shown]"));
        assert_eq!(out.lines().count(), MAX_ENTRIES + 1);
    }
}

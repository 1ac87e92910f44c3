//! `write_file`: create or overwrite a file, creating missing parent directories.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolError, ToolKind, ToolSpec, io_err};
use crate::agent::workspace::Workspace;

pub(crate) const SPEC: ToolSpec = ToolSpec {
    name: "write_file",
    kind: ToolKind::Write,
    description: "Create or overwrite a file in the workspace with the given content. Missing \
                  parent directories are created.",
    input_schema: schema,
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace."},
            "content": {"type": "string", "description": "The complete new content."}
        },
        "required": ["path", "content"],
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    pub path: String,
    pub content: String,
}

pub(crate) async fn run(input: &Input, ws: &Workspace) -> Result<String, ToolError> {
    let path = ws.resolve(&input.path)?;
    if tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_dir()) {
        return Err(ToolError::IsDirectory {
            path: input.path.clone(),
        });
    }
    // The resolved path is a real directory inside the workspace plus plain names, so the
    // directories created here are inside it too.
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(io_err(&input.path))?;
    }
    tokio::fs::write(&path, input.content.as_bytes())
        .await
        .map_err(io_err(&input.path))?;
    Ok(format!(
        "wrote {} bytes to {}",
        input.content.len(),
        ws.display(&path)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(path: &str, content: &str) -> Input {
        Input {
            path: path.to_owned(),
            content: content.to_owned(),
        }
    }

    #[tokio::test]
    async fn writes_files_and_creates_parents() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let out = run(&input("deep/er/a.txt", "hello"), &ws).await?;
        assert_eq!(out, "wrote 5 bytes to deep/er/a.txt");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("deep/er/a.txt"))?,
            "hello"
        );
        run(&input("deep/er/a.txt", "bye"), &ws).await?;
        assert_eq!(
            std::fs::read_to_string(dir.path().join("deep/er/a.txt"))?,
            "bye"
        );
        Ok(())
    }

    #[tokio::test]
    async fn refuses_directories_and_escapes() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws_dir = dir.path().join("ws");
        std::fs::create_dir_all(ws_dir.join("d"))?;
        let ws = Workspace::open(&ws_dir)?;
        assert!(matches!(
            run(&input("d", "x"), &ws).await,
            Err(ToolError::IsDirectory { .. })
        ));
        assert!(matches!(
            run(&input("../escape.txt", "x"), &ws).await,
            Err(ToolError::Path(_))
        ));
        assert!(!dir.path().join("escape.txt").exists());
        Ok(())
    }
}

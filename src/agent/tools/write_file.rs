//! `write_file`: create or overwrite a file, creating missing parent directories.

use std::io::Write;

use serde::Deserialize;
use serde_json::{Value, json};

use super::open::open_regular;
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
    let (target, content) = (path.clone(), input.content.clone());
    let shown = input.path.clone();
    // Off the async workers, and into a regular file only: writing into a FIFO would wait
    // for a reader that may never come.
    tokio::task::spawn_blocking(move || {
        let mut options = std::fs::OpenOptions::new();
        let (mut file, _) = open_regular(options.write(true).create(true), &target, &shown)?;
        // Truncated only now that the file is known to be regular.
        file.set_len(0).map_err(io_err(&shown))?;
        file.write_all(content.as_bytes()).map_err(io_err(&shown))
    })
    .await
    .map_err(|e| io_err(&input.path)(std::io::Error::other(e)))??;
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

    #[cfg(unix)]
    #[tokio::test]
    async fn a_fifo_is_refused_without_waiting_for_a_reader()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let fifo = dir.path().join("pipe");
        super::super::open::tests::mkfifo(&fifo)?;
        // A reader that would take an unchecked write, so the test fails rather than hangs.
        let reader_path = fifo.clone();
        std::thread::spawn(move || std::fs::read(reader_path));
        let ws = Workspace::open(dir.path())?;
        let result = run(&input("pipe", "into the pipe"), &ws).await;
        assert!(
            matches!(&result, Err(ToolError::NotRegular { kind: "a FIFO", .. })),
            "{result:?}"
        );
        // Lets the reader's open return so its thread ends, if our own open has not; never
        // waits itself.
        use std::os::unix::fs::OpenOptionsExt;
        drop(
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo),
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

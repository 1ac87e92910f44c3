//! `read_file`: a text file's contents, whole or a range of lines, capped in size.

use std::io::Read;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Value, json};

use super::open::open_regular;
use super::{ToolError, ToolKind, ToolSpec, io_err, looks_binary};
use crate::agent::workspace::Workspace;

pub(crate) const SPEC: ToolSpec = ToolSpec {
    name: "read_file",
    kind: ToolKind::ReadOnly,
    description: "Read a text file in the workspace. Optionally a range of lines: `offset` is \
                  the first line (1-based), `limit` the number of lines. Output longer than \
                  256 KiB is cut with a note.",
    input_schema: schema,
};

/// Files larger than this are refused rather than read into memory.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Output longer than this is cut.
const MAX_OUTPUT_BYTES: usize = 256 * 1024;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return."}
        },
        "required": ["path"],
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    pub path: String,
    #[serde(default)]
    pub offset: Option<usize>,
    #[serde(default)]
    pub limit: Option<usize>,
}

pub(crate) async fn run(input: &Input, ws: &Workspace) -> Result<String, ToolError> {
    let path = ws.resolve(&input.path)?;
    let shown = input.path.clone();
    // Blocking reads run off the async workers: a slow disk must not stall them.
    let bytes = tokio::task::spawn_blocking(move || read_capped(path, &shown))
        .await
        .map_err(|e| io_err(&input.path)(std::io::Error::other(e)))??;
    if looks_binary(&bytes) {
        return Err(ToolError::Binary {
            path: input.path.clone(),
        });
    }
    let text = String::from_utf8_lossy(&bytes);
    let selected = select_lines(&text, input.offset, input.limit);
    Ok(cap_output(selected, input.offset.unwrap_or(1).max(1)))
}

fn read_capped(path: PathBuf, shown: &str) -> Result<Vec<u8>, ToolError> {
    let (file, meta) = open_regular(std::fs::OpenOptions::new().read(true), &path, shown)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(ToolError::TooLarge {
            path: shown.to_owned(),
            size: meta.len(),
            limit: MAX_FILE_BYTES,
        });
    }
    let mut bytes = Vec::new();
    // The file may grow after the size check; the read is bounded all the same.
    file.take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io_err(shown))?;
    Ok(bytes)
}

/// Lines `offset..offset+limit` (1-based), line ends kept; the whole text without either.
fn select_lines(text: &str, offset: Option<usize>, limit: Option<usize>) -> String {
    if offset.is_none() && limit.is_none() {
        return text.to_owned();
    }
    let skip = offset.unwrap_or(1).saturating_sub(1);
    let take = limit.unwrap_or(usize::MAX);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// The text, cut at [`MAX_OUTPUT_BYTES`] with a note naming the file line (`first` is the
/// file line the text starts at) to read on from.
fn cap_output(text: String, first: usize) -> String {
    if text.len() <= MAX_OUTPUT_BYTES {
        return text;
    }
    let mut cut = MAX_OUTPUT_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let next = first.saturating_add(text[..cut].matches('\n').count());
    if next == first {
        // One line longer than the cap: reading on from it would show the same start again.
        return format!(
            "{}\n[output cut at {cut} of {} bytes: line {first} alone is longer than this tool shows; only its start can be read]",
            &text[..cut],
            text.len()
        );
    }
    format!(
        "{}\n[output cut at {cut} of {} bytes; read on with offset={next}]",
        &text[..cut],
        text.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(path: &str, offset: Option<usize>, limit: Option<usize>) -> Input {
        Input {
            path: path.to_owned(),
            offset,
            limit,
        }
    }

    #[tokio::test]
    async fn reads_whole_files_and_line_ranges() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\nthree\n")?;
        let ws = Workspace::open(dir.path())?;
        assert_eq!(
            run(&input("a.txt", None, None), &ws).await?,
            "one\ntwo\nthree\n"
        );
        assert_eq!(run(&input("a.txt", Some(2), Some(1)), &ws).await?, "two\n");
        assert_eq!(run(&input("a.txt", Some(3), None), &ws).await?, "three\n");
        assert_eq!(run(&input("a.txt", Some(9), None), &ws).await?, "");
        Ok(())
    }

    #[tokio::test]
    async fn refuses_directories_binaries_missing_files_and_escapes()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("d"))?;
        std::fs::write(dir.path().join("bin"), [0u8, 1, 2])?;
        let ws = Workspace::open(dir.path())?;
        let err = |p: &'static str| {
            let ws = ws.clone();
            async move { run(&input(p, None, None), &ws).await.err() }
        };
        assert!(matches!(
            err("d").await,
            Some(ToolError::IsDirectory { .. })
        ));
        assert!(matches!(err("bin").await, Some(ToolError::Binary { .. })));
        assert!(matches!(err("missing").await, Some(ToolError::Io { .. })));
        assert!(matches!(
            err("../x").await,
            Some(ToolError::Path(
                crate::agent::workspace::PathError::Outside { .. }
            ))
        ));
        Ok(())
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_fifo_is_refused_without_waiting_for_a_writer()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let fifo = dir.path().join("pipe");
        let _fed = super::super::open::tests::fed_fifo(&fifo)?;
        let ws = Workspace::open(dir.path())?;
        let result = run(&input("pipe", None, None), &ws).await;
        assert!(
            matches!(&result, Err(ToolError::NotRegular { kind: "a FIFO", .. })),
            "{result:?}"
        );
        // Lets the writer's open return so its thread ends.
        Ok(())
    }

    #[test]
    fn long_output_is_cut_with_a_note() {
        let text = "x".repeat(MAX_OUTPUT_BYTES + 10);
        let out = cap_output(text, 1);
        assert!(out.starts_with("xxx"));
        assert!(
            out.ends_with(
                "line 1 alone is longer than this tool shows; only its start can be read]"
            ),
            "{}",
            &out[out.len() - 80..]
        );
        assert!(out.len() < MAX_OUTPUT_BYTES + 200);
    }

    /// The line to read on from is the file's, wherever the read began: the line the cut fell
    /// in (its start was shown, its end was not).
    #[test]
    fn the_note_names_the_file_line_to_read_on_from() {
        let line = format!("{}\n", "y".repeat(99));
        let text = line.repeat(MAX_OUTPUT_BYTES / 100 + 10);
        let shown = MAX_OUTPUT_BYTES / 100;
        let out = cap_output(text, 10_000);
        let want = format!("read on with offset={}]", 10_000 + shown);
        assert!(out.ends_with(&want), "{}", &out[out.len() - 80..]);
    }
}

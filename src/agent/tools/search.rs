//! `search`: a regex over the text files under a workspace path, one result line per matching
//! line (`path:line: text`). The walk skips `.git`, does not follow symlinks (which could lead
//! out of the workspace or in circles), and skips binary and large files; results are capped.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolError, ToolKind, ToolSpec, io_err, looks_binary};
use crate::agent::workspace::Workspace;

pub(crate) const SPEC: ToolSpec = ToolSpec {
    name: "search",
    kind: ToolKind::ReadOnly,
    description: "Search text files under a workspace path (default: the whole workspace) for a \
                  regular expression (Rust regex syntax). Returns `path:line: text` lines. Skips \
                  .git, binary files, files over 1 MiB and symlinks.",
    input_schema: schema,
};

const DEFAULT_RESULTS: usize = 100;
const MAX_RESULTS: usize = 1000;
const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Longer matching lines are shortened in the results.
const MAX_LINE_CHARS: usize = 240;
/// A bound on the compiled pattern, so a pathological regex fails instead of eating memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression."},
            "path": {"type": "string", "description": "File or directory to search, relative to the workspace; default \".\"."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "description": "Default 100."}
        },
        "required": ["pattern"],
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    pub pattern: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub max_results: Option<usize>,
}

impl Input {
    pub(crate) fn path(&self) -> &str {
        self.path.as_deref().unwrap_or(".")
    }

    pub(super) fn check(&self) -> Result<(), String> {
        match self.max_results {
            Some(n) if n == 0 || n > MAX_RESULTS => {
                Err(format!("max_results must be within 1..={MAX_RESULTS}"))
            }
            _ => Ok(()),
        }
    }
}

pub(crate) async fn run(input: &Input, ws: &Workspace) -> Result<String, ToolError> {
    let start = ws.resolve(input.path())?;
    let regex = RegexBuilder::new(&input.pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(ToolError::BadPattern)?;
    let cap = input.max_results.unwrap_or(DEFAULT_RESULTS);
    let ws = ws.clone();
    let shown = input.path().to_owned();
    tokio::task::spawn_blocking(move || search(&ws, &start, &shown, &regex, cap))
        .await
        .map_err(|e| io_err(input.path())(std::io::Error::other(e)))?
}

fn search(
    ws: &Workspace,
    start: &Path,
    shown: &str,
    regex: &Regex,
    cap: usize,
) -> Result<String, ToolError> {
    fs::metadata(start).map_err(io_err(shown))?;
    let mut results = Vec::new();
    let mut capped = false;
    let mut stack: Vec<PathBuf> = vec![start.to_path_buf()];
    'walk: while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            // Pushed in reverse so the walk visits names in sorted order.
            let mut children = sorted_children(&path);
            children.reverse();
            stack.extend(children);
            continue;
        }
        // The walk starts at a resolved path and never follows a symlink, so the paths it
        // meets are real ones, comparable with the transcript's.
        if !meta.is_file() || meta.len() > MAX_FILE_BYTES || ws.is_transcript(&path) {
            continue;
        }
        for hit in search_file(&path, regex) {
            if results.len() == cap {
                capped = true;
                break 'walk;
            }
            results.push(format!("{}:{}: {}", ws.display(&path), hit.0, hit.1));
        }
    }
    Ok(render(results, capped))
}

fn sorted_children(dir: &Path) -> Vec<PathBuf> {
    let Ok(reader) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut children: Vec<PathBuf> = reader
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != ".git")
        .map(|e| e.path())
        .collect();
    children.sort();
    children
}

/// Matching lines of a text file as (1-based line number, shortened text).
fn search_file(path: &Path, regex: &Regex) -> Vec<(usize, String)> {
    let mut bytes = Vec::new();
    let read = fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES).read_to_end(&mut bytes));
    if read.is_err() || looks_binary(&bytes) {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .enumerate()
        .filter(|(_, line)| regex.is_match(line))
        .map(|(i, line)| (i + 1, shorten(line)))
        .collect()
}

fn shorten(line: &str) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

fn render(results: Vec<String>, capped: bool) -> String {
    if results.is_empty() {
        return "no matches".to_owned();
    }
    let count = results.len();
    let mut out = results.join("\n");
    if capped {
        out.push_str(&format!(
            "\n[results capped at {count}; narrow the pattern or the path]"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(pattern: &str, path: Option<&str>, max: Option<usize>) -> Input {
        Input {
            pattern: pattern.to_owned(),
            path: path.map(str::to_owned),
            max_results: max,
        }
    }

    fn workspace() -> std::io::Result<(tempfile::TempDir, Workspace)> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        fs::create_dir_all(root.join("src/inner"))?;
        fs::create_dir_all(root.join(".git"))?;
        fs::write(root.join("src/a.rs"), "fn main() {}\nlet answer = 42;\n")?;
        fs::write(root.join("src/inner/b.rs"), "answer again\n")?;
        fs::write(root.join(".git/config"), "answer in git\n")?;
        fs::write(root.join("blob.bin"), b"answer\0binary")?;
        fs::write(root.join("z.txt"), "no match here\n")?;
        let ws = Workspace::open(root)?;
        Ok((dir, ws))
    }

    #[tokio::test]
    async fn finds_lines_in_text_files_skipping_git_and_binaries()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, ws) = workspace()?;
        let out = run(&input("answer", None, None), &ws).await?;
        assert_eq!(
            out,
            "src/a.rs:2: let answer = 42;\nsrc/inner/b.rs:1: answer again"
        );
        let scoped = run(&input(r"\d+", Some("src/a.rs"), None), &ws).await?;
        assert_eq!(scoped, "src/a.rs:2: let answer = 42;");
        assert_eq!(run(&input("zzz", None, None), &ws).await?, "no matches");
        Ok(())
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn does_not_follow_symlinks_out() -> Result<(), Box<dyn std::error::Error>> {
        let outer = tempfile::tempdir()?;
        fs::write(outer.path().join("secret.txt"), "answer outside\n")?;
        let (dir, ws) = workspace()?;
        std::os::unix::fs::symlink(outer.path(), dir.path().join("out"))?;
        let out = run(&input("outside", None, None), &ws).await?;
        assert_eq!(out, "no matches");
        Ok(())
    }

    #[tokio::test]
    async fn results_are_capped_and_bad_patterns_refused() -> Result<(), Box<dyn std::error::Error>>
    {
        let (_dir, ws) = workspace()?;
        let out = run(&input("answer", None, Some(1)), &ws).await?;
        assert!(out.starts_with("src/a.rs:2: "));
        assert!(out.ends_with("narrow the pattern or the path]"));
        assert!(matches!(
            run(&input("(", None, None), &ws).await,
            Err(ToolError::BadPattern(_))
        ));
        assert!(input("a", None, Some(0)).check().is_err());
        assert!(input("a", None, Some(MAX_RESULTS + 1)).check().is_err());
        Ok(())
    }

    #[test]
    fn long_lines_are_shortened_on_a_char_boundary() {
        let line = "é".repeat(MAX_LINE_CHARS + 5);
        let short = shorten(&line);
        assert_eq!(short.chars().count(), MAX_LINE_CHARS + 1);
        assert!(short.ends_with('…'));
    }
}

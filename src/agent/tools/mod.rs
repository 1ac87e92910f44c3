//! The tool registry: the one place that lists the tools, produces their schemas for the
//! request, parses a model's call into a typed [`Call`], and routes it to the tool's module.
//!
//! Every failure a tool meets is a [`ToolError`] that becomes an `is_error` tool_result the
//! model can read; nothing a tool does ends the loop.

mod child;
pub(super) mod edit_file;
pub(super) mod list_dir;
mod open;
mod output;
#[cfg(unix)]
mod process_tree;
pub(super) mod read_file;
pub(super) mod run_command;
pub(super) mod search;
pub(super) mod write_file;

use std::fmt;
use std::io;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::cancel::{Cancel, Signal};
use super::shown::{escape, preview};
use super::workspace::{PathError, Workspace};

/// What a tool can do, which decides how the approval hook treats it and whether an
/// interrupted call may be rerun on resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ToolKind {
    /// Reads only; safe to run again.
    ReadOnly,
    /// Changes files.
    Write,
    /// Runs a shell command: may do anything inside the process's rights.
    Run,
}

/// One registered tool.
pub(super) struct ToolSpec {
    pub name: &'static str,
    pub kind: ToolKind,
    pub description: &'static str,
    /// JSON Schema of the input object.
    pub input_schema: fn() -> Value,
}

/// Every tool, in the order the model sees them.
pub(super) const REGISTRY: [&ToolSpec; 6] = [
    &read_file::SPEC,
    &write_file::SPEC,
    &edit_file::SPEC,
    &list_dir::SPEC,
    &search::SPEC,
    &run_command::SPEC,
];

/// The registered tool of that name.
pub(super) fn spec(name: &str) -> Option<&'static ToolSpec> {
    REGISTRY.iter().copied().find(|s| s.name == name)
}

/// The `tools` array of a Messages request.
pub(super) fn schemas() -> Vec<Value> {
    REGISTRY
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "description": s.description,
                "input_schema": (s.input_schema)(),
            })
        })
        .collect()
}

/// A model's tool call, parsed and typed.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Call {
    ReadFile(read_file::Input),
    WriteFile(write_file::Input),
    EditFile(edit_file::Input),
    ListDir(list_dir::Input),
    Search(search::Input),
    RunCommand(run_command::Input),
}

/// Why a call could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CallError {
    UnknownTool { name: String },
    InvalidInput { tool: String, message: String },
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::UnknownTool { name } => {
                let names: Vec<&str> = REGISTRY.iter().map(|s| s.name).collect();
                write!(f, "unknown tool `{name}`; available: {}", names.join(", "))
            }
            CallError::InvalidInput { tool, message } => {
                write!(f, "invalid input for {tool}: {message}")
            }
        }
    }
}

fn typed<T: DeserializeOwned>(tool: &str, input: &Value) -> Result<T, CallError> {
    T::deserialize(input).map_err(|e| CallError::InvalidInput {
        tool: tool.to_owned(),
        message: e.to_string(),
    })
}

impl Call {
    /// Parses a call by tool name; unknown names and inputs that do not fit the schema fail.
    pub(super) fn parse(name: &str, input: &Value) -> Result<Call, CallError> {
        let call = match name {
            "read_file" => Call::ReadFile(typed(name, input)?),
            "write_file" => Call::WriteFile(typed(name, input)?),
            "edit_file" => Call::EditFile(typed(name, input)?),
            "list_dir" => Call::ListDir(typed(name, input)?),
            "search" => Call::Search(typed(name, input)?),
            "run_command" => Call::RunCommand(typed(name, input)?),
            _ => {
                return Err(CallError::UnknownTool {
                    name: name.to_owned(),
                });
            }
        };
        call.check().map_err(|message| CallError::InvalidInput {
            tool: name.to_owned(),
            message,
        })?;
        Ok(call)
    }

    fn spec(&self) -> &'static ToolSpec {
        match self {
            Call::ReadFile(_) => &read_file::SPEC,
            Call::WriteFile(_) => &write_file::SPEC,
            Call::EditFile(_) => &edit_file::SPEC,
            Call::ListDir(_) => &list_dir::SPEC,
            Call::Search(_) => &search::SPEC,
            Call::RunCommand(_) => &run_command::SPEC,
        }
    }

    /// Checks that serde cannot express (ranges, non-empty strings).
    fn check(&self) -> Result<(), String> {
        match self {
            Call::EditFile(i) => i.check(),
            Call::Search(i) => i.check(),
            Call::RunCommand(i) => i.check(),
            Call::ReadFile(_) | Call::WriteFile(_) | Call::ListDir(_) => Ok(()),
        }
    }

    pub(super) fn name(&self) -> &'static str {
        self.spec().name
    }

    pub(super) fn kind(&self) -> ToolKind {
        self.spec().kind
    }

    /// Every path the call names, for the path guard.
    pub(super) fn paths(&self) -> Vec<&str> {
        match self {
            Call::ReadFile(i) => vec![&i.path],
            Call::WriteFile(i) => vec![&i.path],
            Call::EditFile(i) => vec![&i.path],
            Call::ListDir(i) => vec![i.path()],
            Call::Search(i) => vec![i.path()],
            Call::RunCommand(_) => Vec::new(),
        }
    }

    /// Text the call would put on disk or hand to a shell, for the secret scan: a written
    /// file's name too, which stays on disk as its content does.
    pub(super) fn written_text(&self) -> Vec<&str> {
        match self {
            Call::WriteFile(i) => vec![&i.path, &i.content],
            Call::EditFile(i) => vec![&i.path, &i.new_string],
            Call::RunCommand(i) => vec![&i.command],
            Call::ReadFile(_) | Call::ListDir(_) | Call::Search(_) => Vec::new(),
        }
    }

    /// The text a write puts in a file (`write_file` content, `edit_file` replacement).
    pub(super) fn file_text(&self) -> Option<&str> {
        match self {
            Call::WriteFile(i) => Some(&i.content),
            Call::EditFile(i) => Some(&i.new_string),
            _ => None,
        }
    }

    /// A one-line description for a terminal prompt or a log line, the model's text in it
    /// escaped so that it cannot act on the terminal.
    pub(super) fn describe(&self) -> String {
        match self {
            Call::ReadFile(i) => format!("read_file {}", escape(&i.path)),
            Call::WriteFile(i) => {
                format!("write_file {} ({} bytes)", escape(&i.path), i.content.len())
            }
            Call::EditFile(i) => format!("edit_file {}", escape(&i.path)),
            Call::ListDir(i) => format!("list_dir {}", escape(i.path())),
            Call::Search(i) => format!("search {:?} in {}", i.pattern, escape(i.path())),
            Call::RunCommand(i) => format!("run_command: {}", escape(&i.command)),
        }
    }

    /// What a human approving the call should see besides [`Call::describe`]: the text a
    /// write would put in the file, escaped and bounded.
    pub(super) fn preview(&self) -> String {
        const LINES: usize = 20;
        const BYTES: usize = 2048;
        match self {
            Call::WriteFile(i) => preview(&i.content, LINES, BYTES),
            Call::EditFile(i) => format!(
                "  old_string:\n{}  new_string:\n{}",
                preview(&i.old_string, LINES, BYTES),
                preview(&i.new_string, LINES, BYTES)
            ),
            Call::ReadFile(_) | Call::ListDir(_) | Call::Search(_) | Call::RunCommand(_) => {
                String::new()
            }
        }
    }

    /// Runs the call. The path guard has passed, but each tool resolves its paths again
    /// through the same function, so it acts on exactly what was checked.
    pub(super) async fn run(&self, ctx: &ToolContext) -> ToolOutput {
        let result = match self {
            Call::ReadFile(i) => read_file::run(i, &ctx.workspace).await,
            Call::WriteFile(i) => write_file::run(i, &ctx.workspace).await,
            Call::EditFile(i) => edit_file::run(i, &ctx.workspace).await,
            Call::ListDir(i) => list_dir::run(i, &ctx.workspace).await,
            Call::Search(i) => search::run(i, &ctx.workspace).await,
            Call::RunCommand(i) => run_command::run(i, &ctx.workspace, &ctx.cancel).await,
        };
        match result {
            Ok(content) => ToolOutput::ok(content),
            Err(e) => ToolOutput::error(e.to_string()),
        }
    }
}

/// What the tools share.
#[derive(Debug, Clone)]
pub(super) struct ToolContext {
    pub workspace: Workspace,
    pub cancel: Cancel,
}

/// A tool's result as the model will read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ToolOutput {
    pub content: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub(super) fn ok(content: String) -> ToolOutput {
        ToolOutput {
            content,
            is_error: false,
        }
    }

    pub(super) fn error(content: String) -> ToolOutput {
        ToolOutput {
            content,
            is_error: true,
        }
    }
}

/// Everything that can go wrong inside a tool.
#[derive(Debug)]
pub(super) enum ToolError {
    Path(PathError),
    Io {
        path: String,
        source: io::Error,
    },
    IsDirectory {
        path: String,
    },
    NotRegular {
        path: String,
        kind: &'static str,
    },
    NotDirectory {
        path: String,
    },
    Binary {
        path: String,
    },
    TooLarge {
        path: String,
        size: u64,
        limit: u64,
    },
    /// An edit would make the file larger than the tool's bound (`replace_all` multiplies).
    EditTooLarge {
        path: String,
        size: u64,
        limit: u64,
    },
    EmptyOldString,
    OldStringMissing {
        path: String,
    },
    /// Not found, and the model's old_string holds a redaction note (`secrets`): the file has
    /// the key the note stands for, which the model was never shown.
    OldStringWithheld {
        path: String,
    },
    OldStringNotUnique {
        path: String,
        count: usize,
    },
    /// An edit would leave a key-like string the file did not hold.
    KeyLike {
        path: String,
        kind: &'static str,
    },
    BadPattern(regex::Error),
    Spawn(io::Error),
    /// The command started, but waiting for it failed; it was killed.
    Wait {
        error: io::Error,
        output: String,
    },
    TimedOut {
        secs: u64,
        output: String,
    },
    Cancelled {
        by: Signal,
        output: String,
    },
    NotStarted {
        by: Signal,
    },
}

impl From<PathError> for ToolError {
    fn from(e: PathError) -> ToolError {
        ToolError::Path(e)
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::Path(e) => write!(f, "{e}"),
            ToolError::Io { path, source } => write!(f, "{path}: {source}"),
            ToolError::IsDirectory { path } => {
                write!(f, "{path}: is a directory (use list_dir)")
            }
            ToolError::NotDirectory { path } => write!(f, "{path}: not a directory"),
            ToolError::NotRegular { path, kind } => {
                write!(f, "{path}: is {kind}, not a regular file; not opened")
            }
            ToolError::Binary { path } => write!(f, "{path}: looks binary; not shown"),
            ToolError::TooLarge { path, size, limit } => {
                write!(
                    f,
                    "{path}: {size} bytes, more than the {limit} this tool handles"
                )
            }
            ToolError::EditTooLarge { path, size, limit } => write!(
                f,
                "{path}: the edit would make the file {size} bytes, more than the {limit} this tool writes; nothing changed"
            ),
            ToolError::EmptyOldString => write!(f, "old_string must not be empty"),
            ToolError::OldStringMissing { path } => {
                write!(f, "{path}: old_string not found; nothing changed")
            }
            ToolError::OldStringWithheld { path } => write!(
                f,
                "{path}: old_string not found; nothing changed. It holds a note that stands for \
                 a key-like string the tools do not show (`[… withheld]`): choose old_string \
                 from the text around it"
            ),
            ToolError::OldStringNotUnique { path, count } => write!(
                f,
                "{path}: old_string occurs {count} times; give more context to make it unique, \
                 or set replace_all; nothing changed"
            ),
            ToolError::KeyLike { path, kind } => write!(
                f,
                "{path}: the edit would leave {kind} in the file; the agent writes no keys; \
                 nothing changed"
            ),
            ToolError::BadPattern(e) => write!(f, "invalid regex: {e}"),
            ToolError::Spawn(e) => write!(f, "cannot start sh: {e}"),
            ToolError::Wait { error, output } => {
                write!(
                    f,
                    "the wait for the command failed ({error}); it was killed\n{output}"
                )
            }
            ToolError::TimedOut { secs, output } => {
                write!(f, "timed out after {secs} s and was killed\n{output}")
            }
            ToolError::Cancelled { by, output } => {
                write!(f, "cancelled ({by}) and killed\n{output}")
            }
            ToolError::NotStarted { by } => write!(
                f,
                "not run: the run was cancelled ({by}) before the command started"
            ),
        }
    }
}

impl std::error::Error for ToolError {}

/// `io::Error` with the path as the model named it.
pub(crate) fn io_err(path: &str) -> impl FnOnce(io::Error) -> ToolError + '_ {
    move |source| ToolError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Bytes sniffed for a NUL to tell binary files from text.
pub(crate) const SNIFF_BYTES: usize = 8 * 1024;

pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes.iter().take(SNIFF_BYTES).any(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_list_every_tool_with_an_object_schema() {
        let schemas = schemas();
        let names: Vec<&str> = schemas.iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "read_file",
                "write_file",
                "edit_file",
                "list_dir",
                "search",
                "run_command"
            ]
        );
        for s in &schemas {
            assert_eq!(s["input_schema"]["type"], "object", "{s}");
            assert!(s["description"].as_str().is_some_and(|d| !d.is_empty()));
        }
    }

    #[test]
    fn unknown_tools_and_invalid_inputs_are_parse_errors() {
        assert!(matches!(
            Call::parse("delete_everything", &json!({})),
            Err(CallError::UnknownTool { .. })
        ));
        let missing = Call::parse("read_file", &json!({}));
        assert!(
            matches!(&missing, Err(CallError::InvalidInput { tool, .. }) if tool == "read_file")
        );
        let extra = Call::parse("read_file", &json!({"path": "a", "mode": "rw"}));
        assert!(matches!(extra, Err(CallError::InvalidInput { .. })));
        let wrong_type = Call::parse("write_file", &json!({"path": 1, "content": "x"}));
        assert!(matches!(wrong_type, Err(CallError::InvalidInput { .. })));
        let not_object = Call::parse("list_dir", &json!("."));
        assert!(matches!(not_object, Err(CallError::InvalidInput { .. })));
        let message = Call::parse("nope", &json!({}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("read_file"), "{message}");
    }

    #[test]
    fn calls_expose_kind_paths_and_written_text() -> Result<(), CallError> {
        let write = Call::parse("write_file", &json!({"path": "a.txt", "content": "hi"}))?;
        assert_eq!(write.kind(), ToolKind::Write);
        assert_eq!(write.paths(), ["a.txt"]);
        assert_eq!(
            write.written_text(),
            ["a.txt", "hi"],
            "the name stays on disk too"
        );
        let list = Call::parse("list_dir", &json!({}))?;
        assert_eq!(list.kind(), ToolKind::ReadOnly);
        assert_eq!(list.paths(), ["."]);
        let run = Call::parse("run_command", &json!({"command": "ls"}))?;
        assert_eq!(run.kind(), ToolKind::Run);
        assert!(run.paths().is_empty());
        assert_eq!(run.written_text(), ["ls"]);
        Ok(())
    }

    #[test]
    fn registry_kinds_match_the_calls() {
        for (name, kind) in [
            ("read_file", ToolKind::ReadOnly),
            ("list_dir", ToolKind::ReadOnly),
            ("search", ToolKind::ReadOnly),
            ("write_file", ToolKind::Write),
            ("edit_file", ToolKind::Write),
            ("run_command", ToolKind::Run),
        ] {
            assert_eq!(spec(name).map(|s| s.kind), Some(kind), "{name}");
        }
        assert!(spec("nope").is_none());
    }
}

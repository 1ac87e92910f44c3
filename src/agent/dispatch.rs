//! Answering one assistant turn's tool calls, in order: each call is parsed, passes the hook
//! chain, is recorded (and fsynced) with its decision, runs if allowed, and has its result
//! recorded before the next call starts. The same path answers calls left open by a crash
//! when a transcript is resumed.
//!
//! Once the run is cancelled, no further call of the turn passes the chain or runs: each gets
//! a recorded 'not run' result instead, so the turn stays answered in the transcript and the
//! loop stops at the top of the next turn.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;

use serde_json::Value;

use super::cancel::Signal;
use super::conversation::{self, ToolUse};
use super::hooks::{Cancelled, HookChain};
use super::resume::{INTERRUPTED, NOT_RUN_TRUNCATED, RecordedResult};
use super::secrets;
use super::shown::bounded;
use super::tools::{Call, CallError, ToolContext, ToolKind, ToolOutput, spec};
use super::transcript::{Record, Writer};

/// How the calls of a turn are to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A reply that just arrived: every call goes through the chain.
    Live,
    /// Calls left without a result by a crash: read-only ones run again, the others are
    /// answered as interrupted.
    Resumed,
    /// Calls of a reply cut off at max_tokens: none runs.
    Truncated,
}

/// Why answering stopped before every call had its result.
#[derive(Debug)]
pub(super) enum Halt {
    /// The transcript could not be written: running a tool unrecorded would break its promise.
    Transcript(std::io::Error),
}

/// The result given to a call that a cancelled run did not start.
pub(super) fn not_run_cancelled(by: Signal) -> String {
    format!("not run: the run was cancelled ({by}) before this call started")
}

pub(super) struct Dispatcher<'a> {
    pub hooks: &'a HookChain,
    pub tools: &'a ToolContext,
    pub transcript: &'a mut Writer,
}

impl Dispatcher<'_> {
    /// Answers every call of a turn and returns the tool_result blocks, in call order.
    /// `answered` holds results already recorded; `input_errors` the calls whose streamed
    /// input did not parse.
    pub(super) async fn answer(
        &mut self,
        uses: &[ToolUse],
        answered: &HashMap<String, RecordedResult>,
        input_errors: &HashMap<String, String>,
        mode: Mode,
    ) -> Result<Vec<Value>, Halt> {
        let mut blocks = Vec::with_capacity(uses.len());
        for tool_use in uses {
            // Looked at before each call, not once per turn: a signal during one call must
            // keep every later one from starting.
            let stopped = self.tools.cancel.signal();
            let output = match (answered.get(&tool_use.id), mode, stopped) {
                (Some(done), _, _) => ToolOutput {
                    content: done.content.clone(),
                    is_error: done.is_error,
                },
                (None, Mode::Truncated, _) => self.record_only(tool_use, NOT_RUN_TRUNCATED)?,
                (None, Mode::Resumed, _) if !is_read_only(&tool_use.name) => {
                    self.record_only(tool_use, INTERRUPTED)?
                }
                (None, _, Some(by)) => self.record_only(tool_use, &not_run_cancelled(by))?,
                (None, _, None) => {
                    let rerun = mode == Mode::Resumed;
                    self.run_one(tool_use, input_errors.get(&tool_use.id), rerun)
                        .await?
                }
            };
            blocks.push(conversation::tool_result(
                &tool_use.id,
                &output.content,
                output.is_error,
            ));
        }
        Ok(blocks)
    }

    /// An error result for a call that is not run, recorded like any other.
    fn record_only(&mut self, tool_use: &ToolUse, content: &str) -> Result<ToolOutput, Halt> {
        let output = ToolOutput::error(content.to_owned());
        log(&format!("{}: {content}", tool_use.name));
        self.record_result(tool_use, &output)?;
        Ok(output)
    }

    async fn run_one(
        &mut self,
        tool_use: &ToolUse,
        input_error: Option<&String>,
        rerun: bool,
    ) -> Result<ToolOutput, Halt> {
        let call = match input_error {
            Some(message) => Err(CallError::InvalidInput {
                tool: tool_use.name.clone(),
                message: message.clone(),
            }),
            None => Call::parse(&tool_use.name, &tool_use.input),
        };
        let decision = match self.hooks.decide(&call, &self.tools.cancel).await {
            Ok(decision) => decision,
            // A signal while a human was asked: nothing was decided, so nothing runs.
            Err(Cancelled(by)) => return self.record_only(tool_use, &not_run_cancelled(by)),
        };
        self.transcript
            .write(&Record::ToolUse {
                id: tool_use.id.clone(),
                name: tool_use.name.clone(),
                input: tool_use.input.clone(),
                decision: decision.clone(),
                rerun,
            })
            .map_err(Halt::Transcript)?;
        let output = match (&call, decision.allow) {
            (Ok(call), true) => {
                log(&call.describe());
                let mut output = call.run(self.tools).await;
                // What goes back to the model (and into the transcript) holds no key: one in
                // a file read, or printed by a command, is replaced by a note.
                if let Cow::Owned(redacted) = secrets::redact(&output.content) {
                    output.content = redacted;
                }
                output
            }
            _ => {
                let denied = format!("denied by {}: {}", decision.hook, decision.reason);
                log(&format!("{} {denied}", tool_use.name));
                ToolOutput::error(denied)
            }
        };
        self.record_result(tool_use, &output)?;
        Ok(output)
    }

    fn record_result(&mut self, tool_use: &ToolUse, output: &ToolOutput) -> Result<(), Halt> {
        self.transcript
            .write(&Record::ToolResult {
                tool_use_id: tool_use.id.clone(),
                content: output.content.clone(),
                is_error: output.is_error,
            })
            .map_err(Halt::Transcript)
    }
}

fn is_read_only(name: &str) -> bool {
    spec(name).is_some_and(|s| s.kind == ToolKind::ReadOnly)
}

/// One line per call on stderr: stdout carries only the model's text.
fn log(what: &str) {
    let _ = writeln!(std::io::stderr(), "{}", log_line(what));
}

/// The `[tool]` line: escaped, since tool names, paths and commands come from the model, cut
/// short, and without the keys the model is kept from (stderr goes to CI logs too).
fn log_line(what: &str) -> String {
    format!("[tool] {}", bounded(&secrets::redact(what), 200))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::cancel::Cancel;
    use crate::agent::hooks::{Approve, TtyPrompter};
    use crate::agent::workspace::Workspace;
    use serde_json::json;
    use std::sync::Arc;

    struct Fixture {
        _dir: tempfile::TempDir,
        root: std::path::PathBuf,
        log: std::path::PathBuf,
        hooks: HookChain,
        tools: ToolContext,
    }

    fn fixture(approve: Approve) -> std::io::Result<Fixture> {
        fixture_with(approve, Cancel::never())
    }

    fn fixture_with(approve: Approve, cancel: Cancel) -> std::io::Result<Fixture> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("ws");
        std::fs::create_dir(&root)?;
        std::fs::write(root.join("a.txt"), "alpha")?;
        let ws = Workspace::open(&root)?;
        Ok(Fixture {
            log: dir.path().join("t.jsonl"),
            hooks: HookChain::new(ws.clone(), approve, Arc::new(TtyPrompter)),
            tools: ToolContext {
                workspace: ws,
                cancel,
            },
            root,
            _dir: dir,
        })
    }

    fn use_(id: &str, name: &str, input: Value) -> ToolUse {
        ToolUse {
            id: id.to_owned(),
            name: name.to_owned(),
            input,
        }
    }

    async fn answer(
        f: &Fixture,
        uses: &[ToolUse],
        mode: Mode,
    ) -> Result<(Vec<Value>, Vec<Record>), Box<dyn std::error::Error>> {
        let mut writer = Writer::create(&f.log)?;
        let mut d = Dispatcher {
            hooks: &f.hooks,
            tools: &f.tools,
            transcript: &mut writer,
        };
        let blocks = match d.answer(uses, &HashMap::new(), &HashMap::new(), mode).await {
            Ok(b) => b,
            Err(h) => return Err(format!("{h:?}").into()),
        };
        drop(writer);
        let records = crate::agent::transcript::load(&f.log)?.records;
        std::fs::remove_file(&f.log)?;
        Ok((blocks, records))
    }

    #[tokio::test]
    async fn live_calls_are_recorded_before_and_after_they_run()
    -> Result<(), Box<dyn std::error::Error>> {
        let f = fixture(Approve::Auto)?;
        let uses = [
            use_(
                "1",
                "write_file",
                json!({"path": "b.txt", "content": "beta"}),
            ),
            use_("2", "read_file", json!({"path": "../x"})),
            use_("3", "nope", json!({})),
        ];
        let (blocks, records) = answer(&f, &uses, Mode::Live).await?;
        assert_eq!(std::fs::read_to_string(f.root.join("b.txt"))?, "beta");
        assert_eq!(blocks[0]["is_error"], false);
        assert_eq!(blocks[1]["is_error"], true);
        assert!(
            blocks[1]["content"]
                .as_str()
                .is_some_and(|c| c.contains("path_guard"))
        );
        assert!(
            blocks[2]["content"]
                .as_str()
                .is_some_and(|c| c.contains("allowlist"))
        );
        let kinds: Vec<&str> = records
            .iter()
            .map(|r| match r {
                Record::ToolUse { .. } => "use",
                Record::ToolResult { .. } => "result",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["use", "result", "use", "result", "use", "result"]);
        Ok(())
    }

    /// The shape of a transcript: `use:ID` and `result:ID` for each tool record.
    fn shape(records: &[Record]) -> Vec<String> {
        records
            .iter()
            .map(|r| match r {
                Record::ToolUse { id, .. } => format!("use:{id}"),
                Record::ToolResult { tool_use_id, .. } => format!("result:{tool_use_id}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn no_call_starts_after_ctrl_c_and_each_gets_a_result()
    -> Result<(), Box<dyn std::error::Error>> {
        let (handle, cancel) = crate::agent::cancel::new();
        let f = fixture_with(Approve::Auto, cancel)?;
        let gate = f.root.join("gate");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&gate)
                .status()?
                .success()
        );
        let uses = [
            use_(
                "1",
                "run_command",
                json!({"command": "echo up > gate; sleep 30; touch slept.txt"}),
            ),
            use_("2", "write_file", json!({"path": "b.txt", "content": "x"})),
            use_("3", "run_command", json!({"command": "touch ran.txt"})),
            use_(
                "4",
                "edit_file",
                json!({"path": "a.txt", "old_string": "alpha", "new_string": "edited"}),
            ),
        ];
        // Ctrl-C comes once the first command is running: the test has read its line.
        let reader = std::thread::spawn(move || std::fs::read(gate));
        let raise = async {
            let _ = tokio::task::spawn_blocking(move || reader.join()).await;
            handle.cancel();
        };
        let (answered, ()) = tokio::join!(answer(&f, &uses, Mode::Live), raise);
        let (blocks, records) = answered?;
        for name in ["slept.txt", "b.txt", "ran.txt"] {
            assert!(!f.root.join(name).exists(), "{name} was made");
        }
        assert_eq!(std::fs::read_to_string(f.root.join("a.txt"))?, "alpha");
        assert!(
            blocks[0]["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("cancelled (Ctrl-C) and killed")),
            "{}",
            blocks[0]
        );
        for block in &blocks[1..] {
            assert_eq!(block["content"], not_run_cancelled(Signal::Interrupt));
            assert_eq!(block["is_error"], true);
        }
        assert_eq!(
            shape(&records),
            ["use:1", "result:1", "result:2", "result:3", "result:4"]
        );
        Ok(())
    }

    #[test]
    fn log_lines_hold_no_key() {
        let line = log_line("read_file sk-ant-api03-abcdefghijklmnop_QRSTUV");
        assert!(!line.contains("abcdefghijklmnop"), "{line}");
        assert!(line.contains("withheld"), "{line}");
    }

    #[test]
    fn log_lines_are_escaped_and_short() {
        let line = log_line("run_command: ls\n\x1b[1Arm -rf x");
        assert_eq!(line, "[tool] run_command: ls\\n\\x1b[1Arm -rf x");
        let long = log_line(&"y".repeat(1000));
        assert!(long.ends_with("y … (800 more bytes not shown)"), "{long}");
    }

    #[tokio::test]
    async fn resumed_calls_rerun_reads_and_interrupt_writes()
    -> Result<(), Box<dyn std::error::Error>> {
        let f = fixture(Approve::Auto)?;
        let uses = [
            use_("1", "read_file", json!({"path": "a.txt"})),
            use_("2", "write_file", json!({"path": "c.txt", "content": "x"})),
        ];
        let (blocks, records) = answer(&f, &uses, Mode::Resumed).await?;
        assert_eq!(blocks[0]["content"], "alpha");
        assert_eq!(blocks[1]["content"], INTERRUPTED);
        assert_eq!(blocks[1]["is_error"], true);
        assert!(!f.root.join("c.txt").exists());
        assert!(matches!(&records[0], Record::ToolUse { rerun: true, .. }));
        assert_eq!(
            records.len(),
            3,
            "a rerun use and result, an interrupted result"
        );
        Ok(())
    }

    #[tokio::test]
    async fn truncated_calls_never_run() -> Result<(), Box<dyn std::error::Error>> {
        let f = fixture(Approve::Auto)?;
        let uses = [
            use_("1", "read_file", json!({"path": "a.txt"})),
            use_("2", "write_file", json!({"path": "c.txt", "content": "x"})),
        ];
        let (blocks, _) = answer(&f, &uses, Mode::Truncated).await?;
        assert!(blocks.iter().all(|b| b["content"] == NOT_RUN_TRUNCATED));
        assert!(!f.root.join("c.txt").exists());
        Ok(())
    }

    #[tokio::test]
    async fn recorded_results_are_reused_and_input_errors_refused()
    -> Result<(), Box<dyn std::error::Error>> {
        let f = fixture(Approve::Auto)?;
        let mut writer = Writer::none();
        let mut d = Dispatcher {
            hooks: &f.hooks,
            tools: &f.tools,
            transcript: &mut writer,
        };
        let uses = [
            use_("1", "write_file", json!({"path": "d.txt", "content": "x"})),
            use_("2", "write_file", json!({})),
        ];
        let answered = HashMap::from([(
            "1".to_owned(),
            RecordedResult {
                content: "wrote earlier".to_owned(),
                is_error: false,
            },
        )]);
        let errors = HashMap::from([("2".to_owned(), "not valid JSON".to_owned())]);
        let blocks = match d.answer(&uses, &answered, &errors, Mode::Live).await {
            Ok(b) => b,
            Err(h) => return Err(format!("{h:?}").into()),
        };
        assert_eq!(blocks[0]["content"], "wrote earlier");
        assert!(!f.root.join("d.txt").exists());
        assert!(
            blocks[1]["content"]
                .as_str()
                .is_some_and(|c| c.contains("not valid JSON"))
        );
        Ok(())
    }
}

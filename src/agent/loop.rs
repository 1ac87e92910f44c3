//! The agent loop: guards at the top of every turn, one streamed reply per turn, and what each
//! stop reason means. `end_turn` finishes; `tool_use` runs the calls and sends their results;
//! `pause_turn` sends the conversation again so the model carries on; a reply cut off
//! (`max_tokens`) stops the run without running any of its calls.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;

use serde_json::{Value, json};

use super::cancel::{Cancel, Signal};
use super::client::{Client, ClientError};
use super::conversation::{self, Conversation};
use super::dispatch::{Dispatcher, Halt, Mode};
use super::hooks::{Approve, HookChain};
use super::reply::{Reply, StreamError};
use super::resume::OpenTurn;
use super::tools::{self, ToolContext};
use super::transcript::{Record, Writer};
use super::wire::StopReason;

/// `max_tokens` of every request.
pub(super) const MAX_TOKENS: u32 = 8192;

/// The guards checked at the top of every turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    pub max_turns: u32,
    /// Input plus output tokens over all turns; 0 means no limit.
    pub budget_tokens: u64,
}

/// How a run ended.
#[derive(Debug)]
pub(super) enum Outcome {
    Finished,
    MaxTurns(u32),
    Budget {
        used: u64,
        budget: u64,
    },
    /// The reply was cut off (max_tokens, or the context window is full).
    Truncated(StopReason),
    Upstream(ClientError),
    Cancelled(Signal),
    /// The model declined the task.
    Refused,
    /// A stop reason this client does not know how to continue from.
    UnknownStop(String),
    Transcript(std::io::Error),
}

impl Outcome {
    /// The exit code of SPEC §9 (1 for what it does not list).
    pub(super) fn exit_code(&self) -> i32 {
        match self {
            Outcome::Finished => 0,
            Outcome::MaxTurns(_) => 2,
            Outcome::Budget { .. } => 3,
            Outcome::Truncated(_) => 4,
            Outcome::Upstream(_) => 5,
            Outcome::Cancelled(signal) => signal.exit_code(),
            Outcome::Refused | Outcome::UnknownStop(_) | Outcome::Transcript(_) => 1,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Finished => write!(f, "finished"),
            Outcome::MaxTurns(n) => write!(f, "stopped: the turn limit ({n}) was reached"),
            Outcome::Budget { used, budget } => {
                write!(f, "stopped: {used} tokens used, the budget is {budget}")
            }
            Outcome::Truncated(reason) => write!(
                f,
                "stopped: the reply was cut off ({}); none of its tool calls ran",
                reason.as_str()
            ),
            Outcome::Upstream(e) => write!(f, "upstream error: {e}"),
            Outcome::Cancelled(signal) => write!(f, "cancelled ({signal})"),
            Outcome::Refused => write!(f, "stopped: the model refused the task"),
            Outcome::UnknownStop(s) => write!(f, "stopped: unknown stop reason {s:?}"),
            Outcome::Transcript(e) => write!(f, "cannot write the transcript: {e}"),
        }
    }
}

impl From<Halt> for Outcome {
    fn from(h: Halt) -> Outcome {
        match h {
            Halt::Transcript(e) => Outcome::Transcript(e),
        }
    }
}

pub(super) struct Agent {
    pub client: Client,
    pub model: String,
    pub system: String,
    pub conversation: Conversation,
    pub hooks: HookChain,
    pub tools: ToolContext,
    pub transcript: Writer,
    pub limits: Limits,
    /// Turns taken and tokens used so far by this process.
    pub turns: u32,
    pub used_tokens: u64,
}

impl Agent {
    fn cancel(&self) -> &Cancel {
        &self.tools.cancel
    }

    /// Answers the calls a resumed transcript left open and adds the results.
    pub(super) async fn close_open_turn(&mut self, open: &OpenTurn) -> Result<(), Outcome> {
        let mode = if open.truncated {
            Mode::Truncated
        } else {
            Mode::Resumed
        };
        let mut dispatcher = Dispatcher {
            hooks: &self.hooks,
            tools: &self.tools,
            transcript: &mut self.transcript,
        };
        let blocks = dispatcher
            .answer(&open.tool_uses, &open.results, &HashMap::new(), mode)
            .await?;
        self.conversation.push_user(blocks);
        Ok(())
    }

    /// Turns until the model finishes or a guard stops the run.
    pub(super) async fn run(&mut self) -> Outcome {
        loop {
            if let Some(stop) = self.guard() {
                return stop;
            }
            self.turns += 1;
            let reply = match self.turn().await {
                Ok(reply) => reply,
                Err(stop) => return stop,
            };
            self.used_tokens = self.used_tokens.saturating_add(reply.usage.total());
            let record = Record::Assistant {
                content: reply.content.clone(),
                stop_reason: reply.stop_reason.as_str().to_owned(),
                usage: reply.usage,
            };
            if let Err(e) = self.transcript.write(&record) {
                return Outcome::Transcript(e);
            }
            if let Some(stop) = self.follow(reply).await {
                return stop;
            }
        }
    }

    /// The guards, in order: a signal, turns, tokens.
    fn guard(&self) -> Option<Outcome> {
        if let Some(signal) = self.cancel().signal() {
            return Some(Outcome::Cancelled(signal));
        }
        if self.turns >= self.limits.max_turns {
            return Some(Outcome::MaxTurns(self.limits.max_turns));
        }
        let budget = self.limits.budget_tokens;
        if budget > 0 && self.used_tokens >= budget {
            return Some(Outcome::Budget {
                used: self.used_tokens,
                budget,
            });
        }
        None
    }

    /// Acts on a reply's stop reason; `None` means take another turn.
    async fn follow(&mut self, reply: Reply) -> Option<Outcome> {
        match reply.stop_reason {
            StopReason::EndTurn | StopReason::StopSequence => Some(Outcome::Finished),
            StopReason::ToolUse => {
                let uses = conversation::tool_uses(&reply.content);
                if uses.is_empty() {
                    // Nothing to answer: the model is done in all but name.
                    return Some(Outcome::Finished);
                }
                // Each result answers one id: with an id missing or given twice, the calls
                // cannot all be answered (the API refuses the next request), so none runs.
                if let Some(detail) = unanswerable(&uses) {
                    return Some(Outcome::Upstream(ClientError::Stream(
                        StreamError::Malformed {
                            event: "content_block_start".to_owned(),
                            detail,
                        },
                    )));
                }
                self.conversation.push_assistant(reply.content);
                let mut dispatcher = Dispatcher {
                    hooks: &self.hooks,
                    tools: &self.tools,
                    transcript: &mut self.transcript,
                };
                let answered = dispatcher
                    .answer(&uses, &HashMap::new(), &reply.input_errors, Mode::Live)
                    .await;
                match answered {
                    Ok(blocks) => {
                        self.conversation.push_user(blocks);
                        None
                    }
                    Err(halt) => Some(halt.into()),
                }
            }
            StopReason::PauseTurn => {
                self.conversation.push_assistant(reply.content);
                None
            }
            reason @ (StopReason::MaxTokens | StopReason::ContextWindowExceeded) => {
                Some(Outcome::Truncated(reason))
            }
            StopReason::Refusal => Some(Outcome::Refused),
            StopReason::Other(s) => Some(Outcome::UnknownStop(s)),
        }
    }

    /// One request and its streamed reply; a signal abandons the stream at once.
    async fn turn(&mut self) -> Result<Reply, Outcome> {
        let body = json!({
            "model": self.model,
            "max_tokens": MAX_TOKENS,
            "stream": true,
            "system": self.system,
            "tools": tools::schemas(),
            "messages": self.conversation.messages(),
        });
        let mut out = TextOut::default();
        let cancel = self.tools.cancel.clone();
        let result = {
            let mut on_text = |text: &str| out.print(text);
            tokio::select! {
                result = self.client.send(&body, &mut on_text) => Ok(result),
                signal = cancel.cancelled() => Err(signal),
            }
        };
        out.end_line();
        match result {
            Ok(result) => result.map_err(Outcome::Upstream),
            Err(signal) => Err(Outcome::Cancelled(signal)),
        }
    }
}

/// The model's text on stdout, flushed per delta so a watcher sees it as it comes.
struct TextOut {
    at_line_start: bool,
}

impl Default for TextOut {
    fn default() -> TextOut {
        TextOut {
            at_line_start: true,
        }
    }
}

impl TextOut {
    fn print(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(super::shown::reply_text(text).as_bytes());
        let _ = stdout.flush();
        self.at_line_start = text.ends_with('\n');
    }

    /// Ends a reply's text with a newline so the next output starts on its own line.
    fn end_line(&mut self) {
        if !self.at_line_start {
            self.print("\n");
        }
    }
}

/// What the model is told about where it works and what it may do.
/// Why the calls of a reply cannot each get their own result, if they cannot.
pub(super) fn unanswerable(uses: &[conversation::ToolUse]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    for u in uses {
        if u.id.is_empty() {
            return Some(format!(
                "a tool_use block for `{}` has no id; no call ran",
                u.name
            ));
        }
        if !seen.insert(u.id.as_str()) {
            return Some(format!(
                "two tool_use blocks share the id {:?}; no call ran",
                u.id
            ));
        }
    }
    None
}

pub(super) fn system_prompt(root: &std::path::Path, approve: Approve) -> String {
    let approval = match approve {
        Approve::Auto => "Every tool call that passes the automatic checks runs.",
        Approve::Ask => {
            "Calls that write files or run commands are put to a human, who may decline."
        }
        Approve::Readonly => {
            "This run is read-only: write_file, edit_file and run_command are refused."
        }
    };
    format!(
        "You are a coding agent working headless in the workspace directory {root}.\n\
         Use the tools to inspect and change files and to run shell commands there. Paths are \
         relative to the workspace; absolute paths must point inside it. Nothing outside the \
         workspace can be read or written, and symlinks are resolved before that check. Writes \
         that contain credentials (API keys, tokens, private keys) are refused. {approval}\n\
         A tool error comes back as a tool_result with is_error set: read it and adapt.\n\
         When the task is done, reply with a short summary and no tool calls.",
        root = root.display()
    )
}

/// The first user message of a run.
pub(super) fn task_message(task: &str) -> Vec<Value> {
    vec![conversation::text(task)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_spec() {
        let cases = [
            (Outcome::Finished, 0),
            (Outcome::MaxTurns(3), 2),
            (Outcome::Budget { used: 5, budget: 4 }, 3),
            (Outcome::Truncated(StopReason::MaxTokens), 4),
            (
                Outcome::Upstream(ClientError::Idle(std::time::Duration::ZERO)),
                5,
            ),
            (Outcome::Cancelled(Signal::Interrupt), 130),
            (Outcome::Cancelled(Signal::Terminate), 143),
            (Outcome::Cancelled(Signal::Hangup), 129),
            (Outcome::Refused, 1),
        ];
        for (outcome, code) in cases {
            assert_eq!(outcome.exit_code(), code, "{outcome}");
        }
    }

    #[test]
    fn the_system_prompt_names_the_workspace_and_the_mode() {
        let prompt = system_prompt(std::path::Path::new("/w/s"), Approve::Readonly);
        assert!(prompt.contains("/w/s"));
        assert!(prompt.contains("read-only"));
    }
}

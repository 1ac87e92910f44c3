//! Rebuilding the conversation from a transcript for `--resume`.
//!
//! The messages are replayed as they were sent. The last assistant turn may have tool calls
//! without results (the process died among them); it is handed back open, and the loop
//! answers each such call: a read-only one is run again, anything else gets an 'interrupted'
//! error result, since it may or may not have had its effect. Calls of a reply cut off at
//! max_tokens are never run.
//!
//! A transcript that ends with a reply and nothing to answer records where the run stopped:
//! its stop reason says whether there is anything to continue (a paused turn) or the run had
//! ended, and how.

use std::collections::HashMap;

use super::conversation::{self, Conversation, ToolUse};
use super::transcript::Record;
use super::wire::StopReason;

/// A recorded tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RecordedResult {
    pub content: String,
    pub is_error: bool,
}

/// The last assistant turn, whose tool calls are not all answered yet.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OpenTurn {
    pub tool_uses: Vec<ToolUse>,
    pub results: HashMap<String, RecordedResult>,
    /// The reply did not stop for tool use (it was cut off): its calls must not run.
    pub truncated: bool,
}

impl OpenTurn {
    fn is_answered(&self) -> bool {
        self.tool_uses
            .iter()
            .all(|u| self.results.contains_key(&u.id))
    }
}

/// What a transcript says.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Rebuilt {
    /// Model and workspace of the latest run recorded.
    pub model: Option<String>,
    pub workspace: Option<String>,
    /// Every message up to the open turn (included: its assistant message).
    pub conversation: Conversation,
    pub open_turn: Option<OpenTurn>,
    /// The stop reason of the last reply when nothing came after it and it left no call to
    /// answer: the point where the recorded run stopped.
    pub last_stop: Option<StopReason>,
}

pub(super) fn rebuild(records: &[Record]) -> Rebuilt {
    let mut out = Rebuilt::default();
    let mut open: Option<OpenTurn> = None;
    for record in records {
        match record {
            Record::Task {
                model, workspace, ..
            }
            | Record::Resume {
                model, workspace, ..
            } => {
                out.model = Some(model.clone());
                out.workspace = Some(workspace.clone());
            }
            Record::User { content } => {
                close(open.take(), &mut out.conversation);
                out.conversation.push_user(content.clone());
                out.last_stop = None;
            }
            Record::Assistant {
                content,
                stop_reason,
                ..
            } => {
                close(open.take(), &mut out.conversation);
                let stop = StopReason::parse(stop_reason);
                let tool_uses = conversation::tool_uses(content);
                // As the live loop followed the reply (`Agent::follow`): only a reply that
                // stopped for its calls, or was cut off among them, leaves calls to answer.
                let calls_open = match stop {
                    StopReason::ToolUse => Some(false),
                    StopReason::MaxTokens | StopReason::ContextWindowExceeded => Some(true),
                    _ => None,
                };
                match calls_open {
                    _ if tool_uses.is_empty() => out.conversation.push_assistant(content.clone()),
                    // Calls whose ids cannot all be answered: none ran, the reply was not
                    // kept, and the request that made it is sent again.
                    Some(_) if super::agent_loop::unanswerable(&tool_uses).is_some() => {
                        out.last_stop = None;
                        continue;
                    }
                    Some(truncated) => {
                        out.conversation.push_assistant(content.clone());
                        open = Some(OpenTurn {
                            tool_uses,
                            results: HashMap::new(),
                            truncated,
                        });
                    }
                    // A reply that ended (finished, refused, an unknown stop) with calls in
                    // it: they never ran and are never asked for; the text stays for a
                    // follow-up, without calls no result would answer.
                    None => out.conversation.push_assistant(
                        content
                            .iter()
                            .filter(|b| b["type"] != "tool_use")
                            .cloned()
                            .collect(),
                    ),
                }
                out.last_stop = Some(stop);
            }
            // The intent alone decides nothing: only a result shows the call was answered.
            Record::ToolUse { .. } => {}
            Record::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                if let Some(turn) = open.as_mut() {
                    let result = RecordedResult {
                        content: content.clone(),
                        is_error: *is_error,
                    };
                    turn.results.insert(tool_use_id.clone(), result);
                }
            }
        }
    }
    if open.is_some() {
        // The reply's calls have (or will get) results to send: the run goes on from there.
        out.last_stop = None;
    }
    match open {
        Some(turn) if turn.is_answered() => close(Some(turn), &mut out.conversation),
        other => out.open_turn = other,
    }
    out
}

/// Appends a finished turn's results. A call still unanswered here was followed by later
/// records, which a resumed run never writes without answering first; it is reported as
/// interrupted all the same so the conversation stays valid.
fn close(turn: Option<OpenTurn>, conversation: &mut Conversation) {
    let Some(turn) = turn else {
        return;
    };
    let blocks = turn
        .tool_uses
        .iter()
        .map(|u| match turn.results.get(&u.id) {
            Some(r) => conversation::tool_result(&u.id, &r.content, r.is_error),
            None => conversation::tool_result(&u.id, INTERRUPTED, true),
        })
        .collect();
    conversation.push_user(blocks);
}

/// The result given to a call that may have been cut short by a crash.
pub(super) const INTERRUPTED: &str =
    "interrupted: the agent stopped while this call ran; it may or may not have taken effect";

/// The result given to a call in a reply that was cut off.
pub(super) const NOT_RUN_TRUNCATED: &str =
    "not run: the reply was cut off at max_tokens, so this call may be incomplete";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::hooks::{Decision, Hook};
    use crate::agent::wire::Usage;
    use serde_json::{Value, json};

    fn task() -> Record {
        Record::Task {
            task: "t".to_owned(),
            model: "m1".to_owned(),
            workspace: "/w".to_owned(),
            started_at: 0,
        }
    }

    fn user(text: &str) -> Record {
        Record::User {
            content: vec![conversation::text(text)],
        }
    }

    fn assistant(content: Vec<Value>, stop: &str) -> Record {
        Record::Assistant {
            content,
            stop_reason: stop.to_owned(),
            usage: Usage::default(),
        }
    }

    fn call(id: &str, name: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": name, "input": {}})
    }

    fn tool_use(id: &str, name: &str) -> Record {
        Record::ToolUse {
            id: id.to_owned(),
            name: name.to_owned(),
            input: json!({}),
            decision: Decision {
                allow: true,
                hook: Hook::Approval,
                reason: "r".to_owned(),
            },
            rerun: false,
        }
    }

    fn result(id: &str, content: &str) -> Record {
        Record::ToolResult {
            tool_use_id: id.to_owned(),
            content: content.to_owned(),
            is_error: false,
        }
    }

    #[test]
    fn answered_turns_replay_as_messages() {
        let records = vec![
            task(),
            user("t"),
            assistant(vec![call("a", "read_file")], "tool_use"),
            tool_use("a", "read_file"),
            result("a", "content"),
            assistant(vec![conversation::text("done")], "end_turn"),
        ];
        let rebuilt = rebuild(&records);
        assert_eq!(rebuilt.model.as_deref(), Some("m1"));
        assert_eq!(rebuilt.open_turn, None);
        let messages = rebuilt.conversation.messages();
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[2]["content"][0]["content"], "content");
        assert!(!rebuilt.conversation.awaits_reply());
    }

    #[test]
    fn a_crash_among_tool_calls_leaves_the_turn_open() {
        let records = vec![
            task(),
            user("t"),
            assistant(
                vec![
                    call("a", "write_file"),
                    call("b", "read_file"),
                    call("c", "run_command"),
                ],
                "tool_use",
            ),
            tool_use("a", "write_file"),
            result("a", "wrote"),
            tool_use("b", "read_file"),
        ];
        let rebuilt = rebuild(&records);
        let Some(open) = rebuilt.open_turn else {
            panic!("the turn should be open");
        };
        assert!(!open.truncated);
        assert_eq!(open.tool_uses.len(), 3);
        assert_eq!(open.results.len(), 1);
        assert_eq!(rebuilt.conversation.messages().len(), 2);
    }

    #[test]
    fn the_last_stop_is_kept_only_when_nothing_is_left_to_answer() {
        let ended = |stop: &str| {
            rebuild(&[
                task(),
                user("t"),
                assistant(vec![conversation::text("x")], stop),
            ])
            .last_stop
        };
        assert_eq!(ended("pause_turn"), Some(StopReason::PauseTurn));
        assert_eq!(ended("max_tokens"), Some(StopReason::MaxTokens));
        assert_eq!(ended("refusal"), Some(StopReason::Refusal));
        let followed = rebuild(&[
            task(),
            user("t"),
            assistant(vec![conversation::text("x")], "end_turn"),
            user("more"),
        ]);
        assert_eq!(followed.last_stop, None);
        let answered = rebuild(&[
            task(),
            user("t"),
            assistant(vec![call("a", "list_dir")], "tool_use"),
            result("a", "x"),
        ]);
        assert_eq!(answered.last_stop, None);
        assert!(answered.conversation.awaits_reply());
    }

    /// A reply that ended (refused, finished) with calls in it is followed as the live loop
    /// followed it: nothing opens, the run stopped where it did, and a follow-up gets the
    /// reply's text without calls no result answers.
    #[test]
    fn calls_in_a_reply_that_ended_are_never_answered() {
        for (stop, last) in [
            ("refusal", StopReason::Refusal),
            ("end_turn", StopReason::EndTurn),
        ] {
            let rebuilt = rebuild(&[
                task(),
                user("t"),
                assistant(vec![conversation::text("so"), call("a", "list_dir")], stop),
            ]);
            assert_eq!(rebuilt.open_turn, None, "{stop}");
            assert_eq!(rebuilt.last_stop, Some(last), "{stop}");
            let messages = rebuilt.conversation.messages();
            assert_eq!(
                messages[1]["content"],
                json!([{"type": "text", "text": "so"}])
            );
        }
    }

    /// Calls that cannot all be answered (an id given twice) never ran live, and the reply
    /// was not kept: a resume sends the request again, with no result for either call.
    #[test]
    fn a_reply_with_unanswerable_calls_is_left_out() {
        for stop in ["tool_use", "max_tokens"] {
            let rebuilt = rebuild(&[
                task(),
                user("t"),
                assistant(vec![call("x", "list_dir"), call("x", "run_command")], stop),
            ]);
            assert_eq!(rebuilt.open_turn, None, "{stop}");
            assert_eq!(rebuilt.last_stop, None, "{stop}");
            assert_eq!(rebuilt.conversation.messages().len(), 1, "{stop}");
            assert!(rebuilt.conversation.awaits_reply(), "{stop}");
        }
    }

    #[test]
    fn a_cut_off_reply_is_open_and_truncated() {
        let records = vec![
            task(),
            user("t"),
            assistant(vec![call("a", "write_file")], "max_tokens"),
        ];
        let open = rebuild(&records).open_turn;
        assert!(open.is_some_and(|o| o.truncated));
    }

    #[test]
    fn a_later_resume_record_sets_the_model_and_follow_ups_merge() {
        let records = vec![
            task(),
            user("t"),
            assistant(vec![call("a", "list_dir")], "tool_use"),
            result("a", "x"),
            Record::Resume {
                model: "m2".to_owned(),
                workspace: "/w".to_owned(),
                started_at: 0,
            },
            user("more"),
        ];
        let rebuilt = rebuild(&records);
        assert_eq!(rebuilt.model.as_deref(), Some("m2"));
        let messages = rebuilt.conversation.messages();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[2]["content"][0]["type"], "tool_result");
        assert_eq!(messages[2]["content"][1]["text"], "more");
        assert!(rebuilt.conversation.awaits_reply());
    }
}

//! Anthropic stream events → OpenAI `chat.completion.chunk`s (an OpenAI caller served by an
//! Anthropic step).
//!
//! message_start becomes the role chunk; text deltas become content deltas; each tool_use
//! block becomes the next tool call index (its start carries id and name, its
//! `input_json_delta`s the argument fragments). message_delta only records the stop reason and
//! the running usage; message_stop writes the finish chunk, the usage chunk (if the caller
//! asked for it) and `[DONE]`. Thinking and server-tool blocks are dropped; a ping becomes an
//! SSE comment line. A tool call's arguments are checked at its block's stop: arguments that
//! are not a JSON object end the stream with an error chunk rather than a clean finish, unless
//! the output limit cut the call. Anthropic says so only after the block's stop (message_delta's
//! `max_tokens`), so the verdict waits for it: the call's fragments are already out, and a
//! finish `length` is what OpenAI itself sends after arguments cut short.

use super::error::openai_detail;
use super::mapping::{finish_reason, openai_id, openai_usage};
use super::stream::{DONE, write_data, write_openai};
use super::{anthropic as an, openai as oa};
use crate::sse::SseEvent;

#[derive(Debug)]
pub(super) struct ToOpenAi {
    include_usage: bool,
    created: u64,
    id: String,
    model: String,
    started: bool,
    done: bool,
    complete: bool,
    /// Anthropic block index → OpenAI tool call index.
    calls: Vec<(u64, u64)>,
    stop_reason: Option<String>,
    usage: an::Usage,
    /// The tool_use block being streamed: its block index, tool name and arguments so far
    /// (`None` once they outgrow `CHECK_LIMIT`).
    tool: Option<(u64, String, Option<String>)>,
    /// The tool call's first chunk (id, name), held until its first argument fragment or its
    /// block's end: a tool_use block's start is preamble (SPEC §7), and sent on its own it
    /// would commit the stream before the model said anything, so that a cut right after it
    /// could no longer be retried.
    head: Option<oa::ToolCallDelta>,
    /// What is wrong with a tool call whose block stopped with arguments that are not a JSON
    /// object: the stream fails with it unless the stop reason turns out to be `max_tokens`.
    unchecked: Option<String>,
}

/// Arguments beyond this cannot be checked and are refused (a bounded buffer, SPEC §14).
const CHECK_LIMIT: usize = 16 << 20;

impl ToOpenAi {
    pub(super) fn new(include_usage: bool, created: u64) -> Self {
        Self {
            include_usage,
            created,
            id: String::new(),
            model: String::new(),
            started: false,
            done: false,
            complete: false,
            calls: Vec::new(),
            stop_reason: None,
            usage: an::Usage::default(),
            tool: None,
            head: None,
            unchecked: None,
        }
    }

    pub(super) fn is_complete(&self) -> bool {
        self.complete
    }

    /// Its terminal or error was written: nothing follows.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    pub(super) fn on_event(&mut self, event: &SseEvent, out: &mut Vec<u8>) {
        if self.done || event.data.trim().is_empty() {
            return;
        }
        let Ok(parsed) = serde_json::from_str::<an::StreamEvent>(&event.data) else {
            return self.fail(
                out,
                "api_error",
                "the upstream provider sent a stream event legate cannot read",
            );
        };
        if let Some(problem) = self.unchecked.take_if(|_| continues(&parsed)) {
            // The model went on after the call: it was not the output limit that cut it.
            return self.fail(out, "api_error", &problem);
        }
        match parsed {
            an::StreamEvent::MessageStart { message } => {
                self.id = openai_id(&message.id);
                self.model = message.model;
                self.usage = message.usage;
                self.start(out);
            }
            an::StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                self.start(out);
                self.block_start(index, content_block, out);
            }
            an::StreamEvent::ContentBlockDelta { index, delta } => {
                self.start(out);
                self.block_delta(index, delta, out);
            }
            an::StreamEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason = delta.stop_reason;
                }
                if let Some(usage) = usage {
                    self.usage.overwrite_with(&usage);
                }
            }
            an::StreamEvent::MessageStop => self.complete(out),
            an::StreamEvent::Error { error } => self.fail(out, &error.kind, &error.message),
            // No chunk for a ping, but a comment line: OpenAI clients skip it, and it keeps
            // idle watchdogs fed while thinking (which is not carried) streams upstream.
            an::StreamEvent::Ping => out.extend_from_slice(b": ping\n\n"),
            an::StreamEvent::ContentBlockStop { index } => self.block_stop(index, out),
            an::StreamEvent::Other => {}
        }
    }

    /// The role chunk, once.
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let delta = oa::ChunkDelta {
            role: Some("assistant".to_owned()),
            content: Some(String::new()),
            ..oa::ChunkDelta::default()
        };
        self.write_delta(out, delta, None);
    }

    fn block_start(&mut self, index: u64, block: an::Block, out: &mut Vec<u8>) {
        match block {
            an::Block::Text { text, .. } => self.content(text, out),
            an::Block::ToolUse {
                id, name, input, ..
            } => {
                if self.calls.len() >= super::MAX_CALLS {
                    let message = "the upstream model made more tool calls than legate carries in one answer (1,024)";
                    return self.fail(out, "api_error", message);
                }
                let call = self.calls.len() as u64;
                self.calls.push((index, call));
                // Anthropic starts with `{}` and streams the input; a filled input is sent whole.
                let arguments = match &input {
                    serde_json::Value::Object(map) if map.is_empty() => String::new(),
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                };
                self.tool = Some((index, name.clone(), Some(arguments.clone())));
                let filled = !arguments.is_empty();
                let call = oa::ToolCallDelta {
                    index: call,
                    id: Some(id),
                    kind: Some(oa::function_kind()),
                    function: Some(oa::FunctionDelta {
                        name: Some(name),
                        arguments: Some(arguments),
                    }),
                };
                // An input sent whole is the model's output already; an empty one waits for
                // its first fragment.
                if filled {
                    self.write_calls(out, call);
                } else {
                    self.head = Some(call);
                }
            }
            _ => {}
        }
    }

    fn block_delta(&mut self, index: u64, delta: an::Delta, out: &mut Vec<u8>) {
        match delta {
            an::Delta::Text { text } => self.content(text, out),
            an::Delta::InputJson { partial_json } => {
                let Some(&(_, call)) = self.calls.iter().find(|(block, _)| *block == index) else {
                    return;
                };
                if partial_json.is_empty() {
                    return;
                }
                if let Some((block, _, slot)) = &mut self.tool
                    && *block == index
                {
                    match slot {
                        Some(args) if args.len() + partial_json.len() <= CHECK_LIMIT => {
                            args.push_str(&partial_json);
                        }
                        _ => *slot = None,
                    }
                }
                // The held first chunk goes out with the first fragment, as one chunk.
                let call = match self.head.take_if(|h| h.index == call) {
                    Some(mut head) => {
                        if let Some(f) = head.function.as_mut() {
                            f.arguments = Some(partial_json);
                        }
                        head
                    }
                    _ => oa::ToolCallDelta {
                        index: call,
                        id: None,
                        kind: None,
                        function: Some(oa::FunctionDelta {
                            name: None,
                            arguments: Some(partial_json),
                        }),
                    },
                };
                self.write_calls(out, call);
            }
            an::Delta::Other => {}
        }
    }

    /// A tool_use block ended: its arguments must form a JSON object. None at all is the
    /// empty input the block started with (`{}`, and no `input_json_delta`, or only empty
    /// ones): the call is given `{}`, as a whole answer's is, since OpenAI clients parse the
    /// arguments as JSON and an empty string is not.
    fn block_stop(&mut self, index: u64, out: &mut Vec<u8>) {
        self.release_head(out);
        let Some((block, name, args)) = self.tool.take() else {
            return;
        };
        if block != index {
            self.tool = Some((block, name, args));
            return;
        }
        let problem = match &args {
            None => "arguments too large to check",
            Some(a) if a.trim().is_empty() => {
                if let Some(&(_, call)) = self.calls.iter().find(|(b, _)| *b == index) {
                    self.write_calls(out, empty_arguments(call));
                }
                return;
            }
            Some(a) if !super::mapping::is_json_object(a) => "arguments that are not a JSON object",
            Some(_) => return,
        };
        let message = format!("the upstream model called tool `{name}` with {problem}");
        if args.is_some() {
            self.unchecked = Some(message);
        } else {
            self.fail(out, "api_error", &message);
        }
    }

    /// Writes a held tool call's first chunk (its block ended, or the message did, before any
    /// argument fragment).
    fn release_head(&mut self, out: &mut Vec<u8>) {
        if let Some(head) = self.head.take() {
            self.write_calls(out, head);
        }
    }

    fn content(&mut self, text: String, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let delta = oa::ChunkDelta {
            content: Some(text),
            ..oa::ChunkDelta::default()
        };
        self.write_delta(out, delta, None);
    }

    fn write_calls(&self, out: &mut Vec<u8>, call: oa::ToolCallDelta) {
        let delta = oa::ChunkDelta {
            tool_calls: Some(vec![call]),
            ..oa::ChunkDelta::default()
        };
        self.write_delta(out, delta, None);
    }

    fn write_delta(&self, out: &mut Vec<u8>, delta: oa::ChunkDelta, finish: Option<String>) {
        let choice = oa::ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        };
        write_openai(out, &self.chunk(vec![choice], None));
    }

    fn chunk(&self, choices: Vec<oa::ChunkChoice>, usage: Option<oa::Usage>) -> oa::Chunk {
        oa::Chunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            error: None,
        }
    }

    /// message_stop: the finish chunk, the usage chunk (empty choices) and `[DONE]`.
    fn complete(&mut self, out: &mut Vec<u8>) {
        // `max_tokens`, or the context window: the reasons that become `length`.
        if let Some(problem) = self.unchecked.take()
            && finish_reason(self.stop_reason.as_deref()) != "length"
        {
            return self.fail(out, "api_error", &problem);
        }
        self.start(out);
        self.release_head(out);
        let finish = finish_reason(self.stop_reason.as_deref()).to_owned();
        self.write_delta(out, oa::ChunkDelta::default(), Some(finish));
        if self.include_usage {
            write_openai(
                out,
                &self.chunk(Vec::new(), Some(openai_usage(&self.usage))),
            );
        }
        write_data(out, DONE);
        self.done = true;
        self.complete = true;
    }

    fn fail(&mut self, out: &mut Vec<u8>, kind: &str, message: &str) {
        write_openai(
            out,
            &oa::ErrorBody {
                error: openai_detail(kind, message),
            },
        );
        self.done = true;
    }
}

/// An event that carries on the message's content (a tool call left unchecked is then not one
/// the output limit cut).
fn continues(event: &an::StreamEvent) -> bool {
    matches!(
        event,
        an::StreamEvent::ContentBlockStart { .. } | an::StreamEvent::ContentBlockDelta { .. }
    )
}

/// The arguments delta that gives a call with no input `{}`.
fn empty_arguments(call: u64) -> oa::ToolCallDelta {
    oa::ToolCallDelta {
        index: call,
        id: None,
        kind: None,
        function: Some(oa::FunctionDelta {
            name: None,
            arguments: Some("{}".to_owned()),
        }),
    }
}

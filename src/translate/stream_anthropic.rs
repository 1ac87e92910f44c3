//! OpenAI `chat.completion.chunk`s → Anthropic stream events (an Anthropic caller served by an
//! OpenAI-compatible step).
//!
//! Anthropic streams one content block at a time, so the first chunk opens `message_start`,
//! text opens a text block, and the first chunk of a tool call that carries its id opens a
//! tool_use block (closing the block before it). Argument fragments become `input_json_delta`s
//! of that block. Tool calls must arrive one after another, as OpenAI and vLLM send them: a
//! fragment for a call whose block was already closed cannot be placed, and the stream ends
//! with an error event rather than a corrupted tool input. Usage comes in OpenAI's last chunk,
//! so the full usage goes into the final `message_delta` (message_start carries zeros unless the
//! first chunk already reports usage).
//!
//! Tool-call arguments are checked when their block ends: arguments that are not a JSON object
//! end the stream with an error event instead of the block's stop, never a clean end with a
//! broken (or `{}`) input, unless the output limit cut the call (finish reason `length`): its
//! fragments are passed on as they came, and the stop reason `max_tokens` says so. While
//! nothing has been committed to the caller (no content delta written yet), a tool call's
//! fragments are held and written as one delta once the check passes, so that a broken first
//! call is an error before the commit point: the attempt is retried or falls back instead of
//! failing the caller's stream.

use serde_json::json;

use super::error::{anthropic_detail, anthropic_type, parse_openai};
use super::mapping::{anthropic_id, anthropic_tool_id, anthropic_usage, stop_reason};
use super::stream::{is_done, write_anthropic};
use super::{MAX_CALLS, MAX_TOOL_ID, anthropic as an, openai as oa};
use crate::sse::SseEvent;

#[derive(Debug, Default)]
pub(super) struct ToAnthropic {
    started: bool,
    /// The upstream ended (terminal or error): later events are ignored.
    done: bool,
    complete: bool,
    next_block: u64,
    open: Option<Open>,
    calls: Vec<Call>,
    finish_reason: Option<String>,
    /// Refusal text came: a plain `stop` is then a refusal.
    refused: bool,
    usage: Option<oa::Usage>,
    /// A content delta has been written: the caller's stream is past its commit point.
    committed: bool,
    /// A chunk carried the first choice: without one the stream is no answer (the streamed
    /// form of a completion with no choices, SPEC §10).
    chose: bool,
    /// The open tool call's name and arguments so far, for the check at its end.
    tool_name: String,
    tool_args: String,
    /// The open call's arguments outgrew `CHECK_LIMIT`: they cannot be vouched for.
    tool_args_overflow: bool,
    /// The open call is being closed because another call's fragment came: if its arguments
    /// are not whole then, the calls were streamed interleaved.
    opening_another: bool,
    /// Calls that have their id but wait for their first argument fragment: only while there
    /// are any does a fragment or a text delta look for them (a walk over every call per
    /// event made a stream of many calls cost calls × events).
    waiting_with_id: usize,
    /// Bytes of arguments held by calls still waiting (bounded by `CHECK_LIMIT` in all).
    waiting_bytes: usize,
}

/// Held arguments beyond this are written out (the stream commits) rather than held longer.
const HOLD_LIMIT: usize = 256 << 10;
/// Arguments beyond this cannot be checked and are refused (a bounded buffer, SPEC §14).
const CHECK_LIMIT: usize = 16 << 20;

#[derive(Debug, Clone, Copy)]
enum Open {
    Text {
        block: u64,
    },
    /// `call`: the call's place in `calls`.
    Tool {
        block: u64,
        call: usize,
    },
}

/// One OpenAI tool call (by its `index`, and its id once one came).
#[derive(Debug)]
struct Call {
    index: u64,
    id: Option<String>,
    state: CallState,
}

#[derive(Debug)]
enum CallState {
    /// Fragments seen before the call opens: it opens once it has its id and a first
    /// argument fragment (a name may come in pieces before that: the block's start must
    /// carry all of it), or when anything else is to be written.
    Waiting {
        name: String,
        arguments: String,
    },
    Open,
    Closed,
}

impl ToAnthropic {
    pub(super) fn is_complete(&self) -> bool {
        self.complete
    }

    /// Its terminal or error was written: nothing follows.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    /// `message_start` was written.
    pub(super) fn started(&self) -> bool {
        self.started
    }

    pub(super) fn on_event(&mut self, event: &SseEvent, out: &mut Vec<u8>) {
        let is_error = event.event.as_deref() == Some("error");
        if self.done || (event.data.trim().is_empty() && !is_error) {
            return;
        }
        if is_done(event) {
            self.complete(out);
            return;
        }
        if is_error {
            return match parse_openai(event.data.as_bytes()) {
                Some(detail) => self.fail(out, anthropic_type(&detail, None), &detail.message),
                None => self.fail(
                    out,
                    "api_error",
                    "the upstream provider reported a stream error",
                ),
            };
        }
        let chunk = match serde_json::from_str::<oa::Chunk>(&event.data) {
            Ok(chunk) => chunk,
            Err(_) => {
                return self.fail(
                    out,
                    "api_error",
                    "the upstream provider sent a stream event legate cannot read",
                );
            }
        };
        if let Some(detail) = &chunk.error {
            return self.fail(out, anthropic_type(detail, None), &detail.message);
        }
        self.start(&chunk.id, &chunk.model, chunk.usage.as_ref(), out);
        if chunk.usage.is_some() {
            self.usage.clone_from(&chunk.usage);
        }
        // n > 1 is refused at request time: only the first choice exists.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            self.chose = true;
            let delta = choice.delta;
            self.refused |= delta.refusal.as_ref().is_some_and(|r| !r.is_empty());
            for text in [delta.content, delta.refusal].into_iter().flatten() {
                if !text.is_empty() && !self.open_waiting(None, out) {
                    return;
                }
                self.text(&text, out);
            }
            for call in delta.tool_calls.unwrap_or_default() {
                if self.done {
                    return;
                }
                if !self.tool(call, out) {
                    return self.fail(
                        out,
                        "api_error",
                        "the upstream provider interleaved tool call arguments, which cannot be streamed as Anthropic content blocks",
                    );
                }
            }
            if self.done {
                return;
            }
            if choice.finish_reason.is_some() {
                self.finish_reason = choice.finish_reason;
            }
        }
    }

    fn start(&mut self, id: &str, model: &str, usage: Option<&oa::Usage>, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let usage = usage.map(anthropic_usage).unwrap_or(an::Usage {
            input_tokens: Some(0),
            output_tokens: Some(0),
            ..an::Usage::default()
        });
        let message = an::MessageResponse {
            id: anthropic_id(id),
            kind: "message".to_owned(),
            role: an::Role::Assistant,
            content: Vec::new(),
            model: model.to_owned(),
            stop_reason: None,
            stop_sequence: None,
            usage,
        };
        write_anthropic(out, &an::StreamEvent::MessageStart { message });
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.done || text.is_empty() {
            return;
        }
        let block = match self.open {
            Some(Open::Text { block }) => block,
            _ => {
                if !self.close(out) {
                    return;
                }
                let block = self.open_block(
                    out,
                    an::Block::Text {
                        text: String::new(),
                        cache_control: None,
                        citations: None,
                    },
                );
                self.open = Some(Open::Text { block });
                block
            }
        };
        self.committed = true;
        let delta = an::Delta::Text {
            text: text.to_owned(),
        };
        write_anthropic(
            out,
            &an::StreamEvent::ContentBlockDelta {
                index: block,
                delta,
            },
        );
    }

    /// Applies one tool-call fragment; false when it belongs to an already closed block.
    fn tool(&mut self, mut call: oa::ToolCallDelta, out: &mut Vec<u8>) -> bool {
        // Some servers send `"id": ""` on the fragments after the first: no id, not a new one.
        call.id = call.id.filter(|id| !id.is_empty());
        if call.id.as_ref().is_some_and(|id| id.len() > MAX_TOOL_ID) {
            self.fail(
                out,
                "api_error",
                "the upstream model gave a tool call an id longer than legate carries (1 KiB)",
            );
            return true;
        }
        let function = call.function.unwrap_or_default();
        let arguments = function.arguments.unwrap_or_default();
        // The latest call at that index; a fragment with another id there starts a new call:
        // some servers (Ollama) number every call 0, or none, and send them one after another.
        let found = self.calls.iter().rposition(|c| c.index == call.index);
        let another = |c: &Call| matches!((&c.id, &call.id), (Some(had), Some(new)) if had != new);
        let position = match found {
            Some(position) if !another(&self.calls[position]) => position,
            _ if self.calls.len() >= MAX_CALLS => {
                self.fail(
                    out,
                    "api_error",
                    "the upstream model made more tool calls than legate carries in one answer (1,024)",
                );
                return true;
            }
            _ => {
                self.calls.push(Call {
                    index: call.index,
                    id: None,
                    state: CallState::Waiting {
                        name: String::new(),
                        arguments: String::new(),
                    },
                });
                self.calls.len() - 1
            }
        };
        // A call still waiting on its arguments opens before another one writes anything.
        if !self.open_waiting(Some(position), out) {
            return true;
        }
        if call.id.is_some() && self.calls[position].id.is_none() {
            self.calls[position].id.clone_from(&call.id);
            if matches!(self.calls[position].state, CallState::Waiting { .. }) {
                self.waiting_with_id += 1;
            }
        }
        let id = self.calls[position].id.clone();
        match &mut self.calls[position].state {
            CallState::Closed => return false,
            CallState::Open => {
                if let Some(Open::Tool { block, .. }) = self.open {
                    self.arguments(block, arguments, out);
                }
            }
            CallState::Waiting {
                name,
                arguments: held,
            } => {
                if let Some(part) = function.name
                    && name.len() + part.len() <= super::MAX_TOOL_NAME
                {
                    name.push_str(&part);
                }
                self.waiting_bytes += arguments.len();
                if self.waiting_bytes > CHECK_LIMIT {
                    self.fail(
                        out,
                        "api_error",
                        "the upstream model called a tool with arguments too large to check",
                    );
                    return true;
                }
                held.push_str(&arguments);
                if let (Some(id), false) = (id, held.is_empty()) {
                    let (name, held) = (std::mem::take(name), std::mem::take(held));
                    self.open_tool(position, &id, name, held, out);
                }
            }
        }
        true
    }

    /// Opens the calls that have their id but are still waiting on their arguments (all but
    /// `except`), in the order they came, before something else is written: blocks keep the
    /// order of the stream. False once the stream has failed.
    fn open_waiting(&mut self, except: Option<usize>, out: &mut Vec<u8>) -> bool {
        if self.waiting_with_id == 0 {
            return true;
        }
        for position in 0..self.calls.len() {
            if Some(position) == except {
                continue;
            }
            let Some(id) = self.calls[position].id.clone() else {
                continue;
            };
            if let CallState::Waiting { name, arguments } = &mut self.calls[position].state {
                let (name, arguments) = (std::mem::take(name), std::mem::take(arguments));
                self.open_tool(position, &id, name, arguments, out);
                if self.done {
                    return false;
                }
            }
        }
        true
    }

    fn open_tool(
        &mut self,
        position: usize,
        id: &str,
        name: String,
        arguments: String,
        out: &mut Vec<u8>,
    ) {
        if matches!(self.calls[position].state, CallState::Waiting { .. }) {
            if self.calls[position].id.is_some() {
                self.waiting_with_id = self.waiting_with_id.saturating_sub(1);
            }
            self.waiting_bytes = self.waiting_bytes.saturating_sub(arguments.len());
        }
        self.opening_another = true;
        let closed = self.close(out);
        self.opening_another = false;
        if !closed {
            return;
        }
        self.tool_name.clone_from(&name);
        self.tool_args.clear();
        let block = self.open_block(
            out,
            an::Block::ToolUse {
                id: anthropic_tool_id(id),
                name,
                input: json!({}),
                cache_control: None,
            },
        );
        self.calls[position].id = Some(id.to_owned());
        self.calls[position].state = CallState::Open;
        self.open = Some(Open::Tool {
            block,
            call: position,
        });
        self.arguments(block, arguments, out);
    }

    /// One fragment of the open call's arguments: kept for the check at the block's end, and
    /// written now once the stream has committed (held before that, up to `HOLD_LIMIT`).
    fn arguments(&mut self, block: u64, partial_json: String, out: &mut Vec<u8>) {
        if partial_json.is_empty() {
            return;
        }
        if self.tool_args_overflow || self.tool_args.len() + partial_json.len() > CHECK_LIMIT {
            // Beyond the bound nothing can vouch for the input; the copy stays bounded.
            self.tool_args_overflow = true;
            self.tool_args.clear();
            return;
        }
        self.tool_args.push_str(&partial_json);
        if !self.committed && self.tool_args.len() <= HOLD_LIMIT {
            return;
        }
        let partial_json = if self.committed {
            partial_json
        } else {
            // The hold ran over its limit: what was held goes out now, and the rest streams.
            self.tool_args.clone()
        };
        self.committed = true;
        write_input_delta(block, partial_json, out);
    }

    fn open_block(&mut self, out: &mut Vec<u8>, content_block: an::Block) -> u64 {
        let index = self.next_block;
        self.next_block += 1;
        write_anthropic(
            out,
            &an::StreamEvent::ContentBlockStart {
                index,
                content_block,
            },
        );
        index
    }

    /// Closes the open block. A tool call's arguments are checked first: if they are not a
    /// JSON object the stream fails here (and `false` is returned).
    fn close(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(open) = self.open.take() else {
            return true;
        };
        let block = match open {
            Open::Text { block } => block,
            Open::Tool { block, call } => {
                if let Some(c) = self.calls.get_mut(call) {
                    c.state = CallState::Closed;
                }
                let args = std::mem::take(&mut self.tool_args);
                let overflow = std::mem::take(&mut self.tool_args_overflow);
                // A call the output limit cut (finish `length`, only ever known at `[DONE]`)
                // ends mid-way by design: passed on as it came, under `max_tokens`, as
                // Anthropic streams such a cut itself (retrying would be cut the same way).
                let cut = self.finish_reason.as_deref() == Some("length");
                if overflow || !(cut || super::mapping::is_json_object(&args)) {
                    let message = if overflow {
                        format!(
                            "the upstream model called tool `{}` with arguments too large to check",
                            self.tool_name
                        )
                    } else if self.opening_another && cut_short(&args) {
                        // Not the model's arguments: the way they were streamed.
                        format!(
                            "the upstream streamed its tool calls interleaved (a fragment of another call came before the arguments of `{}` were whole), which legate does not translate",
                            self.tool_name
                        )
                    } else {
                        format!(
                            "the upstream model called tool `{}` with arguments that are not a JSON object",
                            self.tool_name
                        )
                    };
                    self.fail(out, "api_error", &message);
                    return false;
                }
                if !self.committed && !args.trim().is_empty() {
                    // Held until now: written whole, after the check.
                    self.committed = true;
                    write_input_delta(block, args, out);
                }
                block
            }
        };
        write_anthropic(out, &an::StreamEvent::ContentBlockStop { index: block });
        true
    }

    /// `[DONE]`: closes the open block, opens calls whose id never came (with a stand-in id),
    /// then message_delta (stop reason, full usage) and message_stop.
    fn complete(&mut self, out: &mut Vec<u8>) {
        if !self.chose {
            return self.fail(
                out,
                "api_error",
                "the upstream stream carried no choices (no answer to pass on)",
            );
        }
        self.start("", "", None, out);
        if !self.close(out) {
            return;
        }
        for position in 0..self.calls.len() {
            let index = self.calls[position].index;
            let id = self.calls[position].id.clone();
            if let CallState::Waiting { name, arguments } = &mut self.calls[position].state {
                let (name, arguments) = (std::mem::take(name), std::mem::take(arguments));
                let id = id.unwrap_or_else(|| format!("call_legate_{index}"));
                self.open_tool(position, &id, name, arguments, out);
                if self.done || !self.close(out) {
                    return;
                }
            }
        }
        let has_calls = !self.calls.is_empty();
        let usage = self
            .usage
            .as_ref()
            .map(anthropic_usage)
            .unwrap_or(an::Usage {
                output_tokens: Some(0),
                ..an::Usage::default()
            });
        let delta = an::MessageDeltaBody {
            stop_reason: Some(
                stop_reason(self.finish_reason.as_deref(), has_calls, self.refused).to_owned(),
            ),
            stop_sequence: None,
        };
        write_anthropic(
            out,
            &an::StreamEvent::MessageDelta {
                delta,
                usage: Some(usage),
            },
        );
        write_anthropic(out, &an::StreamEvent::MessageStop);
        self.done = true;
        self.complete = true;
    }

    fn fail(&mut self, out: &mut Vec<u8>, kind: &str, message: &str) {
        write_anthropic(
            out,
            &an::StreamEvent::Error {
                error: anthropic_detail(kind, message),
            },
        );
        self.done = true;
    }
}

fn write_input_delta(block: u64, partial_json: String, out: &mut Vec<u8>) {
    let delta = an::Delta::InputJson { partial_json };
    write_anthropic(
        out,
        &an::StreamEvent::ContentBlockDelta {
            index: block,
            delta,
        },
    );
}

/// Arguments that are the start of a JSON text cut short (not wrong JSON, nor none): the call
/// was closed before its last fragment came.
fn cut_short(args: &str) -> bool {
    !args.trim().is_empty()
        && serde_json::from_str::<serde::de::IgnoredAny>(args).is_err_and(|e| e.is_eof())
}

//! A Chat Completions chunk stream brought back as the Responses semantic event stream, event
//! by event: `response.created` and `response.in_progress` at the first chunk, an output item
//! per text and per tool call (added, deltas, done), and `response.completed` (or
//! `response.incomplete`) with the whole response and usage when the upstream's `[DONE]` is
//! read. An Anthropic upstream is first brought to Chat chunks by the Chat translator.
//!
//! As in the other translations, the caller's terminal is written only when the upstream's is
//! read: a cut stays a cut for the proxy to end with its own error. An upstream error chunk
//! becomes an `error` event then `response.failed`; nothing is written after it.

use serde_json::{Value, json};

use super::response::{ResponseCtx, call_item, message_item, status_for, usage_from_chat};
use crate::sse::{SseEvent, SseParser};
use crate::translate::{Dir, StreamTranslator};

/// Translates one upstream stream (Chat chunks, or Anthropic events) into Responses events.
#[derive(Debug)]
pub struct ResponsesStream {
    /// For an Anthropic upstream: Anthropic events → Chat chunks first.
    inner: Option<StreamTranslator>,
    chat: SseParser,
    state: State,
}

impl ResponsesStream {
    /// A stream from a Chat Completions upstream.
    pub fn from_chat(ctx: ResponseCtx) -> Self {
        ResponsesStream {
            inner: None,
            chat: SseParser::new(),
            state: State::new(ctx),
        }
    }

    /// A stream from an Anthropic Messages upstream.
    pub fn from_anthropic(ctx: ResponseCtx) -> Self {
        ResponsesStream {
            inner: Some(StreamTranslator::new(Dir::OpenAiToAnthropic, true)),
            ..Self::from_chat(ctx)
        }
    }

    /// Feeds upstream bytes; returns the caller's bytes for every event they completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        match &mut self.inner {
            Some(inner) => {
                let chat = inner.push(chunk);
                self.chat.push(&chat);
            }
            None => self.chat.push(chunk),
        }
        self.drain()
    }

    /// The upstream ended: flushes what the parsers held back. Writes no terminal unless the
    /// upstream's terminal was read.
    pub fn finish(&mut self) -> Vec<u8> {
        if let Some(inner) = &mut self.inner {
            let chat = inner.finish();
            self.chat.push(&chat);
        }
        self.chat.finish();
        self.drain()
    }

    /// Upstream bytes not yet part of a complete event.
    pub fn pending_bytes(&self) -> usize {
        self.chat.pending_bytes()
            + self
                .inner
                .as_ref()
                .map_or(0, StreamTranslator::pending_bytes)
    }

    /// The terminal event was written (completed, incomplete or failed).
    pub fn is_complete(&self) -> bool {
        self.state.ended
    }

    /// The response object as it stands: the whole one once the stream completed (for the
    /// conversation store).
    pub fn final_response(&self) -> Option<&Value> {
        self.state.final_response.as_ref()
    }

    fn drain(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(event) = self.chat.next_event() {
            self.state.on_chunk(&event, &mut out);
        }
        out
    }
}

/// The item being streamed.
#[derive(Debug)]
enum Open {
    None,
    Text {
        id: String,
        text: String,
        refusal: bool,
    },
    Call {
        chat_index: u64,
        /// The upstream's id of the call (None: a stand-in was made for it).
        upstream_id: Option<String>,
        call_id: String,
        name: String,
        args: String,
        /// `response.output_item.added` was written. It waits for the first argument
        /// fragment (or the item's end): some servers send a name in pieces, and the item
        /// announced must carry all of it.
        announced: bool,
    },
}

#[derive(Debug)]
struct State {
    ctx: ResponseCtx,
    model: String,
    seq: u64,
    started: bool,
    /// A chat chunk carried the first choice (a chat stream without one is no answer).
    chose: bool,
    ended: bool,
    open: Open,
    done_items: Vec<Value>,
    finish_reason: Option<String>,
    usage: Value,
    final_response: Option<Value>,
    /// Bytes of text and arguments kept for the done events and the final response.
    kept: usize,
    /// Tool calls begun (bounded at `translate::MAX_CALLS`).
    calls: usize,
}

/// Text and arguments one translated answer keeps at most (SPEC §14: a bounded buffer), as
/// much as a whole answer legate holds: beyond it the stream fails instead of growing.
const MAX_KEPT: usize = 16 << 20;

impl State {
    fn new(ctx: ResponseCtx) -> Self {
        State {
            ctx,
            model: String::new(),
            seq: 0,
            started: false,
            chose: false,
            ended: false,
            open: Open::None,
            done_items: Vec::new(),
            finish_reason: None,
            usage: Value::Null,
            final_response: None,
            kept: 0,
            calls: 0,
        }
    }

    /// Counts `n` more bytes kept; false (and the stream failed) past `MAX_KEPT`.
    fn keep(&mut self, out: &mut Vec<u8>, n: usize) -> bool {
        self.kept += n;
        if self.kept <= MAX_KEPT {
            return true;
        }
        let error = json!({"type": "server_error", "code": "server_error",
            "message": "the upstream answer is too large to translate (over 16 MiB of text and tool arguments)"});
        self.fail(out, &error);
        false
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
    }

    fn on_chunk(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if ev.data.starts_with("[DONE]") {
            // No chunk carried a choice: the streamed form of a completion with no choices,
            // no answer (SPEC §10), not an empty completed response.
            if !self.chose {
                let why = "the upstream stream carried no choices (no answer to pass on)";
                return self.fail(out, &json!({"code": "server_error", "message": why}));
            }
            self.start(out);
            return self.complete(out);
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&ev.data) else {
            return;
        };
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return self.fail(out, error);
        }
        if let Some(model) = chunk["model"].as_str().filter(|m| !m.is_empty()) {
            model.clone_into(&mut self.model);
        }
        self.start(out);
        if chunk.get("usage").is_some_and(Value::is_object) {
            self.usage = usage_from_chat(chunk.get("usage"));
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        self.chose = true;
        let delta = &choice["delta"];
        for (key, refusal) in [("content", false), ("refusal", true)] {
            if let Some(text) = delta[key].as_str().filter(|t| !t.is_empty()) {
                self.text_delta(out, text, refusal);
            }
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            // A call that failed the stream ends it: nothing is written after its
            // `response.failed`.
            if self.ended {
                return;
            }
            self.call_delta(out, call);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let obj = self
            .ctx
            .object(&self.model, "in_progress", Vec::new(), Value::Null);
        self.emit(out, "response.created", json!({"response": obj}));
        self.emit(out, "response.in_progress", json!({"response": obj}));
    }

    fn index(&self) -> usize {
        self.done_items.len()
    }

    fn text_delta(&mut self, out: &mut Vec<u8>, piece: &str, refusal: bool) {
        if !self.keep(out, piece.len()) {
            return;
        }
        if !matches!(&self.open, Open::Text { refusal: r, .. } if *r == refusal) {
            if self.close(out).is_err() {
                return;
            }
            let id = format!(
                "msg_{}_{}",
                self.ctx.id.trim_start_matches("resp_"),
                self.index()
            );
            let item = json!({"id": id, "type": "message", "status": "in_progress",
                              "role": "assistant", "content": []});
            let at = self.index();
            self.emit(
                out,
                "response.output_item.added",
                json!({"output_index": at, "item": item}),
            );
            let part = if refusal {
                json!({"type": "refusal", "refusal": ""})
            } else {
                json!({"type": "output_text", "text": "", "annotations": []})
            };
            self.emit(
                out,
                "response.content_part.added",
                json!({
                    "item_id": id, "output_index": at, "content_index": 0, "part": part,
                }),
            );
            self.open = Open::Text {
                id,
                text: String::new(),
                refusal,
            };
        }
        let at = self.index();
        if let Open::Text { id, text, .. } = &mut self.open {
            text.push_str(piece);
            let data = json!({"item_id": id.clone(), "output_index": at, "content_index": 0,
                              "delta": piece, "logprobs": []});
            let kind = if refusal {
                "response.refusal.delta"
            } else {
                "response.output_text.delta"
            };
            self.emit(out, kind, data);
        }
    }

    fn call_delta(&mut self, out: &mut Vec<u8>, call: &Value) {
        let chat_index = call["index"].as_u64().unwrap_or(0);
        // A fragment with another id at the open call's index starts a new call: some servers
        // (Ollama) number every call 0, or none, and send them one after another.
        // `"id": ""` on a later fragment (some servers send it) is no id, not a new one.
        let id = call["id"].as_str().filter(|id| !id.is_empty());
        let same = matches!(&self.open, Open::Call { chat_index: i, upstream_id, .. }
            if *i == chat_index && (id.is_none() || upstream_id.is_none() || id == upstream_id.as_deref()));
        if !same {
            if self.close(out).is_err() {
                return;
            }
            // Every call's item, id included, is kept for the final response: a bounded list
            // of bounded ids.
            let why = if self.calls >= crate::translate::MAX_CALLS {
                Some(
                    "the upstream model made more tool calls than legate carries in one answer (1,024)",
                )
            } else if id.is_some_and(|id| id.len() > crate::translate::MAX_TOOL_ID) {
                Some("the upstream model gave a tool call an id longer than legate carries (1 KiB)")
            } else {
                None
            };
            if let Some(message) = why {
                let error =
                    json!({"type": "server_error", "code": "server_error", "message": message});
                return self.fail(out, &error);
            }
            self.calls += 1;
            let call_id = id.map_or_else(|| format!("call_legate_{chat_index}"), str::to_owned);
            self.open = Open::Call {
                chat_index,
                upstream_id: id.map(str::to_owned),
                call_id,
                name: String::new(),
                args: String::new(),
                announced: false,
            };
        }
        let name_piece = call.pointer("/function/name").and_then(Value::as_str);
        if let (Open::Call { name, .. }, Some(part)) = (&mut self.open, name_piece)
            && name.len() + part.len() <= crate::translate::MAX_TOOL_NAME
        {
            name.push_str(part);
        }
        let at = self.index();
        let piece = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("");
        if piece.is_empty() || !self.keep(out, piece.len()) {
            return;
        }
        self.announce(out);
        if let Open::Call { call_id, args, .. } = &mut self.open {
            args.push_str(piece);
            let data =
                json!({"item_id": format!("fc_{call_id}"), "output_index": at, "delta": piece});
            self.emit(out, "response.function_call_arguments.delta", data);
        }
    }

    /// Writes the open call's `response.output_item.added`, once.
    fn announce(&mut self, out: &mut Vec<u8>) {
        let at = self.index();
        let Open::Call {
            call_id,
            name,
            announced: announced @ false,
            ..
        } = &mut self.open
        else {
            return;
        };
        *announced = true;
        let item = json!({"id": format!("fc_{call_id}"), "type": "function_call",
                          "status": "in_progress", "call_id": call_id, "name": name,
                          "arguments": ""});
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": at, "item": item}),
        );
    }

    /// Ends the open item with its done events. A tool call whose arguments are not a JSON
    /// object fails the stream (SPEC §10): never a clean end with broken input. One the output
    /// limit cut (known at `[DONE]`, when this runs for the last item) is an `incomplete` item.
    fn close(&mut self, out: &mut Vec<u8>) -> Result<(), ()> {
        self.announce(out);
        let at = self.index();
        let item = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return Ok(()),
            Open::Text { id, text, refusal } => {
                // Closed at the end (not for a tool call after it): the last item, cut if the
                // answer was.
                let cut = self.cut_by_limit();
                let item = message_item(&id, &text, refusal, cut);
                let (kind, field) = if refusal {
                    ("response.refusal.done", "refusal")
                } else {
                    ("response.output_text.done", "text")
                };
                let mut data = json!({"item_id": id, "output_index": at, "content_index": 0});
                data[field] = json!(text);
                self.emit(out, kind, data);
                self.emit(
                    out,
                    "response.content_part.done",
                    json!({
                        "item_id": id, "output_index": at, "content_index": 0,
                        "part": item["content"][0],
                    }),
                );
                item
            }
            Open::Call {
                call_id,
                name,
                args,
                ..
            } => match call_item(&call_id, &name, &args, self.cut_by_limit()) {
                Ok(item) => {
                    self.emit(out, "response.function_call_arguments.done", json!({
                        "item_id": item["id"], "output_index": at, "name": name, "arguments": args,
                    }));
                    item
                }
                Err(e) => {
                    let error = json!({"type": "server_error", "code": "server_error",
                                       "message": e.0});
                    self.fail(out, &error);
                    return Err(());
                }
            },
        };
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        );
        self.done_items.push(item);
        Ok(())
    }

    /// The upstream finished with `length`: the output limit ended the answer.
    fn cut_by_limit(&self) -> bool {
        self.finish_reason.as_deref() == Some("length")
    }

    fn complete(&mut self, out: &mut Vec<u8>) {
        if self.close(out).is_err() {
            return;
        }
        let (status, incomplete) = status_for(self.finish_reason.as_deref());
        let mut obj = self.ctx.object(
            &self.model,
            status,
            self.done_items.clone(),
            self.usage.clone(),
        );
        obj["incomplete_details"] = incomplete;
        self.emit(out, &format!("response.{status}"), json!({"response": obj}));
        self.final_response = Some(obj);
        self.ended = true;
    }

    /// An `error` event with the upstream's code and message, then `response.failed`.
    fn fail(&mut self, out: &mut Vec<u8>, error: &Value) {
        self.start(out);
        let code = error
            .get("code")
            .filter(|c| !c.is_null())
            .or_else(|| error.get("type"))
            .cloned()
            .unwrap_or(json!("server_error"));
        let message = error
            .get("message")
            .cloned()
            .unwrap_or(json!("upstream error"));
        self.emit(
            out,
            "error",
            json!({"code": code, "message": message, "param": null}),
        );
        let mut obj = self.ctx.object(
            &self.model,
            "failed",
            self.done_items.clone(),
            self.usage.clone(),
        );
        obj["error"] = json!({"code": code, "message": message});
        self.emit(out, "response.failed", json!({"response": obj}));
        self.ended = true;
    }
}

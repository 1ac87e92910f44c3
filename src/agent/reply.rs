//! Building one assistant reply from the Messages stream's events. Pure: events in, text
//! deltas and finally the whole reply out.
//!
//! Blocks are kept as the JSON the API sent, with the deltas applied, so anything that must go
//! back unchanged (thinking with its signature, redacted thinking, server tool blocks) does.
//! Events are told apart by their `event:` name, as the SDKs do, with the data's `type` as a
//! fallback; unknown events and pings are ignored.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::{Map, Value};

use super::wire::{StopReason, Usage};
use crate::sse::SseEvent;

/// Why a stream could not be turned into a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StreamError {
    /// An `event: error` from legate or the provider.
    Api { error_type: String, message: String },
    /// An event whose data is not what the API documents.
    Malformed { event: String, detail: String },
    /// The stream ended before `message_stop`.
    Incomplete,
    /// An event, or a line without its end, grew past this many bytes.
    TooLarge { limit: usize },
    /// The whole reply passed this many bytes.
    ReplyTooLarge { limit: usize },
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Api {
                error_type,
                message,
            } => write!(f, "error event in the stream: {error_type}: {message}"),
            StreamError::Malformed { event, detail } => {
                write!(f, "malformed `{event}` event: {detail}")
            }
            StreamError::Incomplete => write!(f, "the stream ended before message_stop"),
            StreamError::TooLarge { limit } => write!(
                f,
                "an event in the stream passed {limit} bytes without ending; the stream was \
                 abandoned"
            ),
            StreamError::ReplyTooLarge { limit } => write!(
                f,
                "the reply passed {limit} bytes, far more than its max_tokens allows; the stream \
                 was abandoned"
            ),
        }
    }
}

impl std::error::Error for StreamError {}

/// One finished reply.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reply {
    /// The content blocks as they go back into the conversation. Empty text blocks are
    /// dropped (the API refuses them in a request).
    pub content: Vec<Value>,
    pub stop_reason: StopReason,
    pub usage: Usage,
    /// Tool calls whose streamed input did not parse, by tool_use id. Their `input` in
    /// `content` is `{}`; the loop answers them with an error instead of running them.
    pub input_errors: HashMap<String, String>,
}

/// A block being streamed.
struct Building {
    block: Map<String, Value>,
    /// `input_json_delta` pieces, concatenated.
    partial_json: Option<String>,
}

/// Accumulates the events of one reply.
#[derive(Default)]
pub(super) struct ReplyBuilder {
    blocks: BTreeMap<u64, Building>,
    stop_reason: Option<String>,
    usage: Usage,
    input_errors: HashMap<String, String>,
    done: bool,
}

impl ReplyBuilder {
    pub(super) fn new() -> ReplyBuilder {
        ReplyBuilder::default()
    }

    /// True once `message_stop` arrived.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    /// Applies one event; returns the text to print now, if it was a text delta.
    pub(super) fn push(&mut self, event: &SseEvent) -> Result<Option<String>, StreamError> {
        let data: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            // A data-less named event (or a comment-only block) carries nothing to apply.
            Err(_) if event.data.trim().is_empty() => return Ok(None),
            Err(e) => {
                return Err(malformed(
                    event.event.as_deref().unwrap_or(""),
                    e.to_string(),
                ));
            }
        };
        let name = match event.event.as_deref() {
            Some(name) => name,
            None => data.get("type").and_then(Value::as_str).unwrap_or(""),
        };
        match name {
            "message_start" => {
                if let Some(usage) = data.pointer("/message/usage") {
                    self.usage.update(usage);
                }
            }
            "content_block_start" => self.start_block(&data)?,
            "content_block_delta" => return self.apply_delta(&data),
            "content_block_stop" => self.stop_block(&data)?,
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = data.get("usage") {
                    self.usage.update(usage);
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                let field = |f: &str| {
                    data.pointer(&format!("/error/{f}"))
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_owned()
                };
                return Err(StreamError::Api {
                    error_type: field("type"),
                    message: field("message"),
                });
            }
            _ => {}
        }
        Ok(None)
    }

    fn start_block(&mut self, data: &Value) -> Result<(), StreamError> {
        let index = index_of("content_block_start", data)?;
        let Some(Value::Object(block)) = data.get("content_block") else {
            return Err(malformed("content_block_start", "no content_block object"));
        };
        let takes_json = matches!(
            block.get("type").and_then(Value::as_str),
            Some("tool_use" | "server_tool_use")
        );
        let building = Building {
            block: block.clone(),
            partial_json: takes_json.then(String::new),
        };
        self.blocks.insert(index, building);
        Ok(())
    }

    fn apply_delta(&mut self, data: &Value) -> Result<Option<String>, StreamError> {
        let index = index_of("content_block_delta", data)?;
        let Some(building) = self.blocks.get_mut(&index) else {
            return Err(malformed(
                "content_block_delta",
                format!("delta for block {index}, which was not started"),
            ));
        };
        let delta = data.get("delta").unwrap_or(&Value::Null);
        let text = |f: &str| delta.get(f).and_then(Value::as_str).unwrap_or("");
        match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => {
                append(&mut building.block, "text", text("text"));
                return Ok(Some(text("text").to_owned()));
            }
            Some("input_json_delta") => {
                if let Some(partial) = building.partial_json.as_mut() {
                    partial.push_str(text("partial_json"));
                }
            }
            Some("thinking_delta") => append(&mut building.block, "thinking", text("thinking")),
            Some("signature_delta") => {
                building
                    .block
                    .insert("signature".to_owned(), Value::from(text("signature")));
            }
            Some("citations_delta") => {
                let citation = delta.get("citation").cloned().unwrap_or(Value::Null);
                let list = building
                    .block
                    .entry("citations")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(items) = list {
                    items.push(citation);
                }
            }
            _ => {}
        }
        Ok(None)
    }

    fn stop_block(&mut self, data: &Value) -> Result<(), StreamError> {
        let index = index_of("content_block_stop", data)?;
        let Some(building) = self.blocks.get_mut(&index) else {
            return Err(malformed(
                "content_block_stop",
                format!("stop for block {index}, which was not started"),
            ));
        };
        if let Some(partial) = building.partial_json.take() {
            // No `input_json_delta` at all: the input is the one the start gave (Anthropic
            // streams `{}` there, then deltas; an upstream that sends the input whole in the
            // start is read as the SDKs read it).
            if partial.trim().is_empty()
                && building.block.get("input").is_some_and(Value::is_object)
            {
                return Ok(());
            }
            let input = match parse_input(&partial) {
                Ok(input) => input,
                Err(detail) => {
                    let id = building.block.get("id").and_then(Value::as_str);
                    self.input_errors
                        .insert(id.unwrap_or("").to_owned(), detail);
                    Value::Object(Map::new())
                }
            };
            building.block.insert("input".to_owned(), input);
        }
        Ok(())
    }

    /// The reply, once the stream is over.
    pub(super) fn finish(mut self) -> Result<Reply, StreamError> {
        if !self.done {
            return Err(StreamError::Incomplete);
        }
        // A block still taking input at message_stop is closed as if its stop had come.
        let open: Vec<u64> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.partial_json.is_some())
            .map(|(i, _)| *i)
            .collect();
        for index in open {
            self.stop_block(&serde_json::json!({"index": index}))?;
        }
        let content = self
            .blocks
            .into_values()
            .map(|b| Value::Object(b.block))
            .filter(|b| !is_empty_text(b))
            .collect();
        let stop_reason = match self.stop_reason {
            Some(reason) => StopReason::parse(&reason),
            None => return Err(malformed("message_delta", "no stop_reason in the stream")),
        };
        Ok(Reply {
            content,
            stop_reason,
            usage: self.usage,
            input_errors: self.input_errors,
        })
    }
}

fn malformed(event: &str, detail: impl Into<String>) -> StreamError {
    StreamError::Malformed {
        event: event.to_owned(),
        detail: detail.into(),
    }
}

fn index_of(event: &str, data: &Value) -> Result<u64, StreamError> {
    data.get("index")
        .and_then(Value::as_u64)
        .ok_or_else(|| malformed(event, "no index"))
}

fn append(block: &mut Map<String, Value>, field: &str, piece: &str) {
    let entry = block
        .entry(field)
        .or_insert_with(|| Value::String(String::new()));
    if let Value::String(s) = entry {
        s.push_str(piece);
    }
}

/// A tool's input: the concatenated JSON, which must be an object; nothing at all means `{}`.
fn parse_input(partial: &str) -> Result<Value, String> {
    if partial.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(partial) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("the tool input is not a JSON object".to_owned()),
        Err(e) => Err(format!("the tool input is not valid JSON: {e}")),
    }
}

fn is_empty_text(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("text")
        && block
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(name: &str, data: Value) -> SseEvent {
        SseEvent {
            event: Some(name.to_owned()),
            data: data.to_string(),
            end_offset: 0,
        }
    }

    fn run(events: &[SseEvent]) -> (String, Result<Reply, StreamError>) {
        let mut builder = ReplyBuilder::new();
        let mut printed = String::new();
        for event in events {
            match builder.push(event) {
                Ok(Some(text)) => printed.push_str(&text),
                Ok(None) => {}
                Err(e) => return (printed, Err(e)),
            }
        }
        (printed, builder.finish())
    }

    fn start(usage: Value) -> SseEvent {
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"content": [], "usage": usage}}),
        )
    }

    fn block_start(index: u64, block: Value) -> SseEvent {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    }

    fn delta(index: u64, delta: Value) -> SseEvent {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    fn block_stop(index: u64) -> SseEvent {
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    }

    fn end(reason: &str, usage: Value) -> [SseEvent; 2] {
        [
            ev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage}),
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ]
    }

    #[test]
    fn text_thinking_and_tool_use_blocks_are_assembled() {
        let mut events = vec![
            start(json!({"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 4})),
            ev("ping", json!({"type": "ping"})),
            block_start(
                0,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
            ),
            delta(0, json!({"type": "thinking_delta", "thinking": "hmm"})),
            delta(0, json!({"type": "signature_delta", "signature": "sig=="})),
            block_stop(0),
            block_start(1, json!({"type": "text", "text": ""})),
            delta(1, json!({"type": "text_delta", "text": "Hel"})),
            delta(1, json!({"type": "text_delta", "text": "lo"})),
            block_stop(1),
            block_start(
                2,
                json!({"type": "tool_use", "id": "t1", "name": "read_file", "input": {}}),
            ),
            delta(2, json!({"type": "input_json_delta", "partial_json": ""})),
            delta(
                2,
                json!({"type": "input_json_delta", "partial_json": "{\"pa"}),
            ),
            delta(
                2,
                json!({"type": "input_json_delta", "partial_json": "th\":\"a\"}"}),
            ),
            block_stop(2),
            ev("some_future_event", json!({"x": 1})),
        ];
        events.extend(end("tool_use", json!({"output_tokens": 15})));
        let (printed, reply) = run(&events);
        let reply = reply.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(printed, "Hello");
        assert_eq!(
            reply.content,
            vec![
                json!({"type": "thinking", "thinking": "hmm", "signature": "sig=="}),
                json!({"type": "text", "text": "Hello"}),
                json!({"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}),
            ]
        );
        assert_eq!(reply.stop_reason, StopReason::ToolUse);
        assert_eq!(reply.usage.total(), 25 + 4 + 15);
        assert!(reply.input_errors.is_empty());
    }

    /// An input given whole in the block's start, with no delta, is the call's input (as the
    /// SDKs read it); a start's `{}` followed by deltas is replaced by them.
    #[test]
    fn an_input_given_in_the_start_is_kept() {
        let mut events = vec![
            start(json!({"input_tokens": 1, "output_tokens": 1})),
            block_start(
                0,
                json!({"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}),
            ),
            block_stop(0),
            block_start(
                1,
                json!({"type": "tool_use", "id": "t2", "name": "list_dir", "input": {}}),
            ),
            block_stop(1),
        ];
        events.extend(end("tool_use", json!({"output_tokens": 8})));
        let (_, reply) = run(&events);
        let reply = reply.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reply.content[0]["input"], json!({"path": "a"}));
        assert_eq!(reply.content[1]["input"], json!({}));
        assert!(reply.input_errors.is_empty());
    }

    #[test]
    fn bad_tool_input_becomes_an_empty_object_and_an_error() {
        let mut events = vec![
            start(json!({"input_tokens": 1, "output_tokens": 1})),
            block_start(
                0,
                json!({"type": "tool_use", "id": "t9", "name": "write_file", "input": {}}),
            ),
            delta(
                0,
                json!({"type": "input_json_delta", "partial_json": "{\"path\": \"a"}),
            ),
        ];
        events.extend(end("max_tokens", json!({"output_tokens": 8192})));
        let (_, reply) = run(&events);
        let reply = reply.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reply.stop_reason, StopReason::MaxTokens);
        assert_eq!(reply.content[0]["input"], json!({}));
        assert!(reply.input_errors.contains_key("t9"));
    }

    #[test]
    fn empty_text_blocks_are_dropped() {
        let mut events = vec![
            start(json!({"input_tokens": 1, "output_tokens": 1})),
            block_start(0, json!({"type": "text", "text": ""})),
            block_stop(0),
        ];
        events.extend(end("pause_turn", json!({"output_tokens": 1})));
        let (_, reply) = run(&events);
        let reply = reply.unwrap_or_else(|e| panic!("{e}"));
        assert!(reply.content.is_empty());
        assert_eq!(reply.stop_reason, StopReason::PauseTurn);
    }

    #[test]
    fn an_error_event_a_cut_and_garbage_are_errors() {
        let (_, error) = run(&[
            start(json!({})),
            ev(
                "error",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]);
        assert_eq!(
            error.err(),
            Some(StreamError::Api {
                error_type: "overloaded_error".to_owned(),
                message: "Overloaded".to_owned()
            })
        );
        let (_, cut) = run(&[start(json!({})), block_start(0, json!({"type": "text"}))]);
        assert_eq!(cut.err(), Some(StreamError::Incomplete));
        let garbage = SseEvent {
            event: Some("message_delta".to_owned()),
            data: "{not json".to_owned(),
            end_offset: 0,
        };
        let (_, bad) = run(&[garbage]);
        assert!(matches!(bad, Err(StreamError::Malformed { .. })));
        let (_, orphan) = run(&[delta(3, json!({"type": "text_delta", "text": "x"}))]);
        assert!(matches!(orphan, Err(StreamError::Malformed { .. })));
    }

    #[test]
    fn events_without_a_name_fall_back_to_the_data_type() {
        let unnamed = |data: Value| SseEvent {
            event: None,
            data: data.to_string(),
            end_offset: 0,
        };
        let (_, reply) = run(&[
            unnamed(json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}})),
            unnamed(json!({"type": "message_stop"})),
        ]);
        assert_eq!(reply.map(|r| r.stop_reason).ok(), Some(StopReason::EndTurn));
    }
}

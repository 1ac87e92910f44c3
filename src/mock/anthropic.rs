//! Bodies in the Anthropic Messages API's shapes: a Message, its SSE event sequence, errors,
//! the models list and token counts.

use bytes::Bytes;
use serde_json::{Value, json};

use super::render::{Render, json_bytes, split_pieces, sse};
use super::script::{Block, Usage};

fn usage_json(usage: &Usage, output_tokens: u64) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": output_tokens,
    })
}

fn tool_id(r: &Render<'_>, index: usize, id: Option<&String>) -> String {
    id.cloned()
        .unwrap_or_else(|| format!("toolu_mock_{}_{index}", r.id))
}

fn block_json(r: &Render<'_>, index: usize, block: &Block) -> Value {
    match block {
        Block::Text { text } => json!({"type": "text", "text": text}),
        Block::ToolUse { id, name, input } => json!({
            "type": "tool_use", "id": tool_id(r, index, id.as_ref()), "name": name, "input": input,
        }),
        Block::Thinking {
            thinking,
            signature,
        } => json!({"type": "thinking", "thinking": thinking, "signature": signature}),
    }
}

fn message_value(r: &Render<'_>, content: Vec<Value>, stop_reason: Value, output: u64) -> Value {
    json!({
        "id": format!("msg_mock_{}", r.id),
        "type": "message",
        "role": "assistant",
        "model": r.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": usage_json(&r.reply.usage, output),
    })
}

/// The non-streaming `Message`.
pub(crate) fn message(r: &Render<'_>) -> Bytes {
    let content = r
        .reply
        .content
        .iter()
        .enumerate()
        .map(|(i, b)| block_json(r, i, b))
        .collect();
    let stop = Value::from(r.reply.stop_reason());
    json_bytes(&message_value(
        r,
        content,
        stop,
        r.reply.usage.output_tokens,
    ))
}

/// The start event's block and its deltas.
fn block_stream(r: &Render<'_>, index: usize, block: &Block) -> (Value, Vec<Value>) {
    match block {
        Block::Text { text } => (
            json!({"type": "text", "text": ""}),
            split_pieces(text)
                .into_iter()
                .map(|p| json!({"type": "text_delta", "text": p}))
                .collect(),
        ),
        Block::ToolUse { id, name, input } => {
            let args = input.to_string();
            // Real streams often open a tool's input with an empty fragment.
            let deltas = std::iter::once("")
                .chain(split_pieces(&args))
                .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                .collect();
            let start = json!({
                "type": "tool_use", "id": tool_id(r, index, id.as_ref()), "name": name, "input": {},
            });
            (start, deltas)
        }
        Block::Thinking {
            thinking,
            signature,
        } => {
            let mut deltas: Vec<Value> = split_pieces(thinking)
                .into_iter()
                .map(|p| json!({"type": "thinking_delta", "thinking": p}))
                .collect();
            deltas.push(json!({"type": "signature_delta", "signature": signature}));
            (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                deltas,
            )
        }
    }
}

/// The streaming event sequence: message_start, ping, each block, message_delta, message_stop.
pub(crate) fn events(r: &Render<'_>) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(4 + r.reply.content.len() * 5);
    let start = message_value(r, Vec::new(), Value::Null, 1);
    out.push(sse(
        Some("message_start"),
        &json!({"type": "message_start", "message": start}),
    ));
    out.push(sse(Some("ping"), &json!({"type": "ping"})));
    for (index, block) in r.reply.content.iter().enumerate() {
        let (start, deltas) = block_stream(r, index, block);
        out.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            out.push(sse(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        out.push(sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    out.push(sse(
        Some("message_delta"),
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": r.reply.stop_reason(), "stop_sequence": null},
            "usage": {"output_tokens": r.reply.usage.output_tokens},
        }),
    ));
    out.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
    out
}

/// An error response body; `request_id` matches the `request-id` header as the real API does.
pub(crate) fn error(error_type: &str, message: &str, request_id: &str) -> Bytes {
    json_bytes(&json!({
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }))
}

/// A mid-stream `event: error`.
pub(crate) fn error_event(error_type: &str, message: &str) -> Bytes {
    sse(
        Some("error"),
        &json!({"type": "error", "error": {"type": error_type, "message": message}}),
    )
}

/// The `GET /v1/models` list.
pub(crate) fn models(names: &[String]) -> Bytes {
    let data: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "type": "model", "id": name, "display_name": name,
                "created_at": "2025-01-01T00:00:00Z",
            })
        })
        .collect();
    json_bytes(&json!({
        "data": data,
        "has_more": false,
        "first_id": names.first(),
        "last_id": names.last(),
    }))
}

/// The `POST /v1/messages/count_tokens` answer.
pub(crate) fn count_tokens(input_tokens: u64) -> Bytes {
    json_bytes(&json!({"input_tokens": input_tokens}))
}

//! Bodies in the OpenAI Chat Completions shapes: a `chat.completion`, its chunk stream and
//! errors. Usage is derived from the script's Anthropic-named counts.

use bytes::Bytes;
use serde_json::{Value, json};

use super::render::{Render, json_bytes, split_pieces, sse, unix_now};
use super::script::{Block, Usage};

/// Maps an Anthropic stop reason to OpenAI's `finish_reason`.
pub(crate) fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// OpenAI counts cached and cache-written tokens inside `prompt_tokens`.
fn usage_json(usage: &Usage) -> Value {
    let prompt =
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
    })
}

fn call_id(r: &Render<'_>, index: usize, id: Option<&String>) -> String {
    id.cloned()
        .unwrap_or_else(|| format!("call_mock_{}_{index}", r.id))
}

/// The concatenated text and the tool calls of a reply (thinking has no OpenAI equivalent).
fn text_and_tools(r: &Render<'_>) -> (Option<String>, Vec<Value>) {
    let mut text: Option<String> = None;
    let mut tools = Vec::new();
    for (index, block) in r.reply.content.iter().enumerate() {
        match block {
            Block::Text { text: t } => text.get_or_insert_with(String::new).push_str(t),
            Block::ToolUse { id, name, input } => tools.push(json!({
                "id": call_id(r, index, id.as_ref()),
                "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
            Block::Thinking { .. } => {}
        }
    }
    (text, tools)
}

/// The non-streaming `chat.completion`.
pub(crate) fn completion(r: &Render<'_>) -> Bytes {
    let (text, tools) = text_and_tools(r);
    let mut message = json!({"role": "assistant", "content": text, "refusal": null});
    if !tools.is_empty() {
        message["tool_calls"] = Value::Array(tools);
    }
    json_bytes(&json!({
        "id": format!("chatcmpl-mock-{}", r.id),
        "object": "chat.completion",
        "created": unix_now(),
        "model": r.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(r.reply.stop_reason()),
        }],
        "usage": usage_json(&r.reply.usage),
    }))
}

/// Builds chunks that share id, timestamp and model.
struct Chunker {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl Chunker {
    fn choice(&self, delta: Value, finish_reason: Option<&str>) -> Bytes {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        });
        // With include_usage, every chunk but the last carries `usage: null`.
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        sse(None, &chunk)
    }

    fn usage(&self, usage: &Usage) -> Bytes {
        sse(
            None,
            &json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": usage_json(usage),
            }),
        )
    }
}

/// Chunks of one tool call: id and name first, then the arguments in pieces.
fn tool_chunks(c: &Chunker, call: usize, id: String, name: &str, args: &str) -> Vec<Bytes> {
    let head = json!({"tool_calls": [{
        "index": call, "id": id, "type": "function", "function": {"name": name, "arguments": ""},
    }]});
    std::iter::once(c.choice(head, None))
        .chain(split_pieces(args).into_iter().map(|piece| {
            let delta = json!({"tool_calls": [{"index": call, "function": {"arguments": piece}}]});
            c.choice(delta, None)
        }))
        .collect()
}

/// The chunk stream: role, content, tool calls, finish, optional usage, `[DONE]`.
pub(crate) fn chunks(r: &Render<'_>, include_usage: bool) -> Vec<Bytes> {
    let c = Chunker {
        id: format!("chatcmpl-mock-{}", r.id),
        created: unix_now(),
        model: r.model.to_owned(),
        include_usage,
    };
    let mut out = vec![c.choice(json!({"role": "assistant"}), None)];
    let mut calls = 0;
    for (index, block) in r.reply.content.iter().enumerate() {
        match block {
            Block::Text { text } => out.extend(
                split_pieces(text)
                    .into_iter()
                    .map(|p| c.choice(json!({"content": p}), None)),
            ),
            Block::ToolUse { id, name, input } => {
                let id = call_id(r, index, id.as_ref());
                out.extend(tool_chunks(&c, calls, id, name, &input.to_string()));
                calls += 1;
            }
            Block::Thinking { .. } => {}
        }
    }
    out.push(c.choice(json!({}), Some(finish_reason(r.reply.stop_reason()))));
    if include_usage {
        out.push(c.usage(&r.reply.usage));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

fn error_value(error_type: &str, message: &str) -> Value {
    json!({"error": {"message": message, "type": error_type, "param": null, "code": error_type}})
}

/// An error response body.
pub(crate) fn error(error_type: &str, message: &str) -> Bytes {
    json_bytes(&error_value(error_type, message))
}

/// A mid-stream error chunk.
pub(crate) fn error_event(error_type: &str, message: &str) -> Bytes {
    sse(None, &error_value(error_type, message))
}

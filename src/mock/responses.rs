//! Bodies in the OpenAI Responses API's shapes: a `response` object, its semantic event stream
//! (`event:` + `data:` with `type` and `sequence_number`, ending in `response.completed` /
//! `response.incomplete`, no `[DONE]`), the small documents of the other `/v1/responses/*`
//! endpoints, and errors. Usage is derived from the script's Anthropic-named counts.

use bytes::Bytes;
use serde_json::{Value, json};

use super::render::{Render, json_bytes, split_pieces, sse, unix_now};
use super::script::{Block, Usage};

/// The Responses API counts cached (and cache-written) tokens inside `input_tokens`.
fn usage_json(usage: &Usage) -> Value {
    let input =
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens;
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + usage.output_tokens,
    })
}

fn response_id(r: &Render<'_>) -> String {
    format!("resp_mock_{}", r.id)
}

fn call_id(r: &Render<'_>, index: usize, id: Option<&String>) -> String {
    id.cloned()
        .unwrap_or_else(|| format!("call_mock_{}_{index}", r.id))
}

/// One output item, whole (as in the final response and `response.output_item.done`).
fn item_json(r: &Render<'_>, index: usize, block: &Block) -> Value {
    match block {
        Block::Text { text } => json!({
            "id": format!("msg_mock_{}_{index}", r.id), "type": "message", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }),
        Block::ToolUse { id, name, input } => json!({
            "id": format!("fc_mock_{}_{index}", r.id), "type": "function_call",
            "status": "completed", "call_id": call_id(r, index, id.as_ref()), "name": name,
            "arguments": input.to_string(),
        }),
        Block::Thinking { thinking, .. } => json!({
            "id": format!("rs_mock_{}_{index}", r.id), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": thinking}],
        }),
    }
}

/// `completed`, or `incomplete` with its reason when the reply stopped at the token limit.
fn status_of(r: &Render<'_>) -> (&'static str, Value) {
    match r.reply.stop_reason() {
        "max_tokens" | "model_context_window_exceeded" => {
            ("incomplete", json!({"reason": "max_output_tokens"}))
        }
        "refusal" => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

fn response_value(r: &Render<'_>, status: &str, output: Vec<Value>, usage: Value) -> Value {
    let incomplete = if status == "incomplete" {
        status_of(r).1
    } else {
        Value::Null
    };
    json!({
        "id": response_id(r), "object": "response", "created_at": unix_now(), "status": status,
        "background": false, "error": null, "incomplete_details": incomplete,
        "instructions": null, "max_output_tokens": null, "model": r.model, "output": output,
        "parallel_tool_calls": true, "previous_response_id": null, "store": true,
        "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
        "tools": [], "top_p": 1.0, "truncation": "disabled", "usage": usage, "metadata": {},
    })
}

fn outputs(r: &Render<'_>) -> Vec<Value> {
    let blocks = r.reply.content.iter().enumerate();
    blocks.map(|(i, b)| item_json(r, i, b)).collect()
}

/// The non-streaming `response` object.
pub(crate) fn response(r: &Render<'_>) -> Bytes {
    let (status, _) = status_of(r);
    json_bytes(&response_value(
        r,
        status,
        outputs(r),
        usage_json(&r.reply.usage),
    ))
}

/// Numbers events as they are written.
struct Events {
    out: Vec<Bytes>,
}

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.out.len());
        self.out.push(sse(Some(kind), &data));
    }
}

/// The event sequence: created, in_progress, each item's added/delta/done events, then
/// completed (or incomplete) carrying the whole response with usage.
pub(crate) fn events(r: &Render<'_>) -> Vec<Bytes> {
    let mut ev = Events { out: Vec::new() };
    let start = response_value(r, "in_progress", Vec::new(), Value::Null);
    ev.push("response.created", json!({"response": start}));
    ev.push("response.in_progress", json!({"response": start}));
    for (index, block) in r.reply.content.iter().enumerate() {
        item_events(&mut ev, r, index, block);
    }
    let (status, _) = status_of(r);
    let done = response_value(r, status, outputs(r), usage_json(&r.reply.usage));
    ev.push(&format!("response.{status}"), json!({"response": done}));
    ev.out
}

fn item_events(ev: &mut Events, r: &Render<'_>, index: usize, block: &Block) {
    let item = item_json(r, index, block);
    let item_id = item["id"].clone();
    let mut added = item.clone();
    added["status"] = json!("in_progress");
    let at = json!({"item_id": item_id, "output_index": index});
    let with = |extra: Value| {
        let mut v = at.clone();
        if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
            v.extend(extra);
        }
        v
    };
    match block {
        Block::Text { text } => {
            added["content"] = json!([]);
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let empty = json!({"type": "output_text", "text": "", "annotations": []});
            let part = item["content"][0].clone();
            ev.push(
                "response.content_part.added",
                with(json!({"content_index": 0, "part": empty})),
            );
            for piece in split_pieces(text) {
                let delta = json!({"content_index": 0, "delta": piece, "logprobs": []});
                ev.push("response.output_text.delta", with(delta));
            }
            let done = json!({"content_index": 0, "text": text, "logprobs": []});
            ev.push("response.output_text.done", with(done));
            ev.push(
                "response.content_part.done",
                with(json!({"content_index": 0, "part": part})),
            );
        }
        Block::ToolUse { .. } => {
            added["arguments"] = json!("");
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let args = item["arguments"].as_str().unwrap_or("{}").to_owned();
            for piece in split_pieces(&args) {
                ev.push(
                    "response.function_call_arguments.delta",
                    with(json!({"delta": piece})),
                );
            }
            ev.push(
                "response.function_call_arguments.done",
                with(json!({"arguments": args, "name": item["name"]})),
            );
        }
        Block::Thinking { thinking, .. } => {
            added["summary"] = json!([]);
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let part = json!({"type": "summary_text", "text": ""});
            ev.push(
                "response.reasoning_summary_part.added",
                with(json!({"summary_index": 0, "part": part})),
            );
            for piece in split_pieces(thinking) {
                let delta = json!({"summary_index": 0, "delta": piece});
                ev.push("response.reasoning_summary_text.delta", with(delta));
            }
            let done = json!({"summary_index": 0, "text": thinking});
            ev.push("response.reasoning_summary_text.done", with(done));
        }
    }
    ev.push(
        "response.output_item.done",
        json!({"output_index": index, "item": item}),
    );
}

/// The mid-stream failure: an `error` event, then `response.failed`, numbered from `at` (the
/// number of events sent before the fault).
pub(crate) fn error_events(r: &Render<'_>, at: usize, error_type: &str, message: &str) -> Bytes {
    let code = error_code(error_type);
    let error = json!({
        "type": "error", "code": code, "message": message, "param": null, "sequence_number": at,
    });
    let mut failed = response_value(r, "failed", Vec::new(), Value::Null);
    failed["error"] = json!({"code": code, "message": message});
    let failed = json!({
        "type": "response.failed", "sequence_number": at + 1, "response": failed,
    });
    let mut out = sse(Some("error"), &error).to_vec();
    out.extend_from_slice(&sse(Some("response.failed"), &failed));
    Bytes::from(out)
}

/// The Responses API's error codes for the script's (Anthropic-named) error types.
fn error_code(error_type: &str) -> &str {
    match error_type {
        "overloaded_error" | "api_error" => "server_error",
        "rate_limit_error" => "rate_limit_exceeded",
        other => other,
    }
}

/// `DELETE /v1/responses/{id}`.
pub(crate) fn deleted(id: &str) -> Bytes {
    json_bytes(&json!({"id": id, "object": "response.deleted", "deleted": true}))
}

/// `GET /v1/responses/{id}/input_items`: the mock keeps no conversations.
pub(crate) fn input_items() -> Bytes {
    json_bytes(&json!({
        "object": "list", "data": [], "first_id": null, "last_id": null, "has_more": false,
    }))
}

/// `POST /v1/responses/input_tokens`.
pub(crate) fn input_tokens(tokens: u64) -> Bytes {
    json_bytes(&json!({"object": "response.input_tokens", "input_tokens": tokens}))
}

/// `GET /v1/responses/{id}` and `POST …/cancel`: the reply rendered under the asked id.
pub(crate) fn stored(r: &Render<'_>, id: &str, status: Option<&str>) -> Bytes {
    let (natural, _) = status_of(r);
    let mut value = response_value(
        r,
        status.unwrap_or(natural),
        outputs(r),
        usage_json(&r.reply.usage),
    );
    value["id"] = json!(id);
    json_bytes(&value)
}

//! Support for the stream tests: feeding a translator in pieces, reading its output back as
//! a client would, and building upstream events in the providers' documented shapes.

use std::collections::BTreeMap;

use proptest::sample::Index;
use serde_json::{Value, json};

use super::super::{Dir, StreamTranslator, anthropic as an, openai as oa};
use crate::sse::SseParser;

pub(super) const CREATED: u64 = 1_700_000_000;

pub(super) fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// Translates `input` fed in pieces cut at `cuts`, then `finish`.
pub(super) fn translate(dir: Dir, include_usage: bool, input: &[u8], cuts: &[Index]) -> Vec<u8> {
    let mut positions: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
    positions.sort_unstable();
    let mut translator = StreamTranslator::with_created(dir, include_usage, CREATED);
    let mut out = Vec::new();
    let mut from = 0;
    for to in positions {
        out.extend(translator.push(&input[from..to]));
        from = to;
    }
    out.extend(translator.push(&input[from..]));
    out.extend(translator.finish());
    out
}

/// What an Anthropic caller sees of the OpenAI stream `openai`, translated in one piece.
pub(super) fn anthropic_view_of(openai: &str) -> Result<AnthropicView, String> {
    anthropic_view(&translate(
        Dir::AnthropicToOpenAi,
        false,
        openai.as_bytes(),
        &[],
    ))
}

/// What an OpenAI caller (asking for usage or not) sees of the Anthropic stream `anthropic`,
/// translated in one piece.
pub(super) fn openai_view_of(anthropic: &str, include_usage: bool) -> Result<OpenAiView, String> {
    openai_view(&translate(
        Dir::OpenAiToAnthropic,
        include_usage,
        anthropic.as_bytes(),
        &[],
    ))
}

/// An Anthropic event as `events` reads it back: named after the type in its data.
pub(super) fn named(data: Value) -> (Option<String>, Value) {
    (data["type"].as_str().map(str::to_owned), data)
}

/// Every event of a translated output, as (event name, data JSON).
pub(super) fn events(bytes: &[u8]) -> Vec<(Option<String>, Value)> {
    let mut parser = SseParser::new();
    parser.push(bytes);
    parser.finish();
    assert_eq!(parser.pending_bytes(), 0, "output ends inside an event");
    let mut out = Vec::new();
    while let Some(ev) = parser.next_event() {
        let data = serde_json::from_str(&ev.data).unwrap_or(Value::String(ev.data));
        out.push((ev.event, data));
    }
    out
}

/// What an Anthropic client rebuilds from a stream, checking the block discipline as it goes.
#[derive(Debug, Default, PartialEq)]
pub(super) struct AnthropicView {
    pub(super) text: String,
    /// (id, name, concatenated partial_json) per tool_use block.
    pub(super) tools: Vec<(String, String, String)>,
    pub(super) stop_reason: Option<String>,
    pub(super) usage: an::Usage,
    pub(super) error: Option<String>,
    pub(super) stopped: bool,
}

pub(super) fn anthropic_view(bytes: &[u8]) -> Result<AnthropicView, String> {
    let mut view = AnthropicView::default();
    let mut open: Option<(u64, bool)> = None;
    let mut blocks = 0;
    for (i, (name, data)) in events(bytes).into_iter().enumerate() {
        if view.stopped || view.error.is_some() {
            return Err("event after the end".into());
        }
        let event: an::StreamEvent = serde_json::from_value(data).map_err(|e| e.to_string())?;
        if name.as_deref() != Some(event.name()) {
            return Err(format!(
                "event name {name:?} does not match {}",
                event.name()
            ));
        }
        match event {
            an::StreamEvent::MessageStart { message } if i == 0 => view.usage = message.usage,
            an::StreamEvent::ContentBlockStart {
                index,
                content_block,
            } if open.is_none() && index == blocks => {
                blocks += 1;
                let is_tool = match content_block {
                    an::Block::ToolUse { id, name, .. } => {
                        view.tools.push((id, name, String::new()));
                        true
                    }
                    _ => false,
                };
                open = Some((index, is_tool));
            }
            an::StreamEvent::ContentBlockDelta { index, delta }
                if open.map(|o| o.0) == Some(index) =>
            {
                match delta {
                    an::Delta::Text { text } => view.text.push_str(&text),
                    an::Delta::InputJson { partial_json } => match view.tools.last_mut() {
                        Some(tool) if open.is_some_and(|o| o.1) => tool.2.push_str(&partial_json),
                        _ => return Err("input_json_delta outside a tool block".into()),
                    },
                    an::Delta::Other => return Err("unexpected delta".into()),
                }
            }
            an::StreamEvent::ContentBlockStop { index } if open.map(|o| o.0) == Some(index) => {
                open = None
            }
            an::StreamEvent::MessageDelta { delta, usage } if open.is_none() => {
                view.stop_reason = delta.stop_reason;
                view.usage.overwrite_with(&usage.unwrap_or_default());
            }
            an::StreamEvent::MessageStop if open.is_none() => view.stopped = true,
            an::StreamEvent::Error { error } => view.error = Some(error.kind),
            other => return Err(format!("event out of order at {i}: {other:?}")),
        }
    }
    Ok(view)
}

/// What an OpenAI client rebuilds from a stream.
#[derive(Debug, Default, PartialEq)]
pub(super) struct OpenAiView {
    pub(super) role: Option<String>,
    pub(super) text: String,
    /// index → (id, name, concatenated arguments)
    pub(super) calls: BTreeMap<u64, (String, String, String)>,
    pub(super) finish_reason: Option<String>,
    pub(super) usage: Option<oa::Usage>,
    pub(super) error: Option<Value>,
    pub(super) done: bool,
}

pub(super) fn openai_view(bytes: &[u8]) -> Result<OpenAiView, String> {
    let mut view = OpenAiView::default();
    for (name, data) in events(bytes) {
        if view.done || view.error.is_some() {
            return Err("event after the end".into());
        }
        if name.is_some() {
            return Err("OpenAI events carry no event name".into());
        }
        if data == Value::String("[DONE]".into()) {
            view.done = true;
            continue;
        }
        if let Some(error) = data.get("error") {
            view.error = Some(error.clone());
            continue;
        }
        let chunk: oa::Chunk = serde_json::from_value(data).map_err(|e| e.to_string())?;
        if chunk.object != "chat.completion.chunk" || chunk.created != CREATED {
            return Err("not a chunk".into());
        }
        if chunk.usage.is_some() {
            view.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(role) = choice.delta.role {
                view.role = Some(role);
            }
            view.text
                .push_str(choice.delta.content.as_deref().unwrap_or(""));
            for call in choice.delta.tool_calls.unwrap_or_default() {
                let entry = view.calls.entry(call.index).or_default();
                if let Some(id) = call.id {
                    entry.0 = id;
                }
                let function = call.function.unwrap_or_default();
                entry.1.push_str(function.name.as_deref().unwrap_or(""));
                entry
                    .2
                    .push_str(function.arguments.as_deref().unwrap_or(""));
            }
            if choice.finish_reason.is_some() {
                view.finish_reason = choice.finish_reason;
            }
        }
    }
    Ok(view)
}

pub(super) fn chunk(delta: Value, finish: Option<&str>) -> String {
    sse(
        None,
        &json!({"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4.1", "choices": [{"index": 0, "delta": delta, "logprobs": null,
        "finish_reason": finish}], "usage": null}),
    )
}

pub(super) const OPENAI_USAGE: &str = r#"{"prompt_tokens": 130, "completion_tokens": 12, "total_tokens": 142,
    "prompt_tokens_details": {"cached_tokens": 100}}"#;

pub(super) fn openai_usage_chunk() -> String {
    let usage: Value = serde_json::from_str(OPENAI_USAGE).unwrap_or(Value::Null);
    sse(
        None,
        &json!({"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4.1", "choices": [], "usage": usage}),
    )
}

pub(super) fn anthropic_event(data: &Value) -> String {
    let name = data["type"].as_str().unwrap_or("unknown").to_owned();
    sse(Some(&name), data)
}

pub(super) fn anthropic_start() -> String {
    anthropic_event(
        &json!({"type": "message_start", "message": {"id": "msg_01X", "type": "message",
        "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null,
        "stop_sequence": null, "usage": {"input_tokens": 25, "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 100, "output_tokens": 1}}}),
    )
}

pub(super) fn anthropic_end(stop: &str) -> String {
    [
        anthropic_event(
            &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 15}}),
        ),
        anthropic_event(&json!({"type": "message_stop"})),
    ]
    .concat()
}

pub(super) fn parsed(json: &str) -> Value {
    serde_json::from_str(json).unwrap_or(Value::Null)
}

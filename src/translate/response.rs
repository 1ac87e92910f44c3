//! Whole (non-streaming) responses: an upstream Anthropic message as a `chat.completion`, and
//! an upstream `chat.completion` as an Anthropic message.

use serde_json::Value;

use super::mapping::{
    anthropic_id, anthropic_tool_id, anthropic_usage, finish_reason, openai_id, openai_usage,
    stop_reason,
};
use super::{Untranslatable, anthropic as an, openai as oa};

/// Upstream Anthropic message → the OpenAI caller's `chat.completion`. A 200 body that is
/// not a message (`{}`, an array, an error object some gateways wrap in a 200) is no answer:
/// every field of the message has a default, so what makes it one is said here.
pub(super) fn to_openai(upstream_body: &[u8], created: u64) -> Result<Vec<u8>, Untranslatable> {
    let not_message = || Untranslatable("the upstream body is not an Anthropic message".to_owned());
    // The parser's error text may quote the body: the message names the problem only.
    let value: Value = serde_json::from_slice(upstream_body).map_err(|_| not_message())?;
    let is_message = value.get("type").is_none_or(|t| t == "message")
        && value.get("content").is_some_and(Value::is_array);
    if !is_message {
        return Err(not_message());
    }
    let message: an::MessageResponse = serde_json::from_value(value).map_err(|_| not_message())?;
    serialise(&openai_completion(message, created)?)
}

/// Upstream `chat.completion` → the Anthropic caller's message.
pub(super) fn to_anthropic(upstream_body: &[u8]) -> Result<Vec<u8>, Untranslatable> {
    let completion: oa::Completion = serde_json::from_slice(upstream_body)
        .map_err(|_| Untranslatable("the upstream body is not a chat completion".to_owned()))?;
    serialise(&anthropic_message(completion)?)
}

fn serialise<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Untranslatable> {
    serde_json::to_vec(value)
        .map_err(|e| Untranslatable(format!("cannot serialise the translated response: {e}")))
}

/// Text blocks join into `content` (thinking and server-tool blocks are dropped), tool_use
/// blocks become `tool_calls`. A tool input that is not a JSON object fails the answer, as
/// in the other direction (SPEC §10), unless the output limit cut the message: then its input
/// ends mid-way by design and goes on as it came, under finish reason `length`.
pub(super) fn openai_completion(
    message: an::MessageResponse,
    created: u64,
) -> Result<oa::Completion, Untranslatable> {
    let cut = message.stop_reason.as_deref() == Some("max_tokens");
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    for block in message.content {
        match block {
            an::Block::Text { text: t, .. } => text.get_or_insert_with(String::new).push_str(&t),
            an::Block::ToolUse {
                id, name, input, ..
            } => {
                let arguments = match input {
                    Value::Object(_) => input.to_string(),
                    Value::Null if cut => "{}".to_owned(),
                    _ if cut => input.to_string(),
                    _ => {
                        return Err(Untranslatable(format!(
                            "the upstream model called tool `{name}` with an input that is \
                             not a JSON object"
                        )));
                    }
                };
                calls.push(oa::ToolCall {
                    id,
                    kind: oa::function_kind(),
                    function: Some(oa::FunctionCall { name, arguments }),
                })
            }
            _ => {}
        }
    }
    let content = match text {
        Some(text) => Some(text),
        // A turn with neither text nor calls still answers with an (empty) text.
        None if calls.is_empty() => Some(String::new()),
        None => None,
    };
    Ok(oa::Completion {
        id: openai_id(&message.id),
        object: "chat.completion".to_owned(),
        created,
        model: message.model,
        choices: vec![oa::Choice::assistant(
            content,
            calls,
            finish_reason(message.stop_reason.as_deref()),
        )],
        usage: Some(openai_usage(&message.usage)),
    })
}

/// The first choice becomes the message: its text (and refusal) as a text block, then one
/// tool_use block per call.
pub(super) fn anthropic_message(
    completion: oa::Completion,
) -> Result<an::MessageResponse, Untranslatable> {
    let mut choices = completion.choices;
    let position = choices.iter().position(|c| c.index == 0).unwrap_or(0);
    if choices.is_empty() {
        return Err(Untranslatable(
            "the upstream chat completion has no choices (no answer to pass on)".to_owned(),
        ));
    }
    let choice = choices.swap_remove(position);
    let message = choice.message;
    let refused = message.refusal.as_ref().is_some_and(|r| !r.is_empty());
    let mut content = Vec::new();
    for text in [message.content, message.refusal].into_iter().flatten() {
        if !text.is_empty() {
            content.push(an::Block::Text {
                text,
                cache_control: None,
                citations: None,
            });
        }
    }
    let calls = message.tool_calls.unwrap_or_default();
    let has_calls = !calls.is_empty();
    let cut = choice.finish_reason.as_deref() == Some("length");
    for call in calls {
        let Some(function) = call.function else {
            continue;
        };
        content.push(an::Block::ToolUse {
            id: anthropic_tool_id(&call.id),
            input: tool_input(&function.name, &function.arguments, cut)?,
            name: function.name,
            cache_control: None,
        });
    }
    let stop = stop_reason(choice.finish_reason.as_deref(), has_calls, refused);
    Ok(an::MessageResponse {
        id: anthropic_id(&completion.id),
        kind: "message".to_owned(),
        role: an::Role::Assistant,
        content,
        model: completion.model,
        stop_reason: Some(stop.to_owned()),
        stop_sequence: None,
        usage: completion
            .usage
            .map(|u| anthropic_usage(&u))
            .unwrap_or_else(zero_usage),
    })
}

fn zero_usage() -> an::Usage {
    an::Usage {
        input_tokens: Some(0),
        output_tokens: Some(0),
        ..an::Usage::default()
    }
}

/// A whole response's arguments must form the JSON object an Anthropic tool_use carries;
/// unlike in a stream, they can be checked before the caller sees anything.
/// A call's arguments as an Anthropic tool input: a JSON object, or the answer fails (empty
/// arguments too: SPEC §10, never a clean end with `{}` as input). The exception is a call
/// the output limit cut (`cut`: finish reason `length`): its arguments end mid-way by design,
/// the same request would be cut the same way again, so retrying it buys nothing but its
/// tokens. It gets `{}`, and the answer's `max_tokens` stop reason says it is not whole, as
/// Anthropic's own answer cut inside a tool_use block does.
fn tool_input(name: &str, arguments: &str, cut: bool) -> Result<Value, Untranslatable> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => Ok(value),
        _ if cut => Ok(Value::Object(serde_json::Map::new())),
        _ => Err(Untranslatable(format!(
            "the upstream model called tool `{name}` with arguments that are not a JSON object"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_message_becomes_a_chat_completion() -> Result<(), Untranslatable> {
        let body = json!({
            "id": "msg_01X", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": 1}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 3, "output_tokens": 9, "cache_read_input_tokens": 20}
        });
        let out = to_openai(body.to_string().as_bytes(), 42)?;
        let out: Value = serde_json::from_slice(&out).map_err(|e| Untranslatable(e.to_string()))?;
        assert_eq!(out["id"], "chatcmpl-01X");
        assert_eq!(out["object"], "chat.completion");
        assert_eq!(out["created"], 42);
        assert_eq!(out["model"], "claude-x");
        let choice = &out["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], "Checking.");
        assert_eq!(choice["message"]["tool_calls"][0]["id"], "toolu_1");
        assert_eq!(
            choice["message"]["tool_calls"][0]["function"]["arguments"],
            r#"{"q":1}"#
        );
        assert_eq!(out["usage"]["prompt_tokens"], 23);
        assert_eq!(out["usage"]["prompt_tokens_details"]["cached_tokens"], 20);
        Ok(())
    }

    #[test]
    fn chat_completion_becomes_an_anthropic_message() -> Result<(), Untranslatable> {
        let body = json!({
            "id": "chatcmpl-9", "object": "chat.completion", "created": 1, "model": "gpt-x",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null, "message": {
                "role": "assistant", "content": null, "refusal": null,
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "get", "arguments": "{}"}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55,
                      "prompt_tokens_details": {"cached_tokens": 40}}
        });
        let out = to_anthropic(body.to_string().as_bytes())?;
        let out: Value = serde_json::from_slice(&out).map_err(|e| Untranslatable(e.to_string()))?;
        assert_eq!(out["id"], "msg_9");
        assert_eq!(out["type"], "message");
        // `stop` with tool calls is repaired to `tool_use` so an agent loop runs the tool.
        assert_eq!(out["stop_reason"], "tool_use");
        assert_eq!(out["content"][0]["type"], "tool_use");
        assert_eq!(out["content"][0]["input"], json!({}));
        assert_eq!(out["usage"]["input_tokens"], 10);
        assert_eq!(out["usage"]["cache_read_input_tokens"], 40);
        Ok(())
    }

    #[test]
    fn refusal_text_becomes_a_refusal_stop() -> Result<(), Untranslatable> {
        let body = json!({"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0,
            "finish_reason": "stop", "message": {"content": null, "refusal": "I can't."}}]});
        let msg = anthropic_message(
            serde_json::from_value(body).map_err(|e| Untranslatable(e.to_string()))?,
        )?;
        assert_eq!(msg.stop_reason.as_deref(), Some("refusal"));
        assert_eq!(msg.content.len(), 1);
        Ok(())
    }

    #[test]
    fn malformed_tool_arguments_or_no_choice_are_untranslatable() {
        let bad_args = json!({"id": "c", "model": "m", "choices": [{"index": 0, "message": {
            "content": null, "tool_calls": [{"id": "x", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\":"}}]}}]});
        assert!(to_anthropic(bad_args.to_string().as_bytes()).is_err());
        // Empty arguments are not an object either: never a clean `{}` input.
        let empty_args = json!({"id": "c", "model": "m", "choices": [{"index": 0, "message": {
            "content": null, "tool_calls": [{"id": "x", "type": "function",
            "function": {"name": "f", "arguments": ""}}]}}]});
        assert!(to_anthropic(empty_args.to_string().as_bytes()).is_err());
        // Cut by the output limit, the call ends mid-way by design: `{}` under `max_tokens`,
        // not a failure to retry (the same request would be cut the same way).
        let cut = json!({"id": "c", "model": "m", "choices": [{"index": 0, "message": {
            "content": null, "tool_calls": [{"id": "x", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\":"}}]}, "finish_reason": "length"}]});
        let cut = to_anthropic(cut.to_string().as_bytes())
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .unwrap_or_default();
        assert_eq!(cut["stop_reason"], "max_tokens");
        assert_eq!(cut["content"][0]["input"], json!({}));
        let no_choice = json!({"id": "c", "model": "m", "choices": []});
        assert!(to_anthropic(no_choice.to_string().as_bytes()).is_err());
        assert!(to_openai(b"<html>", 0).is_err());
    }

    #[test]
    fn a_body_that_is_no_message_or_a_tool_input_that_is_no_object_is_untranslatable() {
        // Every field of a message has a default: `{}` must not pass for an empty answer.
        for body in [
            json!({}),
            json!([]),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
        ] {
            assert!(to_openai(body.to_string().as_bytes(), 0).is_err(), "{body}");
        }
        let with_input = |input: Value, stop: &str| {
            json!({"type": "message", "id": "msg_1", "model": "m", "role": "assistant",
                "stop_reason": stop, "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": input}]})
            .to_string()
        };
        for input in [json!("abc"), json!([1, 2]), Value::Null] {
            assert!(
                to_openai(with_input(input.clone(), "tool_use").as_bytes(), 0).is_err(),
                "{input}"
            );
        }
        // Cut by the output limit, the input goes on as it came, under `length`.
        let out = to_openai(with_input(Value::Null, "max_tokens").as_bytes(), 0)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .unwrap_or_default();
        assert_eq!(out["choices"][0]["finish_reason"], "length");
        assert_eq!(
            out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
    }
}

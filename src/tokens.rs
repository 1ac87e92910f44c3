//! Input-token estimates of a request as a chain step would receive it, for the token-count
//! endpoints on a route whose step speaks the other API (SPEC §3): Anthropic's `count_tokens`
//! now, the Responses API's `input_tokens` later. The caller's body is first translated into
//! the step's API; what is counted is exactly what that step would be sent.
//!
//! - OpenAI-compatible steps: the model's own byte-pair encoding (`o200k_base` for GPT-4o,
//!   GPT-4.1, GPT-5 and the o-series; `cl100k_base` for GPT-4 and GPT-3.5; `o200k_base` for
//!   every model it does not know, such as a local model behind vLLM, where it is an estimate
//!   of that model's own tokenizer), plus the chat format's documented overhead: 3 tokens per
//!   message, 1 per `name`, 3 priming the reply. Tool definitions are counted as their JSON
//!   (the provider renders them differently, so this is within a few percent), an image as 765
//!   tokens (a 1024×1024 picture at high detail), a file as its bytes / 4.
//! - Anthropic steps: Anthropic publishes no tokenizer; text counts as its bytes / 4, rounded
//!   up per text, which tends to overestimate English slightly.

use serde_json::Value;
use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

use crate::config::ApiKind;

/// What one image costs (OpenAI's high-detail 1024×1024 tiling: 85 + 4 × 170).
const IMAGE_TOKENS: u64 = 765;
/// Tokens the chat format adds around every message, and before the reply.
const PER_MESSAGE: u64 = 3;
const REPLY_PRIMING: u64 = 3;

/// Estimated input tokens of `body`, a request in the API of a step of `kind` for `model`.
/// `None` when the body is not JSON.
pub fn input_tokens(kind: ApiKind, model: &str, body: &[u8]) -> Option<u64> {
    let request: Value = serde_json::from_slice(body).ok()?;
    Some(match kind {
        ApiKind::OpenAi => chat_tokens(&request, encoding(model)),
        ApiKind::Anthropic | ApiKind::Responses => by_bytes(&request),
    })
}

/// The byte-pair encoding of an OpenAI model; models it does not know get the newest one.
fn encoding(model: &str) -> &'static CoreBPE {
    match get_tokenizer(model) {
        Some(Tokenizer::Cl100kBase) => tiktoken_rs::cl100k_base_singleton(),
        _ => tiktoken_rs::o200k_base_singleton(),
    }
}

fn count(bpe: &CoreBPE, text: &str) -> u64 {
    bpe.encode_ordinary(text).len() as u64
}

/// A Chat Completions request: messages with the format's overhead, then tool definitions.
fn chat_tokens(request: &Value, bpe: &CoreBPE) -> u64 {
    let mut total = REPLY_PRIMING;
    for message in request["messages"].as_array().into_iter().flatten() {
        total += PER_MESSAGE;
        if let Some(role) = message["role"].as_str() {
            total += count(bpe, role);
        }
        if let Some(name) = message["name"].as_str() {
            total += 1 + count(bpe, name);
        }
        total += content_tokens(&message["content"], bpe);
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let function = &call["function"];
            total += PER_MESSAGE
                + count(bpe, function["name"].as_str().unwrap_or(""))
                + count(bpe, function["arguments"].as_str().unwrap_or(""));
        }
        if let Some(id) = message["tool_call_id"].as_str() {
            total += count(bpe, id);
        }
    }
    if let Some(tools) = request.get("tools").filter(|t| !t.is_null()) {
        total += count(bpe, &tools.to_string());
    }
    if let Some(format) = request.get("response_format").filter(|f| !f.is_null()) {
        total += count(bpe, &format.to_string());
    }
    total
}

fn content_tokens(content: &Value, bpe: &CoreBPE) -> u64 {
    match content {
        Value::String(text) => count(bpe, text),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part["type"].as_str() {
                Some("text") => count(bpe, part["text"].as_str().unwrap_or("")),
                Some("image_url") => IMAGE_TOKENS,
                Some("file") => {
                    let data = part["file"]["file_data"].as_str().unwrap_or("");
                    (data.len() as u64).div_ceil(4)
                }
                _ => (part.to_string().len() as u64).div_ceil(4),
            })
            .sum(),
        _ => 0,
    }
}

/// Without a tokenizer: every string in the request that is not a name of the wire format
/// (text, tool schemas, arguments) counted as bytes / 4.
fn by_bytes(request: &Value) -> u64 {
    let mut total = 0;
    let fields = [
        "system",
        "messages",
        "tools",
        "tool_choice",
        "output_config",
    ];
    for field in fields {
        total += strings_bytes(&request[field]).div_ceil(4);
    }
    total
}

fn strings_bytes(value: &Value) -> u64 {
    match value {
        Value::String(s) => s.len() as u64,
        Value::Array(items) => items.iter().map(strings_bytes).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                // Structure (`type`, `role`, …) costs the model little; content costs bytes.
                let key = if matches!(k.as_str(), "type" | "role" | "cache_control") {
                    0
                } else {
                    k.len() as u64
                };
                key + strings_bytes(v)
            })
            .sum(),
        Value::Number(n) => n.to_string().len() as u64,
        Value::Bool(_) | Value::Null => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_messages_are_counted_with_the_models_encoding() {
        // "Hello world" is 2 tokens in both encodings; "user" 1: 3 + (3 + 1 + 2).
        let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello world"}]});
        let bytes = body.to_string().into_bytes();
        assert_eq!(
            input_tokens(ApiKind::OpenAi, "gpt-4o-mini", &bytes),
            Some(9)
        );
        assert_eq!(input_tokens(ApiKind::OpenAi, "gpt-4", &bytes), Some(9));
        assert_eq!(input_tokens(ApiKind::OpenAi, "llama3", &bytes), Some(9));
    }

    #[test]
    fn tools_images_and_tool_calls_add_to_the_count() {
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        let rich = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "text"}],
            "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]});
        let count = |v: &Value| input_tokens(ApiKind::OpenAi, "gpt-4o", v.to_string().as_bytes());
        let (plain, rich) = (count(&plain).unwrap_or(0), count(&rich).unwrap_or(0));
        assert!(rich > plain + IMAGE_TOKENS + 20, "{plain} vs {rich}");
    }

    #[test]
    fn anthropic_steps_are_estimated_from_bytes() {
        let body = json!({"model": "claude", "max_tokens": 10, "system": "12345678",
            "messages": [{"role": "user", "content": "abcd"}]});
        // system: 8 bytes -> 2; messages: "user" 4 + "content" 7 + "abcd" 4 -> 4.
        assert_eq!(
            input_tokens(ApiKind::Anthropic, "claude", body.to_string().as_bytes()),
            Some(6)
        );
        assert_eq!(input_tokens(ApiKind::Anthropic, "claude", b"nope"), None);
    }
}

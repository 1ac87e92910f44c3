//! The OpenAI Chat Completions API: its path, the request fields that route, meter and admit
//! a call, the class of each streamed chunk (`data:`-only SSE ending in `data: [DONE]`),
//! usage, and its errors.

pub(super) mod errors;
mod stream;
pub(crate) mod unasked;
mod usage;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{
    Dialect, ErrorFields, ErrorTable, Field, LocalError, MetaError, Operation, PROMPT_KEYS,
    RequestMeta, StreamEventKind, read_fields, read_fields_sized, scan_prompt,
};
use crate::meter::Usage;
use crate::sse::SseEvent;

/// The OpenAI Chat Completions dialect.
pub struct OpenAiChat;

impl Dialect for OpenAiChat {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn operation(&self, method: &Method, path: &str) -> Option<Operation> {
        (method == Method::POST && path == "/chat/completions").then_some(Operation::Generate)
    }

    fn upstream_path(&self, op: Operation) -> Option<&'static str> {
        (op == Operation::Generate).then_some("/v1/chat/completions")
    }

    fn parse_request(&self, body: &[u8]) -> Result<RequestMeta, MetaError> {
        parse_request(body)
    }

    fn max_tokens_keys(&self) -> &'static [&'static str] {
        &["max_completion_tokens", "max_tokens"]
    }

    fn classify(&self, ev: &SseEvent) -> StreamEventKind {
        stream::classify(ev)
    }

    fn usage_of_body(&self, body: &[u8]) -> Option<Usage> {
        usage::of_body(body)
    }

    fn observe_usage(&self, ev: &SseEvent, seen: &mut Option<Usage>) -> bool {
        usage::observe(ev, seen)
    }

    fn errors(&self) -> &'static ErrorTable {
        &errors::TABLE
    }

    fn read_error(&self, body: &[u8]) -> Option<ErrorFields> {
        errors::read(body)
    }

    fn error_body(&self, e: LocalError<'_>, _request_id: &str) -> Bytes {
        errors::body(e)
    }

    fn stream_error_event(&self, e: LocalError<'_>) -> Bytes {
        errors::stream_event(e)
    }

    fn error_event_response(&self, data: &str) -> (StatusCode, Bytes) {
        errors::event_response(data)
    }
}

const INCLUDE_USAGE: &str = "stream_options.include_usage";

/// Reads `model` (string) and `messages` (array), which are required, and the optional
/// `max_completion_tokens` (which wins) / `max_tokens`, `stream` and
/// `stream_options.include_usage`.
fn parse_request(body: &[u8]) -> Result<RequestMeta, MetaError> {
    let ([model, messages, max_completion, max_tokens, stream, options], approx_input_tokens) =
        read_fields_sized(
            body,
            [
                "model",
                "messages",
                "max_completion_tokens",
                "max_tokens",
                "stream",
                "stream_options",
            ],
            PROMPT_KEYS,
        )?;
    // One allocation, shared from here on (the journal entry takes the same string).
    let model = std::sync::Arc::<str>::from(model.string("model")?.as_ref());
    messages.array("messages")?;
    let max_completion = max_completion.opt_u64("max_completion_tokens")?;
    let max_tokens = max_tokens.opt_u64("max_tokens")?;
    let stream = stream.opt_bool("stream")?;
    let want_options = match options {
        Field::Object => true,
        Field::Absent | Field::Null => false,
        _ => return Err(MetaError::WrongType("stream_options")),
    };
    // Only a caller that sent stream_options pays for a second walk, to find its value.
    let options_span = want_options
        .then(|| scan_prompt(body, &[], Some("stream_options")).1)
        .flatten();
    let include_usage = match options_span {
        Some(span) => match read_fields(&body[span], ["include_usage"]) {
            Ok([flag]) => flag.opt_bool(INCLUDE_USAGE)?,
            Err(MetaError::Duplicate(_)) => return Err(MetaError::Duplicate(INCLUDE_USAGE)),
            Err(_) => return Err(MetaError::WrongType("stream_options")),
        },
        None => false,
    };
    Ok(RequestMeta {
        model,
        stream,
        max_tokens: max_completion.or(max_tokens),
        include_usage,
        approx_input_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(body: &str) -> Result<RequestMeta, MetaError> {
        parse_request(body.as_bytes())
    }

    #[test]
    fn reads_the_fields_legate_needs() {
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],
            "stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true},
            "max_tokens":10,"max_completion_tokens":20,"tools":[]}"#;
        assert_eq!(
            meta(body),
            Ok(RequestMeta {
                model: "gpt-4o".into(),
                stream: true,
                max_tokens: Some(20),
                include_usage: true,
                // messages = 32 bytes, tools = 2 bytes.
                approx_input_tokens: 9,
            })
        );
    }

    #[test]
    fn max_tokens_is_optional_and_the_fallback() {
        let only_old = meta(r#"{"model":"m","messages":[],"max_tokens":7}"#);
        assert_eq!(only_old.map(|m| m.max_tokens), Ok(Some(7)));
        let neither = meta(r#"{"model":"m","messages":[],"max_completion_tokens":null}"#);
        assert_eq!(
            neither.map(|m| (m.max_tokens, m.stream, m.include_usage)),
            Ok((None, false, false))
        );
    }

    #[test]
    fn required_fields_and_types_are_enforced() {
        let cases = [
            (r#"{"messages":[]}"#, MetaError::Missing("model")),
            (r#"{"model":"m"}"#, MetaError::Missing("messages")),
            (
                r#"{"model":null,"messages":[]}"#,
                MetaError::WrongType("model"),
            ),
            (
                r#"{"model":"m","messages":[],"max_tokens":"9"}"#,
                MetaError::WrongType("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[],"max_completion_tokens":5,"max_tokens":-1}"#,
                MetaError::WrongType("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[],"stream_options":true}"#,
                MetaError::WrongType("stream_options"),
            ),
            (
                r#"{"model":"m","messages":[],"stream_options":{"include_usage":1}}"#,
                MetaError::WrongType(INCLUDE_USAGE),
            ),
            (
                r#"{"model":"m","messages":[],"stream_options":{"include_usage":true,"include_usage":false}}"#,
                MetaError::Duplicate(INCLUDE_USAGE),
            ),
            (
                r#"{"model":"m","messages":[],"stream":true,"stream":false}"#,
                MetaError::Duplicate("stream"),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(meta(body), Err(want), "{body}");
        }
    }
}

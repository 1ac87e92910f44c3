//! The Anthropic Messages API: its paths, the request fields of SPEC §5, the class of each
//! streamed event (the SDKs dispatch on the SSE `event:` name, so legate does too), usage, and
//! its errors.

mod errors;
mod usage;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{
    Dialect, ErrorFields, ErrorTable, Field, LocalError, MetaError, Operation, PROMPT_KEYS,
    RequestMeta, StreamEventKind, read_fields, read_fields_sized,
};
use crate::meter::Usage;
use crate::sse::SseEvent;

/// The Anthropic Messages dialect.
pub struct Anthropic;

impl Dialect for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn operation(&self, method: &Method, path: &str) -> Option<Operation> {
        match (method, path) {
            (&Method::POST, "/messages") => Some(Operation::Generate),
            (&Method::POST, "/messages/count_tokens") => Some(Operation::CountTokens),
            // HEAD is GET without the body (RFC 9110 §9.3.2); the connection leaves it out.
            (&Method::GET | &Method::HEAD, "/models") => Some(Operation::Models),
            (&Method::GET | &Method::HEAD, p)
                if p.len() > "/models/".len() && p.starts_with("/models/") =>
            {
                Some(Operation::Model)
            }
            _ => None,
        }
    }

    fn upstream_path(&self, op: Operation) -> Option<&'static str> {
        match op {
            Operation::Generate => Some("/v1/messages"),
            Operation::CountTokens => Some("/v1/messages/count_tokens"),
            Operation::Models | Operation::Model => Some("/v1/models"),
            Operation::InputTokens | Operation::StoredResponse => None,
        }
    }

    fn parse_request(&self, body: &[u8]) -> Result<RequestMeta, MetaError> {
        parse_request(body)
    }

    fn max_tokens_keys(&self) -> &'static [&'static str] {
        &["max_tokens"]
    }

    fn classify(&self, ev: &SseEvent) -> StreamEventKind {
        classify(ev)
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

    fn error_body(&self, e: LocalError<'_>, request_id: &str) -> Bytes {
        errors::body(e, request_id)
    }

    fn stream_error_event(&self, e: LocalError<'_>) -> Bytes {
        errors::stream_event(e)
    }

    fn error_event_response(&self, data: &str) -> (StatusCode, Bytes) {
        errors::event_response(data)
    }
}

/// Reads `model` (string), `messages` (array), `max_tokens` (non-negative integer) and the
/// optional `stream` flag; every other field is skipped, unknown ones included.
fn parse_request(body: &[u8]) -> Result<RequestMeta, MetaError> {
    let ([model, messages, max_tokens, stream], approx_input_tokens) = read_fields_sized(
        body,
        ["model", "messages", "max_tokens", "stream"],
        PROMPT_KEYS,
    )?;
    // One allocation, shared from here on (the journal entry takes the same string).
    let model = std::sync::Arc::<str>::from(model.string("model")?.as_ref());
    messages.array("messages")?;
    let max_tokens = max_tokens.u64("max_tokens")?;
    let stream = stream.opt_bool("stream")?;
    Ok(RequestMeta {
        model,
        stream,
        max_tokens: Some(max_tokens),
        include_usage: false,
        approx_input_tokens,
    })
}

/// Classifies one event by its `event:` name, falling back to the data's `type` for an event
/// without a name. Unknown names are `Other` (the API adds event types over time).
fn classify(ev: &SseEvent) -> StreamEventKind {
    match ev.event.as_deref() {
        Some(name) => kind_of(name),
        None => match read_fields(ev.data.as_bytes(), ["type"]) {
            Ok([Field::Str(kind)]) => kind_of(&kind),
            _ => StreamEventKind::Other,
        },
    }
}

fn kind_of(name: &str) -> StreamEventKind {
    match name {
        "message_start" | "content_block_start" | "ping" => StreamEventKind::Preamble,
        "content_block_delta" => StreamEventKind::Content,
        "message_stop" => StreamEventKind::Terminal,
        "error" => StreamEventKind::Error,
        _ => StreamEventKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::events_of as events;

    fn meta(body: &str) -> Result<RequestMeta, MetaError> {
        parse_request(body.as_bytes())
    }

    #[test]
    fn reads_the_fields_legate_needs() {
        let body = r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,
            "system":"be brief","messages":[{"role":"user","content":"Hello"}],
            "thinking":{"type":"enabled","budget_tokens":2048},"future_field":[1,{"a":null}]}"#;
        let m = meta(body);
        assert_eq!(
            m,
            Ok(RequestMeta {
                model: "claude-sonnet-4-5".into(),
                stream: true,
                max_tokens: Some(1024),
                include_usage: false,
                // "be brief" = 10 bytes, the messages array = 35 bytes.
                approx_input_tokens: 12,
            })
        );
    }

    #[test]
    fn stream_defaults_to_false() {
        let m = meta(r#"{"model":"m","max_tokens":1,"messages":[],"stream":null}"#);
        assert_eq!(m.map(|m| m.stream), Ok(false));
    }

    #[test]
    fn required_fields_and_types_are_enforced() {
        let cases = [
            (
                r#"{"messages":[],"max_tokens":1}"#,
                MetaError::Missing("model"),
            ),
            (
                r#"{"model":"m","max_tokens":1}"#,
                MetaError::Missing("messages"),
            ),
            (
                r#"{"model":"m","messages":[]}"#,
                MetaError::Missing("max_tokens"),
            ),
            (
                r#"{"model":7,"messages":[],"max_tokens":1}"#,
                MetaError::WrongType("model"),
            ),
            (
                r#"{"model":"m","messages":{},"max_tokens":1}"#,
                MetaError::WrongType("messages"),
            ),
            (
                r#"{"model":"m","messages":[],"max_tokens":-1}"#,
                MetaError::WrongType("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[],"max_tokens":1.5}"#,
                MetaError::WrongType("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[],"max_tokens":null}"#,
                MetaError::WrongType("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[],"max_tokens":1,"stream":"yes"}"#,
                MetaError::WrongType("stream"),
            ),
            (
                r#"{"model":"a","model":"b","messages":[],"max_tokens":1}"#,
                MetaError::Duplicate("model"),
            ),
            ("[]", MetaError::NotObject),
        ];
        for (body, want) in cases {
            assert_eq!(meta(body), Err(want), "{body}");
        }
        assert!(matches!(meta("{\"model\":"), Err(MetaError::NotJson(_))));
    }

    /// A recorded stream shape (wire-protocol A5): preamble, content, usage, terminal.
    const STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );

    #[test]
    fn recorded_stream_is_classified_by_event_name() {
        use StreamEventKind::*;
        let kinds: Vec<_> = events(STREAM).iter().map(classify).collect();
        assert_eq!(
            kinds,
            [
                Preamble, Preamble, Preamble, Content, Other, Other, Terminal
            ]
        );
    }

    /// One event each: named events are classified by their name, unnamed ones by the type in
    /// their data.
    #[test]
    fn error_unknown_and_unnamed_events() {
        use StreamEventKind::*;
        for (event, want) in [
            (
                "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n",
                Error,
            ),
            (
                "event: some_future_event\ndata: {\"type\":\"content_block_delta\"}\n\n",
                Other,
            ),
            (
                "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
                Content,
            ),
            ("data: {\"type\":\"message_stop\"}\n\n", Terminal),
            (
                "data: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"}}\n\n",
                Error,
            ),
            ("data: not json\n\n", Other),
        ] {
            let kinds: Vec<_> = events(event).iter().map(classify).collect();
            assert_eq!(kinds, [want], "{event}");
        }
    }

    #[test]
    fn deeply_nested_values_are_skipped_without_a_depth_limit() {
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let body =
            format!("{{\"model\":\"m\",\"max_tokens\":1,\"messages\":{deep},\"tools\":{deep}}}");
        let m = parse_request(body.as_bytes());
        assert_eq!(m.map(|m| m.approx_input_tokens), Ok(5000));
    }
}

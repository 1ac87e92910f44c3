//! The OpenAI Responses API (SPEC §11): its paths (`POST /v1/responses`, the count, and the
//! stored-response endpoints), the request fields that route, meter and admit a call, the class
//! of each semantic stream event (`event:` + `data:` with `type`; no `[DONE]`), usage, and its
//! errors (the OpenAI envelope, and its own `error` / `response.failed` events).
//!
//! Its callers are routed like the other OpenAI API (`[routing] openai`); an `openai` provider
//! with `responses = true` speaks it, any other step is reached through `crate::responses`.

mod errors;
mod lifecycle;
mod stream;

pub use lifecycle::Lifecycle;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{
    Dialect, ErrorFields, ErrorTable, Field, LocalError, MetaError, Operation, RequestMeta,
    StreamEventKind, read_fields_sized,
};
use crate::meter::Usage;
use crate::sse::SseEvent;

pub(crate) use stream::{event_type, usage_of_member};

/// The OpenAI Responses dialect.
pub struct OpenAiResponses;

impl Dialect for OpenAiResponses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn operation(&self, method: &Method, path: &str) -> Option<Operation> {
        match (method, path) {
            (&Method::POST, "/responses") => Some(Operation::Generate),
            (&Method::POST, "/responses/input_tokens") => Some(Operation::InputTokens),
            (m, p) => is_stored_response(m, p).then_some(Operation::StoredResponse),
        }
    }

    fn upstream_path(&self, op: Operation) -> Option<&'static str> {
        match op {
            Operation::Generate => Some("/v1/responses"),
            Operation::InputTokens => Some("/v1/responses/input_tokens"),
            // Built from the request's own path (it names the response id).
            Operation::StoredResponse => Some("/v1/responses"),
            Operation::CountTokens | Operation::Models | Operation::Model => None,
        }
    }

    fn parse_request(&self, body: &[u8]) -> Result<RequestMeta, MetaError> {
        parse_request(body)
    }

    fn max_tokens_keys(&self) -> &'static [&'static str] {
        &["max_output_tokens"]
    }

    fn classify(&self, ev: &SseEvent) -> StreamEventKind {
        stream::classify(ev)
    }

    fn usage_of_body(&self, body: &[u8]) -> Option<Usage> {
        stream::usage_of_body(body)
    }

    fn observe_usage(&self, ev: &SseEvent, seen: &mut Option<Usage>) -> bool {
        // A terminal event's usage that cannot be read leaves `seen` empty: unmetered.
        if let Some(u) = stream::usage_of_event(ev) {
            *seen = Some(u);
        }
        true
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

/// `GET`/`DELETE /responses/{id}`, `POST …/{id}/cancel`, `GET …/{id}/input_items`.
fn is_stored_response(method: &Method, path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/responses/") else {
        return false;
    };
    let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
    let known = matches!(
        (method, action),
        (&Method::GET | &Method::DELETE, "")
            | (&Method::POST, "cancel")
            | (&Method::GET, "input_items")
    );
    // Ids are path segments of safe characters: nothing that could reshape the path.
    let safe = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    known && safe
}

/// Reads `model` (required), `stream`, `max_output_tokens`; the input estimate is the bytes of
/// `input`, `instructions` and `tools` / 4. `input` may be absent (a stored prompt).
fn parse_request(body: &[u8]) -> Result<RequestMeta, MetaError> {
    let ([model, stream, max_output, input, previous], approx_input_tokens) = read_fields_sized(
        body,
        [
            "model",
            "stream",
            "max_output_tokens",
            "input",
            "previous_response_id",
        ],
        &["input", "instructions", "tools"],
    )?;
    // One allocation, shared from here on (the journal entry takes the same string).
    let model = std::sync::Arc::<str>::from(model.string("model")?.as_ref());
    let stream = stream.opt_bool("stream")?;
    let max_tokens = max_output.opt_u64("max_output_tokens")?;
    if !matches!(
        input,
        Field::Absent | Field::Null | Field::Str(_) | Field::Array
    ) {
        return Err(MetaError::WrongType("input"));
    }
    // Any other type would be forwarded, or read as no earlier turn: the conversation lost
    // without a word.
    if !matches!(previous, Field::Absent | Field::Null | Field::Str(_)) {
        return Err(MetaError::WrongType("previous_response_id"));
    }
    Ok(RequestMeta {
        model,
        stream,
        max_tokens,
        include_usage: false,
        approx_input_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_model_stream_and_max_output_tokens() {
        let body = br#"{"model":"gpt-5","input":"abcd","stream":true,"max_output_tokens":50}"#;
        let meta = parse_request(body);
        assert_eq!(
            meta.map(|m| (m.model, m.stream, m.max_tokens, m.approx_input_tokens)),
            Ok(("gpt-5".into(), true, Some(50), 2))
        );
        assert_eq!(
            parse_request(br#"{"input":"x"}"#),
            Err(MetaError::Missing("model"))
        );
        assert_eq!(
            parse_request(br#"{"model":"m","input":5}"#),
            Err(MetaError::WrongType("input"))
        );
        for prior in ["5", "{}", "[\"resp_1\"]", "true"] {
            let body = format!(r#"{{"model":"m","input":"x","previous_response_id":{prior}}}"#);
            assert_eq!(
                parse_request(body.as_bytes()),
                Err(MetaError::WrongType("previous_response_id")),
                "{prior}"
            );
        }
        assert!(
            MetaError::WrongType("previous_response_id")
                .to_string()
                .ends_with("must be a string or null")
        );
        for prior in ["null", "\"resp_1\""] {
            let body = format!(r#"{{"model":"m","input":"x","previous_response_id":{prior}}}"#);
            assert!(parse_request(body.as_bytes()).is_ok(), "{prior}");
        }
    }

    #[test]
    fn paths_name_their_operations() {
        use Operation::{Generate, InputTokens, StoredResponse as Stored};
        let cases = [
            ("POST /responses", Some(Generate)),
            ("POST /responses/input_tokens", Some(InputTokens)),
            ("GET /responses/resp_1", Some(Stored)),
            ("DELETE /responses/resp_1", Some(Stored)),
            ("POST /responses/resp_1/cancel", Some(Stored)),
            ("GET /responses/resp_1/input_items", Some(Stored)),
            ("GET /responses", None),
            ("POST /responses/resp_1", None),
            ("GET /responses/a.b", None),
            ("GET /responses/resp_1/other", None),
        ];
        for (line, want) in cases {
            let (m, p) = line.split_once(' ').unwrap_or_default();
            let m = Method::from_bytes(m.as_bytes()).unwrap_or_default();
            assert_eq!(OpenAiResponses.operation(&m, p), want, "{line}");
        }
    }

    #[test]
    fn its_error_table_is_openais() {
        let chat = super::super::openai_chat::OpenAiChat;
        assert!(std::ptr::eq(OpenAiResponses.errors(), chat.errors()));
    }
}

//! Everything legate knows of each wire API lives in that API's module, a [`Dialect`]: its
//! inbound paths, the request fields legate reads (model, stream, max_tokens, the size of the
//! prompt), the class of each streamed event, usage, its one error type↔status table, and how
//! legate's own errors and in-stream error events are written in it. The rest of the proxy asks
//! the dialect of an [`ApiKind`] and never matches on the API itself.
//!
//! Adding an API: a module implementing [`Dialect`], a variant of [`ApiKind`], and its line in
//! [`ApiKind::dialect`] and [`ApiKind::ALL`] (the registry). Translation to and from the other
//! APIs lives in `translate`.
//!
//! Bodies are read in one serde pass that borrows from the bytes and skips everything it does
//! not need; they are never re-serialised.

pub mod anthropic;
pub mod errors;
mod fields;
pub mod openai_chat;
pub mod openai_responses;

use std::fmt;

use bytes::Bytes;
use http::{Method, StatusCode};

pub use errors::{ErrorClass, ErrorFields, ErrorTable, LocalError};
pub(crate) use fields::{
    Field, PROMPT_KEYS, has_usage_object, read_fields, read_fields_sized, scan_prompt,
};

use crate::meter::Usage;
use crate::sse::SseEvent;

/// The wire APIs legate speaks, inbound and upstream. A provider's `kind` is Anthropic or
/// OpenAI; a step speaks the Responses API when its `openai` provider serves it
/// (`responses = true`, `Upstream::speaks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiKind {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Chat Completions.
    OpenAi,
    /// The OpenAI Responses API (OpenAI's error envelope, semantic event streams).
    Responses,
}

impl ApiKind {
    /// Every API, in the order inbound paths are matched.
    pub const ALL: [ApiKind; 3] = [ApiKind::Anthropic, ApiKind::OpenAi, ApiKind::Responses];

    /// The registry: the dialect that knows this API.
    pub fn dialect(self) -> &'static dyn Dialect {
        match self {
            ApiKind::Anthropic => &anthropic::Anthropic,
            ApiKind::OpenAi => &openai_chat::OpenAiChat,
            ApiKind::Responses => &openai_responses::OpenAiResponses,
        }
    }

    /// The name in metric labels (`api`) and, for a provider kind, in config
    /// (`providers.*.kind`).
    pub fn as_str(self) -> &'static str {
        self.dialect().name()
    }
}

impl fmt::Display for ApiKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an inbound path asks of legate, in whichever API it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A model call: Anthropic `POST /v1/messages`, OpenAI `POST /v1/chat/completions`,
    /// `POST /v1/responses`.
    Generate,
    /// Anthropic `POST /v1/messages/count_tokens`: forwarded, never metered.
    CountTokens,
    /// `GET /v1/models`: answered from config.
    Models,
    /// `GET /v1/models/{id}`: one configured model, answered from config in the caller's
    /// shape (read from its headers).
    Model,
    /// `POST /v1/responses/input_tokens`: forwarded to the route's first step when it speaks
    /// the Responses API, else estimated locally; never metered.
    InputTokens,
    /// `GET`/`DELETE /v1/responses/{id}`, `POST …/{id}/cancel`, `GET …/{id}/input_items`:
    /// answered from the conversation store, or forwarded to the provider that keeps it.
    StoredResponse,
}

/// Everything legate knows of one wire API. Implementations are stateless unit structs; the
/// state of a stream being watched (its usage so far) is passed in.
pub trait Dialect: Sync {
    /// The API's name in config and metric labels.
    fn name(&self) -> &'static str;

    /// The operation a normalised inbound path (no `/v1` prefix, no trailing slash) names.
    fn operation(&self, method: &Method, path: &str) -> Option<Operation>;

    /// The upstream path of an operation on a provider of this API (None: it has none).
    fn upstream_path(&self, op: Operation) -> Option<&'static str>;

    /// Reads the fields legate needs from a request body of this API.
    fn parse_request(&self, body: &[u8]) -> Result<RequestMeta, MetaError>;

    /// The top-level keys that carry the output-token cap, all rewritten when a step caps it.
    fn max_tokens_keys(&self) -> &'static [&'static str];

    /// The class of one streamed event.
    fn classify(&self, ev: &SseEvent) -> StreamEventKind;

    /// Usage of a whole (non-streaming) answer; None without a usage object.
    fn usage_of_body(&self, body: &[u8]) -> Option<Usage>;

    /// Folds one streamed event into the usage seen so far (only events that carry usage are
    /// parsed).
    /// Folds one stream event's usage into `seen`; false when the event carried usage that
    /// cannot be read and leaves the whole stream's unknown (it is then unmetered, its
    /// reservation kept): Anthropic's deltas are parts of one running total.
    fn observe_usage(&self, ev: &SseEvent, seen: &mut Option<Usage>) -> bool;

    /// The API's one error type↔status table.
    fn errors(&self) -> &'static ErrorTable;

    /// The type, code and message of an error body or error event data of this API.
    fn read_error(&self, body: &[u8]) -> Option<ErrorFields>;

    /// legate's own error as a whole response body of this API.
    fn error_body(&self, e: LocalError<'_>, request_id: &str) -> Bytes;

    /// legate's own error as an in-stream error event of this API (what the SDKs raise).
    fn stream_error_event(&self, e: LocalError<'_>) -> Bytes;

    /// An error event that arrived before any content, as the whole error response the caller
    /// gets instead (it has seen nothing yet): the status its type stands for, and its body.
    fn error_event_response(&self, data: &str) -> (StatusCode, Bytes);
}

/// Whether an error body says the account's quota or spend limit is exhausted (OpenAI
/// `insufficient_quota`, Anthropic `enforced_spend_limit_reached`): waiting does not fix it.
/// Read by every dialect, since a step may speak any API.
pub fn is_quota_exhaustion(body: &[u8]) -> bool {
    ApiKind::ALL.iter().any(|k| {
        let d = k.dialect();
        d.read_error(body).is_some_and(|f| {
            d.errors()
                .class_of(f.error_type.as_deref(), f.code.as_deref())
                == Some(ErrorClass::Billing)
        })
    })
}

/// What legate reads from a request body, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMeta {
    /// Shared with the request's journal entry instead of copied into it.
    pub model: std::sync::Arc<str>,
    pub stream: bool,
    /// Anthropic `max_tokens`; OpenAI `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u64>,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    /// Cheap estimate: bytes of the messages, system and tools values / 4, rounded up.
    pub approx_input_tokens: u64,
}

/// Why a request body cannot be served. Messages name the field, never echo body content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    /// Not valid JSON; carries the parser's description (position, not content).
    NotJson(String),
    /// Valid JSON, but not an object.
    NotObject,
    /// A required field is absent.
    Missing(&'static str),
    /// A field has the wrong JSON type (or an out-of-range number).
    WrongType(&'static str),
    /// A field legate reads appears more than once: legate and the provider could read
    /// different values (routing and metering by one model, serving by another).
    Duplicate(&'static str),
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::NotJson(e) => write!(f, "the request body is not valid JSON: {e}"),
            MetaError::NotObject => f.write_str("the request body must be a JSON object"),
            MetaError::Missing(field) => {
                write!(f, "the request body lacks the required field `{field}`")
            }
            MetaError::WrongType(field) => {
                write!(f, "the field `{field}` must be {}", expected_type(field))
            }
            MetaError::Duplicate(field) => write!(
                f,
                "the field `{field}` appears more than once in the request body; send it once"
            ),
        }
    }
}

impl std::error::Error for MetaError {}

/// The JSON type each field legate reads must have, for error messages.
fn expected_type(field: &str) -> &'static str {
    match field {
        "model" => "a string",
        "messages" => "an array",
        "stream_options" => "an object",
        "stream" | "stream_options.include_usage" => "true or false",
        "input" => "a string or an array of items",
        "previous_response_id" => "a string or null",
        _ => "a non-negative integer",
    }
}

/// Classification of one SSE event of a response stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEventKind {
    /// message_start, content_block_start, ping, role-only chunks: before the commit point.
    Preamble,
    /// The first kind of event that carries content: Anthropic content_block_delta; OpenAI a
    /// chunk whose choice delta has non-empty content, refusal or tool_calls.
    Content,
    /// message_delta / content_block_stop / OpenAI finish chunk / usage chunk: after content,
    /// not terminal.
    Other,
    /// Anthropic message_stop; OpenAI `data: [DONE]`.
    Terminal,
    /// Anthropic `event: error`; OpenAI a data object with a truthy `error` key.
    Error,
}

//! The mock's script: what it answers, parsed once from JSON and validated up front so a bad
//! script is refused with a clear message instead of failing request by request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::Deserialize;

use super::parse;

/// A parsed, validated script: the reply queue, the fallback reply and the optional key check.
#[derive(Debug, Clone)]
pub struct Script {
    pub(crate) expect_key: Option<String>,
    pub(crate) replies: Vec<Arc<Reply>>,
    pub(crate) default: Arc<Reply>,
}

impl Default for Script {
    /// No key check, no queued replies, and a short text reply for everything.
    fn default() -> Script {
        Script {
            expect_key: None,
            replies: Vec::new(),
            default: Arc::new(Reply::default()),
        }
    }
}

impl Script {
    /// Parses and validates a script; the error names the offending field.
    pub fn from_json(text: &str) -> Result<Script, String> {
        parse::from_json(text)
    }

    /// Same as [`Script::from_json`] for a script already held as a JSON value.
    pub fn from_value(value: serde_json::Value) -> Result<Script, String> {
        parse::from_value(value)
    }

    /// Model names the script mentions, for the models listing.
    pub(crate) fn model_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let replies = self.replies.iter().chain(std::iter::once(&self.default));
        for reply in replies {
            let named = [reply.matcher.model.as_ref(), reply.model.as_ref()];
            for name in named.into_iter().flatten() {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names
    }
}

/// Which requests a queued reply applies to; every field that is set must equal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Matcher {
    pub model: Option<String>,
    pub path: Option<String>,
    pub stream: Option<bool>,
}

/// Token counts in Anthropic's naming; OpenAI usage is derived from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
}

impl Default for Usage {
    fn default() -> Usage {
        Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
        }
    }
}

/// One content block of a generated reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Block {
    Text {
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: Option<String>,
        name: String,
        #[serde(default = "empty_object")]
        input: serde_json::Value,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: String,
    },
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// A body sent as is instead of the generated one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawBody {
    /// A JSON value, serialised once at parse time.
    Json(Bytes),
    /// A JSON string in the script: its text is sent verbatim (e.g. an HTML error page).
    Text(Bytes),
}

/// What goes wrong with a stream after a number of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// An error event in the API's shape, then a clean end of the body.
    StreamError,
    /// The connection is aborted: no terminal event, no clean end of the body.
    Cut,
    /// Nothing more is sent, but the connection stays open.
    Hang,
}

/// A fault and the number of events sent before it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault {
    pub kind: FaultKind,
    pub after: usize,
}

/// One scripted reply, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub matcher: Matcher,
    /// Uses before the entry is spent; 0 means unlimited.
    pub times: u32,
    pub status: StatusCode,
    pub error_type: Option<String>,
    pub error_message: Option<String>,
    pub body: Option<RawBody>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub content: Vec<Block>,
    pub stop_reason: Option<String>,
    pub usage: Usage,
    pub model: Option<String>,
    pub delay: Duration,
    pub hang: bool,
    pub event_gap: Duration,
    pub fault: Option<Fault>,
    /// A stream ends cleanly without its terminal event (`message_stop`, `[DONE]`,
    /// `response.completed`).
    pub drop_terminal: bool,
}

impl Default for Reply {
    fn default() -> Reply {
        Reply {
            matcher: Matcher::default(),
            times: 1,
            status: StatusCode::OK,
            error_type: None,
            error_message: None,
            body: None,
            headers: Vec::new(),
            content: vec![Block::Text {
                text: "Hello from legate mock.".to_owned(),
            }],
            stop_reason: None,
            usage: Usage::default(),
            model: None,
            delay: Duration::ZERO,
            hang: false,
            event_gap: Duration::ZERO,
            fault: None,
            drop_terminal: false,
        }
    }
}

impl Reply {
    /// The stop reason to report: the scripted one, else `tool_use` when a tool is called.
    pub(crate) fn stop_reason(&self) -> &str {
        match &self.stop_reason {
            Some(reason) => reason,
            None if self
                .content
                .iter()
                .any(|b| matches!(b, Block::ToolUse { .. })) =>
            {
                "tool_use"
            }
            None => "end_turn",
        }
    }

    /// The error type to report for a non-2xx status or a mid-stream error.
    pub(crate) fn error_type(&self) -> &str {
        match &self.error_type {
            Some(t) => t,
            None => default_error_type(self.status.as_u16()),
        }
    }

    /// The error message to report, defaulting to one that fits the error type.
    pub(crate) fn error_message(&self) -> &str {
        match &self.error_message {
            Some(m) => m,
            None => default_error_message(self.error_type()),
        }
    }

    /// Type and message of a mid-stream error event: overloaded unless scripted otherwise.
    pub(crate) fn stream_error(&self) -> (&str, &str) {
        let error_type = self.error_type.as_deref().unwrap_or("overloaded_error");
        let message = match &self.error_message {
            Some(m) => m,
            None => default_error_message(error_type),
        };
        (error_type, message)
    }
}

/// The error type a provider reports for a status: the script speaks Anthropic's error names
/// for both APIs, so Anthropic's table decides.
pub(crate) fn default_error_type(status: u16) -> &'static str {
    crate::api::ApiKind::Anthropic
        .dialect()
        .errors()
        .type_for_status(status)
}

pub(crate) fn default_error_message(error_type: &str) -> &'static str {
    match error_type {
        "authentication_error" => "invalid x-api-key",
        "billing_error" => "Your credit balance is too low.",
        "permission_error" => {
            "Your API key does not have permission to use the specified resource."
        }
        "not_found_error" => "The requested resource could not be found.",
        "timeout_error" => "Request timed out while processing.",
        "conflict_error" => "The request conflicts with the current state.",
        "request_too_large" => "Request exceeds the maximum allowed number of bytes.",
        "rate_limit_error" => "Number of requests has exceeded your rate limit.",
        "overloaded_error" => "Overloaded",
        "api_error" => "Internal server error",
        _ => "Invalid request",
    }
}

//! Typed wire structs of the Anthropic Messages API, as far as translation reads or writes them.
//!
//! Deserialisation is lenient where the API adds fields over time: unknown top-level request
//! fields land in `extra` (so the fitting rules can name what they drop), unknown content block
//! types and stream event types become `Other` variants. Serialisation writes only what is set.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/messages` request body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Request {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Content>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Every field not modelled above (`thinking`, `top_k`, `cache_control`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Role {
    User,
    Assistant,
    /// A system entry inside `messages[]` (Claude Code sends them mid-conversation): it keeps
    /// its position, unlike the top-level `system`.
    System,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Message {
    pub role: Role,
    pub content: Content,
}

/// Message, system and tool-result content: a plain string or a list of blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block, in requests and responses alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Block {
    Text {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        citations: Option<Value>,
    },
    Image {
        source: Source,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    Document {
        source: Source,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Content>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_control: Option<Value>,
    },
    /// Extended thinking; its fields are never carried across.
    Thinking {},
    RedactedThinking {},
    /// Server tool calls and results (`server_tool_use`, `web_search_tool_result`, …) and any
    /// block type added later.
    #[serde(other)]
    Other,
}

/// Source of an image or document block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Source {
    Base64 {
        media_type: String,
        data: String,
    },
    Url {
        url: String,
    },
    /// Plain-text document.
    Text {
        media_type: String,
        data: String,
    },
    /// `file` (Files API), `content` and later kinds: nothing on the other side holds them.
    #[serde(other)]
    Other,
}

/// A tool definition: custom (`type` absent or `"custom"`) or a server tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Tool {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<Value>,
}

impl Tool {
    /// Server tools run on Anthropic's side (web search, code execution, …).
    pub(super) fn is_server_tool(&self) -> bool {
        !matches!(self.kind.as_deref(), None | Some("custom"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ToolChoice {
    Auto {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    None {},
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

/// A whole response (`type: "message"`), also the `message` of a `message_start` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct MessageResponse {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "message_type")]
    pub kind: String,
    #[serde(default = "assistant_role")]
    pub role: Role,
    #[serde(default)]
    pub content: Vec<Block>,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub stop_reason: Option<String>,
    #[serde(default)]
    pub stop_sequence: Option<String>,
    #[serde(default, deserialize_with = "super::lenient::or_default")]
    pub usage: Usage,
}

fn message_type() -> String {
    "message".to_owned()
}

fn assistant_role() -> Role {
    Role::Assistant
}

/// Token usage. `input_tokens` excludes cache reads and writes. In a `message_delta` every
/// field is optional and a present one overwrites the running value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_details: Option<OutputTokensDetails>,
}

impl Usage {
    /// Overwrites every field that `later` carries (stream usage holds running totals).
    pub(super) fn overwrite_with(&mut self, later: &Usage) {
        let fields = [
            (&mut self.input_tokens, later.input_tokens),
            (
                &mut self.cache_creation_input_tokens,
                later.cache_creation_input_tokens,
            ),
            (
                &mut self.cache_read_input_tokens,
                later.cache_read_input_tokens,
            ),
            (&mut self.output_tokens, later.output_tokens),
        ];
        for (mine, theirs) in fields {
            if theirs.is_some() {
                *mine = theirs;
            }
        }
        if later.output_tokens_details.is_some() {
            self.output_tokens_details
                .clone_from(&later.output_tokens_details);
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OutputTokensDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_tokens: Option<u64>,
}

/// One streamed event's `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum StreamEvent {
    MessageStart {
        message: MessageResponse,
    },
    ContentBlockStart {
        index: u64,
        content_block: Block,
    },
    ContentBlockDelta {
        index: u64,
        delta: Delta,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "super::lenient::option"
        )]
        usage: Option<Usage>,
    },
    MessageStop,
    Ping,
    Error {
        error: ErrorDetail,
    },
    #[serde(other)]
    Other,
}

impl StreamEvent {
    /// The SSE `event:` name the SDKs dispatch on (equal to the data's `type`).
    pub(super) fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
            StreamEvent::Error { .. } => "error",
            StreamEvent::Other => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    /// `thinking_delta`, `signature_delta`, `citations_delta` and later kinds.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct MessageDeltaBody {
    #[serde(default)]
    pub stop_reason: Option<String>,
    #[serde(default)]
    pub stop_sequence: Option<String>,
}

/// Error body: `{"type":"error","error":{...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ErrorDetail {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub message: String,
}

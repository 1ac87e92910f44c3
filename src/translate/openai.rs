//! Typed wire structs of OpenAI Chat Completions, as far as translation reads or writes them.
//!
//! Lenient like the Anthropic side: unknown request fields land in `extra`, unknown roles,
//! content parts and tool kinds become `Other`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/chat/completions` request body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Request {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Every field not modelled above (`logprobs`, `response_format`, `seed`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}

/// One message, tagged by `role`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub(super) enum Message {
    System {
        content: Content,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    Developer {
        content: Content,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    User {
        content: Content,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    Assistant {
        #[serde(default)]
        content: Option<Content>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Vec<ToolCall>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refusal: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    Tool {
        tool_call_id: String,
        content: Content,
    },
    /// The legacy `function` role and any later one.
    #[serde(other)]
    Other,
}

/// Message content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Part {
    Text {
        text: String,
    },
    ImageUrl {
        image_url: ImageUrl,
    },
    File {
        file: FileRef,
    },
    Refusal {
        refusal: String,
    },
    InputAudio {},
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ImageUrl {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct FileRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

/// An assistant's call of a function tool (`type` is `"function"`; `custom` calls have no
/// `function`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCall>,
}

pub(super) fn function_kind() -> String {
    "function".to_owned()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// A tool definition; only `function` tools have `function`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Tool {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionDef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `"auto" | "required" | "none"` or an object naming a tool (or a set of allowed tools).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum ToolChoice {
    Mode(String),
    Named(NamedChoice),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct NamedChoice {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<Name>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<AllowedTools>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Name {
    pub name: String,
}

/// `{"type":"allowed_tools","allowed_tools":{"mode":…,"tools":[{"type":"function",…}]}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct AllowedTools {
    pub mode: String,
    #[serde(default)]
    pub tools: Vec<NamedChoice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

/// A whole non-streaming response (`object: "chat.completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Completion {
    #[serde(default)]
    pub id: String,
    #[serde(default = "completion_object")]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::lenient::option"
    )]
    pub usage: Option<Usage>,
}

fn completion_object() -> String {
    "chat.completion".to_owned()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Choice {
    #[serde(default)]
    pub index: u64,
    pub message: ResponseMessage,
    /// Always written (as `null`): the SDKs' types carry it.
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ResponseMessage {
    #[serde(default = "assistant")]
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub refusal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

fn assistant() -> String {
    "assistant".to_owned()
}

impl Choice {
    /// The one choice of an assistant's answer: its text, its tool calls (left out when there
    /// are none) and why it stopped.
    pub(super) fn assistant(
        content: Option<String>,
        calls: Vec<ToolCall>,
        finish_reason: &str,
    ) -> Self {
        Choice {
            index: 0,
            message: ResponseMessage {
                role: assistant(),
                content,
                refusal: None,
                tool_calls: (!calls.is_empty()).then_some(calls),
            },
            logprobs: None,
            finish_reason: Some(finish_reason.to_owned()),
        }
    }
}

/// Token usage: `prompt_tokens` includes cached tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PromptTokensDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct CompletionTokensDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

/// One streamed `chat.completion.chunk`, or an error object sent in its place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Chunk {
    #[serde(default)]
    pub id: String,
    #[serde(default = "chunk_object")]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::lenient::option"
    )]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

fn chunk_object() -> String {
    "chat.completion.chunk".to_owned()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ChunkChoice {
    #[serde(default)]
    pub index: u64,
    #[serde(default)]
    pub delta: ChunkDelta,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct ChunkDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ToolCallDelta {
    #[serde(default)]
    pub index: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct FunctionDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// Error body: `{"error":{...}}` (some compatible servers send the object at the top level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ErrorDetail {
    #[serde(default)]
    pub message: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub param: Option<Value>,
    /// A string on OpenAI; some compatible servers put the HTTP status here as a number.
    #[serde(default)]
    pub code: Option<Value>,
}

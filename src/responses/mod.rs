//! The OpenAI Responses API served by steps that do not speak it (SPEC §11): pure translation
//! (bytes in, bytes out, no I/O) and the conversation store that makes
//! `previous_response_id` work on such steps.
//!
//! Chat Completions is the pivot. A Chat-only step (`kind = "openai"`, `responses = false`)
//! takes [`request::to_chat`]'s body as is; an Anthropic step takes it through the Chat →
//! Messages translation of `translate` (so every rule of that table applies too). Answers come
//! back the same way: Anthropic → Chat → Responses.
//!
//! # Mapping
//!
//! | Responses request | Chat Completions | losses and fitting rules |
//! |---|---|---|
//! | `instructions` | first message, role `system` | — (to Anthropic: `system`) |
//! | `input` string | one `user` message | — |
//! | message items (`user`, `assistant`, `system`, `developer`) | messages of that role | `input_text`/`output_text` → text parts (assistant/system text joined); `refusal` parts become text; `input_image` by URL → `image_url`; `input_file` → `file`; other parts dropped (`unsupported_parts`); an image by `file_id` is unfit |
//! | `function_call` items | assistant `tool_calls` (folded into the assistant message before them) | — |
//! | `function_call_output` items | `tool` messages | output parts that are not text dropped (`tool_output_media`) |
//! | `reasoning` items | — | dropped (`reasoning_items`): encrypted reasoning only OpenAI can read |
//! | `item_reference` items | — | unfit |
//! | built-in tool call items (`web_search_call`, `local_shell_call`, …) | — | dropped (`builtin_tool_items`) |
//! | `tools` of type `function` | `function` tools (name, description, parameters, strict) | built-in and custom tools dropped (`builtin_tools`) |
//! | `tool_choice` auto/none/required/{function} | the same | `allowed_tools` keeps its mode (the tool list is not narrowed); forcing a built-in tool is unfit |
//! | `parallel_tool_calls` | `parallel_tool_calls` | — (Anthropic: `disable_parallel_tool_use`) |
//! | `max_output_tokens` | `max_completion_tokens` | — (Anthropic: `max_tokens`, 4096 when unset) |
//! | `temperature`, `top_p`, `user` | the same | Anthropic: temperature clamped to 1 |
//! | `text.format` json_schema / json_object | `response_format` | to Anthropic a JSON schema becomes `output_config.format`; `json_object` makes an Anthropic step unfit (never served as free text); `text.verbosity` dropped (`verbosity`) |
//! | `reasoning.effort` | `reasoning_effort` | `reasoning.summary` dropped (`reasoning_summary`); Anthropic drops the effort (`reasoning_effort`) |
//! | `stream` | `stream` + `stream_options.include_usage` | — |
//! | `previous_response_id` | — | rebuilt from the store: the stored input and output items come before `input` |
//! | `store`, `include`, `metadata`, `truncation`, `prompt_cache_key`, `service_tier`, `safety_identifier`, `top_logprobs`, `max_tool_calls` | — | dropped, each by its name; anything else `unknown_fields` |
//! | `background: true`, `conversation`, `prompt` | — | unfit: they live on OpenAI's servers |
//!
//! | Chat answer | Responses object | notes |
//! |---|---|---|
//! | `message.content` / `refusal` | a `message` item with one `output_text` / `refusal` part | Anthropic thinking is lost on the way |
//! | `tool_calls` | `function_call` items (`call_id` = the tool call id, `id` = `fc_` + it) | arguments that are not a JSON object: a failure (SPEC §10), unless the output limit cut the call: an `incomplete` item, passed on as it came |
//! | `finish_reason` stop / tool_calls, length, content_filter | `status` completed, incomplete (`max_output_tokens`), incomplete (`content_filter`) | — |
//! | `usage` | `usage` (`cached_tokens`, `reasoning_tokens`) | both count cached tokens inside the input |
//! | `id`, `created` | `id` `resp_…` chosen by legate, `created_at` | the upstream id is not kept |
//!
//! The stream maps chunk by chunk (see `stream`). Errors keep the OpenAI envelope (an
//! Anthropic error is translated by `translate::error`).

pub mod memory;
pub mod owners;
pub mod request;
pub mod response;
pub mod store;
pub mod stream;
pub mod tombstones;

#[cfg(test)]
mod tests;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value};

pub use crate::translate::Target;
pub use response::ResponseCtx;
pub use store::{ConversationStore, Stored};
pub use stream::ResponsesStream;

use crate::translate::{self, Dir, Untranslatable};

/// The labels of what a translation dropped, each once, in the order first met (a closed set
/// of static names, fit for a metric label).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Labels(Vec<&'static str>);

impl Labels {
    pub fn add(&mut self, label: &'static str) {
        if !self.0.contains(&label) {
            self.0.push(label);
        }
    }

    pub fn into_vec(self) -> Vec<&'static str> {
        self.0
    }
}

/// The upstream body for a translated step, and what the fitting rules dropped.
pub fn request_for(
    target: Target,
    body: &[u8],
    target_model: &str,
) -> Result<(Vec<u8>, Vec<&'static str>), Untranslatable> {
    let (chat, labels) = request::to_chat(body, target_model)?;
    let chat_bytes = serde_json::to_vec(&chat)
        .map_err(|e| Untranslatable(format!("cannot serialise the translated request: {e}")))?;
    match target {
        Target::Chat => Ok((chat_bytes, labels.into_vec())),
        Target::Anthropic => {
            // Structured output follows the Chat → Messages rule: a JSON schema becomes
            // `output_config.format`, schema-less JSON makes the step unfit.
            let (out, more) =
                translate::request(Dir::OpenAiToAnthropic, &chat_bytes, target_model)?;
            let mut all = labels;
            for label in more {
                all.add(label);
            }
            Ok((out, all.into_vec()))
        }
    }
}

/// A whole (2xx) upstream answer as a response object.
pub fn response_for(
    target: Target,
    body: &[u8],
    ctx: &ResponseCtx,
) -> Result<Value, Untranslatable> {
    match target {
        Target::Chat => response::from_chat(body, ctx),
        Target::Anthropic => {
            let chat = translate::response(Dir::OpenAiToAnthropic, body)?;
            response::from_chat(&chat, ctx)
        }
    }
}

/// An upstream error in the OpenAI envelope: (status, body).
pub fn error_for(target: Target, status: u16, body: &[u8]) -> (u16, Vec<u8>) {
    match target {
        Target::Chat => (status, body.to_vec()),
        Target::Anthropic => translate::error(Dir::OpenAiToAnthropic, status, body),
    }
}

/// The stream translator for a step.
pub fn stream_for(target: Target, ctx: ResponseCtx) -> ResponsesStream {
    match target {
        Target::Chat => ResponsesStream::from_chat(ctx),
        Target::Anthropic => ResponsesStream::from_anthropic(ctx),
    }
}

/// The request's input as a list of items (a string is one user message).
pub fn input_items(body: &[u8]) -> Vec<Value> {
    Turn::read(body).input.into_values()
}

/// `input` as a list of items (a string is one user message).
fn items_of(input: Option<Value>) -> Vec<Value> {
    match input {
        Some(Value::String(text)) => vec![serde_json::json!({
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}],
        })],
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

/// A turn's input items as the conversation keeps them.
#[derive(Debug, Clone, PartialEq)]
pub enum Items {
    /// The request's own `input` array, its JSON text as the caller sent it: a first turn's
    /// items go into the store as they came, never built into values and written out again.
    Text(Bytes),
    Values(Vec<Value>),
}

impl Items {
    /// The items as values (the text parsed; it is an array from a body already read whole).
    pub fn into_values(self) -> Vec<Value> {
        match self {
            Items::Text(text) => serde_json::from_slice(&text).unwrap_or_default(),
            Items::Values(items) => items,
        }
    }

    /// Appends the items as one JSON array.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        match self {
            Items::Text(text) => out.extend_from_slice(text),
            // Writing a tree of values into a Vec cannot fail.
            Items::Values(items) => {
                let _ = serde_json::to_writer(out, items);
            }
        }
    }
}

/// What the conversation store needs of one request, read in a single pass over its body.
#[derive(Debug, PartialEq)]
pub struct Turn {
    /// `previous_response_id`, when it is a string.
    pub previous_response_id: Option<String>,
    /// `input` as a list of items ([`input_items`]).
    pub input: Items,
    /// `store` (true unless it is `false`): whether the answer is kept.
    pub store: bool,
}

impl Turn {
    /// A body that is not a JSON object has no earlier turn and no input, and is kept.
    ///
    /// One walk over the top-level members finds the three (nested values are skipped, never
    /// built); only a string `input` or a `previous_response_id` is decoded. A body the walk
    /// cannot read is read as JSON values instead, with the same outcome.
    pub fn read(body: &[u8]) -> Turn {
        Turn::read_with(body, Bytes::copy_from_slice)
    }

    /// [`Turn::read`] of a body held in shared bytes: an `input` array is a view of the body,
    /// not a copy.
    pub fn read_shared(body: &Bytes) -> Turn {
        Turn::read_with(body, |text| body.slice_ref(text))
    }

    fn read_with(body: &[u8], keep: impl FnOnce(&[u8]) -> Bytes) -> Turn {
        let (mut prior, mut input, mut store) = (None, None, None);
        let mut members = crate::splice::top_level_members(body);
        for m in members.by_ref() {
            // With duplicate keys, the last one (what serde_json's map and most parsers honour).
            let key = &body[m.key.clone()];
            if crate::splice::key_matches(key, "previous_response_id") {
                prior = Some(m.value);
            } else if crate::splice::key_matches(key, "input") {
                input = Some(m.value);
            } else if crate::splice::key_matches(key, "store") {
                store = Some(m.value);
            }
        }
        if members.is_malformed() {
            return Turn::read_values(body);
        }
        let input = match input.map(|span| &body[span]) {
            Some(text) if text.starts_with(b"[") => Items::Text(keep(text)),
            Some(text) if text.starts_with(b"\"") => {
                Items::Values(items_of(serde_json::from_slice(text).ok()))
            }
            _ => Items::Values(Vec::new()),
        };
        Turn {
            previous_response_id: prior
                .and_then(|span| serde_json::from_slice::<Option<String>>(&body[span]).ok())
                .flatten(),
            // A value span holds no whitespace around it: `false` is the literal.
            store: store.is_none_or(|span| &body[span] != b"false"),
            input,
        }
    }

    /// [`Turn::read`] through JSON values, for a body that is not a well-formed object.
    fn read_values(body: &[u8]) -> Turn {
        let Some(fields) = TurnFields::read(body) else {
            return Turn {
                previous_response_id: None,
                input: Items::Values(Vec::new()),
                store: true,
            };
        };
        Turn {
            previous_response_id: match fields.previous_response_id {
                Some(Value::String(id)) => Some(id),
                _ => None,
            },
            store: fields
                .store
                .as_ref()
                .and_then(Value::as_bool)
                .unwrap_or(true),
            input: Items::Values(items_of(fields.input)),
        }
    }
}

/// The three members a turn needs; only these are built into values, the rest is skipped.
#[derive(Deserialize)]
struct TurnFields {
    previous_response_id: Option<Value>,
    input: Option<Value>,
    store: Option<Value>,
}

impl TurnFields {
    fn read(body: &[u8]) -> Option<TurnFields> {
        // A derived struct would also accept an array; a request is an object.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        if let Ok(fields) = serde_json::from_slice(body) {
            return Some(fields);
        }
        // A member given twice is refused by the typed read; read as a map, the last one
        // counts, as it always did.
        let mut req: Map<String, Value> = serde_json::from_slice(body).ok()?;
        Some(TurnFields {
            previous_response_id: req.remove("previous_response_id"),
            input: req.remove("input"),
            store: req.remove("store"),
        })
    }
}

/// Items of one provider made fit for another, or for a translation: its reasoning items
/// (their ids, their encrypted content) are its own, which no other can read back, and the
/// ids of its output items name items only it holds (and, without their reasoning, that it
/// would refuse).
pub fn foreign(items: &mut Vec<Value>) {
    items.retain(|item| item["type"] != "reasoning");
    for item in items.iter_mut() {
        if let Some(fields) = item.as_object_mut()
            && matches!(
                fields.get("type").and_then(Value::as_str),
                Some("message" | "function_call")
            )
        {
            fields.remove("id");
        }
    }
}

/// The body with `previous_response_id` resolved: the earlier turn's input and output items
/// come before this request's input, and the field is removed. For a translated step (`to`
/// None) or a relaying one (`to` its provider) that cannot continue the response by its id.
pub fn rebuild(body: &[u8], prior: &Stored, to: Option<&str>) -> Result<Vec<u8>, Untranslatable> {
    let mut req: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| Untranslatable(format!("the body is not a valid Responses request: {e}")))?;
    let mut items: Vec<Value> = prior.input.iter().chain(prior.output()).cloned().collect();
    // Back to the provider whose items these are, its reasoning and ids go with them.
    if prior.provider.is_empty() || to != Some(prior.provider.as_str()) {
        foreign(&mut items);
    }
    items.extend(input_items(body));
    req.insert("input".into(), Value::Array(items));
    req.remove("previous_response_id");
    serde_json::to_vec(&req)
        .map_err(|e| Untranslatable(format!("cannot serialise the rebuilt request: {e}")))
}

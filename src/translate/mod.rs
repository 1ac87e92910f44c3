//! Translation between Anthropic Messages and OpenAI Chat Completions (SPEC §10): a caller of
//! one API served by a chain step of the other kind. Pure code: bytes in, bytes out, no I/O.
//! [`Xlate::between`] says which translation a step needs, this one or the Responses API's
//! (`crate::responses`, which pivots through Chat Completions and this module).
//!
//! [`request`] rewrites the caller's body for the upstream (re-serialised, `model` set to the
//! step's model) and names what the fitting rules dropped; [`response`] and [`error`] bring a
//! whole upstream answer back into the caller's shape; [`StreamTranslator`] does the same for a
//! stream, event by event. A request that cannot be served without something the other API
//! lacks is [`Untranslatable`]: it must not be sent to that step.
//!
//! # Mapping
//!
//! | Anthropic Messages | OpenAI Chat Completions | losses and fitting rules |
//! |---|---|---|
//! | `system` (string or text blocks) | first message, role `system` (string, or text parts) | OpenAI `system`/`developer` messages before the first turn are gathered into `system` (several become text blocks); their `name` is dropped |
//! | `messages[]` entries with role `system` (Claude Code sends them mid-conversation) | a `system` message at the same position | OpenAI `system`/`developer` messages after the first turn stay where they are too |
//! | user/assistant `content`: string | `content`: string | — |
//! | text blocks | text parts; a single text is sent as a plain string | a single text block and a string are the same content; `cache_control`, `citations` dropped |
//! | `image` block, base64 / url source | `image_url` part, `data:` URL / URL | `detail` other than `auto` dropped; Files-API image: untranslatable |
//! | `document` block, base64 (PDF) | `file` part with base64 `file_data`, `filename` = title | text documents become a text part (title dropped); by URL / file id: untranslatable |
//! | assistant `tool_use` blocks | assistant `tool_calls` (`arguments` = input as JSON string) | tool calls follow the text (no interleaving); in the history, arguments that are not a JSON object become `{}` (`invalid_tool_arguments`) |
//! | user `tool_result` blocks | `tool` messages (`tool_call_id`), before the rest of the user turn | `is_error` is carried as a `[tool error]` prefix of the text and restored from it; images in results dropped (`tool_result_images`); tool ids outside `[A-Za-z0-9_-]` get `_` |
//! | consecutive turns of one role | tool messages + user message | merged back into one Anthropic turn |
//! | final assistant turn (prefill) | final assistant message | sent as it is, in both directions, and counted (`assistant_prefill`): OpenAI answers after it, where Anthropic continues it |
//! | `tools` (custom: name, description, `input_schema`) | `tools` (`function`: name, description, `parameters`) | server tools (`type` other than `custom`) dropped (`server_tools`); OpenAI non-function tools dropped (`custom_tools`), `strict` dropped; no `parameters` = empty object schema |
//! | `tool_choice` auto / any / none / tool{name} | `"auto"` / `"required"` / `"none"` / `{type:function,function:{name}}` | forcing a server tool (by name, or `any` with only server tools) or an OpenAI custom tool: untranslatable; OpenAI `allowed_tools` narrows `tools` to the allowed ones |
//! | `disable_parallel_tool_use: true` | `parallel_tool_calls: false` | dropped with `none` |
//! | `stop_sequences` | `stop` (string or list) | — |
//! | `max_tokens` | `max_completion_tokens` | OpenAI → Anthropic: `max_completion_tokens`, else `max_tokens`, else 4096 |
//! | `temperature`, `top_p` | `temperature`, `top_p` | OpenAI temperature above 1 is clamped to 1 (`temperature_clamped`); to Anthropic, `top_p` given with `temperature` is dropped (`top_p`): Claude's newer models refuse the two together |
//! | `metadata.user_id` | `user` | — |
//! | `stream` | `stream` (+ `stream_options.include_usage: true` upstream) | — |
//! | `output_config.format` (or the beta `output_format`) `{type: json_schema, schema}` | `response_format: {type: json_schema, json_schema: {name: "output", schema}}` | structured output is carried both ways; OpenAI `json_object` (no schema) or another format type: untranslatable, never served as free text; other `output_config` keys dropped (`output_config`) |
//! | `thinking` config, thinking blocks and signatures, `top_k`, `cache_control`, `service_tier`, `container`, `mcp_servers`, `context_management`, `output_config` keys other than `format`, … | — | dropped, each listed by name; unknown fields as `unknown_fields` |
//! | — | `n` > 1 | untranslatable |
//! | — | `logprobs`, `top_logprobs`, `audio`, `modalities`, `prediction`, `seed`, penalties, `logit_bias`, `reasoning_effort`, `store`, `metadata`, `service_tier`, `prompt_cache_key`, `safety_identifier`, … | dropped, each listed by name; `input_audio` parts and message `name`s too |
//!
//! Responses:
//!
//! | Anthropic message | `chat.completion` | losses |
//! |---|---|---|
//! | `id` `msg_X` | `id` `chatcmpl-X` | — (either prefix is swapped for the other) |
//! | `model` | `model` | echoed from the upstream |
//! | text blocks | `message.content` (joined) | several text blocks become one; thinking and server-tool blocks dropped |
//! | — | `message.refusal` | becomes text, and `stop` becomes `refusal` |
//! | `tool_use` blocks | `message.tool_calls` | arguments that are not a JSON object: the answer is a failure (retried, then the next step; at the end 502 `upstream_answer_unusable` naming the tool), unless the output limit cut the call (finish `length`): served once, `{}` under `max_tokens` |
//! | `stop_reason` end_turn, stop_sequence / max_tokens / tool_use / refusal | `finish_reason` stop / length / tool_calls / content_filter | `stop_sequence` comes back as `end_turn` and the matched `stop_sequence` is lost; `stop` with tool calls comes back as `tool_use` (so an agent loop runs them) |
//! | `usage` input + cache_read + cache_write | `prompt_tokens` (`cached_tokens` = cache_read, `cache_write_tokens` = cache_write) | — (SPEC §6) |
//! | `usage.output_tokens` (`thinking_tokens`) | `completion_tokens` (`reasoning_tokens`) | `total_tokens` is recomputed |
//! | `stop_reason` pause_turn, model_context_window_exceeded | `finish_reason` stop, length | come back as `end_turn`, `max_tokens` |
//! | — | `created` | set from the clock |
//! | an upstream body that is not a message / has no choice | | untranslatable |
//!
//! Streams carry the same mapping event by event:
//!
//! | Anthropic events | OpenAI chunks | notes |
//! |---|---|---|
//! | `message_start` (id, model, usage) | role chunk (`role: assistant`, `content: ""`) | from OpenAI: message_start is written at the first chunk, with zero usage unless that chunk reports usage |
//! | text block start + `text_delta`s | `content` (and `refusal`) deltas | from OpenAI: a text block opens at the first non-empty content |
//! | `tool_use` block start (id, name) + `input_json_delta`s | `tool_calls` deltas, one `index` per call: the first with id, type, name and the first `arguments` fragment (the block's start is preamble, so it waits for that fragment or the block's end: a cut before it is retried), then the other fragments | from OpenAI: a block opens at the first fragment carrying an id; calls must arrive one after another (a fragment with a new id at an index already used starts a new call: Ollama numbers every call 0, and some servers send no index), and a fragment for an already closed call ends the stream with an `api_error` event instead of a corrupt input; a call whose id never came gets `call_legate_<index>`. Either way, a call's arguments are checked when its block ends: not a JSON object, and the stream ends with an `api_error` event naming the tool instead of a clean end, unless the output limit cut the call (then passed on as it came, under `max_tokens` / `length`; from Anthropic the verdict waits for the message's stop reason). From OpenAI, a tool call that comes before any other content is held until its check passes, so a broken first call fails before the commit point and is retried or falls back |
//! | `message_delta` (stop_reason, cumulative usage) + `message_stop` | finish chunk + usage chunk (only when the OpenAI caller asked for `include_usage`) + `[DONE]` | from OpenAI: written at `[DONE]`, with the full usage of the final usage chunk (translated per SPEC §6) |
//! | `ping` | SSE comment `: ping` | OpenAI has no ping event; the comment keeps idle watchdogs fed. Either way, whole upstream events or comments that give the caller nothing (an OpenAI server's keep-alive comments, thinking or `reasoning_content` the translation drops) are answered with a keep-alive of the caller's API, at most one a second (or per half the step's `idle_timeout`): `ping` after `message_start` for an Anthropic caller (its SDKs refuse any event before it; a comment before), the comment for an OpenAI caller, either API's. So neither the caller's idle watchdog nor legate's `idle_timeout` takes a model that reasons at length for a stalled stream |
//! | thinking / signature / citations deltas, server-tool blocks | — | dropped |
//! | `event: error` | `data: {"error":{…}}` | nothing is written after it |
//!
//! The caller's terminal is written only when the upstream's terminal is read (`[DONE]`,
//! `message_stop`): an upstream cut stays a cut, for the proxy to end with its own error event.
//!
//! Errors keep the HTTP status and the upstream message. The type maps by code, then type, then
//! status, through what it means (`api::ErrorClass`, each side's row in its dialect's table):
//!
//! | Anthropic `error.type` | OpenAI `error.type` / `code` |
//! |---|---|
//! | invalid_request_error | invalid_request_error / null |
//! | authentication_error | authentication_error / invalid_api_key |
//! | permission_error | permission_error / permission_denied (also from unsupported_country_region_territory and type request_forbidden) |
//! | billing_error | insufficient_quota / insufficient_quota |
//! | not_found_error | invalid_request_error / not_found (also from model_not_found) |
//! | conflict_error | invalid_request_error / conflict |
//! | request_too_large | invalid_request_error / request_too_large |
//! | rate_limit_error | rate_limit_error / rate_limit_exceeded (also from types requests and tokens) |
//! | api_error | server_error / null |
//! | overloaded_error | server_error / overloaded |
//! | timeout_error | server_error / timeout |
//! | by status (Anthropic's table), for any other OpenAI type | any other Anthropic type passes as the OpenAI type |
//!
//! Drop labels returned by [`request`] (a closed set, fit for a metric label): the field names
//! of the two tables above (`thinking`, `top_k`, `cache_control`, `service_tier`, `container`,
//! `mcp_servers`, `context_management`, `inference_geo`, `output_config`;
//! `logprobs`, `top_logprobs`, `audio`, `modalities`, `prediction`, `seed`,
//! `frequency_penalty`, `presence_penalty`, `logit_bias`, `reasoning_effort`, `store`,
//! `metadata`, `web_search_options`, `verbosity`, `service_tier`, `prompt_cache_key`,
//! `prompt_cache_retention`, `safety_identifier`, `functions`, `function_call`) and
//! `unknown_fields`, `thinking_blocks`, `citations`, `server_tools`, `custom_tools`,
//! `custom_tool_calls`, `strict`, `tool_result_images`, `document_titles`, `misplaced_media`,
//! `unsupported_blocks`, `unsupported_parts`, `input_audio`, `image_detail`, `message_names`,
//! `function_messages`, `empty_messages`, `invalid_tool_arguments`,
//! `assistant_prefill`, `temperature_clamped`, `top_p`.

mod anthropic;
mod error;
mod fitting;
mod lenient;
mod mapping;
mod openai;
mod request_anthropic;
mod request_openai;
mod response;
mod stream;
mod stream_anthropic;
mod stream_openai;
mod structured;

#[cfg(test)]
mod tests;

use std::fmt;

/// A tool's name streamed in pieces is kept to this many bytes (APIs allow 64 or 128
/// characters): an upstream sending pieces without end cannot grow it further (SPEC §14).
pub(crate) const MAX_TOOL_NAME: usize = 1 << 10;
/// A tool call's id longer than this ends a translated stream with an error: ids are kept
/// for the whole answer (every provider's are a few dozen characters), and an upstream's
/// megabyte-long ones would otherwise be kept, and written, by the thousand.
pub(crate) const MAX_TOOL_ID: usize = 1 << 10;
/// Tool calls in one answer beyond this end a translated stream with an error (a bounded
/// list: no provider's answer comes near it).
pub(crate) const MAX_CALLS: usize = 1024;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::api::ApiKind;

pub use stream::StreamTranslator;

/// Which way a call is translated: the caller's API → the upstream's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// An Anthropic Messages caller served by an OpenAI-compatible step.
    AnthropicToOpenAi,
    /// An OpenAI Chat Completions caller served by an Anthropic step.
    OpenAiToAnthropic,
}

impl Dir {
    /// The direction from a caller of one API to an upstream of another; None when legate
    /// has no translation between them (or they are the same API).
    pub fn between(caller: ApiKind, upstream: ApiKind) -> Option<Dir> {
        match (caller, upstream) {
            (ApiKind::Anthropic, ApiKind::OpenAi) => Some(Dir::AnthropicToOpenAi),
            (ApiKind::OpenAi, ApiKind::Anthropic) => Some(Dir::OpenAiToAnthropic),
            _ => None,
        }
    }

    /// The API of the upstream this direction calls.
    pub fn upstream(self) -> ApiKind {
        match self {
            Dir::AnthropicToOpenAi => ApiKind::OpenAi,
            Dir::OpenAiToAnthropic => ApiKind::Anthropic,
        }
    }
}

/// Which kind of step a translated Responses call goes to (`crate::responses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// An OpenAI-compatible server without the Responses API.
    Chat,
    Anthropic,
}

/// How a chain step is reached from the caller's API, given the API the step speaks: the
/// registry of translations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xlate {
    /// The step speaks the caller's API: bytes pass through.
    None,
    /// Anthropic Messages ↔ Chat Completions (SPEC §10, this module).
    Classic(Dir),
    /// A Responses caller served by a step without the Responses API (SPEC §11,
    /// `crate::responses`).
    Responses(Target),
}

impl Xlate {
    /// The translation from a caller of `caller` to a step speaking `upstream`.
    pub fn between(caller: ApiKind, upstream: ApiKind) -> Xlate {
        match (caller, upstream) {
            (ApiKind::Responses, ApiKind::OpenAi) => Xlate::Responses(Target::Chat),
            (ApiKind::Responses, ApiKind::Anthropic) => Xlate::Responses(Target::Anthropic),
            (caller, upstream) => {
                Dir::between(caller, upstream).map_or(Xlate::None, Xlate::Classic)
            }
        }
    }

    pub fn translating(self) -> bool {
        self != Xlate::None
    }
}

/// Why a request cannot be sent to a step of the other kind (a forced server tool, …), or why
/// an upstream answer cannot be carried back. The text is fit for the caller and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untranslatable(pub String);

impl fmt::Display for Untranslatable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Untranslatable {}

/// Translates a caller's request body into the upstream API, setting `model` to
/// `target_model`. Returns the new body and the labels of what the fitting rules dropped (for
/// logs and metrics; a bounded set of static names).
pub fn request(
    dir: Dir,
    body: &[u8],
    target_model: &str,
) -> Result<(Vec<u8>, Vec<&'static str>), Untranslatable> {
    match dir {
        Dir::AnthropicToOpenAi => typed(body, "Anthropic Messages", |req| {
            request_openai::convert(req, target_model)
        }),
        Dir::OpenAiToAnthropic => typed(body, "Chat Completions", |req| {
            request_anthropic::convert(req, target_model)
        }),
    }
}

/// The frame of a request translation, the same both ways: the caller's body parsed as its
/// API's typed request, converted, and the result serialised.
fn typed<In: serde::de::DeserializeOwned, Out: serde::Serialize>(
    body: &[u8],
    api: &str,
    convert: impl FnOnce(In) -> Result<(Out, fitting::Fitting), Untranslatable>,
) -> Result<(Vec<u8>, Vec<&'static str>), Untranslatable> {
    let req: In = serde_json::from_slice(body)
        .map_err(|e| Untranslatable(format!("the body is not a valid {api} request: {e}")))?;
    let (out, fit) = convert(req)?;
    let bytes = serde_json::to_vec(&out)
        .map_err(|e| Untranslatable(format!("cannot serialise the translated request: {e}")))?;
    Ok((bytes, fit.into_labels()))
}

/// Translates a whole non-streaming upstream response (2xx) back into the caller's API.
pub fn response(dir: Dir, upstream_body: &[u8]) -> Result<Vec<u8>, Untranslatable> {
    match dir {
        Dir::AnthropicToOpenAi => response::to_anthropic(upstream_body),
        Dir::OpenAiToAnthropic => response::to_openai(upstream_body, now_unix_secs()),
    }
}

/// Translates an upstream error (status + body) into the caller's error shape: (status, body).
pub fn error(dir: Dir, status: u16, upstream_body: &[u8]) -> (u16, Vec<u8>) {
    match dir {
        Dir::AnthropicToOpenAi => error::to_anthropic(status, upstream_body),
        Dir::OpenAiToAnthropic => error::to_openai(status, upstream_body),
    }
}

/// Seconds since the epoch for OpenAI's `created` (Anthropic responses carry no timestamp).
fn now_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

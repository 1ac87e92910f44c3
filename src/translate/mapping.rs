//! The small value mappings shared by requests, responses and streams: ids, stop reasons,
//! usage (with the cached-token semantics of SPEC §6), data URLs and the tool-error marker.

use super::{anthropic as an, openai as oa};

const MSG_PREFIX: &str = "msg_";
const CHATCMPL_PREFIX: &str = "chatcmpl-";

/// `msg_X` → `chatcmpl-X`, so that the way back restores the upstream id exactly.
pub(super) fn openai_id(anthropic_id: &str) -> String {
    let rest = anthropic_id
        .strip_prefix(MSG_PREFIX)
        .unwrap_or(anthropic_id);
    format!("{CHATCMPL_PREFIX}{rest}")
}

/// `chatcmpl-X` → `msg_X`.
pub(super) fn anthropic_id(openai_id: &str) -> String {
    let rest = openai_id.strip_prefix(CHATCMPL_PREFIX).unwrap_or(openai_id);
    format!("{MSG_PREFIX}{rest}")
}

/// Anthropic accepts tool-use ids matching `^[a-zA-Z0-9_-]+$`; OpenAI-compatible servers are
/// looser. Other characters become `_` (deterministic, so a call and its result still match).
pub(super) fn anthropic_tool_id(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Anthropic `stop_reason` → OpenAI `finish_reason`.
pub(super) fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        // end_turn, stop_sequence, pause_turn, none yet, and reasons added later.
        _ => "stop",
    }
}

/// OpenAI `finish_reason` → Anthropic `stop_reason`. `has_tool_calls` repairs servers that
/// report `stop` for a turn that called tools: an Anthropic agent loop runs tools only on
/// `tool_use`; and ones that report `tool_calls` for a turn that called none, which would send
/// such a loop looking for `tool_use` blocks there are none of. An answer that carried `refusal` text (`refused`) and ends with a plain `stop`
/// (or none) is a refusal, streamed or not.
pub(super) fn stop_reason(
    finish_reason: Option<&str>,
    has_tool_calls: bool,
    refused: bool,
) -> &'static str {
    match finish_reason {
        None | Some("stop") if refused => "refusal",
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") if has_tool_calls => "tool_use",
        Some("content_filter") => "refusal",
        _ if has_tool_calls => "tool_use",
        _ => "end_turn",
    }
}

/// Anthropic usage → OpenAI usage: `prompt = input + cache_read + cache_write`,
/// `cached_tokens = cache_read`, `cache_write_tokens = cache_write`.
pub(super) fn openai_usage(usage: &an::Usage) -> oa::Usage {
    let input = usage.input_tokens.unwrap_or(0);
    let read = usage.cache_read_input_tokens.unwrap_or(0);
    let write = usage.cache_creation_input_tokens.unwrap_or(0);
    let output = usage.output_tokens.unwrap_or(0);
    let prompt = input.saturating_add(read).saturating_add(write);
    oa::Usage {
        prompt_tokens: prompt,
        completion_tokens: output,
        total_tokens: prompt.saturating_add(output),
        prompt_tokens_details: Some(oa::PromptTokensDetails {
            cached_tokens: Some(read),
            cache_write_tokens: Some(write),
        }),
        completion_tokens_details: usage
            .output_tokens_details
            .as_ref()
            .and_then(|d| d.thinking_tokens)
            .map(|n| oa::CompletionTokensDetails {
                reasoning_tokens: Some(n),
            }),
    }
}

/// OpenAI usage → Anthropic usage: the uncached input is what the prompt holds beyond cache
/// reads and writes.
pub(super) fn anthropic_usage(usage: &oa::Usage) -> an::Usage {
    let details = usage.prompt_tokens_details.as_ref();
    let read = details.and_then(|d| d.cached_tokens).unwrap_or(0);
    let write = details.and_then(|d| d.cache_write_tokens).unwrap_or(0);
    an::Usage {
        input_tokens: Some(
            usage
                .prompt_tokens
                .saturating_sub(read)
                .saturating_sub(write),
        ),
        cache_creation_input_tokens: Some(write),
        cache_read_input_tokens: Some(read),
        output_tokens: Some(usage.completion_tokens),
        output_tokens_details: usage
            .completion_tokens_details
            .as_ref()
            .and_then(|d| d.reasoning_tokens)
            .map(|n| an::OutputTokensDetails {
                thinking_tokens: Some(n),
            }),
    }
}

/// Whether tool-call arguments can be a tool input: a JSON object. Empty arguments are not
/// one (SPEC §10: never a clean end with `{}` as input; a model cut off before its arguments
/// leaves them empty too).
pub(super) fn is_json_object(arguments: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(arguments).is_ok_and(|v| v.is_object())
}

/// `data:<media>;base64,<data>`.
pub(super) fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

/// Splits a base64 data URL into (media type, data); anything else is `None`.
pub(super) fn parse_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media_type = meta.strip_suffix(";base64")?;
    Some((media_type, data))
}

/// OpenAI tool messages have no error flag: an Anthropic `is_error` result is carried as this
/// prefix of its text, and recognised on the way back.
pub(super) const TOOL_ERROR_MARKER: &str = "[tool error]";

/// Prefixes a tool result's first text with the marker.
pub(super) fn mark_error(text: &str) -> String {
    if text.is_empty() {
        TOOL_ERROR_MARKER.to_owned()
    } else {
        format!("{TOOL_ERROR_MARKER} {text}")
    }
}

/// The text without the marker, if it carries one.
pub(super) fn strip_error(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(TOOL_ERROR_MARKER)?;
    if rest.is_empty() {
        Some(rest)
    } else {
        rest.strip_prefix(' ')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_both_prefixes() {
        assert_eq!(openai_id("msg_01AbC"), "chatcmpl-01AbC");
        assert_eq!(anthropic_id("chatcmpl-01AbC"), "msg_01AbC");
        assert_eq!(anthropic_id(&openai_id("msg_x")), "msg_x");
        assert_eq!(openai_id("plain"), "chatcmpl-plain");
    }

    #[test]
    fn tool_ids_keep_allowed_characters_only() {
        assert_eq!(anthropic_tool_id("call_aB-9"), "call_aB-9");
        assert_eq!(anthropic_tool_id("fc.1:x"), "fc_1_x");
    }

    #[test]
    fn stop_reasons_map_both_ways() {
        for (anth, oai) in [
            ("end_turn", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
        ] {
            assert_eq!(finish_reason(Some(anth)), oai);
            assert_eq!(stop_reason(Some(oai), anth == "tool_use", false), anth);
        }
        assert_eq!(finish_reason(Some("stop_sequence")), "stop");
        assert_eq!(stop_reason(Some("stop"), true, false), "tool_use");
        assert_eq!(stop_reason(None, false, false), "end_turn");
        assert_eq!(stop_reason(Some("tool_calls"), false, false), "end_turn");
        assert_eq!(stop_reason(Some("stop"), false, true), "refusal");
        assert_eq!(stop_reason(Some("length"), false, true), "max_tokens");
    }

    #[test]
    fn usage_counts_cache_reads_and_writes_inside_the_prompt() {
        let anth = an::Usage {
            input_tokens: Some(10),
            cache_creation_input_tokens: Some(5),
            cache_read_input_tokens: Some(100),
            output_tokens: Some(7),
            output_tokens_details: None,
        };
        let oai = openai_usage(&anth);
        assert_eq!(oai.prompt_tokens, 115);
        assert_eq!(oai.total_tokens, 122);
        let details = oai.prompt_tokens_details.clone().unwrap_or_default();
        assert_eq!(details.cached_tokens, Some(100));
        assert_eq!(details.cache_write_tokens, Some(5));
        assert_eq!(anthropic_usage(&oai), anth);
    }

    #[test]
    fn data_urls_split_into_media_type_and_data() {
        let url = data_url("image/png", "iVBOR");
        assert_eq!(parse_data_url(&url), Some(("image/png", "iVBOR")));
        assert_eq!(parse_data_url("https://x/y.png"), None);
        assert_eq!(parse_data_url("data:image/png,raw"), None);
    }

    #[test]
    fn error_marker_round_trips() {
        assert_eq!(strip_error(&mark_error("boom")), Some("boom"));
        assert_eq!(strip_error(&mark_error("")), Some(""));
        assert_eq!(strip_error("boom"), None);
        assert_eq!(strip_error("[tool error]x"), None);
    }
}

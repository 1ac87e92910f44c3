//! The OpenAI Responses API as legate reads it (SPEC §11): the request fields that route, meter
//! and admit a call, the kind of each semantic stream event (`event:` + `data:` with `type`;
//! no `[DONE]`), and the usage of a response object.

use serde::Deserialize;

use super::{Field, MetaError, RequestMeta, StreamEventKind, read_fields};
use crate::splice;
use crate::sse::SseEvent;
use crate::usage::Usage;

/// Reads `model` (required), `stream`, `max_output_tokens`; the input estimate is the bytes of
/// `input`, `instructions` and `tools` / 4. `input` may be absent (a stored prompt).
pub fn parse_request(body: &[u8]) -> Result<RequestMeta, MetaError> {
    let [model, stream, max_output, input] =
        read_fields(body, ["model", "stream", "max_output_tokens", "input"])?;
    let model = model.string("model")?.into_owned();
    let stream = stream.opt_bool("stream")?;
    let max_tokens = max_output.opt_u64("max_output_tokens")?;
    if !matches!(
        input,
        Field::Absent | Field::Null | Field::Str(_) | Field::Array
    ) {
        return Err(MetaError::WrongType("input"));
    }
    let mut bytes = 0usize;
    for m in splice::top_level_members(body) {
        let key = &body[m.key.clone()];
        if ["input", "instructions", "tools"]
            .iter()
            .any(|k| splice::key_matches(key, k))
        {
            bytes += m.value.len();
        }
    }
    Ok(RequestMeta {
        model,
        stream,
        max_tokens,
        include_usage: false,
        approx_input_tokens: (bytes as u64).div_ceil(4),
    })
}

/// The event's type: the `event:` name, else the data's `type`.
fn event_type(ev: &SseEvent) -> Option<String> {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    match &ev.event {
        Some(name) => Some(name.clone()),
        None => serde_json::from_str::<Typed>(&ev.data).ok()?.kind,
    }
}

/// Commit point: the first text, refusal or function-argument delta, or the announcement of a
/// function call item. Terminal: completed / incomplete. `error` and `response.failed` are
/// errors (a failure before the commit point is retried; after it, the caller sees it).
pub fn classify(ev: &SseEvent) -> StreamEventKind {
    let Some(kind) = event_type(ev) else {
        return StreamEventKind::Other;
    };
    match kind.as_str() {
        "response.output_text.delta"
        | "response.refusal.delta"
        | "response.function_call_arguments.delta" => StreamEventKind::Content,
        "response.output_item.added" if ev.data.contains("\"function_call\"") => {
            StreamEventKind::Content
        }
        "response.completed" | "response.incomplete" => StreamEventKind::Terminal,
        "error" | "response.failed" => StreamEventKind::Error,
        "response.created"
        | "response.in_progress"
        | "response.queued"
        | "response.output_item.added"
        | "response.content_part.added" => StreamEventKind::Preamble,
        _ => StreamEventKind::Other,
    }
}

#[derive(Deserialize)]
struct ResponseUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: u64,
}

impl ResponseUsage {
    /// `input_tokens` includes the cached tokens; output includes reasoning.
    fn to_usage(&self) -> Usage {
        let cached = self
            .input_tokens_details
            .as_ref()
            .map_or(0, |d| d.cached_tokens);
        Usage {
            input: self.input_tokens.saturating_sub(cached),
            output: self.output_tokens,
            cache_read: cached,
            cache_write: 0,
        }
    }
}

/// Usage of a response object (a JSON answer).
pub fn usage_from_json(body: &[u8]) -> Option<Usage> {
    #[derive(Deserialize)]
    struct Obj {
        usage: Option<ResponseUsage>,
    }
    serde_json::from_slice::<Obj>(body)
        .ok()?
        .usage
        .map(|u| u.to_usage())
}

/// Usage of a stream: the terminal event's `response.usage` (completed, incomplete, failed).
pub fn usage_from_event(ev: &SseEvent) -> Option<Usage> {
    if !ev.data.contains("\"usage\"") {
        return None;
    }
    #[derive(Deserialize)]
    struct Ev {
        response: Option<Obj>,
    }
    #[derive(Deserialize)]
    struct Obj {
        usage: Option<ResponseUsage>,
    }
    serde_json::from_str::<Ev>(&ev.data)
        .ok()?
        .response?
        .usage
        .map(|u| u.to_usage())
}

/// The error code and message of an `error` or `response.failed` event.
pub fn error_of(data: &str) -> (String, String) {
    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
    let e = if v["type"] == "response.failed" {
        &v["response"]["error"]
    } else if v.get("error").is_some_and(serde_json::Value::is_object) {
        &v["error"]
    } else {
        &v
    };
    let code = e["code"]
        .as_str()
        .or_else(|| e["type"].as_str())
        .unwrap_or("server_error");
    let message = e["message"].as_str().unwrap_or("the upstream failed");
    (code.to_owned(), message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseParser;

    #[test]
    fn reads_model_stream_and_max_output_tokens() {
        let body = br#"{"model":"gpt-5","input":"abcd","stream":true,"max_output_tokens":50}"#;
        let meta = parse_request(body);
        assert_eq!(
            meta.map(|m| (m.model, m.stream, m.max_tokens, m.approx_input_tokens)),
            Ok(("gpt-5".to_owned(), true, Some(50), 2))
        );
        assert_eq!(
            parse_request(br#"{"input":"x"}"#),
            Err(MetaError::Missing("model"))
        );
        assert_eq!(
            parse_request(br#"{"model":"m","input":5}"#),
            Err(MetaError::WrongType("input"))
        );
    }

    fn kinds(wire: &str) -> Vec<StreamEventKind> {
        let mut p = SseParser::new();
        p.push(wire.as_bytes());
        std::iter::from_fn(|| p.next_event())
            .map(|e| classify(&e))
            .collect()
    }

    #[test]
    fn classifies_semantic_events() {
        use StreamEventKind::*;
        let ev =
            |t: &str, extra: &str| format!("event: {t}\ndata: {{\"type\":\"{t}\"{extra}}}\n\n");
        let wire = [
            ev("response.created", ""),
            ev(
                "response.output_item.added",
                r#","item":{"type":"message"}"#,
            ),
            ev(
                "response.output_item.added",
                r#","item":{"type":"function_call"}"#,
            ),
            ev("response.output_text.delta", ""),
            ev("response.output_text.done", ""),
            ev("response.completed", ""),
            ev("error", ""),
            ev("response.failed", ""),
        ]
        .concat();
        assert_eq!(
            kinds(&wire),
            [
                Preamble, Preamble, Content, Content, Other, Terminal, Error, Error
            ]
        );
    }

    #[test]
    fn usage_counts_cached_inside_input() {
        let body = br#"{"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":30},"output_tokens":7}}"#;
        let want = Usage {
            input: 10,
            output: 7,
            cache_read: 30,
            cache_write: 0,
        };
        assert_eq!(usage_from_json(body), Some(want));
        let ev = SseEvent {
            event: Some("response.completed".into()),
            data: format!(
                "{{\"type\":\"response.completed\",\"response\":{}}}",
                String::from_utf8_lossy(body)
            ),
            end_offset: 0,
        };
        assert_eq!(usage_from_event(&ev), Some(want));
    }

    #[test]
    fn error_code_and_message_from_either_event() {
        assert_eq!(
            error_of(r#"{"type":"error","code":"rate_limit_exceeded","message":"slow"}"#),
            ("rate_limit_exceeded".into(), "slow".into())
        );
        assert_eq!(
            error_of(
                r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}"#
            ),
            ("server_error".into(), "x".into())
        );
    }
}

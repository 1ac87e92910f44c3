//! Reading a script: the JSON mirror of the format (unknown fields refused) and its
//! validation into the typed script, every problem reported with where it is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::Deserialize;

use super::script::{Block, Fault, FaultKind, Matcher, RawBody, Reply, Script, Usage};

pub(crate) fn from_json(text: &str) -> Result<Script, String> {
    let raw: RawScript = serde_json::from_str(text).map_err(|e| format!("invalid script: {e}"))?;
    raw.validate()
}

pub(crate) fn from_value(value: serde_json::Value) -> Result<Script, String> {
    let raw: RawScript =
        serde_json::from_value(value).map_err(|e| format!("invalid script: {e}"))?;
    raw.validate()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript {
    #[serde(default)]
    expect_key: Option<String>,
    #[serde(default)]
    replies: Vec<RawReply>,
    #[serde(default)]
    default: Option<RawReply>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    model: Option<String>,
    path: Option<String>,
    stream: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReply {
    #[serde(default, rename = "match")]
    matcher: Option<RawMatch>,
    times: Option<u32>,
    status: Option<u16>,
    error_type: Option<String>,
    error_message: Option<String>,
    body: Option<serde_json::Value>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    content: Option<Vec<Block>>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    hang: bool,
    #[serde(default)]
    event_gap_ms: u64,
    stream_error_after: Option<usize>,
    cut_after: Option<usize>,
    hang_after: Option<usize>,
    #[serde(default)]
    drop_terminal: bool,
}

impl RawScript {
    fn validate(self) -> Result<Script, String> {
        let replies = self
            .replies
            .into_iter()
            .enumerate()
            .map(|(i, raw)| raw.validate(&format!("replies[{i}]")).map(Arc::new))
            .collect::<Result<Vec<_>, String>>()?;
        let default = match self.default {
            Some(raw) => raw.validate("default")?,
            None => Reply::default(),
        };
        Ok(Script {
            expect_key: self.expect_key,
            replies,
            default: Arc::new(default),
        })
    }
}

impl RawReply {
    fn validate(self, at: &str) -> Result<Reply, String> {
        let status = match self.status {
            None => StatusCode::OK,
            Some(code @ 200..=599) => StatusCode::from_u16(code)
                .map_err(|_| format!("{at}.status: {code} is not an HTTP status"))?,
            Some(code) => return Err(format!("{at}.status: {code} is not within 200..=599")),
        };
        let headers = self
            .headers
            .iter()
            .map(|(name, value)| parse_header(at, name, value))
            .collect::<Result<Vec<_>, String>>()?;
        let body = self
            .body
            .map(raw_body)
            .transpose()
            .map_err(|e| format!("{at}.body: {e}"))?;
        let fault = fault(at, self.stream_error_after, self.cut_after, self.hang_after)?;
        let matcher = self.matcher.map_or_else(Matcher::default, |m| Matcher {
            model: m.model,
            path: m.path,
            stream: m.stream,
        });
        Ok(Reply {
            matcher,
            times: self.times.unwrap_or(1),
            status,
            error_type: self.error_type,
            error_message: self.error_message,
            body,
            headers,
            content: self.content.unwrap_or_else(|| Reply::default().content),
            stop_reason: self.stop_reason,
            usage: self.usage.unwrap_or_default(),
            model: self.model,
            delay: Duration::from_millis(self.delay_ms),
            hang: self.hang,
            event_gap: Duration::from_millis(self.event_gap_ms),
            fault,
            drop_terminal: self.drop_terminal,
        })
    }
}

fn parse_header(at: &str, name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let header_name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{at}.headers: invalid header name {name:?}"))?;
    let header_value = HeaderValue::from_str(value)
        .map_err(|_| format!("{at}.headers.{name}: invalid header value {value:?}"))?;
    Ok((header_name, header_value))
}

fn raw_body(value: serde_json::Value) -> Result<RawBody, serde_json::Error> {
    match value {
        serde_json::Value::String(text) => Ok(RawBody::Text(Bytes::from(text))),
        other => Ok(RawBody::Json(Bytes::from(serde_json::to_vec(&other)?))),
    }
}

fn fault(
    at: &str,
    stream_error_after: Option<usize>,
    cut_after: Option<usize>,
    hang_after: Option<usize>,
) -> Result<Option<Fault>, String> {
    let set = [
        (FaultKind::StreamError, stream_error_after),
        (FaultKind::Cut, cut_after),
        (FaultKind::Hang, hang_after),
    ];
    let mut faults = set
        .into_iter()
        .filter_map(|(kind, after)| after.map(|after| Fault { kind, after }));
    let first = faults.next();
    if faults.next().is_some() {
        return Err(format!(
            "{at}: set at most one of stream_error_after, cut_after, hang_after"
        ));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_object_is_the_default_script() -> Result<(), String> {
        let script = Script::from_json("{}")?;
        assert_eq!(script.expect_key, None);
        assert!(script.replies.is_empty());
        assert_eq!(*script.default, Reply::default());
        Ok(())
    }

    #[test]
    fn full_reply_parses_every_field() -> Result<(), String> {
        let script = Script::from_json(
            r#"{"expect_key":"sk-1","replies":[{
                "match":{"model":"m","path":"/v1/messages","stream":true},
                "times":0,"status":529,"error_type":"overloaded_error","error_message":"busy",
                "headers":{"retry-after":"1"},
                "content":[{"type":"text","text":"Hi"},{"type":"tool_use","name":"w","input":{"a":1}},
                           {"type":"thinking","thinking":"hmm","signature":"sig"}],
                "stop_reason":"max_tokens","usage":{"input_tokens":3},"model":"other",
                "delay_ms":5,"hang":false,"event_gap_ms":7,"cut_after":2}]}"#,
        )?;
        let reply = &script.replies[0];
        assert_eq!(script.expect_key.as_deref(), Some("sk-1"));
        assert_eq!(reply.matcher.model.as_deref(), Some("m"));
        assert_eq!(reply.matcher.stream, Some(true));
        assert_eq!(reply.times, 0);
        assert_eq!(reply.status.as_u16(), 529);
        assert_eq!(reply.error_message(), "busy");
        assert_eq!(reply.headers[0].0.as_str(), "retry-after");
        assert_eq!(reply.content.len(), 3);
        assert_eq!(reply.stop_reason(), "max_tokens");
        assert_eq!(reply.usage.input_tokens, 3);
        assert_eq!(
            reply.usage.output_tokens, 5,
            "missing usage fields take defaults"
        );
        assert_eq!(reply.delay, Duration::from_millis(5));
        assert_eq!(reply.event_gap, Duration::from_millis(7));
        assert_eq!(
            reply.fault,
            Some(Fault {
                kind: FaultKind::Cut,
                after: 2
            })
        );
        assert_eq!(
            script.model_names(),
            vec!["m".to_owned(), "other".to_owned()]
        );
        Ok(())
    }

    #[test]
    fn unknown_field_is_refused_with_its_name() {
        let err = Script::from_json(r#"{"replies":[{"stauts":500}]}"#).err();
        assert!(err.is_some_and(|e| e.contains("stauts")));
    }

    #[test]
    fn invalid_values_are_refused_with_their_place() {
        let cases = [
            (r#"{"replies":[{"status":99}]}"#, "replies[0].status"),
            (
                r#"{"replies":[{},{"headers":{"a b":"1"}}]}"#,
                "replies[1].headers",
            ),
            (
                r#"{"default":{"headers":{"x":"a\nb"}}}"#,
                "default.headers.x",
            ),
            (
                r#"{"replies":[{"cut_after":1,"hang_after":2}]}"#,
                "replies[0]",
            ),
        ];
        for (text, place) in cases {
            let err = Script::from_json(text).err().unwrap_or_default();
            assert!(err.contains(place), "{text}: {err}");
        }
        assert!(Script::from_json("not json").is_err());
        assert!(Script::from_json(r#"{"replies":[{"content":[{"type":"image"}]}]}"#).is_err());
    }

    #[test]
    fn defaults_follow_the_status_and_content() -> Result<(), String> {
        let script = Script::from_json(
            r#"{"replies":[{"status":429},{"status":503},{"status":418},
                {"content":[{"type":"tool_use","name":"t"}]}]}"#,
        )?;
        assert_eq!(script.replies[0].error_type(), "rate_limit_error");
        assert_eq!(script.replies[1].error_type(), "overloaded_error");
        assert_eq!(script.replies[1].error_message(), "Overloaded");
        assert_eq!(script.replies[2].error_type(), "invalid_request_error");
        assert_eq!(script.replies[3].stop_reason(), "tool_use");
        assert_eq!(script.default.stop_reason(), "end_turn");
        Ok(())
    }

    #[test]
    fn string_body_is_sent_verbatim_and_json_body_compact() -> Result<(), String> {
        let script =
            Script::from_json(r#"{"replies":[{"body":"<html>bad</html>"},{"body":{ "a" : 1 }}]}"#)?;
        assert_eq!(
            script.replies[0].body,
            Some(RawBody::Text(Bytes::from("<html>bad</html>")))
        );
        assert_eq!(
            script.replies[1].body,
            Some(RawBody::Json(Bytes::from(r#"{"a":1}"#)))
        );
        Ok(())
    }
}

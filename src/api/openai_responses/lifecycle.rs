//! What a Responses stream relayed so far says of itself, for the ending legate writes when
//! the stream fails under it: the last `sequence_number`, and the response the stream is about
//! (`id`, `created_at`, `model`, from `response.created`). wire-protocol §F: every event is
//! numbered in order, and the terminal event describes the same response as the first; the
//! OpenAI SDKs' stream helpers check both (a `response.failed` naming no response, or numbered
//! out of sequence, raises there instead of surfacing the failure).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::api::errors::LocalError;
use crate::sse::SseEvent;

/// The events that carry the response object at the start of a stream.
const OPENING: [&str; 3] = [
    "response.created",
    "response.in_progress",
    "response.queued",
];

/// Events read for the response's identity when they do not name their type in `event:`:
/// the opening events come first.
const UNNAMED_LOOKS: u32 = 3;

#[derive(Debug, Default)]
pub struct Lifecycle {
    last_seq: Option<u64>,
    /// `id`, `object`, `created_at` and `model` of the response, once seen.
    identity: Option<Map<String, Value>>,
    unnamed_looked: u32,
}

impl Lifecycle {
    /// Notes one complete event of the stream.
    pub fn observe(&mut self, ev: &SseEvent) {
        if let Some(n) = sequence_number(&ev.data) {
            self.last_seq = Some(n);
        }
        if self.identity.is_some() {
            return;
        }
        let opening = match ev.event.as_deref() {
            Some(name) => OPENING.contains(&name),
            None if self.unnamed_looked < UNNAMED_LOOKS => {
                self.unnamed_looked += 1;
                true
            }
            None => false,
        };
        if opening {
            self.identity = identity(&ev.data);
        }
    }

    /// An `error` event, then the `response.failed` the SDKs' stream helpers end on: numbered
    /// after the last event relayed, and about the same response.
    pub fn failed_events(&self, e: LocalError<'_>) -> Bytes {
        let first = self.last_seq.map_or(0, |n| n.saturating_add(1));
        let error = json!({
            "type": "error", "code": e.code, "message": e.message, "param": null,
            "sequence_number": first,
        });
        let mut response = self.identity.clone().unwrap_or_default();
        response.insert("object".into(), "response".into());
        response.insert("status".into(), "failed".into());
        response.insert("output".into(), json!([]));
        response.insert(
            "error".into(),
            json!({"code": e.code, "message": e.message}),
        );
        let failed = json!({
            "type": "response.failed", "sequence_number": first.saturating_add(1),
            "response": response,
        });
        Bytes::from(format!(
            "event: error\ndata: {error}\n\nevent: response.failed\ndata: {failed}\n\n"
        ))
    }
}

/// The event's top-level `sequence_number`. Found by its key rather than a parse of the whole
/// event: every event of a stream passes here. Inside a JSON string a quote is escaped, so the
/// quoted key only occurs as a member name. The last one is taken: the top-level member comes
/// after the nested objects (OpenAI writes it last, legate's translator in key order, after
/// `item` and `response`), which may hold a member of that name (a tool schema's property).
fn sequence_number(data: &str) -> Option<u64> {
    const KEY: &[u8] = b"\"sequence_number\"";
    let at = memchr::memmem::rfind(data.as_bytes(), KEY)? + KEY.len();
    let rest = data[at..].trim_start().strip_prefix(':')?.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    rest[..digits].parse().ok()
}

/// The response's `id`, `object`, `created_at` and `model` from an opening event.
fn identity(data: &str) -> Option<Map<String, Value>> {
    #[derive(Deserialize)]
    struct Opening {
        response: Identity,
    }
    #[derive(Deserialize)]
    struct Identity {
        id: String,
        #[serde(default)]
        created_at: Option<Value>,
        #[serde(default)]
        model: Option<String>,
    }
    let r = serde_json::from_str::<Opening>(data).ok()?.response;
    let mut m = Map::new();
    m.insert("id".into(), r.id.into());
    if let Some(c) = r.created_at.filter(|c| c.is_number()) {
        m.insert("created_at".into(), c);
    }
    if let Some(model) = r.model {
        m.insert("model".into(), model.into());
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::errors::ErrorClass;

    fn event(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: name.map(str::to_owned),
            data: data.to_owned(),
            end_offset: 0,
        }
    }

    fn failure() -> LocalError<'static> {
        LocalError {
            param: None,
            class: ErrorClass::Server,
            code: "upstream_stream_error",
            message: "cut",
        }
    }

    fn parsed(bytes: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(bytes)
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn the_ending_follows_the_last_event_and_names_the_same_response() {
        let mut l = Lifecycle::default();
        l.observe(&event(
            Some("response.created"),
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1700000000,"model":"gpt-4.1","status":"in_progress","output":[]}}"#,
        ));
        l.observe(&event(
            Some("response.output_text.delta"),
            r#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"say \"sequence_number\": 99","sequence_number" : 4}"#,
        ));
        let v = parsed(&l.failed_events(failure()));
        assert_eq!(v[0]["type"], "error");
        assert_eq!(v[0]["sequence_number"], 5);
        assert_eq!(v[1]["type"], "response.failed");
        assert_eq!(v[1]["sequence_number"], 6);
        let r = &v[1]["response"];
        assert_eq!(
            (&r["id"], &r["created_at"], &r["model"], &r["status"]),
            (
                &json!("resp_1"),
                &json!(1700000000),
                &json!("gpt-4.1"),
                &json!("failed")
            )
        );
        assert_eq!(r["error"]["code"], "upstream_stream_error");
    }

    #[test]
    fn a_nested_member_of_the_same_name_is_not_the_events_number() {
        let mut l = Lifecycle::default();
        l.observe(&event(
            Some("response.created"),
            r#"{"type":"response.created","response":{"id":"resp_3","tools":[{"parameters":{"properties":{"sequence_number":{"type":"integer","default":7}}}}]},"sequence_number":0}"#,
        ));
        let v = parsed(&l.failed_events(failure()));
        assert_eq!(
            (&v[0]["sequence_number"], &v[1]["sequence_number"]),
            (&json!(1), &json!(2))
        );
        assert_eq!(v[1]["response"]["id"], "resp_3");
    }

    #[test]
    fn unnamed_opening_events_are_read_and_nothing_seen_starts_at_zero() {
        let mut l = Lifecycle::default();
        l.observe(&event(
            None,
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_2"}}"#,
        ));
        let v = parsed(&l.failed_events(failure()));
        assert_eq!(
            (&v[0]["sequence_number"], &v[1]["sequence_number"]),
            (&json!(1), &json!(2))
        );
        assert_eq!(v[1]["response"]["id"], "resp_2");
        let v = parsed(&Lifecycle::default().failed_events(failure()));
        assert_eq!(
            (&v[0]["sequence_number"], &v[1]["sequence_number"]),
            (&json!(0), &json!(1))
        );
        assert_eq!(v[1]["response"]["object"], "response");
    }
}

//! Responses stream events and usage. Every event names its type (`event:`, and `type` in the
//! data); the terminal events carry the whole response object, usage included.

use std::borrow::Cow;

use serde::Deserialize;

use crate::api::{StreamEventKind, has_usage_object};
use crate::meter::Usage;
use crate::sse::SseEvent;
use crate::usage::{flat, usage_object};

/// The event's type: the `event:` name, else the data's `type` (borrowed from the event when
/// it can be: this runs for every event of every Responses stream).
pub(crate) fn event_type(ev: &SseEvent) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<Cow<'a, str>>,
    }
    match &ev.event {
        Some(name) => Some(Cow::Borrowed(name)),
        None => serde_json::from_str::<Typed>(&ev.data).ok()?.kind,
    }
}

/// Commit point: the first text, refusal or function-argument delta, or the announcement of a
/// function call item. Terminal: completed / incomplete. `error` and `response.failed` are
/// errors (a failure before the commit point is retried; after it, the caller sees it).
pub(super) fn classify(ev: &SseEvent) -> StreamEventKind {
    let Some(kind) = event_type(ev) else {
        return StreamEventKind::Other;
    };
    match kind.as_ref() {
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
struct Reported {
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
    /// Not OpenAI's: legate's own, in a response translated from an Anthropic answer, whose
    /// cache writes are priced apart (as in its Chat Completions usage).
    #[serde(default)]
    cache_write_tokens: u64,
}

impl Reported {
    /// `input_tokens` includes the cached tokens (and cache writes); output includes
    /// reasoning.
    fn to_usage(&self) -> Usage {
        let (cached, written) = self
            .input_tokens_details
            .as_ref()
            .map_or((0, 0), |d| (d.cached_tokens, d.cache_write_tokens));
        Usage::of_prompt(self.input_tokens, (cached, written), self.output_tokens)
    }
}

/// Usage of a response object (a JSON answer): only its top-level `usage` member is decoded,
/// the walk to it skips the rest unparsed (as for the other APIs).
pub(super) fn usage_of_body(body: &[u8]) -> Option<Usage> {
    usage_object(body, read_in_place).map(|u| u.to_usage())
}

/// Usage from the text of a response object's `usage` member (found by a walk over the
/// object's members that reads others too); None when it is null or unreadable.
pub(crate) fn usage_of_member(value: &[u8]) -> Option<Usage> {
    crate::usage::decode(value, read_in_place).map(|u| u.to_usage())
}

/// [`Reported`] read without serde ([`flat`]): the counts in place and the one nested object's
/// member; None for anything it does not read exactly as serde would, which serde then decides.
fn read_in_place(obj: &[u8]) -> Option<Reported> {
    let [input, output, details] = flat::members(
        obj,
        ["input_tokens", "output_tokens", "input_tokens_details"],
    )?;
    let input_tokens_details = if flat::absent_or_null(obj, &details) {
        None
    } else {
        let details = &obj[details?];
        let [cached, written] = flat::members(details, ["cached_tokens", "cache_write_tokens"])?;
        Some(InputDetails {
            cached_tokens: flat::required(details, cached)?,
            cache_write_tokens: flat::required(details, written)?,
        })
    };
    Some(Reported {
        input_tokens: flat::required(obj, input)?,
        output_tokens: flat::required(obj, output)?,
        input_tokens_details,
    })
}

/// Usage of a stream: the terminal event's `response.usage` (completed, incomplete, failed).
/// Only that member is decoded, and the walks to it start from the end (the response is the
/// event's last member, its usage near the response's end), skipping the output unparsed.
pub(super) fn usage_of_event(ev: &SseEvent) -> Option<Usage> {
    if !has_usage_object(&ev.data) {
        return None;
    }
    let data = ev.data.as_bytes();
    let response = crate::splice::value_near_end(data, "response")?;
    usage_of_body(&data[response])
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::usage::flat::shapes;

    #[test]
    fn a_usage_object_as_providers_send_it_is_read_in_place() {
        let obj = r#"{"input_tokens":1200,"input_tokens_details":{"cached_tokens":1000},
            "output_tokens":70,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":1270}"#;
        let fast = read_in_place(obj.as_bytes()).map(|u| u.to_usage());
        assert!(fast.is_some(), "left to serde");
        assert!(shapes::reads_as_serde(
            obj,
            read_in_place,
            Reported::to_usage
        ));
        assert_eq!(
            fast.map(|u| (u.input, u.cache_read, u.output)),
            Some((200, 1000, 70))
        );
        // What serde refuses or reads otherwise is left to it.
        for obj in [
            r#"{"input_tokens":null}"#,
            r#"{"input_tokens_details":{"cached_tokens":null}}"#,
            r#"{"input_tokens_details":7}"#,
            r#"{"output_tokens":1,"output_tokens":2}"#,
            r#"null"#,
        ] {
            assert!(read_in_place(obj.as_bytes()).is_none(), "{obj}");
        }
        assert_eq!(usage_of_member(b"null"), None);
        assert_eq!(
            usage_of_member(br#"{"input_tokens_details":null,"output_tokens":3}"#)
                .map(|u| u.output),
            Some(3)
        );
    }

    proptest::proptest! {
        #[test]
        fn what_is_read_in_place_serde_reads_alike(
            obj in shapes::object(
                &["input_tokens", "output_tokens"],
                "input_tokens_details",
                &["cached_tokens"],
            )
        ) {
            proptest::prop_assert!(
                shapes::reads_as_serde(&obj, read_in_place, Reported::to_usage),
                "{}",
                obj
            );
        }
    }

    fn kinds(wire: &str) -> Vec<StreamEventKind> {
        crate::sse::events_of(wire).iter().map(classify).collect()
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
        // Without an `event:` line the data's type decides.
        assert_eq!(
            kinds("data: {\"type\":\"response.completed\"}\n\n"),
            [Terminal]
        );
    }

    #[test]
    fn cache_writes_of_a_translated_answer_are_taken_out_of_input() {
        let body = br#"{"usage":{"input_tokens":35,"input_tokens_details":{"cached_tokens":20,"cache_write_tokens":4},"output_tokens":7}}"#;
        let want = Usage {
            input: 11,
            output: 7,
            cache_read: 20,
            cache_write: 4,
        };
        assert_eq!(usage_of_body(body), Some(want));
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
        assert_eq!(usage_of_body(body), Some(want));
        let ev = SseEvent {
            event: Some("response.completed".into()),
            data: format!(
                "{{\"type\":\"response.completed\",\"response\":{}}}",
                String::from_utf8_lossy(body)
            ),
            end_offset: 0,
        };
        assert_eq!(usage_of_event(&ev), Some(want));
    }
}

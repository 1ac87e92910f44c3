//! Anthropic usage: `usage` of a `Message`, `message_start.message.usage`, then every
//! `message_delta.usage` overwrites the fields it carries (running totals: never add deltas).
//! `input_tokens` already excludes cache reads and writes (SPEC §6).

use serde::Deserialize;

use crate::api::has_usage_object;
use crate::meter::Usage;
use crate::sse::SseEvent;
use crate::usage::flat;

/// `usage` fields; each is optional because `message_delta.usage` carries only some.
#[derive(Deserialize, Default)]
struct Reported {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl Reported {
    /// Overwrites the fields this report carries.
    fn apply_to(&self, u: &mut Usage) {
        let fields = [
            (self.input_tokens, &mut u.input),
            (self.output_tokens, &mut u.output),
            (self.cache_creation_input_tokens, &mut u.cache_write),
            (self.cache_read_input_tokens, &mut u.cache_read),
        ];
        for (reported, slot) in fields {
            if let Some(n) = reported {
                *slot = n;
            }
        }
    }

    fn to_usage(&self) -> Usage {
        let mut u = Usage::default();
        self.apply_to(&mut u);
        u
    }
}

/// A `Message` body, or the `message` of a `message_start` event.
#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    usage: Option<Reported>,
}

/// The usage-bearing parts of a stream event.
#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    usage: Option<Reported>,
}

/// Usage of a non-streaming `Message` body (None without a usage object). Its counts are read
/// in place ([`flat::counts`]); serde decodes what that reader leaves to it.
pub(crate) fn of_body(body: &[u8]) -> Option<Usage> {
    let in_place = |obj: &[u8]| {
        let [input, output, cache_write, cache_read] = flat::counts(obj, FIELDS)?;
        Some(Reported {
            input_tokens: input,
            output_tokens: output,
            cache_creation_input_tokens: cache_write,
            cache_read_input_tokens: cache_read,
        })
    };
    crate::usage::usage_object(body, in_place).map(|u| u.to_usage())
}

/// [`Reported`]'s fields, in its order.
const FIELDS: [&str; 4] = [
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
];

pub(crate) fn observe(ev: &SseEvent, seen: &mut Option<Usage>) -> bool {
    let worth_parsing = match ev.event.as_deref() {
        Some(name) => name == "message_start" || name == "message_delta",
        // Without a name the type is in the data; a usage-less event is skipped unparsed.
        None => has_usage_object(&ev.data),
    };
    if !worth_parsing {
        return true;
    }
    // A usage event that cannot be read (a count past 2^64, say) is no reason to take the
    // counts of `message_start` for the whole stream's: the stream is left unmetered.
    let Ok(event) = serde_json::from_str::<Event>(&ev.data) else {
        return !has_usage_object(&ev.data);
    };
    if let Some(start) = event.message.and_then(|m| m.usage) {
        *seen = Some(start.to_usage());
    }
    if let Some(delta) = event.usage {
        delta.apply_to(seen.get_or_insert_with(Usage::default));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ApiKind;
    use crate::usage::of_stream;

    #[test]
    fn message_usage_excludes_cache() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi \"usage\""}],
            "model":"claude-sonnet-4-5","stop_reason":"end_turn","stop_sequence":null,
            "usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":null,
                     "output_tokens":7,"server_tool_use":{"web_search_requests":1},"service_tier":"standard"}}"#;
        let want = Usage {
            input: 25,
            output: 7,
            cache_read: 0,
            cache_write: 100,
        };
        assert_eq!(of_body(body), Some(want));
        assert_eq!(of_body(br#"{"type":"message"}"#), None);
        assert_eq!(of_body(b"not json"), None);
    }

    /// A final usage that cannot be read leaves the stream unmetered (its reservation kept),
    /// as an unreadable JSON answer is: not metered as `message_start`'s counts.
    #[test]
    fn an_unreadable_usage_event_leaves_the_stream_unmetered() {
        let wire = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":100000000000000000000}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":9}}\n\n",
        );
        assert_eq!(of_stream(ApiKind::Anthropic, wire), None);
        // A data line that is not JSON and names no usage changes nothing.
        let noise = "event: message_delta\ndata: {oops\n\nevent: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n";
        assert_eq!(
            of_stream(ApiKind::Anthropic, noise).map(|u| u.input),
            Some(3)
        );
    }

    #[test]
    fn stream_overwrites_running_totals() {
        let wire = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":40,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"usage\\\":{\"}}\n\n",
            "event: ping\n",
            "data: {\"type\": \"ping\"}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":10}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":10682,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":510,\"server_tool_use\":{\"web_search_requests\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n",
            "event: message_stop\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        let want = Usage {
            input: 10682,
            output: 510,
            cache_read: 0,
            cache_write: 0,
        };
        assert_eq!(of_stream(ApiKind::Anthropic, wire), Some(want));
    }

    #[test]
    fn stream_without_final_usage_keeps_start_values() {
        let wire = concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n",
        );
        let want = Usage {
            input: 5,
            output: 3,
            ..Usage::default()
        };
        assert_eq!(of_stream(ApiKind::Anthropic, wire), Some(want));
        assert_eq!(
            of_stream(ApiKind::Anthropic, "event: ping\ndata: {}\n\n"),
            None
        );
    }
}

//! Token usage, normalised across providers (SPEC §6), and its cost.
//!
//! The four kinds never overlap: `input` is uncached input only, `cache_read` and
//! `cache_write` are the cached parts, `output` is everything generated (reasoning included).
//! Anthropic reports them that way already; OpenAI's `prompt_tokens` includes the cached
//! tokens, so its uncached input is the difference.

use serde::Deserialize;

use crate::api::ApiShape;
use crate::meter::Price;
use crate::sse::SseEvent;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Usage {
    /// Cost in pico-USD, all four kinds priced.
    pub fn cost_pico(&self, price: &Price) -> u128 {
        [
            (self.input, price.input),
            (self.output, price.output),
            (self.cache_read, price.cache_read),
            (self.cache_write, price.cache_write),
        ]
        .iter()
        .map(|&(tokens, per_token)| u128::from(tokens) * u128::from(per_token))
        .fold(0u128, u128::saturating_add)
    }

    /// All tokens of the four kinds (what a tokens-per-minute bucket is charged for).
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }
}

/// Anthropic `usage` fields; each is optional because `message_delta.usage` carries only some.
#[derive(Deserialize, Default)]
struct AnthropicUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl AnthropicUsage {
    /// Overwrites the fields this report carries (running totals: never added).
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
struct AnthropicMessage {
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

/// The usage-bearing parts of a stream event: `message_start` has `message.usage`,
/// `message_delta` has `usage`.
#[derive(Deserialize)]
struct AnthropicEvent {
    #[serde(default)]
    message: Option<AnthropicMessage>,
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct OpenAiBody {
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    cache_write_tokens: Option<u64>,
}

impl OpenAiUsage {
    fn to_usage(&self) -> Usage {
        let details = self.prompt_tokens_details.as_ref();
        let cache_read = details.and_then(|d| d.cached_tokens).unwrap_or(0);
        let cache_write = details.and_then(|d| d.cache_write_tokens).unwrap_or(0);
        Usage {
            input: self
                .prompt_tokens
                .unwrap_or(0)
                .saturating_sub(cache_read)
                .saturating_sub(cache_write),
            output: self.completion_tokens.unwrap_or(0),
            cache_read,
            cache_write,
        }
    }
}

/// Usage of a non-streaming Anthropic `Message` body (None without a usage object).
pub fn anthropic_from_json(body: &[u8]) -> Option<Usage> {
    // Only the top-level `usage` value is decoded; the walk to it skips the content unparsed.
    let span = crate::splice::top_level_value_span(body, "usage")?;
    let usage: Option<AnthropicUsage> = serde_json::from_slice(&body[span]).ok()?;
    usage.map(|u| u.to_usage())
}

/// Usage of a non-streaming OpenAI `chat.completion` body (None without a usage object).
pub fn openai_from_json(body: &[u8]) -> Option<Usage> {
    let span = crate::splice::top_level_value_span(body, "usage")?;
    let usage: Option<OpenAiUsage> = serde_json::from_slice(&body[span]).ok()?;
    usage.map(|u| u.to_usage())
}

/// Watches a stream's events for usage. Anthropic: `message_start.message.usage`, then every
/// `message_delta.usage` overwrites the fields it carries (running totals: never add deltas).
/// OpenAI: the chunk whose `usage` is a non-null object (the last such chunk wins, which also
/// fits servers that send running totals on every chunk).
#[derive(Debug, Clone)]
pub struct StreamUsage {
    api: ApiShape,
    usage: Option<Usage>,
}

impl StreamUsage {
    pub fn new(api: ApiShape) -> Self {
        Self { api, usage: None }
    }

    /// Looks at one event; only events that can carry usage are parsed.
    pub fn observe(&mut self, ev: &SseEvent) {
        match self.api {
            ApiShape::Anthropic => self.observe_anthropic(ev),
            ApiShape::OpenAi => self.observe_openai(ev),
            ApiShape::Responses => {
                if let Some(u) = crate::api::responses::usage_from_event(ev) {
                    self.usage = Some(u);
                }
            }
        }
    }

    /// The usage seen so far (None until an event carried some).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn observe_anthropic(&mut self, ev: &SseEvent) {
        let worth_parsing = match ev.event.as_deref() {
            Some(name) => name == "message_start" || name == "message_delta",
            // Without a name the type is in the data; a usage-less event is skipped unparsed.
            None => has_usage_object(&ev.data),
        };
        if !worth_parsing {
            return;
        }
        let Ok(event) = serde_json::from_str::<AnthropicEvent>(&ev.data) else {
            return;
        };
        if let Some(start) = event.message.and_then(|m| m.usage) {
            self.usage = Some(start.to_usage());
        }
        if let Some(delta) = event.usage {
            delta.apply_to(self.usage.get_or_insert_with(Usage::default));
        }
    }

    fn observe_openai(&mut self, ev: &SseEvent) {
        if !has_usage_object(&ev.data) {
            return;
        }
        if let Ok(OpenAiBody { usage: Some(u) }) = serde_json::from_str(&ev.data) {
            self.usage = Some(u.to_usage());
        }
    }
}

/// Cheap pre-check: does the text contain a `"usage"` key whose value is an object? An escaped
/// `\"usage\"` inside a string value does not match (the closing quote would be escaped).
fn has_usage_object(data: &str) -> bool {
    data.match_indices("\"usage\"").any(|(at, key)| {
        let rest = data[at + key.len()..].trim_start();
        rest.strip_prefix(':')
            .is_some_and(|v| v.trim_start().starts_with('{'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseParser;

    fn events(wire: &str) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        p.push(wire.as_bytes());
        std::iter::from_fn(|| p.next_event()).collect()
    }

    fn watch(api: ApiShape, wire: &str) -> Option<Usage> {
        let mut s = StreamUsage::new(api);
        for ev in events(wire) {
            s.observe(&ev);
        }
        s.usage()
    }

    #[test]
    fn cost_prices_all_four_kinds() {
        let price = Price {
            input: 3_000_000,
            output: 15_000_000,
            cache_write: 3_750_000,
            cache_read: 300_000,
        };
        let u = Usage {
            input: 10,
            output: 2,
            cache_read: 100,
            cache_write: 4,
        };
        assert_eq!(
            u.cost_pico(&price),
            30_000_000 + 30_000_000 + 30_000_000 + 15_000_000
        );
        let max = Usage {
            input: u64::MAX,
            output: u64::MAX,
            cache_read: u64::MAX,
            cache_write: u64::MAX,
        };
        let max_price = Price {
            input: u64::MAX,
            output: u64::MAX,
            cache_write: u64::MAX,
            cache_read: u64::MAX,
        };
        assert_eq!(max.cost_pico(&max_price), u128::MAX);
        assert_eq!(u.total(), 116);
    }

    #[test]
    fn anthropic_message_usage_excludes_cache() {
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
        assert_eq!(anthropic_from_json(body), Some(want));
        assert_eq!(anthropic_from_json(br#"{"type":"message"}"#), None);
        assert_eq!(anthropic_from_json(b"not json"), None);
    }

    #[test]
    fn openai_prompt_tokens_include_cached() {
        let body =
            br#"{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1000,
            "completion_tokens":50,"total_tokens":1050,
            "prompt_tokens_details":{"cached_tokens":600,"cache_write_tokens":100,"audio_tokens":0},
            "completion_tokens_details":{"reasoning_tokens":20}}}"#;
        let want = Usage {
            input: 300,
            output: 50,
            cache_read: 600,
            cache_write: 100,
        };
        assert_eq!(openai_from_json(body), Some(want));
        let odd = br#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}"#;
        assert_eq!(openai_from_json(odd).map(|u| u.input), Some(0));
        assert_eq!(openai_from_json(br#"{"usage":null}"#), None);
    }

    #[test]
    fn anthropic_stream_overwrites_running_totals() {
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
        assert_eq!(watch(ApiShape::Anthropic, wire), Some(want));
    }

    #[test]
    fn anthropic_stream_without_final_usage_keeps_start_values() {
        let wire = concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n",
        );
        let want = Usage {
            input: 5,
            output: 3,
            ..Usage::default()
        };
        assert_eq!(watch(ApiShape::Anthropic, wire), Some(want));
        assert_eq!(
            watch(ApiShape::Anthropic, "event: ping\ndata: {}\n\n"),
            None
        );
    }

    #[test]
    fn openai_stream_takes_the_usage_chunk() {
        let wire = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"say \\\"usage\\\": {\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\": {\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
            "data: [DONE]\n\n",
        );
        let want = Usage {
            input: 5,
            output: 2,
            cache_read: 4,
            cache_write: 0,
        };
        assert_eq!(watch(ApiShape::OpenAi, wire), Some(want));
        assert_eq!(watch(ApiShape::OpenAi, "data: {\"usage\":null}\n\n"), None);
    }

    #[test]
    fn usage_pre_check_matches_keys_with_object_values_only() {
        assert!(has_usage_object(r#"{"usage":{"a":1}}"#));
        assert!(has_usage_object("{\"usage\" :\n {}}"));
        assert!(!has_usage_object(r#"{"usage":null}"#));
        assert!(!has_usage_object(r#"{"content":"\"usage\":{"}"#));
        assert!(has_usage_object(r#"{"x":"usage","usage":{}}"#));
    }
}

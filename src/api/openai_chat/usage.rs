//! OpenAI usage: the `usage` object of a `chat.completion`, or of the usage chunk of a stream
//! (the last chunk with a non-null `usage` wins, which also fits servers that send running
//! totals on every chunk). `prompt_tokens` includes the cached tokens, so the uncached input
//! is the difference (SPEC §6).

use serde::Deserialize;

use crate::api::has_usage_object;
use crate::meter::Usage;
use crate::sse::SseEvent;
use crate::usage::{flat, usage_object};

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    usage: Option<Reported>,
}

#[derive(Deserialize)]
struct Reported {
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

impl Reported {
    fn to_usage(&self) -> Usage {
        let details = self.prompt_tokens_details.as_ref();
        let cached = details.and_then(|d| d.cached_tokens).unwrap_or(0);
        let written = details.and_then(|d| d.cache_write_tokens).unwrap_or(0);
        Usage::of_prompt(
            self.prompt_tokens.unwrap_or(0),
            (cached, written),
            self.completion_tokens.unwrap_or(0),
        )
    }
}

/// Usage of a non-streaming `chat.completion` body (None without a usage object). Its counts
/// are read in place ([`read_in_place`]); serde decodes what that reader leaves to it.
pub(crate) fn of_body(body: &[u8]) -> Option<Usage> {
    usage_object(body, read_in_place).map(|u| u.to_usage())
}

/// [`Reported`] read without serde ([`flat`]): the counts in place and the one nested object's;
/// None for anything it does not read exactly as serde would, which serde then decides.
fn read_in_place(obj: &[u8]) -> Option<Reported> {
    let [prompt, completion, details] = flat::members(
        obj,
        [
            "prompt_tokens",
            "completion_tokens",
            "prompt_tokens_details",
        ],
    )?;
    let prompt_tokens_details = if flat::absent_or_null(obj, &details) {
        None
    } else {
        let [cached_tokens, cache_write_tokens] =
            flat::counts(&obj[details?], ["cached_tokens", "cache_write_tokens"])?;
        Some(PromptDetails {
            cached_tokens,
            cache_write_tokens,
        })
    };
    let optional = |span: Option<std::ops::Range<usize>>| match span {
        None => Some(None),
        Some(span) => flat::count(&obj[span]),
    };
    Some(Reported {
        prompt_tokens: optional(prompt)?,
        completion_tokens: optional(completion)?,
        prompt_tokens_details,
    })
}

pub(crate) fn observe(ev: &SseEvent, seen: &mut Option<Usage>) -> bool {
    if !has_usage_object(&ev.data) {
        return true;
    }
    match serde_json::from_str(&ev.data) {
        Ok(Body { usage: Some(u) }) => *seen = Some(u.to_usage()),
        Ok(Body { usage: None }) => {}
        // Each usage chunk is whole (a later one replaces it): an unreadable one leaves the
        // stream unmetered unless a readable one follows, so it is forgotten, not sticky.
        Err(_) => {
            *seen = None;
            crate::usage::unreadable();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::usage::flat::shapes;

    #[test]
    fn a_usage_object_as_providers_send_it_is_read_in_place() {
        let obj = r#"{"prompt_tokens":1000,"completion_tokens":20,"total_tokens":1020,
            "prompt_tokens_details":{"cached_tokens":600,"cache_write_tokens":100,"audio_tokens":0},
            "completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}"#;
        let fast = read_in_place(obj.as_bytes()).map(|u| u.to_usage());
        assert!(fast.is_some(), "left to serde");
        assert!(shapes::reads_as_serde(
            obj,
            read_in_place,
            Reported::to_usage
        ));
        assert_eq!(
            fast.map(|u| (u.input, u.cache_read, u.cache_write, u.output)),
            Some((300, 600, 100, 20))
        );
        // `null` counts are serde's `None` here, read in place too.
        let nulls = r#"{"prompt_tokens":null,"completion_tokens":2,"prompt_tokens_details":null}"#;
        assert!(read_in_place(nulls.as_bytes()).is_some());
        assert!(shapes::reads_as_serde(
            nulls,
            read_in_place,
            Reported::to_usage
        ));
        for obj in [
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens_details":[1]}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}"#,
        ] {
            assert!(read_in_place(obj.as_bytes()).is_none(), "{obj}");
        }
    }

    proptest::proptest! {
        #[test]
        fn what_is_read_in_place_serde_reads_alike(
            obj in shapes::object(
                &["prompt_tokens", "completion_tokens"],
                "prompt_tokens_details",
                &["cached_tokens", "cache_write_tokens"],
            )
        ) {
            proptest::prop_assert!(
                shapes::reads_as_serde(&obj, read_in_place, Reported::to_usage),
                "{}",
                obj
            );
        }
    }
    use crate::api::ApiKind;
    use crate::usage::of_stream;

    #[test]
    fn prompt_tokens_include_cached() {
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
        assert_eq!(of_body(body), Some(want));
        let odd = br#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}"#;
        assert_eq!(of_body(odd).map(|u| u.input), Some(0));
        assert_eq!(of_body(br#"{"usage":null}"#), None);
    }

    #[test]
    fn stream_takes_the_usage_chunk() {
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
        assert_eq!(of_stream(ApiKind::OpenAi, wire), Some(want));
        assert_eq!(
            of_stream(ApiKind::OpenAi, "data: {\"usage\":null}\n\n"),
            None
        );
        // An unreadable usage chunk is forgotten: the stream is unmetered, unless a readable
        // one (whole, as each is) comes after it.
        let bad = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-1}}\n\n";
        let good =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
        assert_eq!(of_stream(ApiKind::OpenAi, &format!("{good}{bad}")), None);
        let then = of_stream(ApiKind::OpenAi, &format!("{bad}{good}"));
        assert_eq!(then.map(|u| (u.input, u.output)), Some((3, 1)));
    }
}

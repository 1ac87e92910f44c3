//! Classifying OpenAI chunks by what their choices carry, read without collecting them.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::api::StreamEventKind;
use crate::sse::SseEvent;

/// Classifies one chunk. `[DONE]` is terminal; a data object with a truthy `error` (or an
/// `event: error`, which the Node SDK honours) is an error; a choice delta with non-empty
/// `content`, `refusal`, `tool_calls` or `function_call` is content. Reasoning deltas of
/// OpenAI-compatible servers (`reasoning_content`, `reasoning`) are model output the caller
/// sees too, so they commit the stream like content. Finish and usage chunks are `Other`;
/// anything else before them (role-only chunks, empty deltas) is preamble.
pub(crate) fn classify(ev: &SseEvent) -> StreamEventKind {
    if ev.event.as_deref() == Some("error") {
        return StreamEventKind::Error;
    }
    // The Python SDK ends at any data starting with "[DONE]".
    if ev.data.starts_with("[DONE]") {
        return StreamEventKind::Terminal;
    }
    // Only objects are chunks: serde would also read a struct from an array.
    if !ev.data.trim_start().starts_with('{') {
        return StreamEventKind::Other;
    }
    let Ok(chunk) = serde_json::from_str::<Chunk>(&ev.data) else {
        return StreamEventKind::Other;
    };
    let choices = chunk.choices.unwrap_or_default();
    // vLLM sends its error object as the chunk itself: `{"object":"error","type":…,"code":400}`.
    if chunk.error.0 || chunk.object == Some("error") {
        StreamEventKind::Error
    } else if choices.content {
        StreamEventKind::Content
    } else if choices.finished || chunk.usage.0 {
        StreamEventKind::Other
    } else {
        StreamEventKind::Preamble
    }
}

/// The parts of a `chat.completion.chunk` that decide its kind.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default)]
    error: Truthy,
    /// Borrowed: read for every chunk, it must not cost an allocation.
    #[serde(default, borrow)]
    object: Option<&'a str>,
    #[serde(default)]
    choices: Option<Choices>,
    #[serde(default)]
    usage: Truthy,
}

/// What all choices of a chunk carry together (read without collecting them).
#[derive(Default)]
struct Choices {
    content: bool,
    finished: bool,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(ChoicesVisitor)
    }
}

struct ChoicesVisitor;

impl<'de> Visitor<'de> for ChoicesVisitor {
    type Value = Choices;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of choices")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
        let mut all = Choices::default();
        while let Some(choice) = seq.next_element::<Choice>()? {
            all.finished |= choice.finish_reason.0;
            all.content |= choice.delta.is_some_and(|d| d.has_content());
        }
        Ok(all)
    }
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Truthy,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Truthy,
    #[serde(default)]
    refusal: Truthy,
    #[serde(default)]
    tool_calls: Truthy,
    #[serde(default)]
    function_call: Truthy,
    #[serde(default)]
    reasoning_content: Truthy,
    #[serde(default)]
    reasoning: Truthy,
}

impl Delta {
    fn has_content(&self) -> bool {
        [
            &self.content,
            &self.refusal,
            &self.tool_calls,
            &self.function_call,
            &self.reasoning_content,
            &self.reasoning,
        ]
        .iter()
        .any(|t| t.0)
    }
}

/// Python truthiness of any JSON value (what the SDK's `data.get("error")` tests): false for
/// null, false, 0, "", [] and {}; absent is false too. Nested values are skipped, not stored.
#[derive(Default)]
struct Truthy(bool);

impl<'de> Deserialize<'de> for Truthy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TruthyVisitor).map(Truthy)
    }
}

struct TruthyVisitor;

impl<'de> Visitor<'de> for TruthyVisitor {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        Ok(v != 0)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        Ok(v != 0)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        Ok(v != 0.0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(!v.is_empty())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut any = false;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(any)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut any = false;
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(wire: &str) -> Vec<StreamEventKind> {
        crate::sse::events_of(wire).iter().map(classify).collect()
    }

    const HEAD: &str =
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","#;

    fn chunk(rest: &str) -> String {
        format!("data: {HEAD}{rest}\n\n")
    }

    #[test]
    fn recorded_stream_with_usage_chunk() {
        let wire = [
            chunk(r#""choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"ab"}"#),
            chunk(r#""choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}],"usage":null}"#),
            chunk(r#""choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}"#),
            chunk(r#""choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        use StreamEventKind::*;
        assert_eq!(kinds(&wire), [Preamble, Content, Other, Other, Terminal]);
    }

    #[test]
    fn tool_calls_refusals_and_reasoning_commit_the_stream() {
        let wire = [
            chunk(r#""choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}"#),
            chunk(r#""choices":[{"index":0,"delta":{"refusal":"I can't"},"finish_reason":null}]}"#),
            chunk(r#""choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}"#),
            chunk(r#""choices":[{"index":0,"delta":{"tool_calls":[]},"finish_reason":null}]}"#),
            chunk(r#""choices":[{"index":0,"delta":null,"finish_reason":null}]}"#),
        ]
        .concat();
        use StreamEventKind::*;
        assert_eq!(
            kinds(&wire),
            [Content, Content, Content, Preamble, Preamble]
        );
    }

    #[test]
    fn error_chunks_follow_python_truthiness() {
        let wire = concat!(
            "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
            "data: {\"error\":null,\"choices\":[]}\n\n",
            "data: {\"error\":{},\"choices\":[]}\n\n",
            "event: error\ndata: {\"message\":\"x\"}\n\n",
            "data: [\"error\"]\n\n",
            "data: not json\n\n",
            // vLLM's: the error object is the chunk.
            "data: {\"object\":\"error\",\"message\":\"bad\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}\n\n",
        );
        use StreamEventKind::*;
        assert_eq!(
            kinds(wire),
            [Error, Preamble, Preamble, Error, Other, Other, Error]
        );
    }
}

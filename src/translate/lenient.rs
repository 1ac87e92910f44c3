//! Usage read leniently by the translators: a provider's usage they cannot read (a negative
//! count, `1e30`, a string) is taken as no usage, never as a reason to refuse the answer or
//! the stream it came with. Refused, a good answer was retried (and billed) and then a 502;
//! metering reads the provider's own usage apart, and meters such an answer as unreported.

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};

/// A usage member: what it holds if it reads as `T`, else none.
pub(super) fn option<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    // A usage object is a few dozen bytes: read whole, then typed.
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}

/// [`option`] for a member whose absence is its default.
pub(super) fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    option(d).map(Option::unwrap_or_default)
}

#[cfg(test)]
mod tests {
    use super::super::{anthropic::StreamEvent, openai::Chunk};

    /// A stream event whose usage cannot be read is still the event, with no usage.
    #[test]
    fn an_unreadable_usage_leaves_the_event_readable() {
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":-3}}"#;
        match serde_json::from_str::<StreamEvent>(delta) {
            Ok(StreamEvent::MessageDelta { usage, .. }) => assert!(usage.is_none()),
            other => panic!("{other:?}"),
        }
        let chunk = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1e30}}"#;
        let chunk: Chunk = serde_json::from_str(chunk).unwrap();
        assert!(chunk.usage.is_none());
        let fine = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}"#;
        let fine: Chunk = serde_json::from_str(fine).unwrap();
        assert_eq!(fine.usage.map(|u| u.prompt_tokens), Some(4));
    }
}

//! Values of the Messages API that the loop acts on: why a reply stopped, and what it cost.

use serde_json::Value;

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    PauseTurn,
    StopSequence,
    Refusal,
    ContextWindowExceeded,
    Other(String),
}

impl StopReason {
    pub(super) fn parse(s: &str) -> StopReason {
        match s {
            "end_turn" => StopReason::EndTurn,
            "tool_use" => StopReason::ToolUse,
            "max_tokens" => StopReason::MaxTokens,
            "pause_turn" => StopReason::PauseTurn,
            "stop_sequence" => StopReason::StopSequence,
            "refusal" => StopReason::Refusal,
            "model_context_window_exceeded" => StopReason::ContextWindowExceeded,
            other => StopReason::Other(other.to_owned()),
        }
    }

    pub(super) fn as_str(&self) -> &str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::ToolUse => "tool_use",
            StopReason::MaxTokens => "max_tokens",
            StopReason::PauseTurn => "pause_turn",
            StopReason::StopSequence => "stop_sequence",
            StopReason::Refusal => "refusal",
            StopReason::ContextWindowExceeded => "model_context_window_exceeded",
            StopReason::Other(s) => s,
        }
    }
}

/// Token counts of one reply, in the API's naming.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
}

impl Usage {
    /// Everything the turn cost: all input (cache writes and reads included) plus output.
    pub(super) fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
            .saturating_add(self.output_tokens)
    }

    /// Overwrites the counts present in `value` (usage counts in the stream are cumulative).
    pub(super) fn update(&mut self, value: &Value) {
        let fields = [
            ("input_tokens", &mut self.input_tokens),
            ("output_tokens", &mut self.output_tokens),
            (
                "cache_creation_input_tokens",
                &mut self.cache_creation_input_tokens,
            ),
            ("cache_read_input_tokens", &mut self.cache_read_input_tokens),
        ];
        for (name, slot) in fields {
            if let Some(n) = value.get(name).and_then(Value::as_u64) {
                *slot = n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stop_reasons_round_trip() {
        for s in [
            "end_turn",
            "tool_use",
            "max_tokens",
            "pause_turn",
            "stop_sequence",
            "refusal",
            "model_context_window_exceeded",
            "something_new",
        ] {
            assert_eq!(StopReason::parse(s).as_str(), s);
        }
    }

    #[test]
    fn usage_counts_are_overwritten_not_added() {
        let mut usage = Usage::default();
        usage.update(
            &json!({"input_tokens": 25, "output_tokens": 1, "cache_creation_input_tokens": 3}),
        );
        usage.update(&json!({"output_tokens": 15}));
        usage.update(&json!({"output_tokens": 40, "cache_read_input_tokens": 2}));
        assert_eq!(
            usage,
            Usage {
                input_tokens: 25,
                output_tokens: 40,
                cache_creation_input_tokens: 3,
                cache_read_input_tokens: 2
            }
        );
        assert_eq!(usage.total(), 70);
    }
}

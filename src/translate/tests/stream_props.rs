//! Properties over generated upstream streams (text and tool calls split across many deltas):
//! any chunking gives the same bytes as one push, a client-side accumulator reproduces the text
//! and every tool input exactly, and a cut stream never gains a terminal.

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

use super::super::Dir;
use super::stream_support::*;

/// A generated response: text fragments, then tool calls with their argument fragments.
#[derive(Debug, Clone)]
struct Script {
    text: Vec<String>,
    calls: Vec<(String, String, Value, Vec<String>)>,
}

fn fragments(s: &str, cuts: &[Index]) -> Vec<String> {
    let bounds: Vec<usize> = s.char_indices().map(|(i, _)| i).skip(1).collect();
    let mut at: Vec<usize> = if bounds.is_empty() {
        Vec::new()
    } else {
        cuts.iter().map(|c| bounds[c.index(bounds.len())]).collect()
    };
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut from = 0;
    for to in at {
        out.push(s[from..to].to_owned());
        from = to;
    }
    out.push(s[from..].to_owned());
    out
}

fn script() -> impl Strategy<Value = Script> {
    let text = prop::collection::vec("(\\PC|[\"\\\\\n]){0,8}", 0..6);
    let args = prop::collection::btree_map(
        "[a-z]{1,6}",
        prop_oneof![
            "(\\PC|[\"\\\\\n]){0,10}".prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            prop::collection::vec(any::<bool>(), 0..3).prop_map(Value::from),
        ],
        0..4,
    );
    let call = (
        "[a-zA-Z0-9]{4,10}",
        "[a-z_]{1,10}",
        args,
        prop::collection::vec(any::<Index>(), 0..12),
    )
        .prop_map(|(id, name, args, cuts)| {
            let args = Value::Object(args.into_iter().collect());
            let pieces = fragments(&args.to_string(), &cuts);
            (format!("call_{id}"), name, args, pieces)
        });
    (text, prop::collection::vec(call, 0..4)).prop_map(|(text, calls)| Script { text, calls })
}

fn openai_recording(script: &Script) -> String {
    let mut out = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    out.extend(
        script
            .text
            .iter()
            .map(|t| chunk(json!({"content": t}), None)),
    );
    for (index, (id, name, _, pieces)) in script.calls.iter().enumerate() {
        out.push(chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        out.extend(pieces.iter().map(|p| {
            chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": p}}]}),
                None,
            )
        }));
    }
    out.push(": keep-alive\n\n".to_owned());
    out.push(chunk(
        json!({}),
        Some(if script.calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        }),
    ));
    out.push(openai_usage_chunk());
    out.push("data: [DONE]\n\n".to_owned());
    out.concat()
}

fn anthropic_recording(script: &Script) -> String {
    let mut out = vec![anthropic_start(), anthropic_event(&json!({"type": "ping"}))];
    let mut index = 0;
    if !script.text.is_empty() {
        out.push(anthropic_event(&json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
        out.extend(script.text.iter().map(|t| {
            anthropic_event(&json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": t}}))
        }));
        out.push(anthropic_event(
            &json!({"type": "content_block_stop", "index": 0}),
        ));
        index = 1;
    }
    for (id, name, _, pieces) in &script.calls {
        out.push(anthropic_event(
            &json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        ));
        out.extend(pieces.iter().map(|p| {
            anthropic_event(&json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": p}}))
        }));
        out.push(anthropic_event(
            &json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    out.push(anthropic_end(if script.calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }));
    out.concat()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn openai_streams_reach_anthropic_callers_intact(s in script(), cuts in prop::collection::vec(any::<Index>(), 0..40)) {
        let input = openai_recording(&s);
        let whole = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
        prop_assert_eq!(&translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &cuts), &whole);
        let view = anthropic_view(&whole).map_err(TestCaseError::fail)?;
        prop_assert!(view.stopped);
        prop_assert_eq!(view.text, s.text.concat());
        prop_assert_eq!(view.tools.len(), s.calls.len());
        for ((id, name, json), (want_id, want_name, args, _)) in view.tools.iter().zip(&s.calls) {
            prop_assert_eq!(id, want_id);
            prop_assert_eq!(name, want_name);
            prop_assert_eq!(&parsed(json), args);
        }
        let want_stop = if s.calls.is_empty() { "end_turn" } else { "tool_use" };
        prop_assert_eq!(view.stop_reason.as_deref(), Some(want_stop));
        prop_assert_eq!((view.usage.input_tokens, view.usage.cache_read_input_tokens, view.usage.output_tokens),
            (Some(30), Some(100), Some(12)));
    }

    #[test]
    fn anthropic_streams_reach_openai_callers_intact(s in script(), cuts in prop::collection::vec(any::<Index>(), 0..40)) {
        let input = anthropic_recording(&s);
        let whole = translate(Dir::OpenAiToAnthropic, true, input.as_bytes(), &[]);
        prop_assert_eq!(&translate(Dir::OpenAiToAnthropic, true, input.as_bytes(), &cuts), &whole);
        let view = openai_view(&whole).map_err(TestCaseError::fail)?;
        prop_assert!(view.done);
        prop_assert_eq!(view.role.as_deref(), Some("assistant"));
        prop_assert_eq!(view.text, s.text.concat());
        // One call index per tool_use block, counted from 0.
        let indices: Vec<u64> = view.calls.keys().copied().collect();
        prop_assert_eq!(indices, (0..s.calls.len() as u64).collect::<Vec<_>>());
        for ((id, name, args), (want_id, want_name, want_args, _)) in view.calls.values().zip(&s.calls) {
            prop_assert_eq!(id, want_id);
            prop_assert_eq!(name, want_name);
            prop_assert_eq!(&parsed(args), want_args);
        }
        let want_finish = if s.calls.is_empty() { "stop" } else { "tool_calls" };
        prop_assert_eq!(view.finish_reason.as_deref(), Some(want_finish));
        prop_assert_eq!(view.usage.map(|u| (u.prompt_tokens, u.completion_tokens)), Some((130, 15)));
    }

    #[test]
    fn a_cut_stream_never_gains_a_terminal(s in script(), cut in any::<Index>(), cuts in prop::collection::vec(any::<Index>(), 0..10)) {
        let openai = openai_recording(&s);
        let end = cut.index(openai.len());
        let view = anthropic_view(&translate(Dir::AnthropicToOpenAi, false, &openai.as_bytes()[..end], &cuts))
            .map_err(TestCaseError::fail)?;
        prop_assert!(!view.stopped);
        prop_assert!(view.stop_reason.is_none());

        let anthropic = anthropic_recording(&s);
        let end = cut.index(anthropic.len());
        let view = openai_view(&translate(Dir::OpenAiToAnthropic, true, &anthropic.as_bytes()[..end], &cuts))
            .map_err(TestCaseError::fail)?;
        prop_assert!(!view.done);
        prop_assert!(view.finish_reason.is_none());
    }
}

//! Whole responses taken to the other API and back keep content, tool calls, stop reason,
//! usage, id and model (`created` has no Anthropic counterpart).

use proptest::prelude::*;
use serde_json::Value;

use super::super::{Dir, anthropic as an, openai as oa, response};
use super::strategies::{ident, text, text_block, to_json, tool_call, tool_use_block};

fn anthropic_usage() -> impl Strategy<Value = an::Usage> {
    (
        0u64..1 << 40,
        0u64..1 << 40,
        0u64..1 << 40,
        0u64..1 << 40,
        proptest::option::of(0u64..1 << 20),
    )
        .prop_map(|(input, write, read, output, thinking)| an::Usage {
            input_tokens: Some(input),
            cache_creation_input_tokens: Some(write),
            cache_read_input_tokens: Some(read),
            output_tokens: Some(output),
            output_tokens_details: thinking.map(|t| an::OutputTokensDetails {
                thinking_tokens: Some(t),
            }),
        })
}

fn anthropic_message() -> impl Strategy<Value = an::MessageResponse> {
    let body = (
        proptest::option::of(text_block()),
        prop::collection::vec(tool_use_block(), 0..3),
    );
    (ident(), ident(), body, anthropic_usage(), 0usize..2).prop_map(
        |(id, model, (text, uses), usage, pick)| {
            let stop = match (uses.is_empty(), pick) {
                (false, 0) => "tool_use",
                (false, _) | (true, 0) => "max_tokens",
                (true, _) => "end_turn",
            };
            let mut content: Vec<an::Block> = text.into_iter().collect();
            content.extend(uses);
            an::MessageResponse {
                id: format!("msg_{id}"),
                kind: "message".to_owned(),
                role: an::Role::Assistant,
                content,
                model,
                stop_reason: Some(stop.to_owned()),
                stop_sequence: None,
                usage,
            }
        },
    )
}

fn openai_completion() -> impl Strategy<Value = oa::Completion> {
    let message = (
        proptest::option::of(text()),
        prop::collection::vec(tool_call(), 0..3),
    )
        .prop_filter("an answer has content", |(c, calls)| {
            c.is_some() || !calls.is_empty()
        });
    let usage = (
        0u64..1 << 40,
        0u64..1 << 40,
        0u64..1 << 40,
        0u64..1 << 40,
        proptest::option::of(0u64..1 << 20),
    );
    (ident(), ident(), message, usage, 0usize..3).prop_map(
        |(id, model, (content, calls), (input, cached, write, completion, reasoning), pick)| {
            let finish = match (calls.is_empty(), pick) {
                (false, 0) | (true, 0) => "length",
                (false, _) => "tool_calls",
                (true, 1) => "stop",
                (true, _) => "content_filter",
            };
            let prompt = input + cached + write;
            oa::Completion {
                id: format!("chatcmpl-{id}"),
                object: "chat.completion".to_owned(),
                created: 0,
                model,
                choices: vec![oa::Choice::assistant(content, calls, finish)],
                usage: Some(oa::Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    total_tokens: prompt + completion,
                    prompt_tokens_details: Some(oa::PromptTokensDetails {
                        cached_tokens: Some(cached),
                        cache_write_tokens: Some(write),
                    }),
                    completion_tokens_details: reasoning.map(|r| oa::CompletionTokensDetails {
                        reasoning_tokens: Some(r),
                    }),
                }),
            }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn anthropic_responses_survive_openai_and_back(original in anthropic_message()) {
        let openai = response(Dir::OpenAiToAnthropic, &to_json(&original)).map_err(|e| TestCaseError::fail(e.0))?;
        let back = response(Dir::AnthropicToOpenAi, &openai).map_err(|e| TestCaseError::fail(e.0))?;
        let back: an::MessageResponse = serde_json::from_slice(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, original);
    }

    #[test]
    fn openai_responses_survive_anthropic_and_back(original in openai_completion()) {
        let anthropic = response(Dir::AnthropicToOpenAi, &to_json(&original)).map_err(|e| TestCaseError::fail(e.0))?;
        let back = response(Dir::OpenAiToAnthropic, &anthropic).map_err(|e| TestCaseError::fail(e.0))?;
        let mut back: oa::Completion = serde_json::from_slice(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // `created` has no Anthropic counterpart: it is stamped from the clock.
        back.created = 0;
        for choice in &mut back.choices {
            for call in choice.message.tool_calls.iter_mut().flatten() {
                if let Some(f) = &mut call.function {
                    let parsed: Value = serde_json::from_str(&f.arguments).unwrap_or(Value::Null);
                    f.arguments = parsed.to_string();
                }
            }
        }
        prop_assert_eq!(back, original);
    }
}

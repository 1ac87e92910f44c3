//! Anthropic requests taken to OpenAI and back keep every field the mapping table keeps. The
//! only normalisation is the table's own: a single text block equals a plain string, and
//! `is_error: false` equals no flag.

use proptest::prelude::*;
use serde_json::Map;

use super::super::{Dir, anthropic as an, request};
use super::strategies::{
    ident, image_block, object, text, text_block, to_json, tool_result_block, tool_use_block,
    unit_float,
};

fn user_content() -> impl Strategy<Value = an::Content> {
    let others = prop_oneof![text_block(), image_block()];
    content(tool_result_block(), others)
}

fn assistant_content() -> impl Strategy<Value = an::Content> {
    content(text_block(), tool_use_block())
}

/// A plain string, or up to three blocks of `first` followed by up to three of `then` (at least
/// one block): the order a turn of one role keeps.
fn content(
    first: impl Strategy<Value = an::Block>,
    then: impl Strategy<Value = an::Block>,
) -> impl Strategy<Value = an::Content> {
    let blocks = (
        prop::collection::vec(first, 0..3),
        prop::collection::vec(then, 0..3),
    )
        .prop_filter("a turn has content", |(f, t)| {
            !f.is_empty() || !t.is_empty()
        })
        .prop_map(|(mut blocks, then)| {
            blocks.extend(then);
            an::Content::Blocks(blocks)
        });
    prop_oneof![text().prop_map(an::Content::Text), blocks]
}

fn anthropic_tools() -> impl Strategy<Value = (Option<Vec<an::Tool>>, Option<an::ToolChoice>)> {
    let tools =
        prop::collection::btree_map(ident(), (proptest::option::of(text()), object()), 0..3);
    tools.prop_flat_map(|tools| {
        let names: Vec<String> = tools.keys().cloned().collect();
        let tools: Vec<an::Tool> = tools
            .into_iter()
            .map(|(name, (description, schema))| an::Tool {
                kind: None,
                name,
                description,
                input_schema: Some(schema),
                cache_control: None,
            })
            .collect();
        let d = || proptest::option::of(any::<bool>());
        let choice = if names.is_empty() {
            Just(None).boxed()
        } else {
            prop_oneof![
                Just(None),
                d().prop_map(|d| Some(an::ToolChoice::Auto {
                    disable_parallel_tool_use: d
                })),
                d().prop_map(|d| Some(an::ToolChoice::Any {
                    disable_parallel_tool_use: d
                })),
                (prop::sample::select(names), d()).prop_map(|(name, d)| {
                    Some(an::ToolChoice::Tool {
                        name,
                        disable_parallel_tool_use: d,
                    })
                }),
                Just(Some(an::ToolChoice::None {})),
            ]
            .boxed()
        };
        let tools = (!tools.is_empty()).then_some(tools);
        (Just(tools), choice)
    })
}

fn anthropic_request() -> impl Strategy<Value = an::Request> {
    let system = proptest::option::of(prop_oneof![
        text().prop_map(an::Content::Text),
        prop::collection::vec(text_block(), 1..3).prop_map(an::Content::Blocks),
    ]);
    let turns = prop::collection::vec((user_content(), assistant_content()), 1..4);
    let sampling = (
        proptest::option::of(unit_float()),
        proptest::option::of(unit_float()),
        proptest::option::of(prop::collection::vec(text(), 0..3)),
    );
    let other = (
        1u64..200_000,
        proptest::option::of(any::<bool>()),
        proptest::option::of(text()),
    );
    (system, turns, anthropic_tools(), sampling, other).prop_map(
        |(
            system,
            turns,
            (tools, tool_choice),
            (temperature, top_p, stop_sequences),
            (max, stream, user),
        )| {
            let messages = turns
                .into_iter()
                .flat_map(|(u, a)| {
                    [
                        an::Message {
                            role: an::Role::User,
                            content: u,
                        },
                        an::Message {
                            role: an::Role::Assistant,
                            content: a,
                        },
                    ]
                })
                .collect();
            an::Request {
                model: "claude-test".to_owned(),
                max_tokens: Some(max),
                messages,
                system,
                stream,
                tools,
                tool_choice,
                metadata: user.map(|u| an::Metadata { user_id: Some(u) }),
                stop_sequences,
                temperature,
                top_p,
                extra: Map::new(),
            }
        },
    )
}

fn single_text(content: an::Content) -> an::Content {
    match content {
        an::Content::Blocks(blocks) => match blocks.as_slice() {
            [
                an::Block::Text {
                    text,
                    cache_control: None,
                    citations: None,
                },
            ] => an::Content::Text(text.clone()),
            _ => an::Content::Blocks(blocks),
        },
        text => text,
    }
}

fn normalise_anthropic(mut req: an::Request) -> an::Request {
    req.model = "m".to_owned();
    // To Anthropic, top_p goes only without temperature (newer Claude models refuse both).
    if req.temperature.is_some() {
        req.top_p = None;
    }
    req.system = req.system.map(single_text);
    for message in &mut req.messages {
        message.content = single_text(message.content.clone());
        if let an::Content::Blocks(blocks) = &mut message.content {
            for block in blocks {
                if let an::Block::ToolResult {
                    content, is_error, ..
                } = block
                {
                    *content = content.take().map(single_text);
                    *is_error = is_error.filter(|e| *e);
                }
            }
        }
    }
    req
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn anthropic_requests_survive_openai_and_back(original in anthropic_request()) {
        let (openai, _) = request(Dir::AnthropicToOpenAi, &to_json(&original), "gpt-test")
            .map_err(|e| TestCaseError::fail(e.0))?;
        let (back, _) = request(Dir::OpenAiToAnthropic, &openai, "claude-test")
            .map_err(|e| TestCaseError::fail(e.0))?;
        let back: an::Request = serde_json::from_slice(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(normalise_anthropic(back), normalise_anthropic(original));
    }
}

//! OpenAI requests taken to Anthropic and back keep every field the mapping table keeps. The
//! only normalisation is the table's own: a single text part equals a plain string, a single
//! stop string equals a one-element list, and tool arguments compare as JSON.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::super::{Dir, openai as oa, request};
use super::strategies::{ident, object, text, to_json, tool_call, unit_float};

fn openai_text() -> impl Strategy<Value = oa::Content> {
    prop_oneof![
        text().prop_map(oa::Content::Text),
        prop::collection::vec(text().prop_map(|text| oa::Part::Text { text }), 1..3)
            .prop_map(oa::Content::Parts),
    ]
}

fn openai_user() -> impl Strategy<Value = oa::Message> {
    let part = prop_oneof![
        text().prop_map(|text| oa::Part::Text { text }),
        ("image/png", "[A-Za-z0-9+/]{4,20}").prop_map(|(m, d)| oa::Part::ImageUrl {
            image_url: oa::ImageUrl {
                url: format!("data:{m};base64,{d}"),
                detail: None
            },
        }),
        ident().prop_map(|p| oa::Part::ImageUrl {
            image_url: oa::ImageUrl {
                url: format!("https://example.com/{p}.jpg"),
                detail: None
            },
        }),
    ];
    prop_oneof![
        text().prop_map(oa::Content::Text),
        prop::collection::vec(part, 1..4).prop_map(oa::Content::Parts),
    ]
    .prop_map(|content| oa::Message::User {
        content,
        name: None,
    })
}

/// An assistant turn, then a `tool` message for each of its calls.
fn openai_assistant() -> impl Strategy<Value = Vec<oa::Message>> {
    let results = prop::collection::vec(openai_text(), 3);
    (
        proptest::option::of(openai_text()),
        prop::collection::vec(tool_call(), 0..3),
        results,
    )
        .prop_filter("a turn has content", |(c, calls, _)| {
            c.is_some() || !calls.is_empty()
        })
        .prop_map(|(content, calls, results)| {
            let mut out = Vec::new();
            for (call, content) in calls.iter().zip(results) {
                out.push(oa::Message::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                });
            }
            let tool_calls = (!calls.is_empty()).then_some(calls);
            out.insert(
                0,
                oa::Message::Assistant {
                    content,
                    tool_calls,
                    refusal: None,
                    name: None,
                },
            );
            out
        })
}

fn openai_tools()
-> impl Strategy<Value = (Option<Vec<oa::Tool>>, Option<oa::ToolChoice>, Option<bool>)> {
    let tools =
        prop::collection::btree_map(ident(), (proptest::option::of(text()), object()), 1..3);
    let some = tools.prop_flat_map(|tools| {
        let names: Vec<String> = tools.keys().cloned().collect();
        let tools: Vec<oa::Tool> = tools
            .into_iter()
            .map(|(name, (description, parameters))| oa::Tool {
                kind: oa::function_kind(),
                function: Some(oa::FunctionDef {
                    name,
                    description,
                    parameters: Some(parameters),
                    strict: None,
                }),
            })
            .collect();
        let mode = |m: &str| Some(oa::ToolChoice::Mode(m.to_owned()));
        let choice = prop_oneof![
            (Just(None), Just(None)),
            (Just(mode("auto")), proptest::option::of(any::<bool>())),
            (Just(mode("required")), proptest::option::of(any::<bool>())),
            (Just(mode("none")), Just(None)),
            (
                prop::sample::select(names).prop_map(|name| Some(oa::ToolChoice::Named(
                    oa::NamedChoice {
                        kind: oa::function_kind(),
                        function: Some(oa::Name { name }),
                        allowed_tools: None,
                    }
                ))),
                proptest::option::of(any::<bool>())
            ),
        ];
        (Just(Some(tools)), choice)
            .prop_map(|(tools, (choice, parallel))| (tools, choice, parallel))
    });
    prop_oneof![Just((None, None, None)), some]
}

fn openai_request() -> impl Strategy<Value = oa::Request> {
    let system = proptest::option::of(openai_text());
    let turns = prop::collection::vec((openai_user(), openai_assistant()), 1..4);
    let stop = proptest::option::of(prop_oneof![
        text().prop_map(oa::Stop::One),
        prop::collection::vec(text(), 0..3).prop_map(oa::Stop::Many),
    ]);
    let sampling = (
        proptest::option::of(unit_float()),
        proptest::option::of(unit_float()),
        stop,
    );
    let other = (1u64..200_000, any::<bool>(), proptest::option::of(text()));
    (system, turns, openai_tools(), sampling, other).prop_map(
        |(
            system,
            turns,
            (tools, tool_choice, parallel_tool_calls),
            (temperature, top_p, stop),
            (max, stream, user),
        )| {
            let mut messages: Vec<oa::Message> = system
                .map(|content| oa::Message::System {
                    content,
                    name: None,
                })
                .into_iter()
                .collect();
            for (user, assistant) in turns {
                messages.push(user);
                messages.extend(assistant);
            }
            oa::Request {
                model: "gpt-test".to_owned(),
                messages,
                max_completion_tokens: Some(max),
                max_tokens: None,
                stream: Some(stream),
                stream_options: stream.then_some(oa::StreamOptions {
                    include_usage: Some(true),
                }),
                tools,
                tool_choice,
                parallel_tool_calls,
                stop,
                temperature,
                top_p,
                user,
                n: None,
                extra: Map::new(),
            }
        },
    )
}

fn single_part(content: oa::Content) -> oa::Content {
    match content {
        oa::Content::Parts(parts) => match parts.as_slice() {
            [oa::Part::Text { text }] => oa::Content::Text(text.clone()),
            _ => oa::Content::Parts(parts),
        },
        text => text,
    }
}

fn normalise_openai(mut req: oa::Request) -> oa::Request {
    req.model = "m".to_owned();
    // To Anthropic, top_p goes only without temperature (newer Claude models refuse both).
    if req.temperature.is_some() {
        req.top_p = None;
    }
    req.stop = req.stop.map(|s| match s {
        oa::Stop::One(one) => oa::Stop::Many(vec![one]),
        many => many,
    });
    for message in &mut req.messages {
        match message {
            oa::Message::System { content, .. }
            | oa::Message::Developer { content, .. }
            | oa::Message::User { content, .. }
            | oa::Message::Tool { content, .. } => *content = single_part(content.clone()),
            oa::Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                *content = content.take().map(single_part);
                for call in tool_calls.iter_mut().flatten() {
                    if let Some(f) = &mut call.function {
                        let parsed: Value =
                            serde_json::from_str(&f.arguments).unwrap_or(Value::Null);
                        f.arguments = parsed.to_string();
                    }
                }
            }
            oa::Message::Other => {}
        }
    }
    req
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn openai_requests_survive_anthropic_and_back(original in openai_request()) {
        let (anthropic, _) = request(Dir::OpenAiToAnthropic, &to_json(&original), "claude-test")
            .map_err(|e| TestCaseError::fail(e.0))?;
        let (back, _) = request(Dir::AnthropicToOpenAi, &anthropic, "gpt-test")
            .map_err(|e| TestCaseError::fail(e.0))?;
        let back: oa::Request = serde_json::from_slice(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(normalise_openai(back), normalise_openai(original));
    }
}

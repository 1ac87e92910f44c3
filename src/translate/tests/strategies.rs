//! Strategies shared by the round-trip properties.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::super::{anthropic as an, openai as oa};

pub(super) fn text() -> impl Strategy<Value = String> {
    // No leading `[`: a text starting with the tool-error marker would read as an error.
    "[a-zA-Z0-9][a-zA-Z0-9 .,]{0,15}"
}

pub(super) fn ident() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9]{1,10}"
}

pub(super) fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        text().prop_map(Value::from),
        Just(Value::Null),
    ]
}

pub(super) fn object() -> impl Strategy<Value = Value> {
    let inner = prop::collection::btree_map(ident(), leaf(), 0..3)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()));
    let value = prop_oneof![
        leaf(),
        inner,
        prop::collection::vec(leaf(), 0..3).prop_map(Value::from)
    ];
    prop::collection::btree_map(ident(), value, 0..4)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// Dyadic fractions in [0, 1]: exact in binary and in short decimal.
pub(super) fn unit_float() -> impl Strategy<Value = f64> {
    (0u32..=64).prop_map(|k| f64::from(k) / 64.0)
}

pub(super) fn text_block() -> impl Strategy<Value = an::Block> {
    text().prop_map(|text| an::Block::Text {
        text,
        cache_control: None,
        citations: None,
    })
}

pub(super) fn image_block() -> impl Strategy<Value = an::Block> {
    let source = prop_oneof![
        ("image/(png|jpeg|gif|webp)", "[A-Za-z0-9+/]{4,20}={0,2}")
            .prop_map(|(media_type, data)| an::Source::Base64 { media_type, data }),
        ident().prop_map(|p| an::Source::Url {
            url: format!("https://example.com/{p}.png")
        }),
    ];
    source.prop_map(|source| an::Block::Image {
        source,
        cache_control: None,
    })
}

pub(super) fn tool_use_block() -> impl Strategy<Value = an::Block> {
    (ident(), ident(), object()).prop_map(|(id, name, input)| an::Block::ToolUse {
        id: format!("toolu_{id}"),
        name,
        input,
        cache_control: None,
    })
}

/// An OpenAI function call with JSON-object arguments.
pub(super) fn tool_call() -> impl Strategy<Value = oa::ToolCall> {
    (ident(), ident(), object()).prop_map(|(id, name, args)| oa::ToolCall {
        id: format!("call_{id}"),
        kind: oa::function_kind(),
        function: Some(oa::FunctionCall {
            name,
            arguments: args.to_string(),
        }),
    })
}

pub(super) fn tool_result_block() -> impl Strategy<Value = an::Block> {
    let content = prop_oneof![
        Just(None),
        text().prop_map(|t| Some(an::Content::Text(t))),
        prop::collection::vec(text_block(), 1..3).prop_map(|b| Some(an::Content::Blocks(b))),
    ];
    (ident(), content, proptest::option::of(any::<bool>())).prop_map(|(id, content, is_error)| {
        an::Block::ToolResult {
            tool_use_id: format!("toolu_{id}"),
            content,
            is_error,
            cache_control: None,
        }
    })
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

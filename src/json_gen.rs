//! Generated JSON values for the property tests of the hand-written JSON walks
//! (`splice::tail`, `responses::Turn::read`): every value type, strings with quotes,
//! backslashes, brackets and control characters, nested up to three levels.

use proptest::prelude::*;
use serde_json::Value;

/// A JSON value whose nested objects have keys drawn from `key`.
pub(crate) fn value(key: BoxedStrategy<String>) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[^\u{0}]{0,6}".prop_map(Value::String),
        Just(Value::String("\"usage\": {\\}]\n\u{1}\\".into())),
    ];
    leaf.prop_recursive(3, 16, 3, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

//! Structured output (a JSON schema the answer must follow) across the two APIs (SPEC §10).
//!
//! Anthropic: `output_config.format = {type: "json_schema", schema}` (and the earlier beta form,
//! a top-level `output_format` of the same shape). OpenAI Chat Completions: `response_format =
//! {type: "json_schema", json_schema: {name, schema, strict?}}`. A schema is carried across; a
//! format the other side cannot hold (OpenAI's schema-less `json_object`, an unknown type)
//! makes the request untranslatable: the caller asked for JSON, and free text in its place
//! would break it silently.

use serde_json::{Map, Value, json};

use super::Untranslatable;

/// The `name` OpenAI requires on a schema; Anthropic's format has none.
const SCHEMA_NAME: &str = "output";

/// Takes Anthropic's `output_format` / `output_config.format` out of `extra` and returns the
/// OpenAI `response_format` that carries it. Other `output_config` keys stay behind for the
/// drop rules.
pub(super) fn to_response_format(
    extra: &mut Map<String, Value>,
) -> Result<Option<Value>, Untranslatable> {
    let mut format = extra.remove("output_format").filter(|v| !v.is_null());
    if let Some(Value::Object(config)) = extra.get_mut("output_config") {
        if let Some(f) = config.remove("format").filter(|v| !v.is_null()) {
            format = Some(f);
        }
        if config.is_empty() {
            extra.remove("output_config");
        }
    }
    let Some(format) = format else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let schema = format.get("schema").cloned().ok_or_else(|| {
                Untranslatable("the structured-output format has no `schema`".to_owned())
            })?;
            Ok(Some(json!({
                "type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": schema},
            })))
        }
        other => Err(Untranslatable(format!(
            "structured output of type `{}` has no OpenAI Chat Completions equivalent",
            other.unwrap_or("(none)")
        ))),
    }
}

/// Takes OpenAI's `response_format` out of `extra` and returns the Anthropic `output_config`
/// that carries it (`None` for plain text, the default).
pub(super) fn to_output_config(
    extra: &mut Map<String, Value>,
) -> Result<Option<Value>, Untranslatable> {
    let Some(format) = extra.remove("response_format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .cloned()
                .ok_or_else(|| {
                    Untranslatable("response_format json_schema has no `schema`".to_owned())
                })?;
            Ok(Some(json!({"format": {"type": "json_schema", "schema": schema}})))
        }
        Some("json_object") => Err(Untranslatable(
            "response_format `json_object` (JSON without a schema) has no Anthropic Messages equivalent; send a json_schema instead"
                .to_owned(),
        )),
        other => Err(Untranslatable(format!(
            "response_format of type `{}` has no Anthropic Messages equivalent",
            other.unwrap_or("(none)")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn anthropic_schema_in_either_field_becomes_a_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        for extra in [
            json!({"output_config": {"format": {"type": "json_schema", "schema": schema}}}),
            json!({"output_format": {"type": "json_schema", "schema": schema}}),
        ] {
            let mut extra = map(extra);
            let got = to_response_format(&mut extra);
            assert_eq!(
                got,
                Ok(Some(json!({"type": "json_schema",
                    "json_schema": {"name": "output", "schema": schema}})))
            );
            assert!(extra.is_empty(), "{extra:?}");
        }
    }

    #[test]
    fn other_output_config_keys_stay_for_the_drop_rules() {
        let mut extra = map(json!({"output_config": {"effort": "low"}}));
        assert_eq!(to_response_format(&mut extra), Ok(None));
        assert_eq!(extra.get("output_config"), Some(&json!({"effort": "low"})));
    }

    #[test]
    fn openai_schema_becomes_output_config_and_json_object_is_refused() {
        let schema = json!({"type": "object"});
        let mut extra = map(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "strict": true, "schema": schema}}}));
        assert_eq!(
            to_output_config(&mut extra),
            Ok(Some(
                json!({"format": {"type": "json_schema", "schema": schema}})
            ))
        );
        let mut text = map(json!({"response_format": {"type": "text"}}));
        assert_eq!(to_output_config(&mut text), Ok(None));
        let mut object = map(json!({"response_format": {"type": "json_object"}}));
        assert!(to_output_config(&mut object).is_err());
    }
}

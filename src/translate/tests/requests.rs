//! Request translation on hand-written bodies: the exact wire shape sent upstream, the drop
//! labels, and the requests that must not be sent to a step of the other kind.

use serde_json::{Value, json};

use super::super::{Dir, Untranslatable, request};

fn translate(dir: Dir, body: &Value) -> Result<(Value, Vec<&'static str>), Untranslatable> {
    let (bytes, dropped) = request(dir, body.to_string().as_bytes(), "target-model")?;
    let value = serde_json::from_slice(&bytes).map_err(|e| Untranslatable(e.to_string()))?;
    Ok((value, dropped))
}

#[test]
fn anthropic_request_is_sent_as_chat_completions() -> Result<(), Untranslatable> {
    let body = json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
        "system": [{"type": "text", "text": "Answer in one line.", "cache_control": {"type": "ephemeral"}}],
        "thinking": {"type": "enabled", "budget_tokens": 2000}, "top_k": 5,
        "temperature": 0.5, "top_p": 0.9, "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
        "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "c2ln"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no network", "is_error": true},
                {"type": "text", "text": "Try again."}
            ]}
        ]
    });
    let (out, dropped) = translate(Dir::AnthropicToOpenAi, &body)?;
    let want = json!({
        "model": "target-model", "max_completion_tokens": 1024, "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0.5, "top_p": 0.9, "stop": ["END"], "user": "u-1",
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}}],
        "tool_choice": "auto", "parallel_tool_calls": false,
        "messages": [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
            ]},
            {"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "toolu_1",
                "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "[tool error] no network"},
            {"role": "user", "content": "Try again."}
        ]
    });
    assert_eq!(out, want);
    let mut dropped = dropped;
    dropped.sort_unstable();
    assert_eq!(
        dropped,
        [
            "cache_control",
            "server_tools",
            "thinking",
            "thinking_blocks",
            "top_k"
        ]
    );
    Ok(())
}

#[test]
fn openai_request_is_sent_as_anthropic_messages() -> Result<(), Untranslatable> {
    let body = json!({
        "model": "gpt-4.1", "n": 1, "stop": "END", "user": "u-2", "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "tools": [{"type": "function", "function": {"name": "ls", "strict": true}}],
        "tool_choice": "required", "parallel_tool_calls": false,
        "messages": [
            {"role": "developer", "content": "Rule one."},
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "high"}}
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"dir\":\"/\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "bin etc"},
            {"role": "user", "content": "And?"}
        ]
    });
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    let want = json!({
        "model": "target-model", "max_tokens": 4096, "system": "Rule one.",
        "stop_sequences": ["END"], "metadata": {"user_id": "u-2"},
        "output_config": {"format": {"type": "json_schema", "schema": {}}},
        "tools": [{"name": "ls", "input_schema": {"type": "object", "properties": {}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"dir": "/"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "bin etc"},
                {"type": "text", "text": "And?"}
            ]}
        ]
    });
    assert_eq!(out, want);
    let mut dropped = dropped;
    dropped.sort_unstable();
    assert_eq!(dropped, ["image_detail", "seed", "strict"]);
    Ok(())
}

#[test]
fn max_tokens_prefers_max_completion_tokens_then_max_tokens() -> Result<(), Untranslatable> {
    let messages = json!([{"role": "user", "content": "hi"}]);
    for (body, want) in [
        (
            json!({"model": "m", "messages": messages, "max_tokens": 10, "max_completion_tokens": 20}),
            20,
        ),
        (
            json!({"model": "m", "messages": messages, "max_tokens": 10}),
            10,
        ),
        (json!({"model": "m", "messages": messages}), 4096),
    ] {
        let (out, _) = translate(Dir::OpenAiToAnthropic, &body)?;
        assert_eq!(out["max_tokens"], want);
    }
    Ok(())
}

#[test]
fn temperature_above_anthropics_range_is_clamped() -> Result<(), Untranslatable> {
    let body =
        json!({"model": "m", "temperature": 1.5, "messages": [{"role": "user", "content": "hi"}]});
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(out["temperature"], 1.0);
    assert_eq!(dropped, ["temperature_clamped"]);
    Ok(())
}

#[test]
fn top_p_beside_temperature_is_dropped_for_anthropic() -> Result<(), Untranslatable> {
    let with = |extra: Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        translate(Dir::OpenAiToAnthropic, &body)
    };
    let (out, dropped) = with(json!({"temperature": 0.2, "top_p": 0.4}))?;
    assert_eq!(
        (out["temperature"].clone(), out.get("top_p")),
        (json!(0.2), None)
    );
    assert_eq!(dropped, ["top_p"]);
    // Alone, either goes as it came.
    let (out, dropped) = with(json!({"top_p": 0.4}))?;
    assert_eq!((out["top_p"].clone(), dropped.len()), (json!(0.4), 0));
    let (out, _) = with(json!({"temperature": 0}))?;
    assert_eq!(out["temperature"], 0.0);
    Ok(())
}

#[test]
fn blank_text_merged_into_a_turn_is_dropped_for_anthropic() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": " "}, {"type": "text", "text": "hi"}]}
    ]});
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(
        out["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
    assert_eq!(dropped, ["empty_messages"]);
    // A lone empty message is left for the provider to refuse as it would.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": ""}]});
    let (out, _) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(out["messages"], json!([{"role": "user", "content": ""}]));
    Ok(())
}

#[test]
fn only_server_tools_leave_no_tools_and_no_choice() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "max_tokens": 5,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "auto"},
        "messages": [{"role": "user", "content": "news?"}]});
    let (out, dropped) = translate(Dir::AnthropicToOpenAi, &body)?;
    assert_eq!(out.get("tools"), None);
    assert_eq!(out.get("tool_choice"), None);
    assert_eq!(out.get("parallel_tool_calls"), None);
    assert_eq!(dropped, ["server_tools"]);
    Ok(())
}

#[test]
fn allowed_tools_narrow_the_tool_list() -> Result<(), Untranslatable> {
    let function = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "go"}],
        "tools": [function("a"), function("b")],
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required",
            "tools": [{"type": "function", "function": {"name": "b"}}]}}});
    let (out, _) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(
        out["tools"],
        json!([{"name": "b", "input_schema": {"type": "object"}}])
    );
    assert_eq!(out["tool_choice"], json!({"type": "any"}));
    Ok(())
}

#[test]
fn later_system_messages_keep_their_position() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "A"},
        {"role": "developer", "content": "A2"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "B"}]},
        {"role": "user", "content": "again"}
    ]});
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(
        out["system"],
        json!([{"type": "text", "text": "A"}, {"type": "text", "text": "A2"}])
    );
    assert_eq!(
        out["messages"],
        json!([
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "B"}]},
            {"role": "user", "content": "again"}
        ])
    );
    assert!(dropped.is_empty(), "{dropped:?}");
    Ok(())
}

#[test]
fn anthropic_system_entries_in_messages_keep_their_position() -> Result<(), Untranslatable> {
    // Claude Code sends these mid-conversation for models it does not recognise.
    let body = json!({"model": "m", "max_tokens": 10, "system": "top", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "reminder"},
        {"role": "system", "content": [{"type": "text", "text": "two", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "go"}
    ]});
    let (out, _) = translate(Dir::AnthropicToOpenAi, &body)?;
    assert_eq!(
        out["messages"],
        json!([
            {"role": "system", "content": "top"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": "reminder"},
            {"role": "system", "content": "two"},
            {"role": "user", "content": "go"}
        ])
    );
    Ok(())
}

#[test]
fn structured_output_is_carried_both_ways() -> Result<(), Untranslatable> {
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "additionalProperties": false});
    let body = json!({"model": "m", "max_tokens": 10,
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
        "messages": [{"role": "user", "content": "count"}]});
    let (out, dropped) = translate(Dir::AnthropicToOpenAi, &body)?;
    assert_eq!(
        out["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}})
    );
    assert!(dropped.is_empty(), "{dropped:?}");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "count"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}});
    let (out, _) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(
        out["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "count"}],
        "response_format": {"type": "json_object"}});
    assert!(translate(Dir::OpenAiToAnthropic, &body).is_err());
    Ok(())
}

#[test]
fn malformed_history_arguments_become_an_empty_input() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c.1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "c.1", "content": [{"type": "text", "text": "[tool error] bad"}]}
    ]});
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(
        out["messages"][1]["content"],
        json!([{"type": "tool_use", "id": "c_1", "name": "f", "input": {}}])
    );
    assert_eq!(
        out["messages"][2]["content"],
        json!([{"type": "tool_result", "tool_use_id": "c_1", "is_error": true,
                "content": [{"type": "text", "text": "bad"}]}])
    );
    assert_eq!(dropped, ["invalid_tool_arguments"]);
    Ok(())
}

#[test]
fn requests_that_need_what_the_other_side_lacks_are_untranslatable() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let server = json!({"type": "web_search_20250305", "name": "web_search"});
    let custom = json!({"name": "f", "input_schema": {"type": "object"}});
    let anthropic_cases = [
        json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [server, custom],
               "tool_choice": {"type": "tool", "name": "web_search"}}),
        json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [server],
               "tool_choice": {"type": "any"}}),
        json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]}),
        json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]}),
        json!({"model": "m", "max_tokens": 5, "messages": "not a list"}),
    ];
    for body in anthropic_cases {
        assert!(translate(Dir::AnthropicToOpenAi, &body).is_err(), "{body}");
    }
    let openai_cases = [
        json!({"model": "m", "n": 2, "messages": user}),
        json!({"model": "m", "messages": user, "tools": [{"type": "custom", "custom": {"name": "g"}}],
               "tool_choice": {"type": "custom", "custom": {"name": "g"}}}),
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-1"}}]}]}),
        json!({"model": "m", "messages": user, "tool_choice": "sometimes"}),
        json!({"messages": user}),
    ];
    for body in openai_cases {
        assert!(translate(Dir::OpenAiToAnthropic, &body).is_err(), "{body}");
    }
}

#[test]
fn documents_travel_as_file_parts_and_back() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "title": "a.pdf",
         "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
        {"type": "text", "text": "Summarise."}]}]});
    let (out, _) = translate(Dir::AnthropicToOpenAi, &body)?;
    assert_eq!(
        out["messages"][0]["content"][0],
        json!({"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}})
    );
    let (back, _) = translate(Dir::OpenAiToAnthropic, &out)?;
    assert_eq!(back["messages"], body["messages"]);
    Ok(())
}

#[test]
fn a_system_without_text_is_left_out() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "max_tokens": 5,
        "system": [{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}],
        "messages": [{"role": "user", "content": "hi"}]});
    let (out, dropped) = translate(Dir::AnthropicToOpenAi, &body)?;
    assert_eq!(out["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(dropped, ["misplaced_media"]);
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]},
        {"role": "user", "content": "hi"}]});
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(out.get("system"), None);
    assert_eq!(dropped, ["unsupported_parts"]);
    Ok(())
}

/// A Chat caller's final assistant message reaches Anthropic as it is, where it is a prefill
/// (continued, not answered after): counted, as the other direction counts it.
#[test]
fn a_final_assistant_message_is_counted_as_a_prefill() -> Result<(), Untranslatable> {
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "partial"}]});
    let (out, dropped) = translate(Dir::OpenAiToAnthropic, &body)?;
    assert_eq!(dropped, ["assistant_prefill"]);
    assert_eq!(out["messages"][1]["content"], "partial");
    let body = json!({"model": "m", "messages": [
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Hi."}]});
    assert!(translate(Dir::OpenAiToAnthropic, &body)?.1.is_empty());
    Ok(())
}

//! Translation tests: requests, whole answers and streams, Responses ↔ Chat and ↔ Anthropic.

use serde_json::{Value, json};

use super::*;

fn chat_of(req: Value) -> (Value, Vec<&'static str>) {
    let (bytes, labels) = request_for(Target::Chat, req.to_string().as_bytes(), "m")
        .unwrap_or_else(|e| panic!("untranslatable: {e}"));
    (serde_json::from_slice(&bytes).unwrap_or_default(), labels)
}

#[test]
fn request_maps_instructions_items_tools_and_sampling() {
    let req = json!({
        "model": "alias", "instructions": "Be brief.", "stream": true,
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking"}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        ],
        "tools": [{"type": "function", "name": "weather", "description": "d",
                   "parameters": {"type": "object"}, "strict": true},
                  {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "weather"},
        "parallel_tool_calls": false, "max_output_tokens": 100, "temperature": 0.5, "top_p": 0.9,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": false, "include": ["reasoning.encrypted_content"], "frob": 1,
    });
    let (chat, labels) = chat_of(req);
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Checking", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        ])
    );
    assert_eq!(
        chat["tools"],
        json!([{"type": "function", "function": {"name": "weather", "description": "d",
                "parameters": {"type": "object"}, "strict": true}}])
    );
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "weather"}})
    );
    assert_eq!(chat["parallel_tool_calls"], false);
    assert_eq!(chat["max_completion_tokens"], 100);
    assert_eq!(chat["temperature"], 0.5);
    assert_eq!(chat["top_p"], 0.9);
    assert_eq!(chat["reasoning_effort"], "low");
    assert_eq!(chat["model"], "m");
    assert_eq!(chat["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        chat["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}})
    );
    let mut labels = labels;
    labels.sort_unstable();
    assert_eq!(
        labels,
        [
            "builtin_tools",
            "include",
            "reasoning_items",
            "reasoning_summary",
            "store",
            "unknown_fields"
        ]
    );
}

#[test]
fn anthropic_step_gets_messages_and_refuses_structured_output() {
    let req = json!({"model": "a", "instructions": "sys", "input": "hi", "max_output_tokens": 50,
                     "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]});
    let (bytes, _) = request_for(Target::Anthropic, req.to_string().as_bytes(), "claude")
        .unwrap_or_else(|e| panic!("{e}"));
    let out: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    assert_eq!(out["model"], "claude");
    assert_eq!(out["max_tokens"], 50);
    assert_eq!(out["system"], "sys");
    assert_eq!(out["messages"][0]["role"], "user");
    assert_eq!(out["tools"][0]["name"], "f");
    let structured =
        json!({"model": "a", "input": "hi", "text": {"format": {"type": "json_object"}}});
    assert!(request_for(Target::Anthropic, structured.to_string().as_bytes(), "c").is_err());
    assert!(request_for(Target::Chat, structured.to_string().as_bytes(), "c").is_ok());
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let with_schema = json!({"model": "a", "input": "hi", "text": {"format":
        {"type": "json_schema", "name": "n", "schema": schema}}});
    let (bytes, _) = request_for(Target::Anthropic, with_schema.to_string().as_bytes(), "c")
        .unwrap_or_else(|e| panic!("{e}"));
    let out: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    assert_eq!(
        out["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
}

#[test]
fn state_held_elsewhere_makes_the_step_unfit() {
    for req in [
        json!({"model": "a", "input": "hi", "background": true}),
        json!({"model": "a", "input": [{"type": "item_reference", "id": "msg_1"}]}),
        json!({"model": "a", "input": "hi", "tool_choice": {"type": "web_search"}}),
        json!({"model": "a", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
    ] {
        assert!(
            request_for(Target::Chat, req.to_string().as_bytes(), "m").is_err(),
            "{req}"
        );
    }
    assert!(
        request_for(
            Target::Chat,
            br#"{"model":"a","input":"x","background":false}"#,
            "m"
        )
        .is_ok()
    );
}

#[test]
fn fields_of_the_wrong_type_or_no_input_make_the_step_unfit_not_silent() {
    for (req, why) in [
        (
            json!({"model": "a", "input": "x", "instructions": 42}),
            "`instructions`",
        ),
        (
            json!({"model": "a", "input": "x", "tools": "nope"}),
            "`tools`",
        ),
        (json!({"model": "a"}), "no `input`"),
        (json!({"model": "a", "input": []}), "no `input`"),
        (json!({"model": "a", "input": ""}), "no `input`"),
        (
            json!({"model": "a", "instructions": "be brief", "input": [{"type": "reasoning"}]}),
            "no `input`",
        ),
    ] {
        match request_for(Target::Chat, req.to_string().as_bytes(), "m") {
            Err(e) => assert!(e.0.contains(why), "{req}: {}", e.0),
            Ok(_) => panic!("{req} was translated"),
        }
    }
    for req in [
        json!({"model": "a", "input": "x", "instructions": null, "tools": null}),
        json!({"model": "a", "input": "x", "tools": []}),
    ] {
        assert!(
            request_for(Target::Chat, req.to_string().as_bytes(), "m").is_ok(),
            "{req}"
        );
    }
}

fn ctx() -> ResponseCtx {
    ResponseCtx::new(
        "resp_t1".into(),
        7,
        br#"{"model":"x","instructions":"I","previous_response_id":"resp_0"}"#,
    )
}

#[test]
fn chat_answer_becomes_a_response_object() {
    let chat = json!({"id": "chatcmpl-1", "model": "gpt", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "Sure", "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
        "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}}});
    let obj = response_for(Target::Chat, chat.to_string().as_bytes(), &ctx()).unwrap_or_default();
    assert_eq!(obj["id"], "resp_t1");
    assert_eq!(obj["object"], "response");
    assert_eq!(obj["status"], "completed");
    assert_eq!(obj["instructions"], "I");
    assert_eq!(obj["previous_response_id"], "resp_0");
    assert_eq!(obj["output"][0]["content"][0]["text"], "Sure");
    assert_eq!(
        obj["output"][1],
        json!({"id": "fc_call_9", "type": "function_call", "status": "completed",
        "call_id": "call_9", "name": "f", "arguments": "{\"a\":1}"})
    );
    assert_eq!(obj["usage"]["input_tokens"], 20);
    assert_eq!(obj["usage"]["input_tokens_details"]["cached_tokens"], 8);
    assert_eq!(obj["usage"]["total_tokens"], 25);
    let bad = json!({"model": "g", "choices": [{"message": {"tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}, "finish_reason": "tool_calls"}]});
    assert!(response_for(Target::Chat, bad.to_string().as_bytes(), &ctx()).is_err());
    // Calls without ids (some compatible servers) get stand-ins of their own, as streamed
    // ones do: two calls sharing "" could not be told apart when their outputs come back.
    let idless = json!({"model": "g", "choices": [{"message": {"tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}},
        {"id": "", "function": {"name": "g", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]});
    let obj = response_for(Target::Chat, idless.to_string().as_bytes(), &ctx()).unwrap_or_default();
    assert_eq!(obj["output"][0]["call_id"], "call_legate_0");
    assert_eq!(obj["output"][1]["call_id"], "call_legate_1");
}

#[test]
fn anthropic_answer_becomes_a_response_object() {
    let msg = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
        "content": [{"type": "text", "text": "Hi"}], "stop_reason": "max_tokens", "stop_sequence": null,
        "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2}});
    let obj =
        response_for(Target::Anthropic, msg.to_string().as_bytes(), &ctx()).unwrap_or_default();
    assert_eq!(obj["status"], "incomplete");
    assert_eq!(obj["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(obj["output"][0]["content"][0]["text"], "Hi");
    assert_eq!(obj["usage"]["input_tokens"], 5);
    assert_eq!(obj["usage"]["input_tokens_details"]["cached_tokens"], 2);
}

fn events(bytes: &[u8]) -> Vec<Value> {
    let mut p = crate::sse::SseParser::new();
    p.push(bytes);
    p.finish();
    std::iter::from_fn(|| p.next_event())
        .map(|e| {
            let v: Value = serde_json::from_str(&e.data).unwrap_or_default();
            assert_eq!(e.event.as_deref(), v["type"].as_str());
            v
        })
        .collect()
}

fn types(evs: &[Value]) -> Vec<&str> {
    evs.iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect()
}

#[test]
fn chat_stream_becomes_semantic_events_one_byte_at_a_time() {
    let chunks = [
        r#"{"model":"gpt","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        r#"{"model":"gpt","choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
        r#"{"model":"gpt","choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
        r#"{"model":"gpt","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
        r#"{"model":"gpt","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]}"#,
        r#"{"model":"gpt","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
        r#"{"model":"gpt","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        r#"{"model":"gpt","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#,
        "[DONE]",
    ];
    let wire: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    let mut s = ResponsesStream::from_chat(ctx());
    let mut out = Vec::new();
    for b in wire.as_bytes() {
        out.extend(s.push(std::slice::from_ref(b)));
    }
    out.extend(s.finish());
    let evs = events(&out);
    assert_eq!(
        types(&evs),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
    }
    let done = &evs[14]["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(done["output"][1]["call_id"], "call_1");
    assert_eq!(done["usage"]["input_tokens"], 9);
    assert!(s.is_complete());
    assert_eq!(s.final_response(), Some(done));
}

#[test]
fn a_cut_stays_a_cut_and_errors_end_with_response_failed() {
    let mut s = ResponsesStream::from_chat(ctx());
    let mut out = s.push(
        b"data: {\"model\":\"g\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
    );
    out.extend(s.finish());
    assert!(!s.is_complete());
    assert!(
        !types(&events(&out))
            .iter()
            .any(|t| t.starts_with("response.completed"))
    );

    let mut s = ResponsesStream::from_chat(ctx());
    let out = s.push(
        b"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n",
    );
    let evs = events(&out);
    assert_eq!(types(&evs)[2..], ["error", "response.failed"]);
    assert_eq!(evs[2]["message"], "boom");
    assert_eq!(evs[2]["code"], "server_error");
    assert!(s.is_complete());
}

#[test]
fn broken_tool_arguments_fail_the_stream() {
    let wire = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{oops\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut s = ResponsesStream::from_chat(ctx());
    let evs = events(&s.push(wire.as_bytes()));
    let t = types(&evs);
    assert_eq!(t[t.len() - 2..], ["error", "response.failed"]);
    assert!(!t.contains(&"response.completed"));
}

/// A call the output limit cut is passed on as it came: an `incomplete` item of an
/// `incomplete` response, whole or streamed, not a failure to retry (it would be cut again).
#[test]
fn a_tool_call_the_output_limit_cut_is_an_incomplete_item() {
    let wire = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"city\\\": \\\"Pa\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut s = ResponsesStream::from_chat(ctx());
    let evs = events(&s.push(wire.as_bytes()));
    let last = evs.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "response.incomplete");
    let item = json!({"id": "fc_c", "type": "function_call", "status": "incomplete",
        "call_id": "c", "name": "f", "arguments": "{\"city\": \"Pa"});
    assert_eq!(last["response"]["output"], json!([item]));
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    let whole = json!({"model": "g", "choices": [{"message": {"tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{\"city\": \"Pa"}}]},
        "finish_reason": "length"}]});
    let obj = response_for(Target::Chat, whole.to_string().as_bytes(), &ctx()).unwrap_or_default();
    assert_eq!(
        (&obj["status"], &obj["output"]),
        (&json!("incomplete"), &json!([item]))
    );
}

/// Text the output limit cut is an `incomplete` message item, whole or streamed; text that a
/// tool call followed is whole (the call is the cut item).
#[test]
fn a_message_the_output_limit_cut_is_an_incomplete_item() {
    let wire = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut s = ResponsesStream::from_chat(ctx());
    let evs = events(&s.push(wire.as_bytes()));
    let done: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["item"]["status"], "incomplete");
    let last = evs.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    let whole = |calls: Value| {
        let chat = json!({"model": "g", "choices": [{"message": {"content": "Hel",
            "tool_calls": calls}, "finish_reason": "length"}]});
        response_for(Target::Chat, chat.to_string().as_bytes(), &ctx()).unwrap_or_default()
    };
    assert_eq!(whole(json!(null))["output"][0]["status"], "incomplete");
    let call = json!([{"id": "c", "function": {"name": "f", "arguments": "{\"a"}}]);
    let with_call = whole(call);
    assert_eq!(with_call["output"][0]["status"], "completed");
    assert_eq!(with_call["output"][1]["status"], "incomplete");
}

/// The events a chat stream `wire` becomes, whole.
fn chat_events(wire: &str) -> Vec<Value> {
    let mut s = ResponsesStream::from_chat(ctx());
    let mut out = s.push(wire.as_bytes());
    out.extend(s.finish());
    events(&out)
}

/// The `output` of the `response.completed` a chat stream `wire` ends with.
fn completed_output(wire: &str) -> Value {
    let evs = chat_events(wire);
    let last = evs.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "response.completed", "{evs:?}");
    last["response"]["output"].clone()
}

/// A chat stream whose chunks carry no choice (only usage, or only `[DONE]`) is no answer:
/// an error and `response.failed`, never an empty `response.completed`.
#[test]
fn a_chat_stream_without_a_choice_fails() {
    for wire in [
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":0}}\n\ndata: [DONE]\n\n",
        "data: [DONE]\n\n",
    ] {
        let evs = chat_events(wire);
        let kinds = types(&evs);
        assert_eq!(kinds.last(), Some(&"response.failed"), "{evs:?}");
        assert!(kinds.contains(&"error") && !kinds.contains(&"response.completed"));
    }
}

/// `"id": ""` on a later fragment continues the call (some servers send it).
#[test]
fn an_empty_id_on_a_later_fragment_continues_the_call() {
    let wire = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"\",\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let output = &completed_output(wire);
    assert_eq!(output.as_array().map(Vec::len), Some(1), "{output}");
    assert_eq!(output[0]["call_id"], "a");
    assert_eq!(output[0]["arguments"], r#"{"city":"Paris"}"#);
}

/// A name sent in pieces (as some servers send it) is the item's name whole: in
/// `response.output_item.added`, which waits for the first argument fragment, and after.
#[test]
fn a_tool_name_in_pieces_is_the_items_name_whole() {
    let wire = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"get_\",\"arguments\":\"\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"weather\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n",
        // A name whole, and then its arguments in their own fragment.
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":\"now\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let evs = chat_events(wire);
    let added: Vec<_> = evs
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| e["item"]["name"].clone())
        .collect();
    assert_eq!(added, [json!("get_weather"), json!("now")], "{evs:?}");
    let output = &completed_output(wire);
    assert_eq!(output[0]["name"], "get_weather", "{output}");
    assert_eq!(output[0]["arguments"], "{}");
    assert_eq!(output[1]["name"], "now");
}

/// Calls that share index 0 (Ollama), or carry none, with ids of their own: two function calls,
/// not one with the arguments of both.
#[test]
fn calls_sharing_an_index_with_ids_of_their_own_are_calls_of_their_own() {
    let wire = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"b\",\"function\":{\"name\":\"weather\",\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let output = &completed_output(wire);
    assert_eq!(output[0]["call_id"], "a");
    assert_eq!(output[0]["arguments"], r#"{"city":"Paris"}"#);
    assert_eq!(output[1]["call_id"], "b");
    assert_eq!(output[1]["arguments"], "{}");
}

#[test]
fn anthropic_stream_becomes_semantic_events() {
    let wire = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"shell\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"cmd\\\":\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"ls\\\"}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":6}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let mut s = ResponsesStream::from_anthropic(ctx());
    let mut out = s.push(wire.as_bytes());
    out.extend(s.finish());
    let evs = events(&out);
    let last = evs.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["model"], "claude");
    assert_eq!(last["response"]["output"][0]["type"], "function_call");
    assert_eq!(last["response"]["output"][0]["name"], "shell");
    assert_eq!(
        last["response"]["output"][0]["arguments"],
        "{\"cmd\":\"ls\"}"
    );
    assert_eq!(last["response"]["usage"]["input_tokens"], 7);
    assert_eq!(last["response"]["usage"]["output_tokens"], 6);
    assert!(types(&evs).contains(&"response.function_call_arguments.delta"));
}

#[test]
fn previous_response_is_rebuilt_into_the_input() {
    let prior = Stored {
        input: vec![json!({"role": "user", "content": "a"})],
        response: json!({"output": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}),
        passthrough: false,
        provider: String::new(),
        owner: "default".to_owned(),
    };
    let body = br#"{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c","output":"ok"}]}"#;
    assert_eq!(
        Turn::read(body).previous_response_id.as_deref(),
        Some("resp_1")
    );
    let rebuilt: Value = serde_json::from_slice(&rebuild(body, &prior, None).unwrap_or_default())
        .unwrap_or_default();
    assert_eq!(rebuilt.get("previous_response_id"), None);
    let input = rebuilt["input"].as_array().cloned().unwrap_or_default();
    assert_eq!(input.len(), 3);
    assert_eq!(input[1]["type"], "function_call");
    assert_eq!(input[2]["type"], "function_call_output");
    let (chat, _) = chat_of(rebuilt);
    assert_eq!(chat["messages"][1]["tool_calls"][0]["id"], "c");
    assert_eq!(chat["messages"][2]["role"], "tool");
}

#[test]
fn a_turn_is_read_in_one_parse() {
    let turn = Turn::read(br#"{"model":"m","input":"hi","store":false,"previous_response_id":7}"#);
    assert_eq!(turn.previous_response_id, None);
    assert!(!turn.store);
    let input = turn.input.into_values();
    assert_eq!(input, input_items(br#"{"input":"hi"}"#));
    assert_eq!(input[0]["content"][0]["text"], "hi");
    let turn = Turn::read(br#"{"input":[{"type":"x"}],"store":"no","previous_response_id":"r"}"#);
    assert_eq!(turn.previous_response_id.as_deref(), Some("r"));
    assert!(turn.store);
    assert_eq!(turn.input.into_values(), vec![json!({"type": "x"})]);
    let none = Turn::read(b"[1]");
    assert_eq!(
        (
            none.previous_response_id,
            none.input.into_values().len(),
            none.store
        ),
        (None, 0, true)
    );
    let none = Turn::read(br#"["r", [{"type":"x"}], false]"#);
    assert_eq!(
        (
            none.previous_response_id,
            none.input.into_values().len(),
            none.store
        ),
        (None, 0, true)
    );
    // A member given twice: the last one counts, as with any JSON object legate reads.
    let twice = Turn::read(br#"{"store":true,"input":"a","store":false,"input":[{"type":"y"}]}"#);
    assert!(!twice.store);
    assert_eq!(twice.input.into_values(), vec![json!({"type": "y"})]);
}

#[test]
fn a_first_turns_input_array_is_kept_as_its_text() {
    let body = br#"{"model":"m", "\u0069nput" : [ {"type":"x", "n": 1} ] , "store" : false }"#;
    let turn = Turn::read(body);
    assert_eq!(
        turn.input,
        Items::Text(br#"[ {"type":"x", "n": 1} ]"#.to_vec().into())
    );
    assert!(!turn.store);
    // Read from shared bytes, the same text is a view of the body, not a copy.
    let shared = bytes::Bytes::from_static(body);
    let Items::Text(view) = Turn::read_shared(&shared).input else {
        panic!("an input array is kept as its text");
    };
    assert_eq!(view, br#"[ {"type":"x", "n": 1} ]"#[..]);
    let start = shared.as_ptr() as usize;
    assert!((start..start + shared.len()).contains(&(view.as_ptr() as usize)));
    // Written into the store as it came, it reads back as the same items.
    let entry = Stored::serialise(
        &turn.input,
        br#"{"id":"r","output":[]}"#,
        (true, "openai"),
        "team-a",
    );
    // Made in one allocation of exactly its size.
    assert_eq!(entry.capacity(), entry.len());
    let stored: Stored = serde_json::from_slice(&entry).unwrap();
    assert_eq!(stored.input, vec![json!({"type": "x", "n": 1})]);
    assert!(stored.passthrough);
    assert_eq!(stored.owner, "team-a");
    // The same layout as a `Stored` written from values.
    let tree = Stored::serialise_tree(&turn.input, &json!({"id": "r"}), (false, ""), "default");
    let stored: Stored = serde_json::from_slice(&tree).unwrap();
    assert_eq!(stored.response, json!({"id": "r"}));
    assert!(!stored.passthrough);
    assert_eq!(stored.owner, "default");
    // An entry kept before owners were written is anyone's without [[clients]], nobody's with.
    let old: Stored =
        serde_json::from_slice(br#"{"input":[],"response":{},"passthrough":true}"#).unwrap();
    assert!(old.belongs_to("default", true));
    assert!(!old.belongs_to("default", false));
    assert!(!old.belongs_to("team-a", false));
    assert!(stored.belongs_to("default", false));
    assert!(!stored.belongs_to("team-a", true));
}

#[test]
fn a_turn_the_walk_cannot_read_is_read_as_values() {
    // Not an object, cut short, a null input, a `store` that is not the literal false.
    for (body, store) in [
        (&br#"{"input":[{"type":"x"}]"#[..], true),
        (br#"{"input":null,"store":"false"}"#, true),
        (br#"{"input":7,"store":false}"#, false),
    ] {
        let turn = Turn::read(body);
        assert_eq!(turn.input.into_values(), Vec::<Value>::new());
        assert_eq!(turn.store, store, "{}", String::from_utf8_lossy(body));
    }
    let turn = Turn::read(br#"{"previous_response_id":"r\u00e9p","input":"a\"b"}"#);
    assert_eq!(turn.previous_response_id.as_deref(), Some("r\u{e9}p"));
    assert_eq!(turn.input.into_values()[0]["content"][0]["text"], "a\"b");
}

mod walk_matches_values {
    //! `Turn::read` walks the top-level members by hand; for every well-formed object it must
    //! find what reading the body as JSON values finds (the last of duplicate members, keys
    //! written with escapes, any whitespace, any value type in the three members).
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("input"),
            Just("store"),
            Just("previous_response_id"),
            Just("model"),
            Just("inputs"),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        crate::json_gen::value("[a-c]{1,2}".boxed())
    }

    /// Every character of the key as a `\u` escape.
    fn escaped(k: &str) -> String {
        let units: String = k.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        format!("\"{units}\"")
    }

    fn render(members: &[(&str, Value, bool)], ws: &str, pretty: bool) -> Vec<u8> {
        let mut out = String::from("{");
        for (i, (k, v, escape)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let key = if *escape {
                escaped(k)
            } else {
                format!("\"{k}\"")
            };
            let value = if pretty {
                serde_json::to_string_pretty(v)
            } else {
                serde_json::to_string(v)
            };
            out.push_str(&format!("{ws}{key}{ws}:{ws}{}{ws}", value.unwrap()));
        }
        out.push('}');
        out.into_bytes()
    }

    fn seen(t: Turn) -> (Option<String>, Vec<Value>, bool) {
        (t.previous_response_id, t.input.into_values(), t.store)
    }

    proptest! {
        #[test]
        fn the_walk_reads_what_the_values_hold(
            members in proptest::collection::vec((key(), value(), any::<bool>()), 0..7),
            ws in prop_oneof![Just(""), Just(" "), Just("\n  "), Just("\t\r\n")],
            pretty in any::<bool>(),
        ) {
            let body = render(&members, ws, pretty);
            prop_assert_eq!(seen(Turn::read(&body)), seen(Turn::read_values(&body)));
        }
    }
}

/// The text and arguments a translated stream keeps for its done events and final response
/// are bounded (SPEC §14): past 16 MiB the stream fails instead of growing.
#[test]
fn a_translated_stream_past_its_bound_fails() {
    let piece = "x".repeat(1 << 20);
    let chunk = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": piece}}]})
    );
    let wire = chunk.repeat(17);
    let evs = chat_events(&wire);
    let kinds = types(&evs);
    assert_eq!(
        kinds.last(),
        Some(&"response.failed"),
        "{:?}",
        &kinds[kinds.len().saturating_sub(3)..]
    );
    assert!(kinds.contains(&"error"));
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 16);
}

/// The calls a translated stream keeps are a bounded list of bounded ids: past 1,024 calls, or
/// at an id over 1 KiB, the stream fails, and nothing follows its `response.failed` (several
/// calls in the chunk that failed it included).
#[test]
fn a_translated_stream_bounds_its_calls_and_their_ids() {
    let call = |i: usize, id: &str| json!({"index": i, "id": id, "function": {"name": "f", "arguments": "{}"}});
    let chunk = |calls: Vec<Value>| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})
        )
    };
    // Text first: an item of its own, not a call.
    let text = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "Calling."}}]})
    );
    let many: String = std::iter::once(text)
        .chain((0..1030).map(|i| chunk(vec![call(i, &format!("call_{i}"))])))
        .collect();
    let kinds_of = |wire: &str| {
        let evs = chat_events(wire);
        types(&evs)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let kinds = kinds_of(&many);
    assert_eq!(kinds.last().map(String::as_str), Some("response.failed"));
    let added = kinds
        .iter()
        .filter(|k| *k == "response.output_item.added")
        .count();
    assert_eq!(added, 1 + 1024);

    let long = "c".repeat(1025);
    let wire = chunk(vec![call(0, "call_a"), call(1, &long), call(2, "call_c")]);
    let kinds = kinds_of(&wire);
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("response.failed"),
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| *k == "response.failed").count(), 1);
    let added = kinds
        .iter()
        .filter(|k| *k == "response.output_item.added")
        .count();
    assert_eq!(added, 1, "{kinds:?}");
    let fine = "c".repeat(1024);
    let kinds = kinds_of(&(chunk(vec![call(0, &fine)]) + "data: [DONE]\n\n"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("response.completed"),
        "{kinds:?}"
    );
}

//! Stream translation on hand-written upstream streams: the exact events the caller gets,
//! usage on request, mid-stream errors, and the cases a translator must refuse to paper over.

use serde_json::{Value, json};

use super::super::{Dir, StreamTranslator};
use super::stream_support::*;

#[test]
fn openai_stream_becomes_anthropic_events() {
    let input = [
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Hi"}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        openai_usage_chunk(),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let out = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
    let want = vec![
        named(
            json!({"type": "message_start", "message": {"id": "msg_abc", "type": "message",
            "role": "assistant", "content": [], "model": "gpt-4.1", "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        ),
        named(json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}})),
        named(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "Hi"}})),
        named(json!({"type": "content_block_stop", "index": 0})),
        named(json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "call_1", "name": "get", "input": {}}})),
        named(json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}})),
        named(json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "1}"}})),
        named(json!({"type": "content_block_stop", "index": 1})),
        named(json!({"type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"input_tokens": 30, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100,
                      "output_tokens": 12}})),
        named(json!({"type": "message_stop"})),
    ];
    assert_eq!(events(&out), want);
}

#[test]
fn anthropic_stream_becomes_openai_chunks() {
    let input = [
        anthropic_start(),
        anthropic_event(&json!({"type": "ping"})),
        anthropic_event(&json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}})),
        anthropic_event(&json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "hmm"}})),
        anthropic_event(&json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "signature_delta", "signature": "c2ln"}})),
        anthropic_event(&json!({"type": "content_block_stop", "index": 0})),
        anthropic_event(&json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {}}})),
        anthropic_event(&json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ""}})),
        anthropic_event(&json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 1}"}})),
        anthropic_event(&json!({"type": "content_block_stop", "index": 1})),
        anthropic_end("tool_use"),
    ]
    .concat();
    let out = translate(Dir::OpenAiToAnthropic, true, input.as_bytes(), &[]);
    // The ping is no chunk, only a comment line (skipped by the parser below).
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches(": ping\n\n").count(), 1);
    let base = |choices: Value, usage: Option<Value>| {
        let mut chunk = json!({"id": "chatcmpl-01X", "object": "chat.completion.chunk", "created": CREATED,
            "model": "claude-sonnet-4-5", "choices": choices});
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        (None, chunk)
    };
    let choice = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
    let want = vec![
        base(
            choice(json!({"role": "assistant", "content": ""}), Value::Null),
            None,
        ),
        // The call's id and name wait for its first argument fragment (the block's start is
        // preamble), and go out with it.
        base(
            choice(
                json!({"tool_calls": [{"index": 0, "id": "toolu_1", "type": "function",
            "function": {"name": "get", "arguments": "{\"a\": 1}"}}]}),
                Value::Null,
            ),
            None,
        ),
        base(choice(json!({}), json!("tool_calls")), None),
        base(
            json!([]),
            Some(
                json!({"prompt_tokens": 130, "completion_tokens": 15, "total_tokens": 145,
            "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 5}}),
            ),
        ),
        (None, json!("[DONE]")),
    ];
    assert_eq!(events(&out), want);
}

#[test]
fn usage_chunk_only_when_the_openai_caller_asked() {
    let input = [anthropic_start(), anthropic_end("end_turn")].concat();
    let view = openai_view_of(&input, false);
    assert_eq!(
        view.as_ref().map(|v| (v.usage.is_none(), v.done)),
        Ok((true, true))
    );
    let view = openai_view_of(&input, true);
    assert_eq!(
        view.map(|v| v.usage.map(|u| u.prompt_tokens)),
        Ok(Some(130))
    );
}

#[test]
fn mid_stream_errors_become_the_callers_error_event_and_end_the_stream() {
    let anthropic = [
        anthropic_start(),
        anthropic_event(&json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        anthropic_end("end_turn"),
    ]
    .concat();
    let view = openai_view_of(&anthropic, true);
    let error = json!({"message": "Overloaded", "type": "server_error", "param": null, "code": "overloaded"});
    assert_eq!(view.map(|v| (v.error, v.done)), Ok((Some(error), false)));

    let openai = [
        chunk(json!({"role": "assistant", "content": "Hi"}), None),
        sse(None, &json!({"error": {"message": "Rate limited", "type": "requests", "code": "rate_limit_exceeded"}})),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let view = anthropic_view_of(&openai);
    assert_eq!(
        view.map(|v| (v.error, v.stopped)),
        Ok((Some("rate_limit_error".to_owned()), false))
    );
}

#[test]
fn a_named_error_event_without_a_json_error_still_ends_the_stream() {
    let input = [
        chunk(json!({"role": "assistant", "content": "Hi"}), None),
        "event: error\ndata: upstream exploded\n\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let view = anthropic_view_of(&input);
    assert_eq!(
        view.map(|v| (v.text, v.error, v.stopped)),
        Ok(("Hi".to_owned(), Some("api_error".to_owned()), false))
    );
}

#[test]
fn interleaved_tool_arguments_end_in_an_error_not_a_corrupt_input() {
    let call = |index: u64, id: Option<&str>, args: &str| {
        let mut c = json!({"index": index, "function": {"arguments": args}});
        if let Some(id) = id {
            c["id"] = json!(id);
            c["function"]["name"] = json!("f");
        }
        chunk(json!({"tool_calls": [c]}), None)
    };
    let input = [
        call(0, Some("a"), "{"),
        call(1, Some("b"), "{"),
        call(0, None, "}"),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let view = anthropic_view_of(&input);
    assert_eq!(
        view.map(|v| (v.error, v.stopped)),
        Ok((Some("api_error".to_owned()), false))
    );
    // The error says what happened: the calls' interleaving, not the model's arguments.
    let raw = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.contains("interleaved"), "{raw}");
    assert!(!raw.contains("not a JSON object"), "{raw}");
    // Calls one after the other, the first with whole arguments that are no object: the
    // model's arguments are the cause, and the error says so.
    let input = [
        call(0, Some("a"), "[1,2]"),
        call(1, Some("b"), "{}"),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let raw = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
    let raw = String::from_utf8_lossy(&raw);
    assert!(
        raw.contains("not a JSON object") && !raw.contains("interleaved"),
        "{raw}"
    );
}

/// Ollama numbers every call of a turn 0 (and some servers send no index at all), sending the
/// calls one after another with ids of their own: each id is a call of its own. They were one
/// call with the arguments of both, `{"city":"Paris"}{}`, and the stream failed.
#[test]
fn calls_sharing_an_index_with_ids_of_their_own_are_calls_of_their_own() {
    let call = |id: Option<&str>, args: &str, indexed: bool| {
        let mut c = json!({"function": {"arguments": args}});
        if indexed {
            c["index"] = json!(0);
        }
        if let Some(id) = id {
            c["id"] = json!(id);
            c["function"]["name"] = json!("weather");
        }
        chunk(json!({"tool_calls": [c]}), None)
    };
    for indexed in [true, false] {
        let input = [
            call(Some("call_a"), "{\"city\":", indexed),
            call(None, "\"Paris\"}", indexed),
            call(Some("call_b"), "{\"city\":\"Rome\"}", indexed),
            chunk(json!({}), Some("tool_calls")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let view = anthropic_view_of(&input);
        let tools = vec![
            (
                "call_a".to_owned(),
                "weather".to_owned(),
                r#"{"city":"Paris"}"#.to_owned(),
            ),
            (
                "call_b".to_owned(),
                "weather".to_owned(),
                r#"{"city":"Rome"}"#.to_owned(),
            ),
        ];
        assert_eq!(
            view.map(|v| (v.tools, v.error, v.stop_reason)),
            Ok((tools, None, Some("tool_use".to_owned()))),
            "indexed: {indexed}"
        );
    }
}

#[test]
fn a_tool_call_without_an_id_gets_a_stand_in_at_the_end() {
    let input = [
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let view = anthropic_view_of(&input);
    let tools = vec![("call_legate_0".to_owned(), "f".to_owned(), "{}".to_owned())];
    assert_eq!(
        view.map(|v| (v.tools, v.stop_reason)),
        Ok((tools, Some("tool_use".to_owned())))
    );
}

#[test]
fn garbage_after_the_terminal_is_ignored_and_a_cut_has_no_terminal() {
    let mut translator = StreamTranslator::with_created(Dir::AnthropicToOpenAi, false, CREATED);
    let head = chunk(json!({"role": "assistant", "content": "Hi"}), None);
    let out = translator.push(head.as_bytes());
    assert!(!translator.is_complete());
    let cut = [out, translator.finish()].concat();
    assert!(anthropic_view(&cut).is_ok_and(|v| !v.stopped && v.text == "Hi"));
    let done = translator.push(b"data: [DONE]\n\ndata: {\"choices\": 3}\n\n");
    assert!(translator.is_complete());
    assert_eq!(
        events(&done).len(),
        3,
        "block stop, message_delta, message_stop"
    );
}

/// An OpenAI stream whose only tool call carries `args`, split in two fragments.
fn openai_tool_stream(text: Option<&str>, args: (&str, &str)) -> String {
    openai_tool_stream_ending(text, args, "tool_calls")
}

/// The same, finishing with `finish`.
fn openai_tool_stream_ending(text: Option<&str>, args: (&str, &str), finish: &str) -> String {
    let mut parts = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    if let Some(text) = text {
        parts.push(chunk(json!({"content": text}), None));
    }
    parts.extend([
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "write", "arguments": args.0}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": args.1}}]}),
            None,
        ),
        chunk(json!({}), Some(finish)),
        "data: [DONE]\n\n".to_owned(),
    ]);
    parts.concat()
}

#[test]
fn a_tool_call_the_output_limit_cut_ends_under_max_tokens_not_in_an_error() {
    // Retrying would be cut the same way: the call is passed on as it came, and the stop
    // reason says it is not whole, as Anthropic's own stream cut inside a tool_use block does.
    for text in [None, Some("Writing.")] {
        let cut = openai_tool_stream_ending(text, ("{\"path\":", " \"a"), "length");
        let out = translate(Dir::AnthropicToOpenAi, false, cut.as_bytes(), &[]);
        let view = anthropic_view(&out).map(|v| (v.error, v.stopped, v.stop_reason, v.tools));
        let tool = (
            "call_1".to_owned(),
            "write".to_owned(),
            "{\"path\": \"a".to_owned(),
        );
        assert_eq!(
            view,
            Ok((None, true, Some("max_tokens".to_owned()), vec![tool])),
            "{text:?}"
        );
    }
}

#[test]
fn a_first_tool_call_is_held_until_its_arguments_check_out() {
    let ok = openai_tool_stream(None, ("{\"path\":", "\"a\"}"));
    let out = translate(Dir::AnthropicToOpenAi, false, ok.as_bytes(), &[]);
    let deltas: Vec<Value> = events(&out)
        .into_iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| d["delta"]["partial_json"].clone())
        .collect();
    // One delta with the whole (checked) input, written at the block's end.
    assert_eq!(deltas, [json!("{\"path\":\"a\"}")]);
    let view = anthropic_view(&out).map(|v| (v.stopped, v.tools.len()));
    assert_eq!(view, Ok((true, 1)));
}

#[test]
fn tool_arguments_that_are_not_an_object_end_in_an_error_before_any_content() {
    for args in [("{\"path\":", ""), ("[1,", "2]"), ("\"text", "\"")] {
        let bad = openai_tool_stream(None, args);
        let out = translate(Dir::AnthropicToOpenAi, false, bad.as_bytes(), &[]);
        let names: Vec<Option<String>> = events(&out).into_iter().map(|(n, _)| n).collect();
        assert!(
            !names.contains(&Some("content_block_delta".to_owned())),
            "nothing committed before the check: {names:?}"
        );
        let view = anthropic_view(&out).map(|v| (v.error, v.stopped));
        assert_eq!(view, Ok((Some("api_error".to_owned()), false)), "{args:?}");
        let message = events(&out)
            .last()
            .map(|(_, d)| d["error"]["message"].as_str().unwrap_or("").to_owned());
        assert!(
            message.is_some_and(|m| m.contains("tool `write`") && m.contains("not a JSON object"))
        );
    }
}

#[test]
fn after_text_a_broken_tool_call_still_ends_in_an_error_event() {
    let bad = openai_tool_stream(Some("Writing."), ("{\"path\":", ""));
    let out = translate(Dir::AnthropicToOpenAi, false, bad.as_bytes(), &[]);
    let view = anthropic_view(&out).map(|v| (v.text, v.error, v.stopped));
    assert_eq!(
        view,
        Ok(("Writing.".to_owned(), Some("api_error".to_owned()), false))
    );
}

#[test]
fn an_anthropic_tool_input_that_is_not_an_object_ends_the_openai_stream_in_an_error() {
    let input = [
        anthropic_start(),
        anthropic_event(&json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}})),
        anthropic_event(&json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{\"path\": "}})),
        anthropic_event(&json!({"type": "content_block_stop", "index": 0})),
        anthropic_end("tool_use"),
    ]
    .concat();
    let out = translate(Dir::OpenAiToAnthropic, false, input.as_bytes(), &[]);
    let view = openai_view(&out).map(|v| (v.error.is_some(), v.done, v.finish_reason));
    assert_eq!(view, Ok((true, false, None)));
}

#[test]
fn an_anthropic_tool_input_the_output_limit_cut_reaches_openai_callers_as_it_came() {
    let input = |stop: &str, more: bool| {
        let mut events = vec![
            anthropic_start(),
            anthropic_event(&json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}})),
            anthropic_event(&json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"a"}})),
            anthropic_event(&json!({"type": "content_block_stop", "index": 0})),
        ];
        if more {
            events.push(anthropic_event(
                &json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "text", "text": "x"}}),
            ));
        }
        events.push(anthropic_end(stop));
        events.concat()
    };
    // Anthropic says `max_tokens` only after the block's stop: the verdict waits for it. The
    // context window's cut is a `length` too.
    for stop in ["max_tokens", "model_context_window_exceeded"] {
        let out = translate(
            Dir::OpenAiToAnthropic,
            false,
            input(stop, false).as_bytes(),
            &[],
        );
        let view = openai_view(&out).map(|v| (v.error, v.done, v.finish_reason, v.calls));
        let call = (
            "toolu_1".to_owned(),
            "write".to_owned(),
            "{\"path\": \"a".to_owned(),
        );
        assert_eq!(
            view,
            Ok((None, true, Some("length".to_owned()), [(0, call)].into())),
            "{stop}"
        );
    }
    // Any other end, or more content after the call, is the broken call it looks like.
    for (stop, more) in [("tool_use", false), ("max_tokens", true)] {
        let out = translate(
            Dir::OpenAiToAnthropic,
            false,
            input(stop, more).as_bytes(),
            &[],
        );
        let view = openai_view(&out).map(|v| (v.error.is_some(), v.done, v.finish_reason));
        assert_eq!(view, Ok((true, false, None)), "{stop} {more}");
    }
}

/// Nothing follows a stream's error or terminal event, a keep-alive neither.
#[test]
fn no_keep_alive_after_the_stream_ended() {
    for (dir, error) in [
        (
            Dir::AnthropicToOpenAi,
            "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n",
        ),
        (
            Dir::OpenAiToAnthropic,
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"boom\"}}\n\n",
        ),
    ] {
        let mut t = StreamTranslator::with_created(dir, false, CREATED);
        assert!(!t.keep_alive().is_empty(), "{dir:?}");
        assert!(!t.push(error.as_bytes()).is_empty());
        assert!(t.keep_alive().is_empty(), "{dir:?}");
    }
}

#[test]
fn empty_tool_arguments_end_in_an_error_not_a_clean_empty_input() {
    let bad = openai_tool_stream(None, ("", ""));
    let out = translate(Dir::AnthropicToOpenAi, false, bad.as_bytes(), &[]);
    let view = anthropic_view(&out).map(|v| (v.error, v.stopped));
    assert_eq!(view, Ok((Some("api_error".to_owned()), false)));
}

#[test]
fn an_anthropic_tool_call_without_input_reaches_openai_callers_as_an_empty_object() {
    // The block starts with `input: {}` and streams nothing more (or only an empty delta):
    // OpenAI clients parse the arguments as JSON, so they get `{}`, as a whole answer has.
    for deltas in [0, 1] {
        let mut input = vec![
            anthropic_start(),
            anthropic_event(&json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}})),
        ];
        if deltas == 1 {
            input.push(anthropic_event(
                &json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": ""}}),
            ));
        }
        input.push(anthropic_event(
            &json!({"type": "content_block_stop", "index": 0}),
        ));
        input.push(anthropic_end("tool_use"));
        let view = openai_view_of(&input.concat(), false).unwrap();
        assert_eq!(
            view.calls.get(&0).map(|c| c.2.as_str()),
            Some("{}"),
            "{deltas} deltas"
        );
        assert_eq!(
            (view.error, view.finish_reason.as_deref(), view.done),
            (None, Some("tool_calls"), true)
        );
    }
}

#[test]
fn a_streamed_refusal_ends_with_a_refusal_stop_as_a_whole_answer_does() {
    let input = [
        chunk(json!({"role": "assistant", "refusal": "I can't "}), None),
        chunk(json!({"refusal": "help with that."}), None),
        chunk(json!({}), Some("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let view = anthropic_view_of(&input).unwrap();
    assert_eq!(view.text, "I can't help with that.");
    assert_eq!(view.stop_reason.as_deref(), Some("refusal"));
}

#[test]
fn an_openai_stream_without_a_choice_is_an_error_not_an_empty_answer() {
    // Only the usage chunk, or nothing at all, before `[DONE]`: the streamed form of a
    // completion with no choices.
    for input in [
        [openai_usage_chunk(), "data: [DONE]\n\n".to_owned()].concat(),
        "data: [DONE]\n\n".to_owned(),
    ] {
        let out = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
        // Ends in an error (message_start, preamble held back before the commit point, may
        // come first), never in message_stop.
        let got = events(&out);
        let last = &got.last().expect("an event").1;
        assert!(got.len() <= 2, "{got:?}");
        assert_eq!(last["type"], "error");
        assert!(
            last["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("no choices")),
            "{got:?}"
        );
    }
    // An empty answer with a choice is still an answer.
    let empty = [
        chunk(json!({"role": "assistant", "content": ""}), Some("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let got = events(&translate(
        Dir::AnthropicToOpenAi,
        false,
        empty.as_bytes(),
        &[],
    ));
    assert_eq!(
        got.last().map(|e| e.1["type"].clone()),
        Some(json!("message_stop"))
    );
}

#[test]
fn an_empty_id_on_a_later_fragment_continues_the_call() {
    let input = [
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get", "arguments": "{\"a\":"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "", "function": {"arguments": "1}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let out = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
    let view = anthropic_view(&out);
    let tools = vec![(
        "call_1".to_owned(),
        "get".to_owned(),
        "{\"a\":1}".to_owned(),
    )];
    assert_eq!(
        view.map(|v| (v.tools, v.stop_reason)),
        Ok((tools, Some("tool_use".to_owned())))
    );
}

/// Some servers stream a tool's name in pieces, as they do its arguments. The block's start
/// carries the whole name: it opens with the first argument fragment, not with the id.
#[test]
fn a_tool_name_in_pieces_reaches_the_block_whole() {
    let input = [
        chunk(json!({"content": "Let me look."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "weather"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Oslo\"}"}}]}),
            None,
        ),
        // A second call whose name comes whole but whose arguments never do: it opens at
        // the end with its own id and `{}`.
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
            "function": {"name": "now", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let out = translate(Dir::AnthropicToOpenAi, false, input.as_bytes(), &[]);
    let view = anthropic_view(&out);
    let tools = vec![
        (
            "call_1".to_owned(),
            "get_weather".to_owned(),
            "{\"city\":\"Oslo\"}".to_owned(),
        ),
        ("call_2".to_owned(), "now".to_owned(), "{}".to_owned()),
    ];
    assert_eq!(
        view.map(|v| (v.text, v.tools, v.error, v.stop_reason)),
        Ok((
            "Let me look.".to_owned(),
            tools,
            None,
            Some("tool_use".to_owned())
        ))
    );
}

/// What a stream of tool calls may hold is bounded (SPEC §14): calls past 1,024 in one answer,
/// or arguments held past 16 MiB for calls still without an id, end the stream in an error
/// event instead of growing legate's memory for as long as the upstream sends.
#[test]
fn tool_calls_beyond_the_bounds_end_the_stream_in_an_error() {
    let many: String = (0..1100)
        .map(|i| {
            chunk(
                json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]}),
                None,
            )
        })
        .collect();
    let out = translate(Dir::AnthropicToOpenAi, false, many.as_bytes(), &[]);
    let view = anthropic_view(&out).unwrap();
    assert_eq!(view.error.as_deref(), Some("api_error"));
    assert!(String::from_utf8_lossy(&out).contains("(1,024)"));
    assert_eq!(view.tools.len(), 1024);

    let piece = "x".repeat(1 << 20);
    let held: String = (0..17)
        .map(|_| {
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                None,
            )
        })
        .collect();
    let out = translate(Dir::AnthropicToOpenAi, false, held.as_bytes(), &[]);
    let view = anthropic_view(&out).unwrap();
    assert_eq!(view.error.as_deref(), Some("api_error"));
    assert!(String::from_utf8_lossy(&out).contains("too large to check"));
}

/// Ids are kept for the whole answer, so an id over 1 KiB ends the stream in an error event;
/// and an Anthropic answer of more than 1,024 tool calls ends an OpenAI caller's stream in one
/// (each call is looked up by its block on every fragment).
#[test]
fn long_ids_and_too_many_anthropic_calls_end_the_stream_in_an_error() {
    let with_id = |id: &str| {
        chunk(
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]}),
            Some("tool_calls"),
        )
    };
    let out = translate(
        Dir::AnthropicToOpenAi,
        false,
        with_id(&"i".repeat(1025)).as_bytes(),
        &[],
    );
    let view = anthropic_view(&out).unwrap();
    assert_eq!(view.error.as_deref(), Some("api_error"));
    assert!(String::from_utf8_lossy(&out).contains("longer than legate carries"));
    assert!(view.tools.is_empty());
    let out = translate(
        Dir::AnthropicToOpenAi,
        false,
        with_id(&"i".repeat(1024)).as_bytes(),
        &[],
    );
    assert_eq!(anthropic_view(&out).unwrap().tools.len(), 1);

    let blocks: String = (0..1030)
        .map(|i| {
            [
                anthropic_event(&json!({"type": "content_block_start", "index": i,
                    "content_block": {"type": "tool_use", "id": format!("toolu_{i}"), "name": "f", "input": {}}})),
                anthropic_event(&json!({"type": "content_block_stop", "index": i})),
            ]
            .concat()
        })
        .collect();
    let input = [anthropic_start(), blocks, anthropic_end("tool_use")].concat();
    let out = translate(Dir::OpenAiToAnthropic, false, input.as_bytes(), &[]);
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains("(1,024)"),
        "{}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(!text.contains("toolu_1024"));
    assert!(text.contains("toolu_1023"));
}

//! One chain across both APIs: a caller of either API served by a provider of the other kind,
//! streaming and not, tool calls included, and a fallback across kinds mid-storm.

use futures_util::StreamExt;

use crate::harness::{self, OPENAI_KEY, header_values};

const CHAINS: &str = r#"
[retry]
base_delay = "10ms"
max_delay = "20ms"

[[models]]
name = "via-openai"
chain = ["openai:gpt-backend"]

[[models]]
name = "via-anthropic"
chain = ["anthropic:claude-backend"]

[[models]]
name = "mixed"
chain = ["anthropic:claude-primary", "openai:gpt-backup"]
"#;

/// A small Anthropic request served by the OpenAI step.
const VIA_OPENAI: &str =
    r#"{"model":"via-openai","max_tokens":16,"messages":[{"role":"user","content":"x"}]}"#;

const TOOL_REPLY: &str = r#"{"default":{"content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"call_1","name":"read_file","input":{"path":"notes/a b.txt","lines":[1,2,3]}}],"stop_reason":"tool_use","usage":{"input_tokens":21,"output_tokens":9}}}"#;

/// Anthropic events of a streamed answer: (event name, data).
async fn anthropic_events(resp: reqwest::Response) -> Vec<(String, serde_json::Value)> {
    let mut parser = legate::sse::SseParser::new();
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        parser.push(&chunk);
        while let Some(ev) = parser.next_event() {
            let data = serde_json::from_str(&ev.data).unwrap_or(serde_json::Value::Null);
            out.push((ev.event.unwrap_or_default(), data));
        }
    }
    out
}

/// Rebuilds the tool input JSON of an Anthropic stream from its input_json_delta pieces.
fn tool_input(events: &[(String, serde_json::Value)]) -> serde_json::Value {
    let json: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    serde_json::from_str(&json).unwrap()
}

#[tokio::test]
async fn an_anthropic_caller_is_served_by_an_openai_provider() {
    let env =
        harness::start_with(legate::mock::Script::from_json(TOOL_REPLY).unwrap(), CHAINS).await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":256,"system":"be brief","messages":[{"role":"user","content":"read it"}],"tools":[{"name":"read_file","description":"read","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-backend");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["text"], "Let me look.");
    assert_eq!(v["content"][1]["type"], "tool_use");
    assert_eq!(v["content"][1]["name"], "read_file");
    assert_eq!(v["content"][1]["input"]["path"], "notes/a b.txt");
    assert_eq!(v["usage"]["input_tokens"], 21);
    assert_eq!(v["usage"]["output_tokens"], 9);
    let up = env.mock.requests().remove(0);
    assert_eq!(up.path, "/v1/chat/completions");
    assert_eq!(
        header_values(&up.headers, "authorization"),
        vec![format!("Bearer {OPENAI_KEY}").as_str()]
    );
    assert!(header_values(&up.headers, "anthropic-version").is_empty());
    let sent: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(sent["model"], "gpt-backend");
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["tools"][0]["function"]["name"], "read_file");
    let translated = env
        .metric(
            "legate_translated_requests_total",
            &[("from", "anthropic"), ("to", "openai")],
        )
        .await;
    assert_eq!(translated, Some(1.0));
}

/// Each SDK reads the provider's request id under its own API's name (`request-id` for
/// Anthropic's, `x-request-id` for OpenAI's): a translated answer carries it under both.
#[tokio::test]
async fn a_translated_answer_names_the_request_id_as_the_callers_sdk_reads_it() {
    let env =
        harness::start_with(legate::mock::Script::from_json(TOOL_REPLY).unwrap(), CHAINS).await;
    let resp = env.messages(VIA_OPENAI).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert!(h["x-request-id"].to_str().unwrap().starts_with("req_mock_"));
    assert_eq!(h["request-id"], h["x-request-id"]);
    let resp = env
        .chat(
            r#"{"model":"via-anthropic","stream":true,"messages":[{"role":"user","content":"x"}]}"#,
        )
        .await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert!(h["request-id"].to_str().unwrap().starts_with("req_mock_"));
    assert_eq!(h["x-request-id"], h["request-id"]);
    // Not translated: only the provider's own name.
    let resp = env
        .messages(
            r#"{"model":"claude-x","max_tokens":8,"messages":[{"role":"user","content":"x"}]}"#,
        )
        .await;
    assert!(resp.headers().get("request-id").is_some());
    assert!(resp.headers().get("x-request-id").is_none());
}

#[tokio::test]
async fn an_anthropic_stream_from_an_openai_provider_carries_the_tool_call_intact() {
    let env =
        harness::start_with(legate::mock::Script::from_json(TOOL_REPLY).unwrap(), CHAINS).await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"read it"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let events = anthropic_events(resp).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert_eq!(names.iter().filter(|n| **n == "message_start").count(), 1);
    assert_eq!(
        tool_input(&events),
        serde_json::json!({"path":"notes/a b.txt","lines":[1,2,3]})
    );
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    // Metered from the upstream's own usage.
    let doc: serde_json::Value = env.admin_json("/admin/usage").await;
    assert_eq!(
        doc["tenants"]["default"]["openai:gpt-backend"]["output_tokens"],
        9
    );
}

#[tokio::test]
async fn an_openai_caller_is_served_by_an_anthropic_provider_streaming_and_not() {
    let env =
        harness::start_with(legate::mock::Script::from_json(TOOL_REPLY).unwrap(), CHAINS).await;
    let body = r#"{"model":"via-anthropic","messages":[{"role":"user","content":"read it"}]}"#;
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-backend"
    );
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "read_file");
    let args: serde_json::Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["lines"], serde_json::json!([1, 2, 3]));
    let up = env.mock.requests().remove(0);
    assert_eq!(up.path, "/v1/messages");
    assert_eq!(
        header_values(&up.headers, "anthropic-version"),
        vec!["2023-06-01"]
    );
    let sent: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert!(
        sent["max_tokens"].as_u64().is_some(),
        "Anthropic requires max_tokens"
    );

    let stream = env
        .chat(r#"{"model":"via-anthropic","stream":true,"messages":[{"role":"user","content":"read it"}]}"#)
        .await;
    let text = stream.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let mut args = String::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(chunk) = serde_json::from_str::<serde_json::Value>(line)
            && let Some(a) =
                chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
        {
            args.push_str(a);
        }
    }
    let args: serde_json::Value = serde_json::from_str(&args).unwrap();
    assert_eq!(args["path"], "notes/a b.txt");
}

#[tokio::test]
async fn a_529_storm_falls_back_across_apis_with_a_streamed_tool_call_intact() {
    let script = r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":529}],
        "default":{"content":[{"type":"tool_use","id":"call_9","name":"write_file","input":{"path":"out.txt","content":"line one\nline \"two\""}}],"stop_reason":"tool_use"}}"#;
    let env = harness::start_with(legate::mock::Script::from_json(script).unwrap(), CHAINS).await;
    let resp = env
        .messages(r#"{"model":"mixed","max_tokens":128,"stream":true,"messages":[{"role":"user","content":"write it"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-backup");
    assert_eq!(resp.headers()["x-legate-attempts"], "4");
    let events = anthropic_events(resp).await;
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("message_stop"));
    assert_eq!(
        tool_input(&events),
        serde_json::json!({"path":"out.txt","content":"line one\nline \"two\""})
    );
}

#[tokio::test]
async fn a_translated_request_no_step_served_is_not_counted_as_translated() {
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"status":529}}"#).unwrap(),
        CHAINS,
    )
    .await;
    let resp = env.messages(VIA_OPENAI).await;
    assert_eq!(resp.status(), 529);
    assert!(env.mock.stats().requests > 0);
    let translated = env
        .metric(
            "legate_translated_requests_total",
            &[("from", "anthropic"), ("to", "openai")],
        )
        .await;
    assert_eq!(translated, None);
}

#[tokio::test]
async fn a_translated_stream_cut_before_its_usage_meters_nothing() {
    // The provider's stream breaks after its content began and before its usage chunk: no
    // usage is known, as on an untranslated stream, even though the events legate wrote for
    // the caller carried zeros.
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"cut_after":3}}"#).unwrap(),
        CHAINS,
    )
    .await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"x"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let events = anthropic_events(resp).await;
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("error"));
    // Counted as a request the provider answered, with no tokens and no cost, as every answer
    // whose usage never came is.
    let usage = env.admin_json("/admin/usage").await;
    let entries = usage["tenants"]["default"].as_object().expect("one tenant");
    assert_eq!(entries.len(), 1, "{usage}");
    let e = entries.values().next().unwrap();
    assert_eq!(e["requests"], 1, "{usage}");
    for kind in [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    ] {
        assert_eq!(e[kind], 0, "{usage}");
    }
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    assert_eq!(doc["input_tokens"], serde_json::Value::Null, "{doc}");
    assert_eq!(doc["cost_pico_usd"], serde_json::Value::Null, "{doc}");
}

#[tokio::test]
async fn an_upstream_error_comes_back_in_the_callers_shape() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"status":400,"error_message":"bad tool schema"}}"#,
        )
        .unwrap(),
        CHAINS,
    )
    .await;
    let resp = env.messages(VIA_OPENAI).await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["message"], "bad tool schema");
}

#[tokio::test]
async fn a_request_a_step_cannot_honour_is_not_sent_to_it() {
    let env = harness::start(CHAINS).await;
    // n > 1 has no Anthropic equivalent.
    let resp = env
        .chat(r#"{"model":"via-anthropic","n":3,"messages":[{"role":"user","content":"x"}]}"#)
        .await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(env.mock.stats().requests, 0);
}

/// A chat stream whose one call, `write`, carries `arguments` in one fragment, then finishes
/// with `finish`.
fn write_call_stream(arguments: &str, finish: &str) -> String {
    let chunk = crate::rawup::chat_chunk;
    let call = serde_json::json!({"role": "assistant", "tool_calls": [{"index": 0,
        "id": "call_1", "type": "function",
        "function": {"name": "write", "arguments": arguments}}]});
    [
        chunk(&call.to_string(), "null"),
        chunk("{}", &format!("\"{finish}\"")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

/// A streamed tool call whose arguments are not a JSON object, before any content reached the
/// caller, is an answer that cannot be carried: retried, then 502 `upstream_answer_unusable`
/// naming the tool, as the same answer whole is (not the 500 the translator's error event
/// would stand for).
#[tokio::test]
async fn a_broken_streamed_tool_call_before_content_is_a_502_after_its_retries() {
    let events = write_call_stream(r#"{"path":"#, "tool_calls");
    let reply = crate::rawup::reply_of("text/event-stream", &events);
    let (env, up) = crate::rawup::behind_with(reply, CHAINS).await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"write it"}]}"#)
        .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-legate-attempts"], "3");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "api_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tool `write`") && message.contains("not a JSON object"),
        "{message}"
    );
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// What is no answer in the other direction is none here either: a 200 body that is not an
/// Anthropic message (`{}`, a 200-wrapped error), a tool input that is not a JSON object, and
/// a chat stream with no choice in it are each retried, then 502 `upstream_answer_unusable`
/// (SPEC §10), never served as an empty or broken answer.
#[tokio::test]
async fn a_body_that_is_no_answer_is_retried_then_a_502_in_both_directions() {
    let not_object = r#"{"type":"message","id":"msg_1","role":"assistant","model":"m","stop_reason":"tool_use","content":[{"type":"tool_use","id":"toolu_1","name":"write","input":"abc"}],"usage":{"input_tokens":1,"output_tokens":1}}"#;
    let usage_only = [
        crate::rawup::chat_chunk("{}", "null").replace(
            r#""choices":[{"index":0,"delta":{},"finish_reason":null}]"#,
            r#""choices":[]"#,
        ),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let cases = [
        (
            "application/json",
            "{}",
            "/v1/chat/completions",
            "via-anthropic",
            "not an Anthropic message",
        ),
        (
            "application/json",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
            "/v1/chat/completions",
            "via-anthropic",
            "not an Anthropic message",
        ),
        (
            "application/json",
            not_object,
            "/v1/chat/completions",
            "via-anthropic",
            "tool `write`",
        ),
        (
            "text/event-stream",
            usage_only.as_str(),
            "/v1/messages",
            "via-openai",
            "no choices",
        ),
    ];
    for (ct, body, path, model, said) in cases {
        let (env, up) = crate::rawup::behind_with(crate::rawup::reply_of(ct, body), CHAINS).await;
        let req = format!(
            r#"{{"model":"{model}","max_tokens":16,"stream":{},"messages":[{{"role":"user","content":"x"}}]}}"#,
            ct != "application/json"
        );
        let resp = match path {
            "/v1/messages" => env.messages(req).await,
            _ => env.chat(req).await,
        };
        assert_eq!(resp.status(), 502, "{body}");
        assert_eq!(resp.headers()["x-legate-attempts"], "3", "{body}");
        let text = resp.text().await.unwrap();
        assert!(text.contains(said), "{body}: {text}");
        assert_eq!(
            up.requests.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "{body}"
        );
    }
}

/// A Responses caller served by a Chat-only step gets the same verdict on a chat stream with
/// no choice: retried, then 502, never an empty `response.completed`.
#[tokio::test]
async fn a_chat_stream_without_a_choice_is_no_answer_for_a_responses_caller_either() {
    let body = [
        crate::rawup::chat_chunk("{}", "null").replace(
            r#""choices":[{"index":0,"delta":{},"finish_reason":null}]"#,
            r#""choices":[]"#,
        ),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let reply = crate::rawup::reply_of("text/event-stream", &body);
    let up = crate::rawup::start(move |_req| {
        let action = crate::rawup::Action::Reply(reply.clone());
        async move { action }
    })
    .await;
    let chat_only = format!(
        "[providers.chat]\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"OPENAI_API_KEY\"\nresponses = false\n\n[[models]]\nname = \"local\"\nchain = [\"chat:llama\"]\n{CHAINS}",
        up.url
    );
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", &chat_only)).await;
    let resp = env
        .responses(r#"{"model":"local","stream":true,"input":"hi"}"#)
        .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-legate-attempts"], "3");
    let text = resp.text().await.unwrap();
    assert!(text.contains("no choices"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// A tool call the output limit cut (finish `length`) is not a broken answer: the same request
/// would be cut the same way, so it is served once, under `max_tokens`, whole or streamed, and
/// never retried into three bills.
#[tokio::test]
async fn a_tool_call_the_output_limit_cut_is_served_once_under_max_tokens() {
    let events = write_call_stream(r#"{"path": "a"#, "length");
    let whole = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"write","arguments":"{\"path\": \"a"}}]},"finish_reason":"length"}]}"#;
    for (stream, ct, body) in [
        (true, "text/event-stream", events.as_str()),
        (false, "application/json", whole),
    ] {
        let (env, up) = crate::rawup::behind_with(crate::rawup::reply_of(ct, body), CHAINS).await;
        let resp = env
            .messages(format!(r#"{{"model":"via-openai","max_tokens":8,"stream":{stream},"messages":[{{"role":"user","content":"write it"}}]}}"#))
            .await;
        assert_eq!(resp.status(), 200, "stream {stream}");
        assert_eq!(resp.headers()["x-legate-attempts"], "1");
        let text = resp.text().await.unwrap();
        assert!(text.contains(r#""stop_reason":"max_tokens""#), "{text}");
        assert!(!text.contains("error"), "{text}");
        let tool = if stream {
            r#""partial_json":"{\"path\": \"a""#
        } else {
            r#""input":{}"#
        };
        assert!(text.contains(tool), "{text}");
        assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}

/// A chat stream in three parts: its role chunk, a reasoning chunk the translation drops, and
/// its answer ("Hi") to the end.
fn reasoning_parts() -> [String; 3] {
    let chunk = crate::rawup::chat_chunk;
    [
        chunk(r#"{"role":"assistant","content":""}"#, "null"),
        chunk(r#"{"reasoning_content":"hmm"}"#, "null"),
        [
            chunk(r#"{"content":"Hi"}"#, "null"),
            chunk("{}", r#""stop""#),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat(),
    ]
}

/// Upstream blocks that give an Anthropic caller nothing (an OpenAI server's keep-alive
/// comment, reasoning the translation drops) reach it as Anthropic's own `ping`, at most one a
/// second, after `message_start`: its idle watchdog, and legate's `idle_timeout`, hear the
/// stream live. They were dropped.
#[tokio::test]
async fn an_upstream_keep_alive_reaches_a_translated_caller_as_a_ping() {
    let [role, reasoning, end] = reasoning_parts();
    let up = crate::rawup::start(move |_| {
        let action = crate::rawup::paced_chunks(&[&role, ": keep-alive\n\n", &reasoning, &end]);
        async move { action }
    })
    .await;
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", CHAINS)).await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names[..3],
        ["message_start", "ping", "content_block_start"],
        "{text}"
    );
    assert_eq!(names.iter().filter(|n| **n == "ping").count(), 1, "{text}");
    assert!(text.contains(r#""text":"Hi""#), "{text}");
}

/// Reasoning the translation drops, streamed for longer than the step's `idle_timeout`, is not
/// a stall: its keep-alives hold the stream (which was cut and retried as idle).
#[tokio::test]
async fn reasoning_longer_than_idle_timeout_keeps_a_translated_stream_alive() {
    let [role, reasoning, end] = reasoning_parts();
    let up = crate::rawup::start(move |_| {
        let mut parts = vec![role.as_str()];
        parts.extend([reasoning.as_str(); 6]);
        parts.push(&end);
        // 150 ms apart: 1.05 s with nothing for the caller, against an idle_timeout of 400 ms.
        let action =
            crate::rawup::paced_chunks_every(&parts, std::time::Duration::from_millis(150));
        async move { action }
    })
    .await;
    let toml = harness::config_toml_with(&up.url, "", "", CHAINS)
        .replace(r#"idle_timeout = "5s""#, r#"idle_timeout = "400ms""#);
    let env = harness::start_alone(&toml).await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    let text = resp.text().await.unwrap();
    assert!(text.contains(r#""text":"Hi""#), "{text}");
    assert!(
        text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{text}"
    );
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A tool_use block's start is preamble (SPEC §7): a stream cut right after it, before the
/// call's first argument fragment, is retried into one clean stream for a caller of either
/// OpenAI API, as a cut before a text block's first delta is.
#[tokio::test]
async fn a_cut_after_a_tool_blocks_start_is_retried_for_openai_callers() {
    let env = harness::start_with(legate::mock::Script::default(), CHAINS).await;
    let tools_chat =
        r#"[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]"#;
    let tools_responses =
        r#"[{"type":"function","name":"read_file","parameters":{"type":"object"}}]"#;
    for (path, body) in [
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"via-anthropic","stream":true,"messages":[{{"role":"user","content":"go"}}],"tools":{tools_chat}}}"#
            ),
        ),
        (
            "/v1/responses",
            format!(
                r#"{{"model":"via-anthropic","stream":true,"input":"go","tools":{tools_responses}}}"#
            ),
        ),
    ] {
        // message_start, ping, content_block_start(tool_use), then the cut; then a whole answer.
        env.script(
            r#"{"replies":[
                {"content":[{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"a"}}],"cut_after":3},
                {"content":[{"type":"tool_use","id":"toolu_2","name":"read_file","input":{"path":"b"}}],"stop_reason":"tool_use"}]}"#,
        );
        let before = env.mock.requests().len();
        let resp = env
            .http
            .post(env.url(path))
            .header("authorization", "Bearer caller-key")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.headers()["x-legate-attempts"], "2", "{path}");
        let text = resp.text().await.unwrap();
        assert_eq!(env.mock.requests().len(), before + 2, "{path}");
        // Only the second attempt's call reached the caller, and the stream ended cleanly.
        assert!(!text.contains("toolu_1"), "{path}: {text}");
        assert!(text.contains("toolu_2"), "{path}: {text}");
        assert!(!text.contains("event: error"), "{path}: {text}");
        assert!(!text.contains("response.failed"), "{path}: {text}");
        assert!(!text.contains("\"error\":{"), "{path}: {text}");
        let clean_end = if path == "/v1/responses" {
            "response.completed"
        } else {
            "[DONE]"
        };
        assert!(text.contains(clean_end), "{path}: {text}");
    }
}

/// A long context (past the size translated on a blocking thread) and a Responses caller's
/// with an unfit part: translated the same, or passed over the same, as a short one.
#[tokio::test]
async fn a_long_context_is_translated_off_the_worker_the_same() {
    let env = harness::start(CHAINS).await;
    let long = "lorem ipsum ".repeat(40_000);
    let body = serde_json::json!({
        "model": "via-openai", "max_tokens": 16, "system": "be brief",
        "messages": [{"role": "user", "content": long}, {"role": "assistant", "content": "ok"},
                     {"role": "user", "content": "and then?"}],
    })
    .to_string();
    assert!(body.len() > 256 << 10);
    let resp = env.messages(body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-backend");
    let up = env.mock.requests();
    assert_eq!(up.len(), 1);
    let sent: serde_json::Value = serde_json::from_slice(&up[0].body).unwrap();
    assert_eq!(sent["model"], "gpt-backend");
    let roles: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(sent["messages"][1]["content"], long.as_str());
    // A request the step cannot take fails the same way, long or short: n > 1 is unfit for
    // an Anthropic step.
    let unfit = serde_json::json!({
        "model": "via-anthropic", "n": 2,
        "messages": [{"role": "user", "content": long}],
    })
    .to_string();
    let resp = env.chat(unfit).await;
    assert_eq!(resp.status(), 400);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"].as_str().unwrap().contains("n > 1"),
        "{err}"
    );
    assert_eq!(
        env.mock.requests().len(),
        1,
        "nothing sent for the unfit one"
    );
}

/// A refusal the provider sends as a stream's error event before any content, on a step in
/// another API than the caller's: the Responses caller gets the refusal's status, once, and
/// the chain does not route around it. The translated event carried the error's type where the
/// Responses API has a code, which read as a 500: retried three times, then the next step.
#[tokio::test]
async fn a_refusal_in_a_translated_stream_is_a_refusal_for_a_responses_caller() {
    let events = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long\"}}\n\n";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{events}",
        events.len()
    );
    let (env, up) = crate::rawup::behind_with(reply.into_bytes(), CHAINS).await;
    let resp = env
        .responses(r#"{"model":"mixed","stream":true,"input":"x"}"#)
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["message"], "prompt is too long", "{v}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A deployment with a provider of one API only (an Ollama server speaking Chat
/// Completions): no provider of the other kind need be declared. The other API serves the
/// names [[models]] routes, translated, and any other model is 404 model_not_found, with
/// nothing sent.
#[tokio::test]
async fn one_api_alone_serves_the_other_through_its_models_only() {
    let mock = crate::harness::start_mock(legate::mock::Script::default()).await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [providers.ollama]\nkind = \"openai\"\nbase_url = \"{}\"\n\
         [[models]]\nname = \"claude-local\"\nchain = [\"ollama:llama3\"]\n",
        mock.base_url()
    );
    let env = crate::harness::start_toml(mock, &toml).await;
    let ask = |model: &str| {
        format!(
            r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
        )
    };
    let resp = env.messages(ask("claude-local")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "ollama:llama3");
    let resp = env.messages(ask("claude-elsewhere")).await;
    assert_eq!(resp.status(), 404);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["type"], "not_found_error", "{err}");
    assert_eq!(env.mock.requests().len(), 1);
}

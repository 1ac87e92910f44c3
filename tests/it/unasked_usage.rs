//! Usage that would otherwise go unmetered: an OpenAI stream whose caller did not ask for the
//! usage chunk (legate asks for it and takes it out again), and attempts that failed before
//! their commit point after the provider reported usage.

use crate::harness;

const USAGE: &str =
    r#"{"usage":{"input_tokens":31,"output_tokens":7,"cache_read_input_tokens":4}}"#;

fn script(json: &str) -> legate::mock::Script {
    legate::mock::Script::from_json(json).unwrap()
}

/// The stream's bytes with every `"created":<digits>` set to 0 (the mock stamps the time).
fn without_created(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    let mut rest = text.as_ref();
    while let Some(i) = rest.find("\"created\":") {
        let (head, tail) = rest.split_at(i + "\"created\":".len());
        out.push_str(head);
        out.push('0');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

fn data_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn an_unasked_openai_stream_is_metered_and_the_caller_sees_the_plain_stream() {
    let env = harness::start_with(script(&format!(r#"{{"default":{USAGE}}}"#)), "").await;
    let body = r#"{"model":"gpt-u","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    let got = resp.bytes().await.unwrap();

    // Upstream: the caller's bytes with the option appended, nothing else changed.
    let sent = env.mock.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        String::from_utf8_lossy(&sent[0].body),
        r#"{"model":"gpt-u","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}"#
    );

    // The caller: exactly what the provider sends a caller that did not ask.
    let direct = env
        .http
        .post(format!("{}/v1/chat/completions", env.mock.base_url()))
        .header("authorization", "Bearer any")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    // The mock numbers its replies: this is its second.
    let direct = without_created(&direct).replace("chatcmpl-mock-2", "chatcmpl-mock-1");
    assert!(!direct.contains("usage"));
    assert_eq!(without_created(&got), direct);

    let doc = env.admin_json("/admin/usage").await;
    let e = &doc["tenants"]["default"]["openai:gpt-u"];
    assert_eq!(e["requests"], 1);
    assert_eq!(e["input_tokens"], 31);
    assert_eq!(e["cache_read_tokens"], 4);
    assert_eq!(e["output_tokens"], 7);
    let labels = |kind| [("provider", "openai"), ("kind", kind)];
    assert_eq!(
        env.metric("legate_tokens_total", &labels("input")).await,
        Some(31.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &labels("output")).await,
        Some(7.0)
    );
}

#[tokio::test]
async fn a_caller_that_asked_gets_its_usage_chunk_once_and_its_body_unchanged() {
    let env = harness::start_with(script(&format!(r#"{{"default":{USAGE}}}"#)), "").await;
    let body =
        r#"{"model":"gpt-u","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
    let text = env.chat(body).await.text().await.unwrap();
    assert_eq!(env.mock.requests()[0].body, body.as_bytes());
    let chunks = data_lines(&text);
    let usage: Vec<_> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1, "{text}");
    assert_eq!(usage[0]["usage"]["prompt_tokens"], 35);
    assert_eq!(usage[0]["choices"], serde_json::json!([]));
    assert!(text.ends_with("data: [DONE]\n\n"));
    let doc = env.admin_json("/admin/usage").await;
    assert_eq!(
        doc["tenants"]["default"]["openai:gpt-u"]["input_tokens"],
        31
    );
}

#[tokio::test]
async fn an_explicit_false_is_asked_upstream_and_kept_from_the_caller() {
    let env = harness::start_with(script(&format!(r#"{{"default":{USAGE}}}"#)), "").await;
    let body =
        r#"{"model":"gpt-u","stream":true,"stream_options":{"include_usage":false},"messages":[]}"#;
    let text = env.chat(body).await.text().await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&env.mock.requests()[0].body),
        r#"{"model":"gpt-u","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#
    );
    assert!(!text.contains("usage"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let doc = env.admin_json("/admin/usage").await;
    assert_eq!(
        doc["tenants"]["default"]["openai:gpt-u"]["output_tokens"],
        7
    );
}

#[tokio::test]
async fn translated_streams_ask_once_and_are_metered_once() {
    let env = harness::start_with(
        script(&format!(r#"{{"default":{USAGE}}}"#)),
        "[[models]]\nname = \"to-openai\"\nchain = [\"openai:gpt-t\"]\n\
         [[models]]\nname = \"to-anthropic\"\nchain = [\"anthropic:claude-t\"]\n",
    )
    .await;
    // An Anthropic caller on an OpenAI step: the translated request asks for usage itself.
    let text = env
        .messages(r#"{"model":"to-openai","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains("message_stop"), "{text}");
    let up: serde_json::Value = serde_json::from_slice(&env.mock.requests()[0].body).unwrap();
    assert_eq!(
        up["stream_options"],
        serde_json::json!({"include_usage": true})
    );
    // An OpenAI caller that did not ask, on an Anthropic step: no usage chunk either.
    let text = env
        .chat(
            r#"{"model":"to-anthropic","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(!text.contains("usage"), "{text}");
    let doc = env.admin_json("/admin/usage").await;
    for target in ["openai:gpt-t", "anthropic:claude-t"] {
        let e = &doc["tenants"]["default"][target];
        assert_eq!(e["requests"], 1, "{target}");
        assert_eq!(e["input_tokens"], 31, "{target}");
        assert_eq!(e["output_tokens"], 7, "{target}");
    }
}

#[tokio::test]
async fn a_retried_stream_meters_the_usage_of_the_attempt_that_broke() {
    let env = harness::start_with(
        script(&format!(
            r#"{{"replies":[{{"match":{{"stream":true}},"cut_after":2,
                "usage":{{"input_tokens":700,"output_tokens":90,"cache_read_input_tokens":300,"cache_creation_input_tokens":20}}}}],
              "default":{USAGE}}}"#
        )),
        "",
    )
    .await;
    let resp = env
        .messages(r#"{"model":"claude-r","max_tokens":9,"stream":true,"messages":[]}"#)
        .await;
    assert_eq!(resp.headers()["x-legate-attempts"], "2");
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(resp.text().await.unwrap().contains("message_stop"));
    // The broken attempt's message_start: 700 input, 300 cache read, 20 cache write, 1 output;
    // the served one's: 31, 4, 0, 7. One request.
    // The request's record adds up to what was metered, the broken attempt's usage included.
    let rec = env.admin_json(&format!("/admin/requests/{rid}")).await;
    let counts = [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    ]
    .map(|k| rec[k].as_u64());
    assert_eq!(counts, [Some(731), Some(8), Some(304), Some(20)], "{rec}");
    let doc = env.admin_json("/admin/usage").await;
    let e = &doc["tenants"]["default"]["anthropic:claude-r"];
    assert_eq!(e["requests"], 1);
    assert_eq!(e["input_tokens"], 731);
    assert_eq!(e["output_tokens"], 8);
    assert_eq!(e["cache_read_tokens"], 304);
    assert_eq!(e["cache_write_tokens"], 20);
    let labels = [("provider", "anthropic"), ("kind", "input")];
    assert_eq!(
        env.metric("legate_tokens_total", &labels).await,
        Some(731.0)
    );
}

#[tokio::test]
async fn a_fallback_meters_the_failed_step_on_its_own_provider_and_model() {
    let env = harness::start_with(
        script(&format!(
            r#"{{"replies":[{{"match":{{"model":"claude-a"}},"times":0,"stream_error_after":1,
                "usage":{{"input_tokens":40,"output_tokens":90}}}}],
              "default":{USAGE}}}"#
        )),
        "[retry]\nmax_attempts = 1\n\
         [[models]]\nname = \"large\"\nchain = [\"anthropic:claude-a\", \"openai:gpt-b\"]\n",
    )
    .await;
    let resp = env
        .messages(r#"{"model":"large","max_tokens":9,"stream":true,"messages":[]}"#)
        .await;
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-b");
    assert!(resp.text().await.unwrap().contains("message_stop"));
    let doc = env.admin_json("/admin/usage").await;
    let failed = &doc["tenants"]["default"]["anthropic:claude-a"];
    assert_eq!(failed["requests"], 0);
    assert_eq!(failed["input_tokens"], 40);
    assert_eq!(failed["output_tokens"], 1);
    let served = &doc["tenants"]["default"]["openai:gpt-b"];
    assert_eq!(served["requests"], 1);
    assert_eq!(served["input_tokens"], 31);
    assert_eq!(served["output_tokens"], 7);
    let input = |provider| [("provider", provider), ("kind", "input")];
    assert_eq!(
        env.metric("legate_tokens_total", &input("anthropic")).await,
        Some(40.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &input("openai")).await,
        Some(31.0)
    );
}

#[tokio::test]
async fn usage_of_failed_attempts_is_charged_to_the_tenant_even_when_none_serves() {
    let env = harness::start_with(
        script(
            r#"{"replies":[{"times":0,"stream_error_after":1,
                "usage":{"input_tokens":400,"output_tokens":9}}]}"#,
        ),
        "[retry]\nmax_attempts = 1\n[tenants.default]\ntokens_per_minute = 1000\n",
    )
    .await;
    let body = r#"{"model":"claude-f","max_tokens":300,"stream":true,"messages":[]}"#;
    // Each failed request costs 401 tokens (input and message_start's 1 output): the third no
    // longer fits (a refunded one would leave the bucket full).
    for _ in 0..2 {
        let resp = env.messages(body).await;
        assert_eq!(resp.status(), 529);
        let rid = resp.headers()["x-legate-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let _ = resp.bytes().await;
        // What the tenant was charged is in the request's record, though no attempt served.
        let rec = env.admin_json(&format!("/admin/requests/{rid}")).await;
        assert_eq!(
            (rec["input_tokens"].as_u64(), rec["output_tokens"].as_u64()),
            (Some(400), Some(1)),
            "{rec}"
        );
    }
    assert_eq!(env.messages(body).await.status(), 429);
    let doc = env.admin_json("/admin/usage").await;
    assert_eq!(
        doc["tenants"]["default"]["anthropic:claude-f"]["input_tokens"],
        800
    );
}

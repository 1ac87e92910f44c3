//! The conversation store keeps each response for the tenant whose request made it (SPEC §11
//! with `[[clients]]`): another tenant cannot read, list, delete or continue it, nor have its
//! provider asked for it (nor for any id legate does not keep for the caller), and the ids
//! legate makes cannot be counted to. A conversation
//! legate made (a translated step's) continues on a step that relays the Responses API with
//! its history, since that provider never saw the id.

use serde_json::Value;

use crate::harness::{self, Env, sha256_hex};

use crate::responses::MODELS;

async fn start(script: &str) -> Env {
    start_and(script, "").await
}

/// Two tenants, `team-a` (key `key-a`) and `team-b` (key `key-b`), and `extra` config.
async fn start_and(script: &str, extra: &str) -> Env {
    let clients = format!(
        "[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{}\"\n[[clients]]\ntenant = \"team-b\"\nkey_sha256 = \"{}\"\n",
        sha256_hex(b"key-a"),
        sha256_hex(b"key-b"),
    );
    harness::start_with(
        legate::mock::Script::from_json(script).unwrap(),
        &format!("{MODELS}{clients}{extra}"),
    )
    .await
}

async fn call(env: &Env, key: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut req = env
        .http
        .request(method.parse().unwrap(), env.url(path))
        .header("authorization", format!("Bearer {key}"));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_owned());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn upstream_calls(env: &Env) -> usize {
    env.mock.requests().len()
}

#[tokio::test]
async fn a_tenant_cannot_read_delete_or_continue_another_tenants_responses() {
    let env = start(r#"{"default":{"content":[{"type":"text","text":"kept for team-a"}]}}"#).await;
    let (status, made) = call(
        &env,
        "key-a",
        "POST",
        "/v1/responses",
        Some(r#"{"model":"agent","input":"team-a's secret"}"#),
    )
    .await;
    assert_eq!(status, 200);
    let made = made["id"].as_str().unwrap().to_owned();
    let (status, relayed) = call(
        &env,
        "key-a",
        "POST",
        "/v1/responses",
        Some(r#"{"model":"fast","input":"team-a's other secret"}"#),
    )
    .await;
    assert_eq!(status, 200);
    let relayed = relayed["id"].as_str().unwrap().to_owned();
    // An id legate makes is OpenAI's shape, 48 hex digits that no request id gives away.
    let digits = made.strip_prefix("resp_").unwrap();
    assert_eq!(digits.len(), 48, "{made}");
    assert!(digits.bytes().all(|b| b.is_ascii_hexdigit()), "{made}");
    let calls = upstream_calls(&env);
    assert_eq!(calls, 2);

    for id in [&made, &relayed] {
        for (method, path) in [
            ("GET", format!("/v1/responses/{id}")),
            ("GET", format!("/v1/responses/{id}/input_items")),
            ("DELETE", format!("/v1/responses/{id}")),
        ] {
            let (status, err) = call(&env, "key-b", method, &path, None).await;
            assert_eq!(status, 404, "team-b {method} {path}: {err}");
            assert_eq!(err["error"]["code"], "response_not_found", "{err}");
            assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
            assert!(
                !err.to_string().contains("secret"),
                "team-b {method} {path}: {err}"
            );
        }
        for model in ["agent", "fast"] {
            let body =
                format!(r#"{{"model":"{model}","previous_response_id":"{id}","input":"go on"}}"#);
            let (status, err) = call(&env, "key-b", "POST", "/v1/responses", Some(&body)).await;
            assert_eq!(status, 400, "team-b continues {id} on {model}: {err}");
            // Nor is it counted for team-b: input_tokens forwards the id as a generation does.
            let (status, counted) = call(
                &env,
                "key-b",
                "POST",
                "/v1/responses/input_tokens",
                Some(&body),
            )
            .await;
            assert_eq!(status, 400, "team-b counts {id} on {model}: {counted}");
            assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
            assert_eq!(err["error"]["param"], "previous_response_id", "{err}");
        }
    }
    // An id legate does not keep (evicted, expired, from before a restart, never seen) may be
    // another tenant's: with several tenants it is not asked of the provider either.
    let (status, err) = call(&env, "key-b", "GET", "/v1/responses/resp_elsewhere", None).await;
    assert_eq!(status, 404, "{err}");
    let (status, err) = call(
        &env,
        "key-b",
        "POST",
        "/v1/responses",
        Some(r#"{"model":"fast","previous_response_id":"resp_elsewhere","input":"go on"}"#),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    // Nothing of team-b's reached a provider: not the reads, not the continuations.
    assert_eq!(upstream_calls(&env), calls);

    // team-a still has both, whole.
    let (status, got) = call(&env, "key-a", "GET", &format!("/v1/responses/{made}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(got["output"][0]["content"][0]["text"], "kept for team-a");
    let body = format!(r#"{{"model":"agent","previous_response_id":"{made}","input":"go on"}}"#);
    let (status, _) = call(&env, "key-a", "POST", "/v1/responses", Some(&body)).await;
    assert_eq!(status, 200);
    let sent: Value = serde_json::from_slice(&env.mock.requests()[calls].body).unwrap();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 3, "{sent}");
    let (status, _) = call(
        &env,
        "key-a",
        "DELETE",
        &format!("/v1/responses/{made}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_conversation_legate_made_continues_on_a_relaying_step_with_its_history() {
    let env = start(
        r#"{"replies":[{"match":{"model":"gpt-down"},"status":503,"times":0}],
            "default":{"content":[{"type":"text","text":"from claude"}]}}"#,
    )
    .await;
    let (status, first) = call(
        &env,
        "key-a",
        "POST",
        "/v1/responses",
        Some(r#"{"model":"spare","input":"hi"}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(first["output"][0]["content"][0]["text"], "from claude");
    let id = first["id"].as_str().unwrap().to_owned();
    // The OpenAI step is back.
    env.script(r#"{"default":{"content":[{"type":"text","text":"from gpt"}]}}"#);
    let before = upstream_calls(&env);
    let body = format!(r#"{{"model":"spare","previous_response_id":"{id}","input":"next"}}"#);
    let (status, second) = call(&env, "key-a", "POST", "/v1/responses", Some(&body)).await;
    assert_eq!(status, 200, "{second}");
    let requests = env.mock.requests();
    assert_eq!(requests.len(), before + 1);
    let sent = &requests[before];
    assert_eq!(sent.path, "/v1/responses");
    let sent: Value = serde_json::from_slice(&sent.body).unwrap();
    // The provider never saw legate's id: it gets the conversation instead.
    assert_eq!(sent.get("previous_response_id"), None, "{sent}");
    assert_eq!(sent["model"], "gpt-down");
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{sent}");
    let text = |item: &Value| match &item["content"] {
        Value::String(s) => s.clone(),
        parts => parts[0]["text"].as_str().unwrap_or_default().to_owned(),
    };
    assert_eq!(text(&input[0]), "hi");
    assert_eq!(text(&input[1]), "from claude");
    assert_eq!(text(&input[2]), "next");
}

/// With several tenants, a relayed response stays its tenant's after the store lets it go
/// (evicted by the tenant's own later responses) and from its stream's `response.created` on
/// (a stream that never completes is never kept): its provider is asked about it for that
/// tenant, and for no other.
#[tokio::test]
async fn a_relayed_response_the_store_let_go_is_still_its_tenants_alone() {
    let env = start_and(
        r#"{"replies":[{"match":{"stream":true},"drop_terminal":true}],
            "default":{"content":[{"type":"text","text":"for team-b"}]}}"#,
        "[responses]\nmax_bytes = 4000\n",
    )
    .await;
    let relay = r#"{"model":"fast","input":"hi"}"#;
    let (status, first) = call(&env, "key-b", "POST", "/v1/responses", Some(relay)).await;
    assert_eq!(status, 200);
    let first = first["id"].as_str().unwrap().to_owned();
    // team-b's later responses take the store's room: its first is evicted.
    for _ in 0..8 {
        let (status, _) = call(&env, "key-b", "POST", "/v1/responses", Some(relay)).await;
        assert_eq!(status, 200);
    }
    // A stream that ends without its terminal event: the store never keeps it.
    let resp = env
        .http
        .post(env.url("/v1/responses"))
        .header("authorization", "Bearer key-b")
        .header("content-type", "application/json")
        .body(r#"{"model":"fast","input":"hi","stream":true}"#)
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    let started = text
        .lines()
        .find_map(|l| {
            let v: Value = serde_json::from_str(l.strip_prefix("data: ")?).ok()?;
            (v["type"] == "response.created")
                .then(|| v["response"]["id"].as_str().map(str::to_owned))
                .flatten()
        })
        .unwrap_or_else(|| panic!("no response.created in {text}"));
    assert!(!text.contains("response.completed"), "{text}");

    for id in [&first, &started] {
        let calls = upstream_calls(&env);
        // Not team-a's: nothing asked of the provider.
        let (status, err) = call(&env, "key-a", "GET", &format!("/v1/responses/{id}"), None).await;
        assert_eq!(status, 404, "team-a GET {id}: {err}");
        let go_on = format!(r#"{{"model":"fast","previous_response_id":"{id}","input":"go on"}}"#);
        let (status, err) = call(&env, "key-a", "POST", "/v1/responses", Some(&go_on)).await;
        assert_eq!(status, 400, "team-a continues {id}: {err}");
        assert_eq!(upstream_calls(&env), calls);
        // team-b's: asked of the provider, which keeps it.
        let (status, got) = call(&env, "key-b", "GET", &format!("/v1/responses/{id}"), None).await;
        assert_eq!(status, 200, "team-b GET {id}: {got}");
        assert_eq!(got["id"], id.as_str());
        let (status, next) = call(&env, "key-b", "POST", "/v1/responses", Some(&go_on)).await;
        assert_eq!(status, 200, "team-b continues {id}: {next}");
        let requests = env.mock.requests();
        assert_eq!(requests.len(), calls + 2);
        let sent: Value = serde_json::from_slice(&requests[calls + 1].body).unwrap();
        assert_eq!(sent["previous_response_id"], id.as_str(), "{sent}");
    }
}

/// With several tenants, a translated response deleted by its own tenant while it streams is
/// not kept when the stream ends (it was unknown to the store until then, and the delete was
/// refused 404 without a tombstone); another tenant's delete of it is refused and changes
/// nothing.
#[tokio::test]
async fn a_translated_response_deleted_while_it_streams_is_not_kept() {
    let env = start(
        r#"{"default":{"event_gap_ms":100,"content":[{"type":"text","text":"a b c d e f"}]}}"#,
    )
    .await;
    let resp = env
        .http
        .post(env.url("/v1/responses"))
        .header("authorization", "Bearer key-a")
        .header("content-type", "application/json")
        .body(r#"{"model":"agent","input":"forget me","stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let opened = crate::responses::Opened::read(resp).await;
    let path = format!("/v1/responses/{}", opened.id);
    let (status, _) = call(&env, "key-b", "DELETE", &path, None).await;
    assert_eq!(status, 404, "another tenant's");
    // Asked of the provider (the mock says it deleted it), no longer refused.
    let (status, _) = call(&env, "key-a", "DELETE", &path, None).await;
    assert_eq!(status, 200);
    let id = opened.id.clone();
    assert_eq!(opened.last_event().await, "response.completed");
    let next = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"next"}}"#);
    let (status, err) = call(&env, "key-a", "POST", "/v1/responses", Some(&next)).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
}

//! Background responses (`background: true`, SPEC §11): answered `queued` with no usage, and
//! metered when a poll or a cancel finds them final, once per response.

use serde_json::{Value, json};

use crate::harness::{self, Env};

const CONFIG: &str = r#"
[[models]]
name = "gpt-bg"
chain = ["openai:gpt-bg"]

[[prices]]
model = "openai:gpt-bg"
input = "2"
output = "8"
cache_write = "0"
cache_read = "0.5"
"#;

fn response(id: &str, status: &str, usage: Value) -> Value {
    json!({"id": id, "object": "response", "created_at": 1, "status": status,
           "background": true, "model": "gpt-bg", "output": [], "usage": usage})
}

fn reply(path: &str, body: Value) -> Value {
    json!({"match": {"path": path}, "body": body})
}

async fn ask(env: &Env, method: reqwest::Method, path: &str) -> Value {
    ask_with_id(env, method, path).await.0
}

/// The answer, and the request id legate gave the request.
async fn ask_with_id(env: &Env, method: reqwest::Method, path: &str) -> (Value, String) {
    let resp = env
        .http
        .request(method, env.url(path))
        .header("authorization", "Bearer dummy-client-key")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (resp.json().await.unwrap(), rid)
}

/// The request's record in the journal: its tokens and cost.
async fn record(env: &Env, rid: &str) -> (Option<u64>, Option<u64>, Option<u64>, Value) {
    let rec = env.admin_json(&format!("/admin/requests/{rid}")).await;
    let n = |k: &str| rec[k].as_u64();
    let cost = rec["cost_pico_usd"].clone();
    (
        n("input_tokens"),
        n("output_tokens"),
        n("cache_read_tokens"),
        cost,
    )
}

async fn start_background(env: &Env) -> Value {
    let resp = env
        .responses(r#"{"model":"gpt-bg","input":"hi","background":true,"max_output_tokens":100}"#)
        .await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The ledger entry of the model: requests, input, output, cache reads and cost.
async fn ledger(env: &Env) -> (u64, u64, u64, u64, String) {
    let doc = env.admin_json("/admin/usage").await;
    let e = &doc["tenants"]["default"]["openai:gpt-bg"];
    let n = |k: &str| e[k].as_u64().unwrap_or(0);
    (
        n("requests"),
        n("input_tokens"),
        n("output_tokens"),
        n("cache_read_tokens"),
        e["cost_pico_usd"].as_str().unwrap_or("").to_owned(),
    )
}

async fn tokens(env: &Env, kind: &str) -> Option<f64> {
    let labels = [("tenant", "default"), ("model", "gpt-bg"), ("kind", kind)];
    env.metric("legate_tokens_total", &labels).await
}

#[tokio::test]
async fn a_polled_background_response_is_metered_once_when_it_is_final() {
    let env = harness::start(CONFIG).await;
    let usage = json!({"input_tokens": 120, "input_tokens_details": {"cached_tokens": 20},
                       "output_tokens": 30, "total_tokens": 150});
    let path = "/v1/responses/resp_bg1";
    let script = json!({"replies": [
        reply("/v1/responses", response("resp_bg1", "queued", Value::Null)),
        reply(path, response("resp_bg1", "in_progress", Value::Null)),
        {"match": {"path": path}, "times": 2, "body": response("resp_bg1", "completed", usage)},
    ]});
    env.script(&script.to_string());

    let started = start_background(&env).await;
    assert_eq!(started["status"], "queued");
    // Answered without usage: a request in the ledger, no tokens yet.
    assert_eq!(ledger(&env).await, (1, 0, 0, 0, "0".to_owned()));

    let polled = ask(&env, reqwest::Method::GET, path).await;
    assert_eq!(polled["status"], "in_progress");
    assert_eq!(ledger(&env).await, (1, 0, 0, 0, "0".to_owned()));

    let (done, rid) = ask_with_id(&env, reqwest::Method::GET, path).await;
    assert_eq!(done["status"], "completed");
    // The poll's own record carries what it metered: the journal adds up to the ledger.
    assert_eq!(
        record(&env, &rid).await,
        (Some(100), Some(30), Some(20), json!(450000000))
    );
    // 100 input at 2, 30 output at 8, 20 cache reads at 0.5 USD per million: 450 µUSD.
    assert_eq!(ledger(&env).await, (1, 100, 30, 20, "450000000".to_owned()));
    assert_eq!(tokens(&env, "input").await, Some(100.0));
    assert_eq!(tokens(&env, "output").await, Some(30.0));
    assert_eq!(tokens(&env, "cache_read").await, Some(20.0));

    // Polled again, final again: metered once.
    let (again, rid) = ask_with_id(&env, reqwest::Method::GET, path).await;
    assert_eq!(again["status"], "completed");
    assert_eq!(record(&env, &rid).await, (None, None, None, Value::Null));
    assert_eq!(ledger(&env).await, (1, 100, 30, 20, "450000000".to_owned()));
    assert_eq!(tokens(&env, "output").await, Some(30.0));
    let paths: Vec<String> = env.mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/responses", path, path, path]);
}

#[tokio::test]
async fn a_cancelled_background_response_is_metered_with_the_cancel_answer() {
    let env = harness::start(CONFIG).await;
    // The mock answers the cancel with the response `cancelled`, its default usage (10, 5).
    let script = json!({"replies": [reply("/v1/responses", response("resp_bg2", "in_progress", Value::Null))]});
    env.script(&script.to_string());
    start_background(&env).await;
    let cancelled = ask(&env, reqwest::Method::POST, "/v1/responses/resp_bg2/cancel").await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(ledger(&env).await, (1, 10, 5, 0, "60000000".to_owned()));
    // A poll after the cancel meters nothing more.
    let polled = ask(&env, reqwest::Method::GET, "/v1/responses/resp_bg2").await;
    assert_eq!(polled["id"], "resp_bg2");
    assert_eq!(ledger(&env).await, (1, 10, 5, 0, "60000000".to_owned()));
}

#[tokio::test]
async fn a_response_answered_final_is_not_waited_for() {
    let env = harness::start(CONFIG).await;
    // A provider that answers `background: true` with the finished response (or ignores it):
    // metered with the answer, and a poll adds nothing.
    let script = json!({"replies": [reply("/v1/responses", response("resp_bg3", "completed",
        json!({"input_tokens": 4, "output_tokens": 2, "total_tokens": 6})))]});
    env.script(&script.to_string());
    start_background(&env).await;
    assert_eq!(ledger(&env).await, (1, 4, 2, 0, "24000000".to_owned()));
    ask(&env, reqwest::Method::GET, "/v1/responses/resp_bg3").await;
    assert_eq!(ledger(&env).await, (1, 4, 2, 0, "24000000".to_owned()));
}

/// Server-sent events as a provider sends them: `event:` and `data:` per event.
fn events(list: &[(&str, Value)]) -> String {
    list.iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

fn stream_reply(path: &str, text: String) -> Value {
    json!({"match": {"path": path}, "body": text,
           "headers": {"content-type": "text/event-stream"}})
}

#[tokio::test]
async fn a_background_stream_cut_before_its_end_is_metered_by_its_replay() {
    let env = harness::start(CONFIG).await;
    let queued = response("resp_bg4", "queued", Value::Null);
    let running = response("resp_bg4", "in_progress", Value::Null);
    let done = response(
        "resp_bg4",
        "completed",
        json!({"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}),
    );
    let delta = json!({"type": "response.output_text.delta", "item_id": "msg_1",
                       "output_index": 0, "content_index": 0, "delta": "Hel"});
    // The first stream ends after its first words, without its final event (the caller's
    // connection, or the provider's, went); the replay runs to the end.
    let cut = events(&[
        (
            "response.created",
            json!({"type": "response.created", "response": queued}),
        ),
        (
            "response.in_progress",
            json!({"type": "response.in_progress", "response": running}),
        ),
        ("response.output_text.delta", delta.clone()),
    ]);
    let replay = events(&[
        ("response.output_text.delta", delta),
        (
            "response.completed",
            json!({"type": "response.completed", "response": done}),
        ),
    ]);
    let script = json!({"replies": [
        stream_reply("/v1/responses", cut),
        stream_reply("/v1/responses/resp_bg4", replay),
    ]});
    env.script(&script.to_string());
    let resp = env
        .responses(r#"{"model":"gpt-bg","input":"hi","background":true,"stream":true}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("response.created"), "{text}");
    assert_eq!(ledger(&env).await, (1, 0, 0, 0, "0".to_owned()));

    let resp = env
        .http
        .get(env.url("/v1/responses/resp_bg4?stream=true&starting_after=2"))
        .header("authorization", "Bearer dummy-client-key")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("response.completed"));
    assert_eq!(ledger(&env).await, (1, 12, 3, 0, "48000000".to_owned()));
    assert_eq!(env.mock.requests().len(), 2);
}

#[tokio::test]
async fn a_stream_that_is_not_in_background_is_not_waited_for() {
    let env = harness::start(CONFIG).await;
    // The mock's own stream says `background: false`; cut before its final event.
    env.script(r#"{"replies":[{"drop_terminal":true}]}"#);
    let resp = env
        .responses(r#"{"model":"gpt-bg","input":"hi","stream":true}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let created = text
        .split("\n\n")
        .find_map(|ev| ev.strip_prefix("event: response.created\ndata: "))
        .expect("a response.created event");
    let created: Value = serde_json::from_str(created).unwrap();
    let id = created["response"]["id"].as_str().unwrap();
    assert_eq!(created["response"]["status"], "in_progress");
    let (_, rid) = ask_with_id(&env, reqwest::Method::GET, &format!("/v1/responses/{id}")).await;
    assert_eq!(record(&env, &rid).await, (None, None, None, Value::Null));
    assert_eq!(ledger(&env).await, (1, 0, 0, 0, "0".to_owned()));
}

#[tokio::test]
async fn a_replay_answered_with_the_responses_json_is_read_as_json() {
    let env = harness::start(CONFIG).await;
    // A provider that answers `?stream=true` with the finished response's JSON, not events.
    let script = json!({"replies": [
        reply("/v1/responses", response("resp_bg5", "queued", Value::Null)),
        reply("/v1/responses/resp_bg5", response("resp_bg5", "completed",
            json!({"input_tokens": 6, "output_tokens": 1, "total_tokens": 7}))),
    ]});
    env.script(&script.to_string());
    start_background(&env).await;
    let resp = env
        .http
        .get(env.url("/v1/responses/resp_bg5?stream=true"))
        .header("authorization", "Bearer dummy-client-key")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    assert_eq!(ledger(&env).await, (1, 6, 1, 0, "20000000".to_owned()));
}

/// The default tenant's spend today, as the local store keeps it.
async fn spent(env: &Env) -> Value {
    let state = env.admin_json("/admin/state").await;
    state["buckets"]["local"]["default"]["spent_today_pico_usd"].clone()
}

#[tokio::test]
async fn the_daily_budget_is_put_right_when_the_usage_comes() {
    // A budget: the tenant's spend is kept, and the estimate charged when the response is
    // queued is replaced by what it cost once a poll finds it final.
    let config = format!("{CONFIG}\n[tenants.default]\ndaily_budget_usd = \"10\"\n");
    let env = harness::start(&config).await;
    let small = json!({"input_tokens": 4, "output_tokens": 2, "total_tokens": 6});
    let large = json!({"input_tokens": 1000, "output_tokens": 50000, "total_tokens": 51000});
    let script = json!({"replies": [
        reply("/v1/responses", response("resp_b1", "queued", Value::Null)),
        reply("/v1/responses/resp_b1", response("resp_b1", "completed", small)),
        reply("/v1/responses", response("resp_b2", "queued", Value::Null)),
        reply("/v1/responses/resp_b2", response("resp_b2", "completed", large)),
    ]});
    env.script(&script.to_string());
    // Asked for up to 100 output tokens: the estimate (its input, and 100 output at 8 µUSD)
    // is spent at first, then the 24 µUSD the response cost.
    start_background(&env).await;
    let estimate: u128 = spent(&env).await.as_str().unwrap().parse().unwrap();
    assert!(estimate >= 800_000_000, "{estimate}");
    ask(&env, reqwest::Method::GET, "/v1/responses/resp_b1").await;
    assert_eq!(spent(&env).await, "24000000");
    // No max_output_tokens: 4,096 output reserved, 50,000 used. The difference is charged.
    let resp = env
        .responses(r#"{"model":"gpt-bg","input":"hi","background":true}"#)
        .await;
    assert_eq!(resp.status(), 200);
    ask(&env, reqwest::Method::GET, "/v1/responses/resp_b2").await;
    // 24 µUSD, then 1,000 at 2 and 50,000 at 8 (402,000 µUSD).
    assert_eq!(spent(&env).await, "402024000000");
    assert_eq!(
        ledger(&env).await,
        (2, 1004, 50002, 0, "402024000000".to_owned())
    );
}

/// A background stream whose events are `created` (it ends there, before any content), and a
/// poll that finds the response `id` final with `usage`: what the stream's caller read.
async fn cut_background_stream(env: &Env, id: &str, created: String, usage: Value) -> String {
    let script = json!({"replies": [
        stream_reply("/v1/responses", created),
        reply(&format!("/v1/responses/{id}"), response(id, "completed", usage)),
    ]});
    env.script(&script.to_string());
    let resp = env
        .responses(r#"{"model":"gpt-bg","input":"hi","background":true,"stream":true}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    let text = resp.text().await.unwrap();
    ask(env, reqwest::Method::GET, &format!("/v1/responses/{id}")).await;
    text
}

#[tokio::test]
async fn a_background_stream_commits_at_the_event_that_names_it() {
    let env = harness::start(CONFIG).await;
    let queued = response("resp_bg6", "queued", Value::Null);
    // The response is created (after a gateway's ping), and the stream ends before any
    // content: no second attempt (it would start a second response), and the caller has the
    // id to poll.
    let created = events(&[
        ("ping", json!({})),
        (
            "response.created",
            json!({"type": "response.created", "response": queued}),
        ),
    ]);
    let usage = json!({"input_tokens": 5, "output_tokens": 5, "total_tokens": 10});
    let text = cut_background_stream(&env, "resp_bg6", created, usage).await;
    assert!(text.contains("resp_bg6"), "{text}");
    assert_eq!(env.mock.requests().len(), 2, "one POST, one poll");
    assert_eq!(ledger(&env).await, (1, 5, 5, 0, "50000000".to_owned()));
}

#[tokio::test]
async fn a_queued_answer_showing_no_output_is_waited_for() {
    let env = harness::start(CONFIG).await;
    // Its input only, as some servers report it while the response is queued.
    let zero = json!({"input_tokens": 7, "output_tokens": 0, "total_tokens": 7});
    let script = json!({"replies": [
        reply("/v1/responses", response("resp_bg7", "queued", zero)),
        reply("/v1/responses/resp_bg7", response("resp_bg7", "completed",
            json!({"input_tokens": 9, "output_tokens": 1, "total_tokens": 10}))),
    ]});
    env.script(&script.to_string());
    start_background(&env).await;
    ask(&env, reqwest::Method::GET, "/v1/responses/resp_bg7").await;
    assert_eq!(ledger(&env).await, (1, 9, 1, 0, "26000000".to_owned()));
}

#[tokio::test]
async fn a_cut_background_stream_whose_start_shows_usage_is_waited_for() {
    let env = harness::start(CONFIG).await;
    // A part of it (its input), from a server that reports usage on every event.
    let zero = json!({"input_tokens": 3, "output_tokens": 1, "total_tokens": 4});
    let created = events(&[(
        "response.created",
        json!({"type": "response.created", "response": response("resp_bg8", "queued", zero)}),
    )]);
    let usage = json!({"input_tokens": 3, "output_tokens": 3, "total_tokens": 6});
    cut_background_stream(&env, "resp_bg8", created, usage).await;
    assert_eq!(ledger(&env).await, (1, 3, 3, 0, "30000000".to_owned()));
}

#[tokio::test]
async fn a_background_stream_silent_in_its_queue_is_no_failure_of_the_provider() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let extra = format!(
        "{CONFIG}\n[retry]\nmax_attempts = 1\n\n[breaker]\nmin_calls = 2\nopen_for = \"60s\"\n"
    );
    let toml = harness::config_toml(&mock.base_url(), &extra)
        .replace("idle_timeout = \"5s\"", "idle_timeout = \"300ms\"");
    let env = harness::start_toml(mock, &toml).await;
    // The response is created, then nothing comes: the mock sends the first half of the body
    // (the whole `response.created`, and part of a comment after it) and stalls.
    let stalled = |id: &str| {
        let created = events(&[(
            "response.created",
            json!({"type": "response.created", "response": response(id, "queued", Value::Null)}),
        )]);
        let pad = format!(": {}\n\n", "x".repeat(created.len()));
        json!({"match": {"path": "/v1/responses"}, "body": format!("{created}{pad}"),
               "headers": {"content-type": "text/event-stream"}, "hang_after": 1})
    };
    let script = json!({"replies": [stalled("resp_q1"), stalled("resp_q2")]});
    env.script(&script.to_string());
    for id in ["resp_q1", "resp_q2"] {
        let resp = env
            .responses(r#"{"model":"gpt-bg","input":"hi","background":true,"stream":true}"#)
            .await;
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        assert!(text.contains(id), "{text}");
    }
    // Two stalls, and the breaker (two calls are enough to judge) stays closed.
    let labels = [("provider", "openai"), ("model", "gpt-bg")];
    assert_eq!(env.metric("legate_breaker_state", &labels).await, Some(0.0));
    assert_eq!(env.mock.requests().len(), 2);
}

//! The Responses API (SPEC §11): passthrough with every guarantee of the other APIs, event by
//! event; translation to an Anthropic step with the conversation rebuilt from the store; the
//! small endpoints and the WebSocket 426.

use std::time::Duration;

use futures_util::StreamExt;
use legate::mock::Script;
use legate::sse::SseParser;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::harness::{self, Env, OPENAI_KEY};

pub(crate) const MODELS: &str = r#"
[[models]]
name = "fast"
chain = ["openai:gpt-real"]

[[models]]
name = "agent"
chain = ["anthropic:claude-x"]

[[models]]
name = "spare"
chain = ["openai:gpt-down", "anthropic:claude-spare"]
"#;

async fn responses(env: &Env, body: &str) -> reqwest::Response {
    env.http
        .post(env.url("/v1/responses"))
        .header("authorization", "Bearer caller-key")
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

async fn events(resp: reqwest::Response) -> Vec<(Instant, String, Value)> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        let now = Instant::now();
        parser.push(&chunk);
        while let Some(ev) = parser.next_event() {
            let data = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
            out.push((now, ev.event.unwrap_or_default(), data));
        }
    }
    out
}

/// Where the stream's content begins: its first text delta.
fn first_delta(evs: &[(Instant, String, Value)]) -> usize {
    evs.iter()
        .position(|e| e.1 == "response.output_text.delta")
        .expect("a text delta")
}

/// A Responses stream read up to its `response.created` event: the response's id, and what
/// reads the rest ([`Opened::last_event`]).
pub(crate) struct Opened {
    pub(crate) id: String,
    parser: SseParser,
    rest: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
}

impl Opened {
    pub(crate) async fn read(resp: reqwest::Response) -> Opened {
        let mut parser = SseParser::new();
        let mut rest = Box::pin(resp.bytes_stream());
        while let Some(Ok(chunk)) = rest.next().await {
            parser.push(&chunk);
            while let Some(ev) = parser.next_event() {
                if ev.event.as_deref() == Some("response.created") {
                    let data: Value = serde_json::from_str(&ev.data).unwrap();
                    let id = data["response"]["id"].as_str().unwrap().to_owned();
                    return Opened { id, parser, rest };
                }
            }
        }
        panic!("the stream ended without response.created");
    }

    /// Reads the stream to its end: the name of its last event.
    pub(crate) async fn last_event(mut self) -> String {
        let mut last = String::new();
        loop {
            while let Some(ev) = self.parser.next_event() {
                last = ev.event.unwrap_or_default();
            }
            match self.rest.next().await {
                Some(Ok(chunk)) => self.parser.push(&chunk),
                _ => return last,
            }
        }
    }
}

/// A second provider of the Responses API on the same mock.
const OPENAI2: &str = r#"
[providers.openai2]
kind = "openai"
base_url = "{MOCK}"
api_key_env = "OPENAI_API_KEY"
"#;

async fn start(script: &str) -> Env {
    harness::start_with(Script::from_json(script).unwrap(), MODELS).await
}

#[tokio::test]
async fn passthrough_json_splices_the_alias_and_sends_one_credential() {
    let env = start("{}").await;
    let body = r#"{"model":"fast", "input":[{"role":"user","content":"hi"}],"max_output_tokens":20,"x_future":{"k":[1, 2]}}"#;
    let resp = responses(&env, body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-real");
    let obj: Value = resp.json().await.unwrap();
    assert_eq!(obj["object"], "response");
    let seen = env.mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/responses");
    assert_eq!(
        String::from_utf8_lossy(&seen[0].body),
        body.replace(r#""fast""#, r#""gpt-real""#)
    );
    let auth: Vec<&str> = seen[0].header_values("authorization").collect();
    assert_eq!(auth, [format!("Bearer {OPENAI_KEY}")]);
    assert_eq!(
        env.metric(
            "legate_requests_total",
            &[("api", "responses"), ("status", "200")]
        )
        .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn passthrough_stream_arrives_event_by_event_and_is_metered() {
    let env = start(
        r#"{"default":{"event_gap_ms":150,"content":[{"type":"text","text":"one two three"}],
            "usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":30}}}"#,
    )
    .await;
    let resp = responses(&env, r#"{"model":"fast","input":"hi","stream":true}"#).await;
    assert_eq!(resp.status(), 200);
    let evs = events(resp).await;
    let first = first_delta(&evs);
    for pair in evs[first..].windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= Duration::from_millis(100),
            "{} then {} {gap:?}",
            pair[0].1,
            pair[1].1
        );
    }
    assert_eq!(evs.last().unwrap().1, "response.completed");
    let doc = env.admin_json("/admin/usage").await;
    let e = &doc["tenants"]["default"]["openai:gpt-real"];
    assert_eq!(e["input_tokens"], 10);
    assert_eq!(e["cache_read_tokens"], 30);
    assert_eq!(e["output_tokens"], 4);
}

#[tokio::test]
async fn a_cut_after_content_ends_with_error_then_response_failed() {
    let env = start(r#"{"default":{"cut_after":6}}"#).await;
    // Relayed as it is, and translated from an Anthropic stream: legate's ending is numbered
    // after the last event and names the response the stream opened with (the SDKs' stream
    // helpers check both).
    for (n, model) in ["fast", "agent"].into_iter().enumerate() {
        let body = format!(r#"{{"model":"{model}","input":"hi","stream":true}}"#);
        let evs = events(responses(&env, &body).await).await;
        let names: Vec<&str> = evs.iter().map(|e| e.1.as_str()).collect();
        assert!(names.contains(&"response.output_text.delta"), "{names:?}");
        assert_eq!(names[names.len() - 2..], ["error", "response.failed"]);
        let seqs: Vec<u64> = evs
            .iter()
            .map(|e| e.2["sequence_number"].as_u64().unwrap())
            .collect();
        let want: Vec<u64> = (seqs[0]..seqs[0] + seqs.len() as u64).collect();
        assert_eq!(seqs, want, "{model}: numbered in order, without a gap");
        let (opened, failed) = (&evs[0].2["response"], &evs.last().unwrap().2["response"]);
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["error"]["code"], "upstream_stream_error");
        for k in ["id", "created_at", "model"] {
            assert!(!opened[k].is_null(), "{model}: {k}");
            assert_eq!(failed[k], opened[k], "{model}: {k}");
        }
        assert_eq!(
            env.mock.requests().len(),
            n + 1,
            "nothing is retried after the commit point"
        );
    }
}

#[tokio::test]
async fn a_failure_before_content_is_retried_into_one_clean_stream() {
    let env =
        start(r#"{"replies":[{"stream_error_after":2},{"drop_terminal":true,"content":[]}]}"#)
            .await;
    let resp = responses(&env, r#"{"model":"fast","input":"hi","stream":true}"#).await;
    assert_eq!(resp.status(), 200);
    let evs = events(resp).await;
    let names: Vec<&str> = evs.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(names.last(), Some(&"response.completed"), "{names:?}");
    assert!(!names.contains(&"error"));
    assert_eq!(env.mock.requests().len(), 3);
}

#[tokio::test]
async fn an_unavailable_step_falls_back_to_a_translated_one() {
    let env = start(
        r#"{"replies":[{"match":{"model":"gpt-down"},"status":503,"times":0}],
            "default":{"content":[{"type":"text","text":"from claude"}]}}"#,
    )
    .await;
    let resp = responses(&env, r#"{"model":"spare","input":"hi"}"#).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-spare"
    );
    let obj: Value = resp.json().await.unwrap();
    assert_eq!(obj["output"][0]["content"][0]["text"], "from claude");
    let paths: Vec<String> = env.mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths.last().map(String::as_str), Some("/v1/messages"));
}

#[tokio::test]
async fn translated_function_call_round_trip_with_previous_response_id() {
    let env = start(
        r#"{"replies":[
            {"content":[{"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Oslo"}}]},
            {"content":[{"type":"text","text":"It rains in Oslo."}]}]}"#,
    )
    .await;
    let tools = r#"[{"type":"function","name":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]"#;
    let first = format!(
        r#"{{"model":"agent","instructions":"Be brief.","input":"Weather in Oslo?","tools":{tools},"stream":true}}"#
    );
    let evs = events(responses(&env, &first).await).await;
    let done = &evs.last().unwrap().2;
    assert_eq!(done["type"], "response.completed");
    let resp1 = done["response"].clone();
    assert_eq!(resp1["output"][0]["type"], "function_call");
    assert_eq!(resp1["output"][0]["call_id"], "toolu_1");
    assert_eq!(resp1["output"][0]["arguments"], r#"{"city":"Oslo"}"#);
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e.2["sequence_number"], i);
    }
    let id = resp1["id"].as_str().unwrap();
    let second = format!(
        r#"{{"model":"agent","previous_response_id":"{id}","tools":{tools},
            "input":[{{"type":"function_call_output","call_id":"toolu_1","output":"rain"}}]}}"#
    );
    let resp = responses(&env, &second).await;
    assert_eq!(resp.status(), 200);
    let obj: Value = resp.json().await.unwrap();
    assert_eq!(obj["output"][0]["content"][0]["text"], "It rains in Oslo.");
    assert_eq!(obj["previous_response_id"], id);
    // The Anthropic step got the whole conversation, rebuilt from the store.
    let sent: Value = serde_json::from_slice(&env.mock.requests()[1].body).unwrap();
    // As on OpenAI, instructions are not carried over from the earlier turn.
    assert_eq!(sent.get("system"), None);
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{sent}");
    assert_eq!(msgs[1]["content"][0]["type"], "tool_use");
    assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
    assert_eq!(msgs[2]["content"][0]["tool_use_id"], "toolu_1");
    // The translated response answers from the store.
    let got: Value = env
        .http
        .get(env.url(&format!("/v1/responses/{}", obj["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["output"][0]["content"][0]["text"], "It rains in Oslo.");
}

#[tokio::test]
async fn an_unknown_previous_response_id_on_a_translated_route_is_a_400() {
    let env = start("{}").await;
    let resp = responses(
        &env,
        r#"{"model":"agent","previous_response_id":"resp_never","input":"hi"}"#,
    )
    .await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    // OpenAI's own shape for it, which the SDKs and agents already handle.
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert_eq!(err["error"]["code"], "previous_response_not_found");
    assert_eq!(err["error"]["param"], "previous_response_id");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'resp_never' not found")
    );
    // A caller's id is repeated only in part when it is long: no echo of a huge string.
    let long = "r".repeat(100_000);
    let resp = responses(
        &env,
        &format!(r#"{{"model":"agent","previous_response_id":"{long}","input":"hi"}}"#),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("'{}…'", &long[..128])),
        "{message}"
    );
    assert!(message.len() < 400, "{}", message.len());
    assert!(env.mock.requests().is_empty());
}

#[tokio::test]
async fn a_websocket_upgrade_gets_426_at_once() {
    let env = start("{}").await;
    let resp = env
        .http
        .get(env.url("/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 426);
    // legate's own headers, as on every answer.
    assert!(resp.headers().contains_key("x-legate-overhead-ms"));
    assert!(resp.headers().contains_key("x-legate-request-id"));
    assert!(env.mock.requests().is_empty());
    env.wait_metric(
        "legate_requests_total",
        &[("api", "responses"), ("status", "426")],
        1.0,
    )
    .await;
}

#[tokio::test]
async fn input_tokens_is_forwarded_or_estimated() {
    let env = start("{}").await;
    let post = |model: &str| {
        env.http
            .post(env.url("/v1/responses/input_tokens"))
            .body(format!(r#"{{"model":"{model}","input":"hello there"}}"#))
            .send()
    };
    let forwarded = post("fast").await.unwrap();
    assert_eq!(forwarded.status(), 200);
    assert!(forwarded.headers().get("x-legate-estimate").is_none());
    // The step that answered, as on every upstream answer: provider and model.
    assert_eq!(forwarded.headers()["x-legate-served-by"], "openai:gpt-real");
    let estimated = post("agent").await.unwrap();
    assert_eq!(estimated.headers()["x-legate-estimate"], "true");
    let v: Value = estimated.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(env.mock.requests().len(), 1);
    let _ = json!({});
}

/// `input_tokens` counts the conversation a turn continues, as its request would send it: a
/// translated step's estimate includes the stored turns (and an id legate does not hold is
/// the request's 400), and a relaying step is sent the rebuilt conversation when the id is
/// one legate made. Both counted the new input alone; the second sent the provider an id it
/// never saw.
#[tokio::test]
async fn input_tokens_counts_the_conversation_a_turn_continues() {
    let long = "many words ".repeat(400);
    let env = start(&format!(
        r#"{{"default":{{"content":[{{"type":"text","text":"{long}"}}]}}}}"#
    ))
    .await;
    let resp = responses(&env, r#"{"model":"agent","input":"hi"}"#).await;
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let count = |model: &str, prior: &str| {
        env.http
            .post(env.url("/v1/responses/input_tokens"))
            .body(format!(r#"{{"model":"{model}","input":"next"{prior}}}"#))
            .send()
    };
    let tokens = |v: Value| v["input_tokens"].as_u64().unwrap_or(0);
    let alone = tokens(count("agent", "").await.unwrap().json().await.unwrap());
    let prior = format!(r#","previous_response_id":"{id}""#);
    let with = count("agent", &prior).await.unwrap();
    assert_eq!(with.headers()["x-legate-estimate"], "true");
    let with = tokens(with.json().await.unwrap());
    assert!(with > alone + 900, "{with} vs {alone}");
    let unknown = count("agent", r#","previous_response_id":"resp_never""#)
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(unknown["error"]["code"], "previous_response_not_found");
    // Relayed: the provider gets the conversation, not an id it never saw.
    let relayed = count("fast", &prior).await.unwrap();
    assert_eq!(relayed.status(), 200);
    let sent = env.mock.requests().last().unwrap().body.clone();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    assert!(sent.to_string().contains("many words"), "{sent}");
}

/// A relayed answer, whole or streamed, is kept in the store as it came: a later turn on a
/// translated route is rebuilt from it.
#[tokio::test]
async fn a_relayed_answer_whole_or_streamed_is_kept_for_a_translated_next_turn() {
    for stream in [false, true] {
        let env = start(
            r#"{"replies":[
                {"content":[{"type":"text","text":"relayed \"first\" answer"}]},
                {"content":[{"type":"text","text":"translated second"}]}]}"#,
        )
        .await;
        let first = format!(r#"{{"model":"fast","input":"hi","stream":{stream}}}"#);
        let resp = responses(&env, &first).await;
        assert_eq!(resp.status(), 200);
        let id = if stream {
            let evs = events(resp).await;
            let done = &evs.last().unwrap().2;
            assert_eq!(done["type"], "response.completed");
            done["response"]["id"].as_str().unwrap().to_owned()
        } else {
            let obj: Value = resp.json().await.unwrap();
            obj["id"].as_str().unwrap().to_owned()
        };
        let second = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"next"}}"#);
        let resp = responses(&env, &second).await;
        assert_eq!(resp.status(), 200, "stream {stream}");
        let obj: Value = resp.json().await.unwrap();
        assert_eq!(obj["output"][0]["content"][0]["text"], "translated second");
        let sent: Value = serde_json::from_slice(&env.mock.requests()[1].body).unwrap();
        let msgs = sent["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "stream {stream}: {sent}");
        assert_eq!(msgs[0]["role"], "user");
        assert_eq!(msgs[1]["role"], "assistant");
        assert_eq!(
            msgs[1]["content"], "relayed \"first\" answer",
            "stream {stream}: {sent}"
        );
        assert_eq!(msgs[2]["role"], "user");
    }
}

/// A relayed turn that continued a response legate does not hold (from before a restart, or
/// made at the provider directly) is not kept: a translated next turn would be rebuilt
/// without the turns before it. It gets the 400 that asks for the whole conversation, as its
/// predecessor would; it was served 200 with the history silently cut.
#[tokio::test]
async fn a_turn_after_an_unknown_response_is_not_rebuilt_without_its_history() {
    for stream in [false, true] {
        let env = start(r#"{"default":{"content":[{"type":"text","text":"relayed"}]}}"#).await;
        let first = format!(
            r#"{{"model":"fast","previous_response_id":"resp_from_before","input":"q2","stream":{stream}}}"#
        );
        let resp = responses(&env, &first).await;
        assert_eq!(resp.status(), 200);
        let id = if stream {
            let evs = events(resp).await;
            evs.last().unwrap().2["response"]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        } else {
            let obj: Value = resp.json().await.unwrap();
            obj["id"].as_str().unwrap().to_owned()
        };
        let second = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"q3"}}"#);
        let resp = responses(&env, &second).await;
        assert_eq!(resp.status(), 400, "stream {stream}");
        let err: Value = resp.json().await.unwrap();
        assert!(
            err["error"]["message"].as_str().unwrap().contains(&id),
            "{err}"
        );
        assert_eq!(env.mock.requests().len(), 1, "stream {stream}");
    }
}

/// A response legate made from another API's answer has no kept events: asked for its stream
/// (`GET …?stream=true`) it is a 400 that says so. It was answered whole, as JSON, and the
/// SDK's stream ended with no event and no error.
#[tokio::test]
async fn a_translated_responses_stream_is_not_replayed_silently() {
    let env = start(r#"{"default":{"content":[{"type":"text","text":"made here"}]}}"#).await;
    let resp = responses(&env, r#"{"model":"agent","input":"hi"}"#).await;
    assert_eq!(resp.status(), 200);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let get = |query: &str| {
        env.http
            .get(env.url(&format!("/v1/responses/{id}{query}")))
            .send()
    };
    let streamed = get("?stream=true").await.unwrap();
    assert_eq!(streamed.status(), 400);
    let err: Value = streamed.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream=true"),
        "{err}"
    );
    let whole = get("").await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.json::<Value>().await.unwrap()["id"], json!(id));
    assert_eq!(env.mock.requests().len(), 1);
}

/// Events closer together than `idle_timeout` keep a stream alive however long it runs: before
/// its first content (four preamble events, held back) and after it.
#[tokio::test]
async fn a_stream_paced_within_the_idle_timeout_runs_past_it_before_and_after_its_content() {
    let mock = harness::start_mock(
        Script::from_json(
            r#"{"default":{"event_gap_ms":150,"content":[{"type":"text","text":"one two three"}]}}"#,
        )
        .unwrap(),
    )
    .await;
    let toml = harness::config_toml(&mock.base_url(), MODELS)
        .replace("idle_timeout = \"5s\"", "idle_timeout = \"450ms\"");
    let env = harness::start_toml(mock, &toml).await;
    let started = Instant::now();
    let resp = responses(&env, r#"{"model":"fast","input":"hi","stream":true}"#).await;
    assert_eq!(resp.status(), 200);
    let evs = events(resp).await;
    let first = first_delta(&evs);
    // Longer than the idle timeout before the first content, and twice that after it.
    assert!(evs[first].0 - started > Duration::from_millis(450));
    assert!(evs.last().unwrap().0 - evs[first].0 > Duration::from_millis(900));
    let names: Vec<&str> = evs.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(names.last(), Some(&"response.completed"), "{names:?}");
    assert!(!names.contains(&"error"), "{names:?}");
    assert_eq!(env.mock.requests().len(), 1, "nothing was retried");
}

/// A conversation store whose Redis takes connections and never answers: a lookup of
/// `previous_response_id` is a 503 with `retry-after`, nothing is sent upstream, and callers
/// at the same moment share one connection attempt instead of each waiting out their own in
/// turn (the attempts are paused after one fails).
#[tokio::test]
async fn an_unreachable_conversation_store_is_a_503_and_callers_share_one_attempt() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(sock);
        }
    });
    let extra = format!(
        "{MODELS}\n[ratelimit]\nredis_url = \"redis://127.0.0.1:{port}/0\"\n[responses]\nstore = \"redis\"\n"
    );
    let env = harness::start_with(Script::default(), &extra).await;
    let body = r#"{"model":"agent","previous_response_id":"resp_earlier","input":"hi"}"#;
    let calls: Vec<_> = (0..8).map(|_| responses(&env, body)).collect();
    for resp in futures_util::future::join_all(calls).await {
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(
            err["error"]["code"], "conversation_store_unavailable",
            "{err}"
        );
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Reading or deleting a stored response is not forwarded to the provider instead.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = env
            .http
            .request(method, env.url("/v1/responses/resp_earlier"))
            .header("authorization", "Bearer caller-key")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
    }
    assert!(env.mock.requests().is_empty());
}

/// One long conversation, each of whose turns the store keeps whole, spends its own earlier
/// turns before another conversation's last one: the store evicts continued turns first.
#[tokio::test]
async fn a_long_conversation_evicts_its_own_earlier_turns_first() {
    let env = harness::start_with(
        Script::from_json(r#"{"default":{"content":[{"type":"text","text":"an answer"}]}}"#)
            .unwrap(),
        // Room for the last turn (which holds the whole conversation) and the other
        // conversation's, each counted with its bookkeeping, and not for the earlier turns.
        &format!("{MODELS}[responses]\nmax_bytes = 10500\n"),
    )
    .await;
    let id_of = |obj: &Value| obj["id"].as_str().unwrap().to_owned();
    let resp = responses(&env, r#"{"model":"agent","input":"another conversation"}"#).await;
    assert_eq!(resp.status(), 200);
    let other = id_of(&resp.json().await.unwrap());
    let resp = responses(&env, r#"{"model":"agent","input":"turn 0"}"#).await;
    let mut chain = vec![id_of(&resp.json().await.unwrap())];
    for turn in 1..12 {
        let body = format!(
            r#"{{"model":"agent","previous_response_id":"{}","input":"turn {turn}"}}"#,
            chain[turn - 1]
        );
        let resp = responses(&env, &body).await;
        assert_eq!(resp.status(), 200, "turn {turn}");
        chain.push(id_of(&resp.json().await.unwrap()));
    }
    let sent: Value = serde_json::from_slice(&env.mock.requests()[12].body).unwrap();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 23, "{sent}");
    let get = |id: &str| {
        env.http
            .get(env.url(&format!("/v1/responses/{id}")))
            .header("authorization", "Bearer caller-key")
            .send()
    };
    // Each response was made here, by a translated step: one the store holds is answered
    // from it, and one it let go is asked of the provider (with one tenant, as SPEC §11 says).
    for (id, held) in [(&other, true), (&chain[11], true), (&chain[0], false)] {
        let before = env.mock.requests().len();
        let resp = get(id).await.unwrap();
        let got = env.mock.requests().len() - before;
        assert_eq!((got, held), (usize::from(!held), held), "{id}");
        if held {
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.json::<Value>().await.unwrap()["id"], id.as_str());
        }
    }
}

/// A provider that streams its Responses events without `event:` lines (each names its type
/// in `type`, as every event must) has its streamed turn kept too, as the same turn answered
/// whole is: a translated next turn is rebuilt from it, where it got the 400 asking for the
/// whole conversation.
#[tokio::test]
async fn a_relayed_stream_without_event_lines_is_kept_for_a_translated_next_turn() {
    let up = crate::rawup::start(|req| async move {
        if req.head.starts_with("POST /v1/responses") {
            let response = json!({"id": "resp_up1", "object": "response", "status": "completed",
                "model": "gpt-real", "output": [{"type": "message", "id": "msg_1", "role": "assistant",
                "status": "completed", "content": [{"type": "output_text", "text": "relayed", "annotations": []}]}],
                "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}});
            let created = json!({"type": "response.created", "sequence_number": 0,
                "response": {"id": "resp_up1", "object": "response", "status": "in_progress", "output": []}});
            let delta = json!({"type": "response.output_text.delta", "sequence_number": 1,
                "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "relayed"});
            let done = json!({"type": "response.completed", "sequence_number": 2, "response": response});
            let body = format!("data: {created}\n\ndata: {delta}\n\ndata: {done}\n\n");
            crate::rawup::Action::Reply(crate::rawup::reply_of("text/event-stream", &body))
        } else {
            crate::rawup::Action::Reply(crate::rawup::json_reply(
                r#"{"id":"msg_2","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"second"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":1}}"#,
            ))
        }
    })
    .await;
    let toml = harness::config_toml_with(&up.url, "", "", MODELS);
    let env = harness::start_alone(&toml).await;
    let resp = responses(&env, r#"{"model":"fast","input":"hi","stream":true}"#).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("response.completed"), "{text}");
    let second = r#"{"model":"agent","previous_response_id":"resp_up1","input":"next"}"#;
    let resp = responses(&env, second).await;
    assert_eq!(resp.status(), 200);
    let obj: Value = resp.json().await.unwrap();
    assert_eq!(obj["output"][0]["content"][0]["text"], "second");
}

/// A chain that falls back from one provider of the Responses API to another: the second
/// never saw the first's response ids, so a turn continuing one of them is rebuilt from the
/// store for it (as for a translated step), where it was forwarded as is and the provider
/// answered 400 `previous_response_not_found`, a refusal the chain does not route around. A
/// turn continuing a response on the provider that made it still goes by id.
#[tokio::test]
async fn a_fallback_to_another_responses_provider_carries_the_conversation() {
    let extra = format!(
        "{OPENAI2}{}",
        r#"
[[models]]
name = "pp"
chain = ["openai:gpt-one", "openai2:gpt-two"]
"#
    );
    let script = r#"{"replies":[
        {"match":{"model":"gpt-one"},"content":[{"type":"text","text":"first"}]},
        {"match":{"model":"gpt-one"},"status":500},
        {"match":{"model":"gpt-one"},"status":500},
        {"match":{"model":"gpt-one"},"status":500}]}"#;
    let env = harness::start_with(Script::from_json(script).unwrap(), &extra).await;
    let first = responses(&env, r#"{"model":"pp","input":"hi"}"#).await;
    assert_eq!(first.status(), 200);
    let id = first.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = format!(r#"{{"model":"pp","previous_response_id":"{id}","input":"next"}}"#);
    let resp = responses(&env, &second).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "openai2:gpt-two");
    let reqs = env.mock.requests();
    let sent: Value = serde_json::from_slice(&reqs.last().unwrap().body).unwrap();
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{sent}");
    let text = |i: usize| input[i].to_string();
    assert!(
        text(0).contains("\"hi\"") && input[0]["role"] == "user",
        "{sent}"
    );
    assert!(
        text(1).contains("first") && input[1]["role"] == "assistant",
        "{sent}"
    );
    assert!(text(2).contains("next"), "{sent}");
    // The first provider answers again: its own response is continued by id.
    let third = format!(r#"{{"model":"pp","previous_response_id":"{id}","input":"again"}}"#);
    let resp = responses(&env, &third).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-one");
    let reqs = env.mock.requests();
    let sent: Value = serde_json::from_slice(&reqs.last().unwrap().body).unwrap();
    assert_eq!(sent["previous_response_id"], id.as_str(), "{sent}");
}

/// A provider's reasoning items reach no other provider: carried in a translated turn's
/// stored input, they are left out when a later turn is rebuilt for a relaying step.
#[tokio::test]
async fn reasoning_items_carried_through_a_translated_turn_reach_no_other_provider() {
    let extra = OPENAI2.to_owned()
        + r#"
[[models]]
name = "one"
chain = ["openai:gpt-one"]

[[models]]
name = "two"
chain = ["openai2:gpt-two"]

[[models]]
name = "agent"
chain = ["anthropic:claude-x"]
"#;
    let script = r#"{"replies":[
        {"match":{"model":"gpt-one"},"content":[
            {"type":"thinking","thinking":"hmm","signature":"sig"},
            {"type":"text","text":"first"}]}]}"#;
    let env = harness::start_with(Script::from_json(script).unwrap(), &extra).await;
    let first = responses(&env, r#"{"model":"one","input":"hi"}"#).await;
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["output"][0]["type"], "reasoning", "{first}");
    let turn = |model: &str, prior: &Value| {
        let prior = prior["id"].as_str().unwrap_or_default();
        format!(r#"{{"model":"{model}","previous_response_id":"{prior}","input":"next"}}"#)
    };
    let second = responses(&env, &turn("agent", &first)).await;
    assert_eq!(second.status(), 200);
    let second: Value = second.json().await.unwrap();
    let third = responses(&env, &turn("two", &second)).await;
    assert_eq!(third.status(), 200);
    assert_eq!(third.headers()["x-legate-served-by"], "openai2:gpt-two");
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 3);
    let sent: Value = serde_json::from_slice(&reqs[2].body).unwrap();
    let input = sent["input"].as_array().unwrap();
    let types: Vec<&str> = input
        .iter()
        .map(|i| i["type"].as_str().unwrap_or("message"))
        .collect();
    assert!(!types.contains(&"reasoning"), "{sent}");
    // The conversation is whole but for it: hi, first, next, the second answer, next. The
    // first answer's item id is the first provider's, and goes too.
    assert_eq!(input.len(), 5, "{sent}");
    assert!(input[1].to_string().contains("first"), "{sent}");
    assert!(input[1].get("id").is_none(), "{sent}");
    // Back to the provider that made them, its reasoning and ids go with the conversation.
    let fourth = responses(&env, &turn("one", &second)).await;
    assert_eq!(fourth.status(), 200);
    assert_eq!(fourth.headers()["x-legate-served-by"], "openai:gpt-one");
    let reqs = env.mock.requests();
    let sent: Value = serde_json::from_slice(&reqs[3].body).unwrap();
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 6, "{sent}");
    assert_eq!(input[1]["type"], "reasoning", "{sent}");
    assert!(input[2].get("id").is_some(), "{sent}");
    // A turn relayed to the other provider continuing that one keeps none of the first's
    // reasoning in its own entry: a translated turn after it, back to the first provider,
    // is sent none either.
    let fourth: Value = fourth.json().await.unwrap();
    let fifth = responses(&env, &turn("two", &fourth)).await;
    assert_eq!(fifth.status(), 200);
    let fifth: Value = fifth.json().await.unwrap();
    let sixth = responses(&env, &turn("agent", &fifth)).await;
    assert_eq!(sixth.status(), 200);
    let sixth: Value = sixth.json().await.unwrap();
    let seventh = responses(&env, &turn("two", &sixth)).await;
    assert_eq!(seventh.status(), 200);
    let reqs = env.mock.requests();
    let sent = String::from_utf8_lossy(&reqs.last().unwrap().body).into_owned();
    assert!(!sent.contains("reasoning"), "{sent}");
}

/// A relayed response's copy goes when the provider's has gone, not before: a DELETE the
/// provider failed leaves the copy, and a later turn that falls back to a translated step is
/// still rebuilt from it. Once the provider deleted it, so has legate.
#[tokio::test]
async fn a_relayed_delete_keeps_the_copy_until_the_provider_deleted_it() {
    let env = start("{}").await;
    let resp = responses(&env, r#"{"model":"fast","input":"remember me"}"#).await;
    assert_eq!(resp.status(), 200);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let delete = || {
        env.http
            .delete(env.url(&format!("/v1/responses/{id}")))
            .header("authorization", "Bearer caller-key")
            .send()
    };
    // The turn goes by id to the first step, which fails, and then to the Anthropic step,
    // which needs the conversation from legate's copy.
    let next = format!(r#"{{"model":"spare","previous_response_id":"{id}","input":"next"}}"#);
    let first_step_down = || {
        let down = r#"{"match":{"model":"gpt-down"},"status":500}"#;
        Script::from_json(&format!(r#"{{"replies":[{}]}}"#, [down; 6].join(","))).unwrap()
    };
    let failing =
        format!(r#"{{"replies":[{{"match":{{"path":"/v1/responses/{id}"}},"status":500}}]}}"#);
    env.mock.set_script(Script::from_json(&failing).unwrap());
    assert_eq!(delete().await.unwrap().status(), 500);

    env.mock.set_script(first_step_down());
    let resp = responses(&env, &next).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-spare"
    );
    let sent = env.mock.requests().last().unwrap().body.clone();
    assert!(String::from_utf8_lossy(&sent).contains("remember me"));

    env.mock.set_script(Script::default());
    assert_eq!(delete().await.unwrap().status(), 200);
    // Now the copy is gone: a translated step cannot continue the response.
    let next = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"next"}}"#);
    let resp = responses(&env, &next).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
}

/// A response deleted while its stream still runs is not kept when the stream ends: the
/// caller's delete stands, and a translated next turn cannot continue it.
#[tokio::test]
async fn a_response_deleted_during_its_stream_is_not_kept_after_it() {
    let env = start(
        r#"{"default":{"event_gap_ms":100,"content":[{"type":"text","text":"a b c d e f"}]}}"#,
    )
    .await;
    let resp = responses(
        &env,
        r#"{"model":"fast","input":"forget me","stream":true}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let opened = Opened::read(resp).await;
    let id = opened.id.clone();
    let deleted = env
        .http
        .delete(env.url(&format!("/v1/responses/{id}")))
        .header("authorization", "Bearer caller-key")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(
        opened.last_event().await,
        "response.completed",
        "the stream ran to its end after the delete"
    );
    let next = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"next"}}"#);
    let resp = responses(&env, &next).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
    assert_eq!(env.mock.requests().len(), 2, "the stream and the delete");
}

/// A provider that answers a DELETE with 204 (no content) has deleted the response, and
/// so has legate; a redirection on a stored response's endpoints is not passed on for the SDK
/// to follow past legate: 502.
#[tokio::test]
async fn a_204_deletion_is_a_deletion_and_a_redirection_is_not_passed_on() {
    let env = start("{}").await;
    let resp = responses(&env, r#"{"model":"fast","input":"remember me"}"#).await;
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/responses/{id}");
    let script = format!(
        r#"{{"replies":[{{"match":{{"path":"{path}"}},"status":302,"headers":{{"location":"http://127.0.0.1:1/x"}},"body":""}},
                     {{"match":{{"path":"{path}"}},"status":204,"body":""}}]}}"#
    );
    env.mock.set_script(Script::from_json(&script).unwrap());
    let call = |method: reqwest::Method| {
        env.http
            .request(method, env.url(&path))
            .header("authorization", "Bearer caller-key")
            .send()
    };
    let got = call(reqwest::Method::GET).await.unwrap();
    assert_eq!(got.status(), 502);
    assert!(got.headers().get("location").is_none());
    let deleted = call(reqwest::Method::DELETE).await.unwrap();
    assert_eq!(deleted.status(), 204);
    let next = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"next"}}"#);
    let resp = responses(&env, &next).await;
    assert_eq!(resp.status(), 400, "the copy went with the provider's");
}

/// With no provider of the Responses API to ask, a response legate does not hold is one it
/// does not have (404 `response_not_found`), not an endpoint it does not serve.
#[tokio::test]
async fn without_a_responses_provider_an_unknown_response_is_not_found() {
    let mock = harness::start_mock(Script::default()).await;
    let chat = "[providers.chat]\nkind = \"openai\"\nbase_url = \"{MOCK}\"\napi_key_env = \"OPENAI_API_KEY\"\nresponses = false\n";
    let toml = harness::config_toml_with(&mock.base_url(), "", "", chat)
        .replace("openai = \"openai\"", "openai = \"chat\"");
    let env = harness::start_toml(mock, &toml).await;
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = env
            .http
            .request(method.clone(), env.url("/v1/responses/resp_gone"))
            .header("authorization", "Bearer caller-key")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{method}");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(
            err["error"]["code"], "response_not_found",
            "{method}: {err}"
        );
    }
    assert!(env.mock.requests().is_empty());
}

//! Cloud providers against `legate mock --cloud` playing Bedrock, Vertex AI, Azure OpenAI and
//! the endpoints their credentials come from: the model in the URL, the platform's body, SigV4
//! verified by the fake, Bedrock's event stream read as SSE, credentials refreshed before they
//! expire, credential failures, and chains mixing platforms.

use std::collections::HashMap;
use std::time::Duration;

use legate::mock::{CloudOptions, MockServer, Script};

use crate::harness::{self, Env};

const BEDROCK_MODEL: &str = "anthropic.claude-sonnet-4-5-20250929-v1:0";
const VERTEX_MODEL: &str = "claude-sonnet-4-5@20250929";

struct Cloud {
    env: Env,
    _dir: tempfile::TempDir,
}

/// Providers on the cloud mock: `bedrock` (web identity via STS), `vertex` (metadata server),
/// `azure` (Entra workload identity), plus the harness's direct `anthropic` and `openai`.
async fn start(script: &str, opts: CloudOptions, extra: &str) -> Cloud {
    start_env(script, opts, extra, &[]).await
}

/// Like [`start`] with environment variables replaced (an empty value removes one).
async fn start_env(script: &str, opts: CloudOptions, extra: &str, over: &[(&str, &str)]) -> Cloud {
    let mock = MockServer::start_with(
        ([127, 0, 0, 1], 0).into(),
        Script::from_json(script).unwrap(),
        None,
        Some(opts),
    )
    .await
    .unwrap();
    let url = mock.base_url();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "CANARY-federated-projected-token\n").unwrap();
    let providers = format!(
        r#"
[providers.bedrock]
kind = "bedrock"
region = "us-east-1"
base_url = "{url}"
sts_endpoint = "{url}/sts"
first_byte_timeout = "5s"

[providers.vertex]
kind = "vertex"
project = "proj-1"
region = "us-east5"
base_url = "{url}"
metadata_url = "{url}"

[providers.azure]
kind = "azure-openai"
base_url = "{url}"
token_url = "{url}/tenant-1/oauth2/v2.0/token"
deployments = [{{ model = "gpt-4o", deployment = "gpt4o-prod" }}]

[retry]
max_attempts = 2
base_delay = "1ms"
max_delay = "2ms"

[[models]]
name = "b"
chain = ["bedrock:{BEDROCK_MODEL}"]

[[models]]
name = "v"
chain = ["vertex:{VERTEX_MODEL}"]

[[models]]
name = "gpt-4o"
chain = ["azure:gpt-4o"]
{extra}
"#
    );
    let toml = harness::config_toml(&url, &providers);
    let mut vars: HashMap<String, String> = harness::test_env_vars();
    let tf = token_file.display().to_string();
    for (k, v) in [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", tf.as_str()),
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/legate"),
        ("AZURE_FEDERATED_TOKEN_FILE", tf.as_str()),
        ("AZURE_CLIENT_ID", "client-1"),
        ("AZURE_TENANT_ID", "tenant-1"),
    ] {
        vars.insert(k.to_owned(), v.to_owned());
    }
    for (k, v) in over {
        if v.is_empty() {
            vars.remove(*k);
        } else {
            vars.insert((*k).to_owned(), v.replace("{MOCK}", &url));
        }
    }
    let cfg = legate::config::load_str(&toml, &vars).expect("valid config");
    let registry = prometheus::Registry::new();
    // A reload reads the same config again.
    let source: legate::server::ConfigSource =
        std::sync::Arc::new(move || legate::config::load_str(&toml, &vars));
    let legate = legate::server::start_reloadable(cfg, registry.clone(), Some(source))
        .await
        .unwrap();
    let env = Env {
        mock,
        legate,
        registry,
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
    };
    Cloud { env, _dir: dir }
}

async fn issued(env: &Env) -> serde_json::Value {
    env.http
        .get(format!("{}/_mock/cloud", env.mock.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn tool_reply() -> &'static str {
    r#"{"replies":[{"times":0,"content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],"stop_reason":"tool_use"}]}"#
}

#[tokio::test]
async fn bedrock_json_and_stream_through_web_identity_with_the_model_in_the_url() {
    // Prices apply to the platform's model ids, through a prefix pattern.
    let prices = "[[prices]]\nmodel = \"bedrock:anthropic.claude-sonnet-4-5*\"\ninput = \"3\"\noutput = \"15\"\n";
    let c = start(tool_reply(), CloudOptions::default(), prices).await;
    let env = &c.env;
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "fine-grained-tool-streaming-2025-05-14")
        .body(r#"{"model":"b","max_tokens":50,"messages":[{"role":"user","content":"weather?"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["content"][1]["type"], "tool_use");
    assert_eq!(v["content"][1]["input"]["city"], "Paris");

    let resp = env
        .messages(r#"{"model":"b","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"weather?"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = resp.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert!(text.contains(r#""partial_json""#), "{text}");

    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].path,
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    );
    assert_eq!(
        reqs[1].path,
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
    );
    let body: serde_json::Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(body["anthropic_version"], "bedrock-2023-05-31");
    assert_eq!(
        body["anthropic_beta"][0],
        "fine-grained-tool-streaming-2025-05-14"
    );
    assert!(body.get("model").is_none() && body.get("stream").is_none());
    assert!(
        reqs[0]
            .header("authorization")
            .unwrap()
            .starts_with("AWS4-HMAC-SHA256 Credential=ASIACANARY")
    );
    // One STS exchange serves both requests.
    assert_eq!(issued(env).await["sts"], 1);
    assert_eq!(
        env.metric(
            "legate_credential_refreshes_total",
            &[("provider", "bedrock"), ("result", "ok")]
        )
        .await,
        Some(1.0)
    );
    // Usage is metered from the converted stream like any other.
    assert_eq!(
        env.metric(
            "legate_tokens_total",
            &[("provider", "bedrock"), ("kind", "output")]
        )
        .await,
        Some(10.0)
    );
    // 2 × (10 input × $3 + 5 output × $15) per million tokens.
    let cost = env
        .metric("legate_cost_usd_total", &[("provider", "bedrock")])
        .await;
    assert!((cost.unwrap() - 0.00021).abs() < 1e-12, "{cost:?}");
    let state = env.admin_json("/admin/state").await;
    let cred = &state["providers"]["bedrock"]["credential"];
    assert!(cred["source"].as_str().unwrap().starts_with("web identity"));
    assert!(cred["expires_at"].as_u64().is_some());
    assert!(!state.to_string().contains("CANARY"));
}

#[tokio::test]
async fn vertex_and_azure_serve_both_apis_with_their_tokens() {
    let c = start(tool_reply(), CloudOptions::default(), "").await;
    let env = &c.env;
    let v: serde_json::Value = env
        .messages(r#"{"model":"v","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["content"][1]["name"], "get_weather");
    let stream = env
        .messages(r#"{"model":"v","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        stream.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{stream}"
    );
    // An OpenAI caller reaches Bedrock through translation, stream included.
    let chat = env
        .chat(r#"{"model":"b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        chat.contains(r#""tool_calls""#) && chat.ends_with("data: [DONE]\n\n"),
        "{chat}"
    );
    let azure: serde_json::Value = env
        .chat(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        azure["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );

    let reqs = env.mock.requests();
    let paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
            "/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
            "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream",
            "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21",
        ]
    );
    let vbody: serde_json::Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(vbody["anthropic_version"], "vertex-2023-10-16");
    assert!(
        reqs[0]
            .header("authorization")
            .unwrap()
            .starts_with("Bearer ya29.metadata-CANARY")
    );
    assert!(
        reqs[3]
            .header("authorization")
            .unwrap()
            .starts_with("Bearer entra-CANARY")
    );
    assert!(reqs[3].header("api-key").is_none());
    let counts = issued(env).await;
    assert_eq!(
        (counts["metadata"].as_u64(), counts["entra"].as_u64()),
        (Some(1), Some(1))
    );
}

#[tokio::test]
async fn a_credential_expiring_mid_run_is_refreshed_without_a_failed_request() {
    let opts = CloudOptions {
        credential_ttl: Duration::from_secs(2),
        ..CloudOptions::default()
    };
    let c = start(r#"{"replies":[]}"#, opts, "").await;
    let env = &c.env;
    // The fake refuses any credential past its expiry: every request must carry a fresh one.
    let started = std::time::Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(10) {
        for model in ["b", "v"] {
            let resp = env
                .messages(format!(r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#))
                .await;
            assert_eq!(resp.status(), 200, "request {sent} to {model}");
            sent += 1;
        }
        let counts = issued(env).await;
        if counts["sts"].as_u64() >= Some(3) && counts["metadata"].as_u64() >= Some(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = issued(env).await;
    assert!(
        counts["sts"].as_u64() >= Some(3),
        "{counts} after {sent} requests"
    );
    assert!(counts["metadata"].as_u64() >= Some(3), "{counts}");
    assert!(
        counts.get("refused").is_none(),
        "an expired credential was sent: {counts}"
    );
    assert_eq!(
        env.metric("legate_credential_refreshes_total", &[("result", "error")])
            .await,
        None
    );
}

#[tokio::test]
async fn a_credential_that_cannot_be_obtained_is_a_502_that_trips_no_breaker() {
    // Nor does it count against the caller's limits: six such requests under a limit of three
    // a minute are all told why, none refused for the limit.
    let c = start(
        r#"{"replies":[]}"#,
        CloudOptions::default(),
        r#"
[tenants.default]
requests_per_minute = 3

[providers.broken]
kind = "bedrock"
region = "us-east-1"
base_url = "{MOCK}"
sts_endpoint = "{MOCK}/no-such-sts"

[[models]]
name = "broken-only"
chain = ["broken:anthropic.claude-haiku-4-5-20251001-v1:0"]

[[models]]
name = "broken-then-vertex"
chain = ["broken:anthropic.claude-haiku-4-5-20251001-v1:0", "vertex:claude-haiku-4-5@20251001"]
"#,
    )
    .await;
    let env = &c.env;
    for _ in 0..6 {
        let resp = env
            .messages(r#"{"model":"broken-only","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
            .await;
        assert_eq!(resp.status(), 502);
        let v: serde_json::Value = resp.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("provider `broken`")
                && msg.contains("STS (AssumeRoleWithWebIdentity) answered 404"),
            "{msg}"
        );
        assert!(!msg.contains("CANARY"));
    }
    let sent = env
        .mock
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/model/"))
        .count();
    assert_eq!(sent, 0, "nothing was sent to a platform");
    assert_eq!(
        env.metric("legate_upstream_attempts_total", &[("provider", "broken")])
            .await,
        None
    );
    // Not a fetch per request: those within the pause after a failed fetch (1 s, doubling)
    // get its failure at once. (Two, should a slow host spread the six past the first pause.)
    let fetches = env
        .metric(
            "legate_credential_refreshes_total",
            &[("provider", "broken"), ("result", "error")],
        )
        .await;
    assert!(
        matches!(fetches, Some(f) if (1.0..=2.0).contains(&f)),
        "{fetches:?}"
    );
    // The next chain step answers, and the breaker of the first never opened.
    let resp = env
        .messages(r#"{"model":"broken-then-vertex","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "vertex:claude-haiku-4-5@20251001"
    );
    let state = env.admin_json("/admin/state").await;
    assert!(
        state["providers"]["broken"]["credential"]["last_error"]
            .as_str()
            .unwrap()
            .contains("STS")
    );
}

/// A token that cannot go in a header (a line break inside) is a failed fetch, retried after
/// the usual pause: held as good, it failed every request for its whole hour, with nothing
/// fetched again and the admin state saying all was well.
#[tokio::test]
async fn a_token_no_header_can_carry_is_a_failed_fetch_that_is_tried_again() {
    use crate::rawup::{Action, RawRequest};
    let entra = crate::rawup::start(|_: RawRequest| async move {
        Action::Reply(crate::rawup::json_reply(
            r#"{"access_token":"eyJ-first-half\nsecond-half","expires_in":3600}"#,
        ))
    })
    .await;
    let extra = format!(
        r#"
[providers.azbad]
kind = "azure-openai"
base_url = "{{MOCK}}"
token_url = "{}/tenant-1/oauth2/v2.0/token"

[[models]]
name = "bad-token"
chain = ["azbad:gpt-4o"]
"#,
        entra.url
    );
    let c = start(r#"{"replies":[]}"#, CloudOptions::default(), &extra).await;
    let env = &c.env;
    let ask = || env.chat(r#"{"model":"bad-token","messages":[{"role":"user","content":"hi"}]}"#);
    let resp = ask().await;
    assert_eq!(resp.status(), 502);
    let said = resp.text().await.unwrap();
    assert!(said.contains("a request header cannot carry"), "{said}");
    assert!(!said.contains("first-half"), "{said}");
    let state = env.admin_json("/admin/state").await;
    let last = state["providers"]["azbad"]["credential"]["last_error"].as_str();
    assert!(last.is_some_and(|e| e.contains("cannot carry")), "{state}");
    // Fetched again once the pause after the failure (1 s) is over.
    let again = async {
        while entra.requests.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            assert_eq!(ask().await.status(), 502);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), again)
        .await
        .expect("a second fetch");
    let name = "legate_credential_refreshes_total";
    let ok = env
        .metric(name, &[("provider", "azbad"), ("result", "ok")])
        .await;
    let failed = env
        .metric(name, &[("provider", "azbad"), ("result", "error")])
        .await;
    assert_eq!(ok, None);
    assert!(failed.is_some_and(|n| n >= 2.0), "{failed:?}");
    let sent = env
        .mock
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/openai/"))
        .count();
    assert_eq!(sent, 0, "nothing was sent with the token");
}

#[tokio::test]
async fn a_chain_does_not_wait_out_a_first_credential_fetch_that_hangs() {
    // An STS that takes connections and never answers: legate's fetch waits on it for its
    // whole bound (10 s), the caller with a fallback only a second.
    let sts = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sts_addr = sts.local_addr().unwrap();
    let (held_tx, mut held) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((sock, _)) = sts.accept().await {
            let _ = held_tx.send(sock);
        }
    });
    let c = start(
        r#"{"replies":[]}"#,
        CloudOptions::default(),
        &format!(
            r#"
[providers.stalled]
kind = "bedrock"
region = "us-east-1"
base_url = "{{MOCK}}"
sts_endpoint = "http://{sts_addr}/sts"

[[models]]
name = "stalled-then-vertex"
chain = ["stalled:anthropic.claude-haiku-4-5-20251001-v1:0", "vertex:claude-haiku-4-5@20251001"]
"#
        ),
    )
    .await;
    let env = &c.env;
    let body = r#"{"model":"stalled-then-vertex","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        let resp = env.messages(body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-legate-served-by"],
            "vertex:claude-haiku-4-5@20251001"
        );
    }
    // Answered while the one fetch was still waiting on STS: it has no outcome yet, and its
    // connection is open (legate closes it when the fetch gives up).
    assert_eq!(
        env.metric(
            "legate_credential_refreshes_total",
            &[("provider", "stalled")]
        )
        .await,
        None
    );
    let sock = held.recv().await.expect("legate connected to STS");
    // What legate sent is read past; the end of the connection would read as 0 bytes.
    let mut buf = [0u8; 4096];
    loop {
        match sock.try_read(&mut buf) {
            Ok(n) if n > 0 => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            other => panic!("the STS connection ended early: {other:?}"),
        }
    }
    assert!(held.try_recv().is_err(), "one fetch, not one per request");
}

/// A relay to the mock's STS that holds each answer until `hold` after the connection came:
/// a slow first credential fetch. The mock's address is known only once it has started.
async fn slow_sts(hold: Duration) -> (std::net::SocketAddr, tokio::sync::watch::Sender<String>) {
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = relay.local_addr().unwrap();
    let (target_tx, target) = tokio::sync::watch::channel(String::new());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = relay.accept().await {
            let mut target = target.clone();
            tokio::spawn(async move {
                let came = tokio::time::Instant::now();
                let to = target.wait_for(|t| !t.is_empty()).await.unwrap().clone();
                let mut up = tokio::net::TcpStream::connect(to).await.unwrap();
                let (mut sr, mut sw) = sock.split();
                let (mut ur, mut uw) = up.split();
                let ask = tokio::io::copy(&mut sr, &mut uw);
                let answer = async {
                    // The slow STS itself: its answer leaves `hold` after the connection.
                    tokio::time::sleep_until(came + hold).await;
                    tokio::io::copy(&mut ur, &mut sw).await
                };
                let _ = tokio::join!(ask, answer);
            });
        }
    });
    (addr, target_tx)
}

#[tokio::test]
async fn a_slow_first_credential_fetch_is_waited_for_when_every_later_step_is_breaker_open() {
    // The brief wait on a fetch is for a request that a later step can serve. Here the later
    // step's breaker is open: cutting the wait at a second would fail a request that the
    // platform serves once its first credential arrives (2 s).
    let (sts, target) = slow_sts(Duration::from_secs(2)).await;
    let c = start(
        r#"{"replies":[{"match":{"model":"claude-sonnet-4-5@20250929"},"times":0,"status":529}]}"#,
        CloudOptions::default(),
        &format!(
            r#"
[providers.slow]
kind = "bedrock"
region = "us-east-1"
base_url = "{{MOCK}}"
sts_endpoint = "http://{sts}/sts"

[breaker]
min_calls = 1

[[models]]
name = "slow-then-vertex"
chain = ["slow:anthropic.claude-haiku-4-5-20251001-v1:0", "vertex:{VERTEX_MODEL}"]
"#
        ),
    )
    .await;
    let env = &c.env;
    target.send(env.mock.addr().to_string()).unwrap();
    // Vertex fails once, and its breaker opens.
    let resp = env
        .messages(r#"{"model":"v","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 529);
    assert_eq!(
        env.metric(
            "legate_breaker_state",
            &[("provider", "vertex"), ("model", VERTEX_MODEL)]
        )
        .await,
        Some(1.0)
    );
    let resp = env
        .messages(r#"{"model":"slow-then-vertex","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "slow:anthropic.claude-haiku-4-5-20251001-v1:0"
    );
    assert_eq!(
        env.metric(
            "legate_credential_refreshes_total",
            &[("provider", "slow"), ("result", "ok")]
        )
        .await,
        Some(1.0)
    );
}

/// A platform that answers every call with a 400 echoing the credential it was sent, in its
/// body and in a header: Bedrock's session token, or a bearer token.
async fn echoing_platform() -> crate::rawup::RawUpstream {
    use crate::rawup::{Action, RawRequest};
    crate::rawup::start(|req: RawRequest| async move {
        let sent = req
            .head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                let value = value.trim();
                match name.to_ascii_lowercase().as_str() {
                    "x-amz-security-token" => Some(value.to_owned()),
                    "authorization" => value.strip_prefix("Bearer ").map(str::to_owned),
                    _ => None,
                }
            })
            .unwrap_or_default();
        // Bedrock's error shape and Google's, in one.
        let message = format!("bad token {sent} (Bearer {sent})");
        let body = format!(
            r#"{{"message":"{message}","error":{{"code":400,"message":"{message}","status":"INVALID_ARGUMENT"}}}}"#
        );
        Action::Reply(
            format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nx-echo: {sent}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    })
    .await
}

#[tokio::test]
async fn a_platform_credential_echoed_back_is_redacted_from_the_answer() {
    let echo = echoing_platform().await;
    let c = start(
        r#"{"replies":[]}"#,
        CloudOptions::default(),
        &format!(
            r#"
[providers.echo-bedrock]
kind = "bedrock"
region = "us-east-1"
base_url = "{url}"
sts_endpoint = "{{MOCK}}/sts"

[providers.echo-vertex]
kind = "vertex"
project = "proj-1"
region = "us-east5"
base_url = "{url}"
metadata_url = "{{MOCK}}"

[[models]]
name = "eb"
chain = ["echo-bedrock:{BEDROCK_MODEL}"]

[[models]]
name = "ev"
chain = ["echo-vertex:{VERTEX_MODEL}"]
"#,
            url = echo.url
        ),
    )
    .await;
    let env = &c.env;
    for model in ["eb", "ev"] {
        let resp = env
            .messages(format!(
                r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
            ))
            .await;
        assert_eq!(resp.status(), 400, "{model}");
        let echoed = resp.headers()["x-echo"].to_str().unwrap().to_owned();
        let body = resp.text().await.unwrap();
        assert_eq!(echoed, "[redacted]", "{model}");
        assert!(
            body.contains("bad token [redacted] (Bearer [redacted])"),
            "{model}: {body}"
        );
    }
    assert_eq!(echo.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_reload_that_keeps_the_credential_source_keeps_the_credential_in_hand() {
    let c = start(r#"{"replies":[]}"#, CloudOptions::default(), "").await;
    let env = &c.env;
    let ask = |model: &str| {
        format!(
            r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
        )
    };
    let fetched = |provider: &'static str| async move {
        env.metric(
            "legate_credential_refreshes_total",
            &[("provider", provider), ("result", "ok")],
        )
        .await
    };
    for model in ["b", "v"] {
        assert_eq!(env.messages(ask(model)).await.status(), 200);
    }
    assert_eq!(fetched("bedrock").await, Some(1.0));
    assert_eq!(fetched("vertex").await, Some(1.0));
    let resp = env
        .http
        .post(env.admin_url("/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    for model in ["b", "v"] {
        assert_eq!(env.messages(ask(model)).await.status(), 200);
    }
    // Served with the credentials held before the reload: none fetched again.
    assert_eq!(fetched("bedrock").await, Some(1.0));
    assert_eq!(fetched("vertex").await, Some(1.0));
    let state = env.admin_json("/admin/state").await;
    assert!(
        state["providers"]["bedrock"]["credential"]["expires_at"].is_number(),
        "{state}"
    );
}

#[tokio::test]
async fn count_tokens_on_a_platform_step_is_estimated_locally() {
    // Bedrock and Vertex serve no count endpoint: Claude Code's routine count is answered
    // with an estimate, as on a translated step, and nothing is sent.
    let c = start(r#"{"replies":[]}"#, CloudOptions::default(), "").await;
    let env = &c.env;
    for (model, target) in [
        ("b", format!("bedrock:{BEDROCK_MODEL}")),
        ("v", format!("vertex:{VERTEX_MODEL}")),
    ] {
        let resp = env
            .http
            .post(env.url("/v1/messages/count_tokens"))
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .body(format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"What is the weather in Paris today?"}}]}}"#
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{model}");
        assert_eq!(resp.headers()["x-legate-estimate"], "true");
        assert_eq!(resp.headers()["x-legate-served-by"], target.as_str());
        let body: serde_json::Value = resp.json().await.unwrap();
        let tokens = body["input_tokens"].as_u64().unwrap();
        assert!((5..100).contains(&tokens), "{body}");
    }
    assert_eq!(
        env.mock.stats().requests,
        0,
        "nothing was sent to a platform"
    );
}

#[tokio::test]
async fn a_chain_falls_back_from_anthropic_to_bedrock_to_vertex_on_529s() {
    let c = start(
        r#"{"replies":[
            {"match":{"model":"claude-sonnet-4-5"},"times":0,"status":529},
            {"match":{"model":"anthropic.claude-sonnet-4-5-20250929-v1:0"},"times":0,"status":529}
        ]}"#,
        CloudOptions::default(),
        r#"
[[models]]
name = "sonnet"
chain = ["anthropic:claude-sonnet-4-5", "bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0", "vertex:claude-sonnet-4-5@20250929"]
"#,
    )
    .await;
    let env = &c.env;
    for stream in [false, true] {
        let resp = env
            .messages(format!(r#"{{"model":"sonnet","max_tokens":5,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#))
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-legate-served-by"],
            "vertex:claude-sonnet-4-5@20250929"
        );
        assert_eq!(resp.headers()["x-legate-attempts"], "5");
    }
    let paths: Vec<String> = env.mock.requests().iter().map(|r| r.path.clone()).collect();
    let count = |p: &str| paths.iter().filter(|x| x.starts_with(p)).count();
    assert_eq!(
        (
            count("/v1/messages"),
            count("/model/"),
            count("/v1/projects/")
        ),
        (4, 4, 2)
    );
    // Bedrock's 503 ServiceUnavailableException counted as the overload it is.
    assert_eq!(
        env.metric(
            "legate_upstream_attempts_total",
            &[("provider", "bedrock"), ("outcome", "retryable")]
        )
        .await,
        Some(4.0)
    );
}

#[tokio::test]
async fn platform_errors_reach_the_caller_in_its_shape_with_their_retry_meaning() {
    let c = start(
        r#"{"replies":[
            {"match":{"model":"claude-sonnet-4-5@20250929"},"times":0,"status":429},
            {"match":{"model":"anthropic.claude-sonnet-4-5-20250929-v1:0","stream":false},"times":0,"status":400,"error_message":"messages: field required"},
            {"match":{"model":"anthropic.claude-sonnet-4-5-20250929-v1:0","stream":true},"times":0,"stream_error_after":4,"error_type":"overloaded_error","error_message":"try later"}
        ]}"#,
        CloudOptions::default(),
        "",
    )
    .await;
    let env = &c.env;
    // Vertex quota (Google's RESOURCE_EXHAUSTED): retried, then a 429 rate_limit_error.
    let resp = env
        .messages(r#"{"model":"v","max_tokens":5,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 429);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Vertex AI RESOURCE_EXHAUSTED")
    );
    // Bedrock ValidationException: final at once, an invalid_request_error; for an OpenAI
    // caller in OpenAI's shape.
    let resp = env
        .messages(r#"{"model":"b","max_tokens":5,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let resp = env.chat(r#"{"model":"b","messages":[]}"#).await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    // An exception frame after content reaches the caller as an error event, in order.
    let text = env
        .messages(r#"{"model":"b","max_tokens":5,"stream":true,"messages":[]}"#)
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains("event: content_block_delta"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\n"), "{text}");
    assert!(last.contains(r#""type":"overloaded_error""#), "{last}");
    assert!(
        last.contains("Bedrock serviceUnavailableException: try later"),
        "{last}"
    );
    let bedrock_calls = env
        .mock
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/model/"))
        .count();
    assert_eq!(bedrock_calls, 3);
}

#[tokio::test]
async fn container_endpoint_static_keys_and_service_account_keys_all_sign_in() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/google-service-account.json"
    );
    let dir = tempfile::tempdir().unwrap();
    let pod_token = dir.path().join("eks-pod-identity-token");
    std::fs::write(&pod_token, "CANARY-eks-pod-identity-token").unwrap();
    let pod_token = pod_token.display().to_string();
    let extra = format!(
        r#"
[providers.vertex-sa]
kind = "vertex"
project = "proj-1"
region = "global"
base_url = "{{MOCK}}"
credentials_file = "{fixture}"
token_url = "{{MOCK}}/google/token"

[[models]]
name = "v-sa"
chain = ["vertex-sa:{VERTEX_MODEL}"]
"#
    );
    let pod = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", ""),
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "{MOCK}/aws/credentials",
        ),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", pod_token.as_str()),
    ];
    let c = start_env(r#"{"replies":[]}"#, CloudOptions::default(), &extra, &pod).await;
    let env = &c.env;
    for model in ["b", "v-sa"] {
        let resp = env
            .messages(format!(r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#))
            .await;
        assert_eq!(resp.status(), 200, "{model}");
    }
    let counts = issued(env).await;
    assert_eq!(
        (
            counts["container"].as_u64(),
            counts["google_token"].as_u64()
        ),
        (Some(1), Some(1)),
        "{counts}"
    );
    let state = env.admin_json("/admin/state").await;
    assert!(
        state["providers"]["bedrock"]["credential"]["source"]
            .as_str()
            .unwrap()
            .starts_with("container credentials endpoint")
    );

    let opts = CloudOptions {
        aws_static_key: Some(("AKIACANARYSTATIC".into(), "CANARY-static-secret".into())),
        ..CloudOptions::default()
    };
    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKIACANARYSTATIC"),
        ("AWS_SECRET_ACCESS_KEY", "CANARY-static-secret"),
    ];
    let c = start_env(r#"{"replies":[]}"#, opts, "", &keys).await;
    let resp = c
        .env
        .messages(r#"{"model":"b","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    // A wrong secret is refused by the fake's SigV4 check: the signature is really verified.
    let wrong = [
        ("AWS_ACCESS_KEY_ID", "AKIACANARYSTATIC"),
        ("AWS_SECRET_ACCESS_KEY", "CANARY-not-the-secret"),
    ];
    let opts = CloudOptions {
        aws_static_key: Some(("AKIACANARYSTATIC".into(), "CANARY-static-secret".into())),
        ..CloudOptions::default()
    };
    let c = start_env(r#"{"replies":[]}"#, opts, "", &wrong).await;
    let resp = c
        .env
        .messages(r#"{"model":"b","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 403);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "permission_error");
    assert!(!v.to_string().contains("CANARY"));
}

#[tokio::test]
async fn bedrock_takes_the_instance_role_or_a_profile_when_nothing_comes_before() {
    let one = r#"{"model":"b","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let home = tempfile::tempdir().unwrap();
    let home_s = home.path().display().to_string();
    // No key, profile, web identity or container endpoint: the instance metadata service,
    // session token first (the fake refuses reads without one).
    let instance = [
        ("HOME", home_s.as_str()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", ""),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "{MOCK}"),
    ];
    let c = start_env(r#"{"replies":[]}"#, CloudOptions::default(), "", &instance).await;
    let env = &c.env;
    for _ in 0..2 {
        assert_eq!(env.messages(one).await.status(), 200);
    }
    let counts = issued(env).await;
    assert_eq!(
        (
            counts["imds_token"].as_u64(),
            counts["imds"].as_u64(),
            counts.get("sts"),
            counts.get("refused")
        ),
        (Some(1), Some(1), None, None),
        "{counts}"
    );
    let reqs = env.mock.requests();
    assert!(
        reqs[0]
            .header("authorization")
            .unwrap()
            .starts_with("AWS4-HMAC-SHA256 Credential=ASIACANARY")
    );
    let state = env.admin_json("/admin/state").await;
    let cred = &state["providers"]["bedrock"]["credential"];
    assert!(
        cred["source"]
            .as_str()
            .unwrap()
            .starts_with("the EC2 instance metadata service"),
        "{cred}"
    );
    assert!(cred["expires_at"].as_u64().is_some());
    assert!(!state.to_string().contains("CANARY"));

    // A profile of the shared credentials file comes before the instance role.
    let file = home.path().join("credentials");
    std::fs::write(
        &file,
        "[default]\naws_access_key_id = AKIADEFAULTPROFILE\naws_secret_access_key = wrong\n\
         [ci]\naws_access_key_id = AKIACANARYPROFILE\naws_secret_access_key = CANARY-profile-secret\n",
    )
    .unwrap();
    let file_s = file.display().to_string();
    let profile = [
        ("HOME", home_s.as_str()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", ""),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "{MOCK}"),
        ("AWS_SHARED_CREDENTIALS_FILE", file_s.as_str()),
        ("AWS_PROFILE", "ci"),
    ];
    let opts = CloudOptions {
        aws_static_key: Some(("AKIACANARYPROFILE".into(), "CANARY-profile-secret".into())),
        ..CloudOptions::default()
    };
    let c = start_env(r#"{"replies":[]}"#, opts, "", &profile).await;
    let env = &c.env;
    assert_eq!(env.messages(one).await.status(), 200);
    let reqs = env.mock.requests();
    assert!(
        reqs[0]
            .header("authorization")
            .unwrap()
            .starts_with("AWS4-HMAC-SHA256 Credential=AKIACANARYPROFILE/")
    );
    assert_eq!(issued(env).await.get("imds_token"), None);

    // A metadata service that does not answer is a 502 naming it, with nothing sent upstream.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let absent = [
        ("HOME", home_s.as_str()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", ""),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", gone.as_str()),
    ];
    let c = start_env(r#"{"replies":[]}"#, CloudOptions::default(), "", &absent).await;
    let resp = c.env.messages(one).await;
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.unwrap();
    assert!(text.contains("instance metadata service"), "{text}");
    assert!(c.env.mock.requests().is_empty());

    // One that takes the connection and never answers (a container behind a hop limit of 1
    // gets no token back) is given up on after a second, not the fetch's ten.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            conns.push(conn);
        }
    });
    let hung = [
        ("HOME", home_s.as_str()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", ""),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", silent_url.as_str()),
    ];
    let c = start_env(r#"{"replies":[]}"#, CloudOptions::default(), "", &hung).await;
    let resp = c.env.messages(one).await;
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.unwrap();
    assert!(text.contains("gave no session token within 1s"), "{text}");
    held.abort();
}

/// A Bedrock request that waits for its turn (`max_concurrency` reached) is signed when it
/// goes out, not when it was made: AWS refuses a signature more than five minutes old, and
/// the pacer and the queue may hold a request that long.
#[tokio::test]
async fn a_cloud_request_that_waited_for_its_turn_is_signed_when_sent() {
    let extra = format!(
        r#"
[providers.bedrock1]
kind = "bedrock"
region = "us-east-1"
base_url = "{{MOCK}}"
sts_endpoint = "{{MOCK}}/sts"
max_concurrency = 1

[[models]]
name = "b1"
chain = ["bedrock1:{BEDROCK_MODEL}"]
"#
    );
    let c = start_env(
        r#"{"default":{"delay_ms":2500}}"#,
        CloudOptions::default(),
        &extra,
        &[],
    )
    .await;
    let env = &c.env;
    let send = || {
        let req = env
            .http
            .post(env.url("/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .body(r#"{"model":"b1","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#);
        tokio::spawn(async move { req.send().await.unwrap().status().as_u16() })
    };
    let first = send();
    env.mock.wait_requests(1).await;
    let second = send();
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(second.await.unwrap(), 200);
    let seconds = |r: &legate::mock::RecordedRequest| {
        let date = harness::header_values(&r.headers, "x-amz-date")[0].to_owned();
        let t = &date[9..15];
        let n = |i: usize| t[i..i + 2].parse::<u64>().unwrap();
        n(0) * 3600 + n(2) * 60 + n(4)
    };
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 2);
    let waited = (seconds(&reqs[1]) + 86_400 - seconds(&reqs[0])) % 86_400;
    assert!(waited >= 2, "signed {waited} s after the first");
}

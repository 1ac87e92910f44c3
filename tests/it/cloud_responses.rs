//! The Responses API on Azure OpenAI's v1 surface (SPEC §11, §13; wire-protocol §G), against
//! `legate mock --cloud`: `/openai/v1/responses` with the deployment named in the body, the
//! platform's credential (an Entra token or the api-key) on generation calls and on the stored
//! responses' endpoints, no count endpoint, and `responses = false` for resources without it.

use std::collections::HashMap;

use legate::mock::{CloudOptions, MockServer, Script};
use serde_json::Value;

use crate::harness::{self, Env};

const AZURE_KEY: &str = "azure-key-CANARY-0123456789";

/// A function call, so that the answer shows the mock rendered the script as a response.
const TOOL_REPLY: &str = r#"{"replies":[{"times":0,"content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],"stop_reason":"tool_use"}]}"#;

struct Azure {
    env: Env,
    _dir: tempfile::TempDir,
}

/// legate with one `azure` provider on the mock (the default of the OpenAI APIs), credentialed
/// by Entra workload identity when `entra`, else by its api-key; `provider` adds keys to it.
async fn start(entra: bool, provider: &str) -> Azure {
    start_routed(entra, provider, "azure").await
}

/// [`start`] with a direct `openai` provider on the same mock too, and `openai` (one of the
/// two) as the default of the OpenAI APIs.
async fn start_routed(entra: bool, provider: &str, openai: &str) -> Azure {
    let mut opts = CloudOptions::default();
    if !entra {
        opts.azure_api_key = Some(AZURE_KEY.to_owned());
    }
    let script = Script::from_json(TOOL_REPLY).unwrap();
    let mock = MockServer::start_with(([127, 0, 0, 1], 0).into(), script, None, Some(opts))
        .await
        .unwrap();
    let url = mock.base_url();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "CANARY-federated-projected-token\n").unwrap();
    let credential = if entra {
        format!(r#"token_url = "{url}/tenant-1/oauth2/v2.0/token""#)
    } else {
        r#"api_key_env = "AZURE_OPENAI_API_KEY""#.to_owned()
    };
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
kind = "anthropic"
base_url = "{url}"
api_key_env = "ANTHROPIC_API_KEY"

[providers.openai]
kind = "openai"
base_url = "{url}"
api_key_env = "OPENAI_API_KEY"

[providers.azure]
kind = "azure-openai"
base_url = "{url}"
{credential}
deployments = [{{ model = "gpt-4o", deployment = "gpt4o-prod" }}]
{provider}

[routing]
anthropic = "anthropic"
openai = "{openai}"

[[models]]
name = "agent"
chain = ["azure:gpt-4o"]

[[models]]
name = "claude-first"
chain = ["anthropic:claude-x"]
"#
    );
    let mut vars: HashMap<String, String> = harness::test_env_vars();
    if entra {
        let tf = token_file.display().to_string();
        vars.insert("AZURE_FEDERATED_TOKEN_FILE".into(), tf);
        vars.insert("AZURE_CLIENT_ID".into(), "client-1".into());
        vars.insert("AZURE_TENANT_ID".into(), "tenant-1".into());
    } else {
        vars.insert("AZURE_OPENAI_API_KEY".into(), AZURE_KEY.into());
    }
    let cfg = legate::config::load_str(&toml, &vars).expect("valid config");
    let registry = prometheus::Registry::new();
    let legate = legate::server::start(cfg, registry.clone()).await.unwrap();
    let env = Env {
        mock,
        legate,
        registry,
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
    };
    Azure { env, _dir: dir }
}

async fn send(env: &Env, method: reqwest::Method, path: &str, body: &str) -> reqwest::Response {
    env.http
        .request(method, env.url(path))
        .header("authorization", "Bearer caller-key")
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn azure_serves_responses_on_its_v1_surface_with_the_deployment_in_the_body() {
    let a = start(true, "").await;
    let env = &a.env;
    let post = reqwest::Method::POST;
    let resp = send(
        env,
        post.clone(),
        "/v1/responses",
        r#"{"model":"agent","input":"hi"}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "azure:gpt-4o");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "response");
    let call = body["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("a function_call item");
    assert_eq!(call["name"], "get_weather");
    let id = body["id"].as_str().unwrap().to_owned();

    let stream = send(
        env,
        post.clone(),
        "/v1/responses",
        r#"{"model":"gpt-4o","input":"hi","stream":true}"#,
    )
    .await;
    assert_eq!(stream.status(), 200);
    let text = stream.text().await.unwrap();
    assert!(text.contains("event: response.completed"), "{text}");

    // The stored response's endpoints go to the same surface, with the same credential.
    let got = send(
        env,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        "",
    )
    .await;
    assert_eq!(got.status(), 200);
    let deleted = send(
        env,
        reqwest::Method::DELETE,
        &format!("/v1/responses/{id}"),
        "",
    )
    .await;
    assert_eq!(deleted.status(), 200);
    // Azure serves no count endpoint: the count is estimated, nothing is sent.
    let count = send(
        env,
        post,
        "/v1/responses/input_tokens",
        r#"{"model":"agent","input":"hi"}"#,
    )
    .await;
    assert_eq!(count.status(), 200);
    assert_eq!(count.headers()["x-legate-estimate"], "true");

    let reqs = env.mock.requests();
    let paths: Vec<(&str, &str)> = reqs
        .iter()
        .filter(|r| !r.path.contains("oauth2"))
        .map(|r| (r.method.as_str(), r.path.as_str()))
        .collect();
    let stored = format!("/openai/v1/responses/{id}");
    assert_eq!(
        paths,
        [
            ("POST", "/openai/v1/responses"),
            ("POST", "/openai/v1/responses"),
            ("GET", stored.as_str()),
            ("DELETE", stored.as_str()),
        ]
    );
    for r in reqs.iter().filter(|r| r.path.starts_with("/openai/")) {
        assert!(
            r.header("authorization")
                .unwrap()
                .starts_with("Bearer entra-CANARY"),
            "{}",
            r.path
        );
        assert!(r.header("api-key").is_none());
    }
    // The alias and the model the caller named both reach Azure as the deployment's name,
    // every other byte as the caller sent it.
    let sent: Vec<&[u8]> = reqs.iter().take(2).map(|r| r.body.as_ref()).collect();
    assert_eq!(sent[0], br#"{"model":"gpt4o-prod","input":"hi"}"#);
    assert_eq!(
        sent[1],
        br#"{"model":"gpt4o-prod","input":"hi","stream":true}"#
    );
    assert_eq!(
        env.metric(
            "legate_upstream_attempts_total",
            &[("provider", "azure"), ("outcome", "ok")]
        )
        .await,
        Some(2.0)
    );
}

#[tokio::test]
async fn azure_with_an_api_key_sends_it_alone_and_a_model_without_a_deployment_as_named() {
    let a = start(false, "").await;
    let env = &a.env;
    let resp = send(
        env,
        reqwest::Method::POST,
        "/v1/responses",
        r#"{"model":"gpt-4.1-mini","input":"hi"}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/openai/v1/responses");
    assert_eq!(reqs[0].header("api-key"), Some(AZURE_KEY));
    assert!(reqs[0].header("authorization").is_none());
    assert_eq!(
        reqs[0].body.as_ref(),
        br#"{"model":"gpt-4.1-mini","input":"hi"}"#
    );
}

#[tokio::test]
async fn azure_without_the_responses_api_is_reached_through_translation() {
    let a = start(false, "responses = false").await;
    let env = &a.env;
    let resp = send(
        env,
        reqwest::Method::POST,
        "/v1/responses",
        r#"{"model":"agent","input":"hi"}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "response");
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].path,
        "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    );
}

/// A stored response is asked of the provider that relayed it, whatever the default of the
/// OpenAI APIs is; one legate holds no copy of goes to that default.
#[tokio::test]
async fn a_stored_response_is_asked_of_the_provider_that_made_it() {
    let a = start_routed(true, "", "openai").await;
    let env = &a.env;
    let resp = send(
        env,
        reqwest::Method::POST,
        "/v1/responses",
        r#"{"model":"agent","input":"hi"}"#,
    )
    .await;
    assert_eq!(resp.headers()["x-legate-served-by"], "azure:gpt-4o");
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let got = send(
        env,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        "",
    )
    .await;
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["x-legate-served-by"], "azure");
    let other = send(
        env,
        reqwest::Method::GET,
        "/v1/responses/resp_elsewhere",
        "",
    )
    .await;
    assert_eq!(other.headers()["x-legate-served-by"], "openai");
    let reqs = env.mock.requests();
    let paths: Vec<&str> = reqs
        .iter()
        .filter(|r| !r.path.contains("oauth2"))
        .map(|r| r.path.as_str())
        .collect();
    let stored = format!("/openai/v1/responses/{id}");
    assert_eq!(
        paths,
        [
            "/openai/v1/responses",
            stored.as_str(),
            "/v1/responses/resp_elsewhere"
        ]
    );
}

/// The count on Azure of a turn continuing the first turn `first_model` answered (20,000
/// bytes of text), and which step answered that first turn.
async fn count_after(env: &Env, first_model: &str) -> (u64, String) {
    let long = "word ".repeat(4000);
    let first = format!(r#"{{"model":"{first_model}","input":"{long}"}}"#);
    let resp = send(env, reqwest::Method::POST, "/v1/responses", &first).await;
    let served = resp.headers()["x-legate-served-by"]
        .to_str()
        .unwrap()
        .to_owned();
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let next = format!(r#"{{"model":"agent","input":"and then?","previous_response_id":"{id}"}}"#);
    let count = send(
        env,
        reqwest::Method::POST,
        "/v1/responses/input_tokens",
        &next,
    )
    .await;
    assert_eq!(count.headers()["x-legate-estimate"], "true");
    let tokens = count.json::<Value>().await.unwrap()["input_tokens"].as_u64();
    (tokens.unwrap(), served)
}

/// Azure serves no count endpoint: the local estimate of a turn continuing a response Azure
/// keeps counts the earlier turns legate holds a copy of, as the provider would.
#[tokio::test]
async fn an_azure_count_of_a_continued_turn_counts_the_earlier_turns() {
    let a = start(true, "").await;
    let env = &a.env;
    // About 5,000 tokens for the first turn's text, not the 20 of the body.
    let (tokens, served) = count_after(env, "agent").await;
    assert_eq!(served, "azure:gpt-4o");
    assert!((5_000..6_000).contains(&tokens), "{tokens}");
    // A first turn another step made (translated from Anthropic's answer) is rebuilt into the
    // body: counted once, not again on top of it.
    let (tokens, served) = count_after(env, "claude-first").await;
    assert_eq!(served, "anthropic:claude-x");
    assert!((5_000..6_000).contains(&tokens), "{tokens}");
}

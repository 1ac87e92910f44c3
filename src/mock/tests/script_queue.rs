//! Script semantics over HTTP: queue order, match and times, the default reply, expect_key,
//! raw bodies, and set_script.

use serde_json::json;

use super::{TestResult, anthropic_request, client, json_of, openai_request, post, start};
use crate::mock::Script;

async fn statuses(
    server: &crate::mock::MockServer,
    calls: &[(&str, serde_json::Value)],
) -> Result<Vec<u16>, reqwest::Error> {
    let mut out = Vec::new();
    for (path, body) in calls {
        out.push(post(server, path, body).await?.status().as_u16());
    }
    Ok(out)
}

fn with_model(model: &str) -> serde_json::Value {
    let mut body = anthropic_request(false);
    body["model"] = json!(model);
    body
}

#[tokio::test]
async fn queue_takes_the_first_fitting_entry_until_spent() -> TestResult {
    let server = start(json!({
        "replies": [
            {"match": {"model": "a"}, "status": 500, "times": 2},
            {"status": 529},
            {"match": {"path": "/v1/chat/completions"}, "status": 503, "times": 0},
        ],
        "default": {"status": 200},
    }))
    .await?;
    let m = "/v1/messages";
    let chat = "/v1/chat/completions";
    let calls = [
        (m, with_model("b")),
        (m, with_model("b")),
        (m, with_model("a")),
        (m, with_model("a")),
        (m, with_model("a")),
        (chat, openai_request(false, false)),
        (chat, openai_request(true, false)),
    ];
    assert_eq!(
        statuses(&server, &calls).await?,
        vec![529, 200, 500, 500, 200, 503, 503]
    );
    Ok(())
}

#[tokio::test]
async fn match_on_stream_separates_streaming_calls() -> TestResult {
    let server = start(json!({"replies": [{"match": {"stream": true}, "status": 529}]})).await?;
    let calls = [
        ("/v1/messages", anthropic_request(false)),
        ("/v1/messages", anthropic_request(true)),
    ];
    assert_eq!(statuses(&server, &calls).await?, vec![200, 529]);
    Ok(())
}

#[tokio::test]
async fn scripted_default_answers_when_the_queue_is_spent() -> TestResult {
    let server = start(json!({
        "replies": [{"content": [{"type": "text", "text": "first"}]}],
        "default": {"content": [{"type": "text", "text": "again"}], "stop_reason": "max_tokens"},
    }))
    .await?;
    let mut texts = Vec::new();
    for _ in 0..3 {
        let body = json_of(post(&server, "/v1/messages", &anthropic_request(false)).await?).await?;
        texts.push(format!(
            "{}/{}",
            body["content"][0]["text"], body["stop_reason"]
        ));
    }
    assert_eq!(
        texts,
        [
            r#""first"/"end_turn""#,
            r#""again"/"max_tokens""#,
            r#""again"/"max_tokens""#
        ]
    );
    Ok(())
}

#[tokio::test]
async fn expect_key_refuses_a_missing_or_wrong_key_in_either_form() -> TestResult {
    let server = start(json!({"expect_key": "sk-good"})).await?;
    let url = |path: &str| format!("{}{path}", server.base_url());
    let body = anthropic_request(false).to_string();
    let send = |path: &'static str, header: Option<(&'static str, &'static str)>| {
        let mut request = client().post(url(path)).body(body.clone());
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    let none = send("/v1/messages", None).await?;
    assert_eq!(none.status(), 401);
    let body_json = json_of(none).await?;
    assert_eq!(body_json["error"]["type"], "authentication_error");
    assert_eq!(
        send("/v1/messages", Some(("x-api-key", "sk-bad")))
            .await?
            .status(),
        401
    );
    assert_eq!(
        send("/v1/messages", Some(("x-api-key", "sk-good")))
            .await?
            .status(),
        200
    );
    let bearer = Some(("authorization", "Bearer sk-good"));
    assert_eq!(send("/v1/messages", bearer).await?.status(), 200);
    let wrong_openai = send(
        "/v1/chat/completions",
        Some(("authorization", "Bearer sk-bad")),
    )
    .await?;
    assert_eq!(wrong_openai.status(), 401);
    let openai_error = json_of(wrong_openai).await?;
    assert_eq!(openai_error["error"]["type"], "authentication_error");
    assert_eq!(
        server.stats().requests,
        5,
        "refused requests are recorded too"
    );
    Ok(())
}

#[tokio::test]
async fn raw_body_is_sent_as_is_with_the_scripted_status() -> TestResult {
    let server = start(json!({"replies": [
        {"status": 502, "body": "<html>bad gateway</html>", "headers": {"content-type": "text/html"}},
        {"body": {"custom": [1, 2]}},
    ]}))
    .await?;
    let html = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    assert_eq!(html.status(), 502);
    assert_eq!(html.headers()["content-type"], "text/html");
    assert_eq!(html.text().await?, "<html>bad gateway</html>");
    let custom = post(&server, "/v1/messages", &anthropic_request(false)).await?;
    assert_eq!(custom.headers()["content-type"], "application/json");
    assert_eq!(custom.text().await?, r#"{"custom":[1,2]}"#);
    Ok(())
}

#[tokio::test]
async fn set_script_replaces_the_queue() -> TestResult {
    let server = start(json!({"replies": [{"status": 500, "times": 0}]})).await?;
    assert_eq!(
        post(&server, "/v1/messages", &anthropic_request(false))
            .await?
            .status(),
        500
    );
    server.set_script(Script::from_json(r#"{"replies":[{"status":418}]}"#)?);
    let calls = [
        ("/v1/messages", anthropic_request(false)),
        ("/v1/messages", anthropic_request(false)),
    ];
    assert_eq!(statuses(&server, &calls).await?, vec![418, 200]);
    Ok(())
}

//! What the mock records and the `/_mock/` control endpoints; the CLI entry's error paths.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{TestResult, anthropic_request, client, get_json, json_of, post, start, within};
use crate::mock::run;

#[tokio::test]
async fn records_method_path_headers_and_exact_body() -> TestResult {
    let server = start(json!({})).await?;
    // Odd spacing and key order must survive: the body is recorded byte for byte.
    let body = r#"{ "stream":false,"model" : "m","max_tokens":1,"messages":[] }"#;
    let response = client()
        .post(format!("{}/v1/messages?beta=true", server.base_url()))
        .header("X-Custom", "one")
        .header("x-dup", "a")
        .header("x-dup", "b")
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let recorded = &requests[0];
    assert_eq!(recorded.method, "POST");
    assert_eq!(recorded.path, "/v1/messages?beta=true");
    assert_eq!(recorded.body, body.as_bytes());
    assert_eq!(
        recorded.body_sha256,
        hex::encode(Sha256::digest(body.as_bytes()))
    );
    assert_eq!(recorded.header("x-custom"), Some("one"));
    assert_eq!(
        recorded.header_values("x-dup").collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(recorded.headers.iter().all(|(n, _)| *n == n.to_lowercase()));
    let position = |name: &str| recorded.headers.iter().position(|(n, _)| n == name);
    assert!(
        position("x-custom") < position("anthropic-version"),
        "arrival order"
    );
    Ok(())
}

#[tokio::test]
async fn control_endpoints_list_count_and_reset() -> TestResult {
    let server = start(json!({})).await?;
    let base = server.base_url();
    post(&server, "/v1/messages", &anthropic_request(false))
        .await?
        .bytes()
        .await?;
    within(server.wait_completed(1)).await?;

    let listed = get_json(format!("{base}/_mock/requests")).await?;
    let listed = listed.as_array().ok_or("not an array")?;
    assert_eq!(listed.len(), 1, "control calls are not recorded");
    assert_eq!(listed[0]["method"], "POST");
    assert_eq!(listed[0]["path"], "/v1/messages");
    assert_eq!(listed[0]["body"], anthropic_request(false).to_string());
    assert_eq!(listed[0]["body_sha256"], server.requests()[0].body_sha256);
    let has_content_type = listed[0]["headers"]
        .as_array()
        .is_some_and(|h| h.contains(&json!(["content-type", "application/json"])));
    assert!(has_content_type);

    let stats = get_json(format!("{base}/_mock/stats")).await?;
    assert_eq!(
        stats,
        json!({"requests": 1, "completed": 1, "cancelled": 0, "inflight": 0})
    );

    let reset = client().post(format!("{base}/_mock/reset")).send().await?;
    assert_eq!(reset.status(), 200);
    assert!(server.requests().is_empty());
    assert_eq!(server.stats().requests, 0);
    assert_eq!(server.stats().completed, 0);

    let unknown = client().get(format!("{base}/_mock/nothing")).send().await?;
    assert_eq!(unknown.status(), 404);
    Ok(())
}

#[tokio::test]
async fn put_script_replaces_it_or_explains_why_not() -> TestResult {
    let server = start(json!({})).await?;
    let url = format!("{}/_mock/script", server.base_url());
    let bad = client()
        .put(&url)
        .body(r#"{"replies":[{"status":"x"}]}"#)
        .send()
        .await?;
    assert_eq!(bad.status(), 400);
    let message: Value = json_of(bad).await?;
    assert!(
        message["error"]
            .as_str()
            .is_some_and(|m| m.contains("invalid script")),
        "{message}"
    );
    assert_eq!(
        post(&server, "/v1/messages", &anthropic_request(false))
            .await?
            .status(),
        200
    );

    let good = client()
        .put(&url)
        .body(r#"{"replies":[{"status":503}]}"#)
        .send()
        .await?;
    assert_eq!(good.status(), 200);
    assert_eq!(
        post(&server, "/v1/messages", &anthropic_request(false))
            .await?
            .status(),
        503
    );
    Ok(())
}

#[tokio::test]
async fn run_reports_an_unreadable_or_invalid_script_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let listen = "127.0.0.1:0".parse()?;
    let missing = dir.path().join("missing.json");
    let err = run(listen, Some(missing), None)
        .await
        .err()
        .unwrap_or_default();
    assert!(err.contains("missing.json"), "{err}");

    let invalid = dir.path().join("bad.json");
    std::fs::write(&invalid, r#"{"replies":[{"hang_after":1,"cut_after":2}]}"#)?;
    let err = run(listen, Some(invalid), None)
        .await
        .err()
        .unwrap_or_default();
    assert!(
        err.contains("bad.json") && err.contains("replies[0]"),
        "{err}"
    );
    Ok(())
}

//! The canary test for cloud credentials: with every secret the cloud mock issues or reads
//! carrying `CANARY` (access keys, secret keys, session tokens, OAuth and Entra tokens,
//! federated and projected tokens), none may appear in legate's trace-level log, its answers,
//! its metrics, its admin plane or `legate check`.

use crate::harness::{BIN, addrs, sigterm, spawn, spawn_mock};

#[tokio::test]
async fn cloud_secrets_never_appear_in_logs_metrics_admin_or_error_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let (_mock, mock) = spawn_mock(&["--cloud"]).await;
    let token = dir.path().join("projected-token");
    std::fs::write(&token, "CANARY-projected-service-account-token").unwrap();
    let external = dir.path().join("external-account.json");
    let external_json = serde_json::json!({
        "type": "external_account",
        "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/k",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": format!("{mock}/google/token"),
        "credential_source": {"file": token.display().to_string()},
    });
    std::fs::write(&external, external_json.to_string()).unwrap();
    let cfg = dir.path().join("legate.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
base_url = "{mock}"

[providers.openai]
base_url = "{mock}"

[providers.bedrock]
kind = "bedrock"
region = "us-east-1"
base_url = "{mock}"
sts_endpoint = "{mock}/sts"

[providers.bedrock-denied]
kind = "bedrock"
region = "us-east-1"
base_url = "{mock}"
sts_endpoint = "{mock}/refusing-sts"

[providers.vertex]
kind = "vertex"
project = "p"
region = "us-east5"
base_url = "{mock}"
credentials_file = "{external}"

[providers.azure]
kind = "azure-openai"
base_url = "{mock}"
token_url = "{mock}/t/oauth2/v2.0/token"

[[models]]
name = "b"
chain = ["bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0"]

[[models]]
name = "denied"
chain = ["bedrock-denied:anthropic.claude-sonnet-4-5-20250929-v1:0"]

[[models]]
name = "v"
chain = ["vertex:claude-sonnet-4-5@20250929"]

[[models]]
name = "gpt-4o"
chain = ["azure:gpt-4o"]
"#,
            external = external.display()
        ),
    )
    .unwrap();
    let token = token.display().to_string();
    let envs = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token.as_str()),
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/legate"),
        ("AZURE_FEDERATED_TOKEN_FILE", token.as_str()),
        ("AZURE_CLIENT_ID", "client"),
        ("AZURE_TENANT_ID", "t"),
        ("LEGATE_LOG", "trace"),
    ];
    let check = tokio::process::Command::new(BIN)
        .args(["check", "--config", cfg.to_str().unwrap()])
        .envs(envs)
        .output()
        .await
        .unwrap();
    assert!(check.status.success());
    let check_out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check_out.contains("# credentials: web identity"),
        "{check_out}"
    );
    assert!(
        check_out.contains("# credentials: Entra workload identity"),
        "{check_out}"
    );

    let log = dir.path().join("stderr.log");
    let (mut legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &envs,
        Some(&log),
    )
    .await;
    let (data, admin) = addrs(&line);
    let http = reqwest::Client::new();
    let mut seen = String::new();
    let calls = [
        (
            "/v1/messages",
            r#"{"model":"b","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
            200,
        ),
        (
            "/v1/messages",
            r#"{"model":"b","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            200,
        ),
        (
            "/v1/messages",
            r#"{"model":"v","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
            200,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#,
            200,
        ),
        (
            "/v1/messages",
            r#"{"model":"denied","max_tokens":5,"messages":[]}"#,
            502,
        ),
    ];
    for (path, body, status) in calls {
        let resp = http
            .post(format!("{data}{path}"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{body}");
        seen.push_str(&format!("{:?}", resp.headers()));
        seen.push_str(&resp.text().await.unwrap());
    }
    for path in ["/metrics", "/admin/state", "/admin/usage"] {
        seen.push_str(
            &http
                .get(format!("{admin}{path}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
    }
    assert!(seen.contains("legate_credential_refreshes_total"));
    sigterm(&legate);
    assert!(legate.wait().await.unwrap().success());
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(!logs.is_empty());
    let check_err = String::from_utf8_lossy(&check.stderr).into_owned();
    for (what, text) in [
        ("responses", &seen),
        ("logs", &logs),
        ("check", &check_out.into_owned()),
        ("check stderr", &check_err),
    ] {
        assert!(
            !text.contains("CANARY"),
            "a cloud secret leaked into {what}"
        );
    }
}

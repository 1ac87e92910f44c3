//! State keyed by caller-chosen model names stays bounded (SPEC §14): breakers and the usage
//! ledger keep the most recently used entries, the ledger folds the others into
//! `provider:other` so its totals stay exact, and over-long names are refused.

use futures_util::StreamExt;

use crate::harness;

/// Sends one request for each model name `prefix{i}`, `i` in `0..n`, 16 at a time; all 200.
async fn one_request_per_name(env: &harness::Env, prefix: &str, n: usize) {
    let statuses: Vec<u16> = futures_util::stream::iter(0..n)
        .map(|i| {
            let body = format!(
                r#"{{"model":"{prefix}{i}","max_tokens":8,"messages":[{{"role":"user","content":"hi"}}]}}"#
            );
            async move { env.messages(body).await.status().as_u16() }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 200));
}

#[tokio::test]
async fn eleven_hundred_distinct_model_names_leave_bounded_breakers_and_an_exact_ledger() {
    let env = harness::start("").await;
    const N: usize = 1100;
    one_request_per_name(&env, "claude-made-up-", N).await;

    let state = env.admin_json("/admin/state").await;
    let breakers = state["breakers"].as_array().unwrap().len();
    assert!(breakers <= 1024, "{breakers} breakers");

    let usage = env.admin_json("/admin/usage").await;
    let models = usage["tenants"]["default"].as_object().unwrap();
    assert!(models.len() <= 1025, "{} ledger entries", models.len());
    assert!(models.contains_key("anthropic:other"));
    // The mock reports 10 input tokens per call: folding loses nothing.
    let requests: u64 = models
        .values()
        .map(|e| e["requests"].as_u64().unwrap())
        .sum();
    let input: u64 = models
        .values()
        .map(|e| e["input_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(requests, N as u64);
    assert_eq!(input, 10 * N as u64);

    let long = format!(
        r#"{{"model":"{}","max_tokens":8,"messages":[]}}"#,
        "m".repeat(257)
    );
    assert_eq!(env.messages(long).await.status(), 400);
}

/// Names a configured `*` pattern matches are as much the caller's choice as unknown ones: their
/// breakers and ledger entries are bounded too, while an exactly configured model's breaker is
/// never dropped and its ledger entry never folded by them.
#[tokio::test]
async fn names_under_a_price_pattern_leave_bounded_breakers() {
    let env = harness::start(
        "[[prices]]\nmodel = \"anthropic:claude-sonnet-4-5*\"\ninput = \"3\"\noutput = \"15\"\n\
         [[prices]]\nmodel = \"anthropic:claude-exact\"\ninput = \"3\"\noutput = \"15\"\n",
    )
    .await;
    one_request_per_name(&env, "claude-exac", 1).await;
    let exact = r#"{"model":"claude-exact","max_tokens":8,"messages":[]}"#;
    assert_eq!(env.messages(exact).await.status(), 200);
    one_request_per_name(&env, "claude-sonnet-4-5-", 1100).await;

    let state = env.admin_json("/admin/state").await;
    let upstreams: Vec<&str> = state["breakers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["upstream"].as_str().unwrap())
        .collect();
    // 1,024 most recent of the 1,101 caller-chosen names, and the configured one.
    assert_eq!(upstreams.len(), 1025);
    assert!(upstreams.contains(&"anthropic:claude-exact"));
    assert!(!upstreams.contains(&"anthropic:claude-exac0"));

    // The ledger too: the configured model's priced entry stays its own, while the caller's
    // names are folded into `other`. It was folded with them, its spend no longer its own.
    let usage = env.admin_json("/admin/usage").await;
    let models = usage["tenants"]["default"].as_object().unwrap();
    let exact = &models["anthropic:claude-exact"];
    assert_eq!(exact["requests"], 1);
    // The mock's 10 input and 5 output tokens at $3 and $15 per million.
    assert_eq!(exact["cost_pico_usd"], "105000000");
    assert!(!models.contains_key("anthropic:claude-exac0"));
    assert!(models.contains_key("anthropic:other"));
    // The 1,024 most recent names, `other`, and the configured one.
    assert_eq!(models.len(), 1026, "{} ledger entries", models.len());
}

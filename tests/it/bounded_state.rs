//! State keyed by caller-chosen model names stays bounded (SPEC §14): breakers and the usage
//! ledger keep the most recently used entries, the ledger folds the others into
//! `provider:other` so its totals stay exact, and over-long names are refused.

use futures_util::StreamExt;

use crate::harness;

#[tokio::test]
async fn eleven_hundred_distinct_model_names_leave_bounded_breakers_and_an_exact_ledger() {
    let env = harness::start("").await;
    const N: usize = 1100;
    let statuses: Vec<u16> = futures_util::stream::iter(0..N)
        .map(|i| {
            let body = format!(
                r#"{{"model":"claude-made-up-{i}","max_tokens":8,"messages":[{{"role":"user","content":"hi"}}]}}"#
            );
            let env = &env;
            async move { env.messages(body).await.status().as_u16() }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 200));

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

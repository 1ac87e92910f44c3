//! `legate_breaker_state` as an operator reads it: a series shared by the breakers of every
//! name under a configured `*` pattern shows the worst of them, so an open breaker is never
//! reported closed because another name under the pattern answered.

use crate::harness::{self, Env};

const CONFIG: &str = r#"
[retry]
max_attempts = 1

[breaker]
min_calls = 2
open_for = "60s"

[[prices]]
model = "anthropic:claude-sonnet-4-5*"
input = "3"
output = "15"
"#;

fn body(model: &str) -> String {
    format!(r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#)
}

async fn pattern_series(env: &Env) -> Option<f64> {
    env.metric(
        "legate_breaker_state",
        &[("provider", "anthropic"), ("model", "claude-sonnet-4-5*")],
    )
    .await
}

#[tokio::test]
async fn a_patterns_series_stays_open_while_any_breaker_under_it_is_open() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"replies":[{"match":{"model":"claude-sonnet-4-5-x"},"times":0,"status":503}]}"#,
        )
        .unwrap(),
        CONFIG,
    )
    .await;
    for _ in 0..2 {
        assert_eq!(
            env.messages(body("claude-sonnet-4-5-x")).await.status(),
            503
        );
    }
    assert_eq!(pattern_series(&env).await, Some(1.0));

    // Another snapshot under the pattern answers: its new, closed breaker must not hide x's.
    assert_eq!(
        env.messages(body("claude-sonnet-4-5-y")).await.status(),
        200
    );
    assert_eq!(
        env.messages(body("claude-sonnet-4-5-x")).await.status(),
        529
    );
    assert_eq!(pattern_series(&env).await, Some(1.0));
    assert_eq!(env.mock.stats().requests, 3);
}

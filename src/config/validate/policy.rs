//! `[retry]` and `[breaker]`: the failure policy's knobs, with the cross-field checks that keep
//! them coherent (`max_delay >= base_delay`, `open_for <= max_open_for`).

use super::reader::{self, Cx, Table};
use crate::config::{BreakerConfig, RetryConfig};

pub(crate) fn parse_retry(mut t: Table, cx: &mut Cx) -> RetryConfig {
    let d = RetryConfig::default();
    let max_attempts = t
        .opt(cx, "max_attempts", reader::positive_uint)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        .unwrap_or(d.max_attempts);
    let base_delay = t
        .opt(cx, "base_delay", reader::positive_duration)
        .unwrap_or(d.base_delay);
    let max_delay = t
        .opt(cx, "max_delay", reader::positive_duration)
        .unwrap_or(d.max_delay);
    if max_delay < base_delay {
        cx.err(
            &t.child("max_delay"),
            format!(
                "`{}` is shorter than base_delay `{}`",
                humantime::format_duration(max_delay),
                humantime::format_duration(base_delay)
            ),
        );
    }
    let max_retry_after = t
        .opt(cx, "max_retry_after", reader::duration)
        .unwrap_or(d.max_retry_after);
    let budget_ratio = t
        .opt(cx, "budget_ratio", reader::ratio)
        .unwrap_or(d.budget_ratio);
    t.finish(cx);
    RetryConfig {
        max_attempts,
        base_delay,
        max_delay,
        max_retry_after,
        budget_ratio,
    }
}

pub(crate) fn parse_breaker(mut t: Table, cx: &mut Cx) -> BreakerConfig {
    let d = BreakerConfig::default();
    let window = t
        .opt(cx, "window", reader::positive_duration)
        .unwrap_or(d.window);
    let min_calls = t
        .opt(cx, "min_calls", reader::positive_uint)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        .unwrap_or(d.min_calls);
    let failure_ratio = t
        .opt(cx, "failure_ratio", reader::ratio)
        .unwrap_or(d.failure_ratio);
    if failure_ratio == 0.0 {
        cx.err(
            &t.child("failure_ratio"),
            "0 would open the breaker on the first call; use a share above 0",
        );
    }
    let open_for = t
        .opt(cx, "open_for", reader::positive_duration)
        .unwrap_or(d.open_for);
    let max_open_for = t
        .opt(cx, "max_open_for", reader::positive_duration)
        .unwrap_or(d.max_open_for);
    if open_for > max_open_for {
        cx.err(
            &t.child("open_for"),
            format!(
                "`{}` is longer than max_open_for `{}`",
                humantime::format_duration(open_for),
                humantime::format_duration(max_open_for)
            ),
        );
    }
    t.finish(cx);
    BreakerConfig {
        window,
        min_calls,
        failure_ratio,
        open_for,
        max_open_for,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use crate::config::load_str;

    fn errors(toml: &str) -> String {
        match load_str(toml, &HashMap::new()) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn retry_and_breaker_read_with_defaults() {
        let cfg = load_str(
            "[retry]\nmax_attempts = 5\nbudget_ratio = 0.5\n[breaker]\nmin_calls = 2\nopen_for = \"1s\"\n",
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(cfg.retry.max_attempts, 5);
        assert_eq!(cfg.retry.budget_ratio, 0.5);
        assert_eq!(cfg.retry.base_delay, Duration::from_millis(500));
        assert_eq!(cfg.breaker.min_calls, 2);
        assert_eq!(cfg.breaker.open_for, Duration::from_secs(1));
        assert_eq!(cfg.breaker.max_open_for, Duration::from_secs(300));
    }

    #[test]
    fn contradictions_are_refused_with_their_key_paths() {
        let e = errors(
            "[retry]\nbase_delay = \"2s\"\nmax_delay = \"1s\"\nbudget_ratio = 1.5\nfoo = 1\n[breaker]\nopen_for = \"10m\"\nmax_open_for = \"5m\"\nfailure_ratio = 0\n",
        );
        for path in [
            "retry.max_delay",
            "retry.budget_ratio",
            "retry.foo",
            "breaker.open_for",
            "breaker.failure_ratio",
        ] {
            assert!(e.contains(path), "{path} missing in: {e}");
        }
    }
}

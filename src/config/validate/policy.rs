//! `[retry]` and `[breaker]`: the contradictions between their keys (`max_delay >=
//! base_delay`, `open_for <= max_open_for`) and the one value no type excludes.

use super::Cx;
use crate::config::{BreakerConfig, RetryConfig};

pub(crate) fn check(r: &RetryConfig, b: &BreakerConfig, cx: &mut Cx) {
    let show = crate::config::adapt::shown_duration;
    if r.max_delay < r.base_delay {
        cx.err(
            "retry.max_delay",
            format!(
                "`{}` is shorter than base_delay `{}`",
                show(r.max_delay),
                show(r.base_delay)
            ),
        );
    }
    if b.failure_ratio == 0.0 {
        cx.err(
            "breaker.failure_ratio",
            "0 would open the breaker on the first call; use a share above 0",
        );
    }
    if b.open_for > b.max_open_for {
        cx.err(
            "breaker.open_for",
            format!(
                "`{}` is longer than max_open_for `{}`",
                show(b.open_for),
                show(b.max_open_for)
            ),
        );
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

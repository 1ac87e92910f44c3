//! All breakers of the process, keyed by `provider:model`, and the `legate_breaker_state`
//! series each one writes. They outlive config reloads. A model the config names exactly keeps
//! its breaker for ever, and that breaker owns its series; any other name is the caller's
//! choice, so its breaker lives in a bounded least-recently-used set (SPEC §14), and under a
//! `*` pattern it counts towards the pattern's shared series (see `breaker::SharedSeries`).

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use prometheus::IntGaugeVec;

use super::breaker::{Breaker, Series, SharedSeries, State};
use crate::config::BreakerConfig;
use crate::lru::Lru;

/// Breakers of models that are not configured by their exact name (callers may send any model
/// name to a default route, or any snapshot name under a configured `*` pattern) are kept for
/// at most this many upstreams, the least recently used forgotten first. Exactly configured
/// models' breakers are bounded by the config and never forgotten.
const MAX_UNCONFIGURED_BREAKERS: usize = 1024;

/// Breakers of exactly configured models, and a bounded set of the others.
struct Map {
    /// Fx-hashed: only `provider:model` pairs whose model the config names exactly are
    /// inserted here (callers' other names, those a `*` pattern matches included, go to the
    /// bounded, SipHash-keyed `others`).
    configured: HashMap<String, Arc<Breaker>>,
    others: Lru<String, Arc<Breaker>>,
    /// The shared series of each `provider:pattern`: as bounded as the config's patterns.
    patterns: HashMap<String, Arc<SharedSeries>>,
    /// Where `provider:model` is written for a lookup: reused, so that finding an existing
    /// breaker (every request but the first of an upstream) allocates nothing.
    key: String,
    /// Providers a reload removed: a request still running on the config before it makes no
    /// breaker (and no series) for them again. As bounded as the configs' providers.
    removed: Vec<String>,
}

/// Removed providers remembered at most (`Map::removed`).
const MAX_REMOVED: usize = 256;

/// The largest lookup buffer `Map::key` keeps between lookups.
const MAX_KEPT_KEY: usize = 256;

pub struct Breakers {
    cfg: Arc<ArcSwap<BreakerConfig>>,
    map: Mutex<Map>,
    gauge: IntGaugeVec,
}

impl Breakers {
    pub fn new(cfg: BreakerConfig, gauge: IntGaugeVec) -> Self {
        Breakers {
            cfg: Arc::new(ArcSwap::from_pointee(cfg)),
            map: Mutex::new(Map {
                configured: HashMap::default(),
                others: Lru::new(MAX_UNCONFIGURED_BREAKERS),
                patterns: HashMap::default(),
                key: String::new(),
                removed: Vec::new(),
            }),
            gauge,
        }
    }

    /// Applies a reloaded `[breaker]` to every breaker, existing and future. Their states and
    /// windows carry over: an upstream's health does not reset with the config.
    pub fn set_config(&self, cfg: BreakerConfig) {
        self.cfg.store(Arc::new(cfg));
    }

    /// Forgets `provider`'s breakers: a reload pointed it at another endpoint (another
    /// `base_url`, or kind), whose health the old endpoint's failures say nothing about. Its
    /// models start closed, their series at 0; a breaker a request in flight still holds
    /// decides nothing for later requests.
    pub fn forget_provider(&self, provider: &str) {
        self.forget(provider, false);
    }

    /// Forgets the breakers of a provider the config no longer has, their state series
    /// removed from `/metrics` as well (a removed provider's breakers listed in
    /// `/admin/state` and exported at 0 said it was still configured).
    pub fn forget_removed(&self, provider: &str) {
        self.forget(provider, true);
        let mut map = self.map.lock();
        if !map.removed.iter().any(|p| p == provider) {
            // Reload after reload removing new names: the oldest go first (their configs'
            // requests ended long ago).
            if map.removed.len() >= MAX_REMOVED {
                map.removed.remove(0);
            }
            map.removed.push(provider.to_owned());
        }
    }

    /// The providers of the config in force now: one a reload removed and a later one brings
    /// back has breakers again.
    pub fn providers_now(&self, configured: impl Fn(&str) -> bool) {
        self.map.lock().removed.retain(|p| !configured(p));
    }

    fn forget(&self, provider: &str, removed: bool) {
        let mut map = self.map.lock();
        let ours = |k: &String| {
            k.strip_prefix(provider)
                .is_some_and(|rest| rest.starts_with(':'))
        };
        let gauge = &self.gauge;
        map.configured.retain(|k, _| {
            if !ours(k) {
                return true;
            }
            // A configured model's label is the model itself.
            let model = &k[provider.len() + 1..];
            if removed {
                let _ = gauge.remove_label_values(&[provider, model]);
            } else if let Ok(g) = gauge.get_metric_with_label_values(&[provider, model]) {
                g.set(0);
            }
            false
        });
        map.others.retain(|k| !ours(k));
        // A removed provider's `*` patterns go too, their shared series with them (a moved
        // one's stay: its patterns are still configured, and their breakers start anew).
        if removed {
            map.patterns.retain(|k, _| {
                if !ours(k) {
                    return true;
                }
                let _ = gauge.remove_label_values(&[provider, &k[provider.len() + 1..]]);
                false
            });
        }
    }

    /// The breaker of `provider:model`; `model_label` is the bounded metric label.
    pub fn get(&self, provider: &str, model: &str, model_label: &str) -> Option<Arc<Breaker>> {
        // The label is the model itself only for a name the config spells out; a name that a
        // `*` pattern matches is the caller's choice, as unbounded as an unknown one.
        let exact = crate::names::labels_itself(model_label, model);
        let mut map = self.map.lock();
        let Map {
            configured,
            others,
            patterns,
            key,
            removed,
        } = &mut *map;
        if key.capacity() > MAX_KEPT_KEY {
            // A caller's huge model name must not keep its buffer for the process's life.
            *key = String::new();
        }
        key.clear();
        key.push_str(provider);
        key.push(':');
        key.push_str(model);
        if exact {
            if let Some(b) = configured.get(key.as_str()) {
                return Some(b.clone());
            }
            // The rare path: a breaker made. None for a provider the config no longer has.
            if removed.iter().any(|p| p == provider) {
                return None;
            }
            let g = self.gauge.with_label_values(&[provider, model_label]);
            g.set(0);
            let b = Arc::new(Breaker::new(self.cfg.clone(), Series::Own(g)));
            configured.insert(key.clone(), b.clone());
            return Some(b);
        }
        if let Some(b) = others.touch(key.as_str()) {
            return Some(b.clone());
        }
        if removed.iter().any(|p| p == provider) {
            return None;
        }
        // A new breaker: the rare path, where its pattern's series is looked up.
        let series = if model_label == "other" {
            Series::None
        } else {
            let shared = patterns
                .entry(format!("{provider}:{model_label}"))
                .or_insert_with(|| {
                    let g = self.gauge.with_label_values(&[provider, model_label]);
                    Arc::new(SharedSeries::new(g))
                });
            Series::Shared(shared.clone())
        };
        let (b, _) = others.entry(key, || Arc::new(Breaker::new(self.cfg.clone(), series)));
        Some(b.clone())
    }

    pub fn snapshot(&self) -> Vec<(String, State)> {
        let map = self.map.lock();
        let mut out: Vec<(String, State)> = map
            .configured
            .iter()
            .chain(map.others.iter())
            .map(|(k, b)| (k.clone(), b.state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::breaker::{Admission, Outcome};

    fn breakers() -> Breakers {
        let cfg = BreakerConfig {
            window: Duration::from_secs(30),
            min_calls: 2,
            failure_ratio: 0.5,
            open_for: Duration::from_secs(10),
            max_open_for: Duration::from_secs(20),
        };
        let gauge = IntGaugeVec::new(prometheus::Opts::new("b", "b"), &["provider", "model"]);
        Breakers::new(cfg, gauge.unwrap())
    }

    fn report(b: &Arc<Breaker>, outcome: Outcome) {
        match b.admit() {
            Admission::Pass(t) => t.report(outcome),
            Admission::Refused { .. } => panic!("refused"),
        }
    }

    fn series(all: &Breakers, model: &str) -> i64 {
        all.gauge.with_label_values(&["p", model]).get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_patterns_series_shows_the_worst_state_of_its_live_breakers() {
        let all = breakers();
        let x = all.get("p", "m-x", "m*").unwrap();
        report(&x, Outcome::Failure);
        report(&x, Outcome::Failure);
        assert_eq!(series(&all, "m*"), 1, "x is open");
        // A new breaker under the pattern, and a success on it, leave x's open state shown.
        let y = all.get("p", "m-y", "m*").unwrap();
        report(&y, Outcome::Success);
        assert_eq!(series(&all, "m*"), 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        let Admission::Pass(probe) = x.admit() else {
            panic!("no probe");
        };
        assert_eq!(series(&all, "m*"), 2, "x is half-open");
        probe.report(Outcome::Success);
        assert_eq!(series(&all, "m*"), 0);

        // An open breaker forgotten (the least recently used) no longer counts.
        // y's one success and one failure are two calls, half of them failed: it opens.
        report(&y, Outcome::Failure);
        assert_eq!(series(&all, "m*"), 1);
        drop((x, y));
        for i in 0..MAX_UNCONFIGURED_BREAKERS {
            all.get("p", &format!("other-{i}"), "other");
        }
        assert_eq!(all.snapshot().len(), MAX_UNCONFIGURED_BREAKERS);
        assert_eq!(series(&all, "m*"), 0);
    }

    /// A removed provider's breakers leave the metrics: its exact models' series and its
    /// patterns' shared series; another provider's stay.
    #[tokio::test(start_paused = true)]
    async fn a_removed_providers_series_are_removed_with_its_breakers() {
        let all = breakers();
        let _exact = all.get("p", "m-1", "m-1").unwrap();
        let _pattern = all.get("p", "m-x", "m*").unwrap();
        let _other = all.get("q", "m-1", "m-1").unwrap();
        use prometheus::core::Collector;
        let exported = |all: &Breakers| {
            let mut labels: Vec<String> = all
                .gauge
                .collect()
                .iter()
                .flat_map(|f| f.get_metric().iter())
                .map(|m| {
                    let l = m.get_label();
                    format!("{}:{}", l[1].value(), l[0].value())
                })
                .collect();
            labels.sort();
            labels
        };
        assert_eq!(exported(&all), ["p:m*", "p:m-1", "q:m-1"]);
        all.forget_removed("p");
        assert_eq!(exported(&all), ["q:m-1"]);
        assert_eq!(all.snapshot().len(), 1);
        // A request still running on the old config makes none again...
        assert!(all.get("p", "m-1", "m-1").is_none());
        assert!(all.get("p", "m-y", "m*").is_none());
        assert_eq!(exported(&all), ["q:m-1"]);
        // ...until a config brings the provider back.
        all.providers_now(|p| p == "p");
        assert!(all.get("p", "m-1", "m-1").is_some());
        assert_eq!(exported(&all), ["p:m-1", "q:m-1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_exactly_configured_model_owns_its_series_and_is_never_forgotten() {
        let all = breakers();
        let exact = all.get("p", "m-1", "m-1").unwrap();
        report(&exact, Outcome::Failure);
        report(&exact, Outcome::Failure);
        drop(exact);
        for i in 0..=MAX_UNCONFIGURED_BREAKERS {
            all.get("p", &format!("m-1-{i}"), "m*");
        }
        assert_eq!(series(&all, "m-1"), 1);
        assert_eq!(series(&all, "m*"), 0);
        let listed = all.snapshot();
        assert_eq!(listed.len(), MAX_UNCONFIGURED_BREAKERS + 1);
        assert!(matches!(listed[0], (ref k, State::Open { .. }) if k == "p:m-1"));
    }
}

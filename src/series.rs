//! Metric series handles, resolved once per label combination. `with_label_values` hashes
//! every label value with SipHash and takes the vector's lock on each call, and a request asked
//! for about a dozen of them, the same few combinations again and again. Here the handles a
//! request uses are kept in groups keyed by what the request path knows at that point: one
//! lookup (a cheap hash, a read lock) gives all of an upstream step's series, or all of a
//! request's.
//!
//! Nothing changes in what is exported: a group resolves each of its series lazily, at its
//! first use, exactly where `with_label_values` used to create it, so `/metrics` lists the
//! same series with the same values. Keys are label values that are already bounded by config
//! (`route::Labels`, provider names, the API kinds); each cache also keeps at most `CAP`
//! groups, past which a group is built for one use and not kept (a reload may bring new names).

use std::hash::Hasher;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use hashbrown::HashTable;
use prometheus::{Counter, Histogram, IntCounter, IntGauge};
use rustc_hash::FxHasher;

use crate::telemetry::Metrics;

/// Groups kept per cache: far above what a config names, small enough to be no concern.
pub const CAP: usize = 4096;

/// Label values → a group of handles.
pub struct Cache<V> {
    table: RwLock<HashTable<Entry<V>>>,
}

/// A group and the label values it was made for.
type Entry<V> = (Box<[Box<str>]>, V);

impl<V> Default for Cache<V> {
    fn default() -> Self {
        Cache {
            table: RwLock::new(HashTable::new()),
        }
    }
}

impl<V: Clone> Cache<V> {
    /// The group for `labels`, made by `make` the first time.
    pub fn get(&self, labels: &[&str], make: impl FnOnce() -> V) -> V {
        let hash = hash_labels(labels);
        let same = |(k, _): &Entry<V>| {
            k.len() == labels.len() && k.iter().zip(labels).all(|(a, b)| **a == **b)
        };
        if let Some((_, v)) = self.table.read().find(hash, same) {
            return v.clone();
        }
        let mut table = self.table.write();
        if let Some((_, v)) = table.find(hash, same) {
            return v.clone();
        }
        let v = make();
        if table.len() < CAP {
            let key = labels.iter().map(|l| Box::<str>::from(*l)).collect();
            table.insert_unique(hash, (key, v.clone()), |(k, _)| hash_labels(k));
        }
        v
    }

    /// Groups kept.
    pub fn len(&self) -> usize {
        self.table.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn hash_labels<S: AsRef<str>>(labels: &[S]) -> u64 {
    let mut h = FxHasher::default();
    for l in labels {
        h.write(l.as_ref().as_bytes());
        // Separates ("ab", "c") from ("a", "bc").
        h.write_u8(0xff);
    }
    h.finish()
}

/// The request path's caches, one per group kind.
#[derive(Default)]
pub struct Series {
    steps: Cache<Arc<StepSeries>>,
    usage: Cache<Arc<UsageSeries>>,
    requests: Cache<Arc<RequestSeries>>,
    /// By API, in `API_LABELS`' order.
    overhead: [OnceLock<Histogram>; API_LABELS.len()],
}

/// The `api` label values.
const API_LABELS: [&str; 3] = ["anthropic", "openai", "responses"];

impl Series {
    /// An upstream step's series: provider and model label.
    pub fn step(&self, provider: &str, model: &str) -> Arc<StepSeries> {
        self.steps.get(&[provider, model], || {
            Arc::new(StepSeries {
                provider: provider.into(),
                model: model.into(),
                ..Default::default()
            })
        })
    }

    /// Token and cost series: tenant, provider and model label.
    pub fn usage(&self, tenant: &str, provider: &str, model: &str) -> Arc<UsageSeries> {
        self.usage.get(&[tenant, provider, model], || {
            Arc::new(UsageSeries {
                labels: [tenant.into(), provider.into(), model.into()],
                ..Default::default()
            })
        })
    }

    /// A request's own series: API, model label and tenant label.
    pub fn request(&self, api: &str, model: &str, tenant: &str) -> Arc<RequestSeries> {
        self.requests.get(&[api, model, tenant], || {
            Arc::new(RequestSeries {
                labels: [api.into(), model.into(), tenant.into()],
                ..Default::default()
            })
        })
    }

    /// `legate_overhead_seconds` for an API.
    pub fn overhead(&self, m: &Metrics, api: &str) -> Histogram {
        let resolve = || m.overhead.with_label_values(&[api]);
        match API_LABELS.iter().position(|a| *a == api) {
            Some(i) => self.overhead[i].get_or_init(resolve).clone(),
            None => resolve(),
        }
    }
}

/// The outcomes of `legate_upstream_attempts_total` (`policy::judge`), each kept once.
const OUTCOMES: [&str; 6] = [
    "ok",
    "retryable",
    "fatal",
    "timeout",
    "connect_error",
    "breaker_open",
];

/// The series of one (provider, model label).
#[derive(Default)]
pub struct StepSeries {
    provider: Box<str>,
    model: Box<str>,
    attempts: [OnceLock<IntCounter>; OUTCOMES.len()],
    retries: OnceLock<IntCounter>,
    duration: OnceLock<Histogram>,
    ttft: OnceLock<Histogram>,
    inflight: OnceLock<IntGauge>,
    estimate_ratio: OnceLock<Histogram>,
}

impl StepSeries {
    /// Counts an attempt with `outcome` in `legate_upstream_attempts_total`.
    pub fn count_attempt(&self, m: &Metrics, outcome: &str) {
        let resolve = || {
            m.upstream_attempts
                .with_label_values(&[&self.provider, &self.model, outcome])
        };
        match OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => self.attempts[i].get_or_init(resolve).inc(),
            None => resolve().inc(),
        }
    }

    pub fn retries(&self, m: &Metrics) -> &IntCounter {
        self.retries
            .get_or_init(|| m.retries.with_label_values(&[&self.provider, &self.model]))
    }

    pub fn upstream_duration(&self, m: &Metrics) -> &Histogram {
        self.duration.get_or_init(|| {
            m.upstream_duration
                .with_label_values(&[&self.provider, &self.model])
        })
    }

    pub fn ttft(&self, m: &Metrics) -> &Histogram {
        self.ttft
            .get_or_init(|| m.ttft.with_label_values(&[&self.provider, &self.model]))
    }

    /// `legate_inflight_requests` of the provider.
    pub fn inflight(&self, m: &Metrics) -> &IntGauge {
        self.inflight
            .get_or_init(|| m.inflight.with_label_values(&[&self.provider]))
    }

    /// `legate_token_estimate_ratio` of the provider.
    pub fn estimate_ratio(&self, m: &Metrics) -> &Histogram {
        self.estimate_ratio
            .get_or_init(|| m.token_estimate_ratio.with_label_values(&[&self.provider]))
    }
}

/// The token kinds of `legate_tokens_total`, in `Usage`'s order.
const KINDS: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

/// The token and cost series of one (tenant, provider, model label).
#[derive(Default)]
pub struct UsageSeries {
    labels: [Box<str>; 3],
    tokens: OnceLock<[IntCounter; 4]>,
    cost: OnceLock<Counter>,
}

impl UsageSeries {
    /// input, output, cache_read, cache_write.
    pub fn tokens(&self, m: &Metrics) -> &[IntCounter; 4] {
        self.tokens.get_or_init(|| {
            let [t, p, model] = &self.labels;
            KINDS.map(|kind| m.tokens.with_label_values(&[t, p, model, kind]))
        })
    }

    pub fn cost(&self, m: &Metrics) -> &Counter {
        self.cost.get_or_init(|| {
            let [t, p, model] = &self.labels;
            m.cost.with_label_values(&[t, p, model])
        })
    }
}

/// The series of one (API, model label, tenant label): the request count of the common status
/// and the duration.
#[derive(Default)]
pub struct RequestSeries {
    labels: [Box<str>; 3],
    ok: OnceLock<IntCounter>,
    duration: OnceLock<Histogram>,
}

impl RequestSeries {
    /// Counts a request answered with `status` in `legate_requests_total`; only the handle
    /// of 200 is kept, the others are rare.
    pub fn count_request(&self, m: &Metrics, status: &str) {
        let [api, model, tenant] = &self.labels;
        let resolve = || m.requests.with_label_values(&[api, model, tenant, status]);
        if status == "200" {
            self.ok.get_or_init(resolve).inc();
        } else {
            resolve().inc();
        }
    }

    pub fn duration(&self, m: &Metrics) -> &Histogram {
        self.duration.get_or_init(|| {
            let [api, model, _] = &self.labels;
            m.request_duration.with_label_values(&[api, model])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_made_once_per_label_combination() {
        let cache: Cache<Arc<u32>> = Cache::default();
        let a = cache.get(&["p", "m"], || Arc::new(1));
        let b = cache.get(&["p", "m"], || Arc::new(2));
        assert!(Arc::ptr_eq(&a, &b));
        // The labels are told apart, not only their concatenation.
        let c = cache.get(&["pm", ""], || Arc::new(3));
        assert_eq!(*c, 3);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn past_the_cap_groups_are_built_and_not_kept() {
        let cache: Cache<usize> = Cache::default();
        for i in 0..CAP + 10 {
            let key = i.to_string();
            assert_eq!(cache.get(&[&key], || i), i);
        }
        assert_eq!(cache.len(), CAP);
        let key = (CAP + 5).to_string();
        assert_eq!(cache.get(&[&key], || 7), 7);
    }

    #[test]
    fn series_are_created_at_first_use_only() {
        let registry = prometheus::Registry::new();
        let m = Metrics::new(&registry).unwrap_or_else(|e| panic!("{e}"));
        let step = m.series.step("anthropic", "claude");
        let usage = m.series.usage("default", "anthropic", "claude");
        assert!(!crate::telemetry::render(&registry).contains("legate_tokens_total{"));
        usage.tokens(&m)[1].inc_by(3);
        step.count_attempt(&m, "ok");
        step.count_attempt(&m, "ok");
        let text = crate::telemetry::render(&registry);
        assert!(text.contains(
            "legate_tokens_total{kind=\"output\",model=\"claude\",provider=\"anthropic\",tenant=\"default\"} 3"
        ));
        assert!(text.contains(
            "legate_upstream_attempts_total{model=\"claude\",outcome=\"ok\",provider=\"anthropic\"} 2"
        ));
        assert!(!text.contains("legate_cost_usd_total{"));
        assert!(!text.contains("legate_retries_total{"));
    }
}

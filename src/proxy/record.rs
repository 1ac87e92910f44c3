//! Accounting for one request: exactly one `legate_requests_total` sample per request, with
//! status 499 when the caller went away before the answer was complete (recorded from `Drop`,
//! so a cancelled future or a dropped response body is never lost), plus usage and cost.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use crate::meter::{Ledger, Price};
use crate::policy::ratelimit::Reservation;
use crate::series::{StepSeries, UsageSeries};
use crate::telemetry::Metrics;
use crate::usage::Usage;

/// Status recorded for a caller that disconnected before the response was complete.
pub const CLIENT_GONE: u16 = 499;

pub struct RequestRecord {
    metrics: Arc<Metrics>,
    api: &'static str,
    /// The model and tenant labels, once known (`other` and `default` until then: nothing
    /// is allocated for them up front).
    model: Option<Arc<str>>,
    tenant: Option<Cow<'static, str>>,
    started: Instant,
    /// Set once the outcome is known; `None` at drop means the caller went away.
    status: Option<u16>,
    gone: bool,
    recorded: bool,
    /// The tenant's token/budget reservation, settled with the reported usage (or refunded in
    /// full if none is reported). Boxed: the record is moved with the request through its
    /// layers, and a copy past 256 bytes takes memcpy's longer loop (the reservation is 112).
    reservation: Option<Box<Reservation>>,
    /// The request's facts for the access log, journal and traces.
    obs: Option<crate::observe::RequestObs>,
    /// Tokens and cost reported by attempts that failed before their commit point: the tenant
    /// is charged for them too, whatever the request's outcome.
    earlier: (u64, u128),
    /// The same attempts' usage by kind: the request's record counts it with the served
    /// attempt's, so that the access log and journal add up to what was metered.
    earlier_usage: Usage,
}

// Moved with the request through its layers (into the request's box, out with its outcome):
// kept within the 256 bytes past which a copy takes memcpy's longer loop.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<RequestRecord>() <= 256);

impl RequestRecord {
    pub fn new(metrics: Arc<Metrics>, api: &'static str, started: Instant) -> Self {
        RequestRecord {
            metrics,
            api,
            model: None,
            tenant: None,
            started,
            status: None,
            gone: false,
            recorded: false,
            reservation: None,
            obs: None,
            earlier: (0, 0),
            earlier_usage: Usage::default(),
        }
    }

    /// Reports this request's outcome, usage and cost to `obs` too.
    pub fn observe(&mut self, obs: crate::observe::RequestObs) {
        self.obs = Some(obs);
    }

    /// The first content event reached the caller now.
    pub fn first_content(&self) {
        if let Some(o) = &self.obs {
            let ttft = self.started.elapsed();
            o.update(|f| {
                f.ttft.get_or_insert(ttft);
            });
        }
    }

    pub fn reserve(&mut self, r: Reservation) {
        self.reservation = Some(Box::new(r));
    }

    /// An attempt failed before its commit point after the provider reported `usage` (cost
    /// `cost_pico`): charged to the tenant when the reservation is settled.
    pub fn charge_attempt(&mut self, usage: Usage, cost_pico: u128) {
        self.earlier.0 = self.earlier.0.saturating_add(usage.total());
        self.earlier.1 = self.earlier.1.saturating_add(cost_pico);
        self.earlier_usage = self.earlier_usage.plus(usage);
        // Recorded now: a request whose every attempt fails is charged this, and its record
        // says so.
        if let Some(o) = &self.obs {
            let (usage, cost) = (self.earlier_usage, self.earlier.1);
            o.update(|f| {
                f.usage = Some(usage);
                f.cost_pico = Some(cost);
            });
        }
    }

    /// Nothing was sent upstream: legate refused the request itself (no platform credential,
    /// SPEC §13; shed; every breaker open; the deadline spent waiting). The request counts
    /// against none of the tenant's limits.
    pub fn never_sent(&mut self) {
        if let Some(r) = self.reservation.as_mut() {
            r.never_sent();
        }
    }

    /// An answer was served but its usage is unknown: the reservation stands as charged (plus
    /// what earlier attempts reported), its estimate spent at `price`, the answering step's.
    pub fn keep_reservation(&mut self, price: Option<crate::meter::Price>) {
        if let Some(r) = self.reservation.as_mut() {
            r.keep_plus(self.earlier.0, self.earlier.1, price);
        }
    }

    /// [`RequestRecord::keep_reservation`] for an answer whose usage a later call reports (a
    /// background response's), with what puts the tenant's daily budget right then.
    pub fn keep_reservation_until_known(
        &mut self,
        price: Option<crate::meter::Price>,
    ) -> Option<crate::policy::ratelimit::Resettle> {
        let later = self.reservation.as_mut()?.resettle(price);
        self.keep_reservation(price);
        later
    }

    /// Settles the reservation with what the provider reported to `sink`; `partial`: the
    /// report is not the final one (a stream cut before it), and the charge is at least what
    /// [`RequestRecord::keep_reservation`] would charge.
    pub fn settle(&mut self, usage: Usage, cost_pico: u128, sink: &UsageSink, partial: bool) {
        let estimated = self.reservation.as_ref().map(|r| r.estimated_input);
        let input = usage
            .input
            .saturating_add(usage.cache_read)
            .saturating_add(usage.cache_write);
        if let Some(o) = &self.obs {
            // The request's usage and cost: the failed attempts' and the served one's. The
            // estimate was of one attempt's input: it is compared with the served one's.
            let (all, cost) = (
                usage.plus(self.earlier_usage),
                cost_pico.saturating_add(self.earlier.1),
            );
            o.update(|f| {
                f.usage = Some(all);
                f.cost_pico = Some(cost);
                f.estimate_error = estimated.map(|e| e as i64 - input as i64);
            });
        }
        let Some(mut r) = self.reservation.take() else {
            return;
        };
        if input > 0 {
            sink.step
                .estimate_ratio(&self.metrics)
                .observe(r.estimated_input as f64 / input as f64);
        }
        let used = (
            input + usage.output + self.earlier.0,
            cost_pico + self.earlier.1,
        );
        if partial {
            r.settle_at_least(used, self.earlier, sink.price);
        } else {
            r.settle(used.0, used.1);
        }
    }

    /// The model's label, shared with the config's labels (None: `other`).
    pub fn set_model(&mut self, label: Option<Arc<str>>) {
        self.model = label;
    }

    /// The tenant's label, noted in the request's facts when the record is written (in the
    /// same update as the status: nothing reads the facts before the request is reported,
    /// which is after the record's write).
    pub fn set_tenant(&mut self, label: &str) {
        self.tenant = Some(crate::route::tenant_name(label));
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Records the request as answered with `status` (now, for local and buffered answers),
    /// unless the caller was already seen to go away: that stays a 499.
    pub fn finish(self, status: u16) {
        self.finish_at(status, Instant::now());
    }

    /// `finish`, the request ended at `at` (the caller's reading of the clock).
    pub fn finish_at(self, status: u16, at: Instant) {
        self.finish_noting(status, at, |_| {});
    }

    /// `finish_at`, with `more` noted in the request's facts in the same update as the
    /// record's own.
    pub fn finish_noting(
        mut self,
        status: u16,
        at: Instant,
        more: impl FnOnce(&mut crate::observe::facts::Facts),
    ) {
        if !self.gone {
            self.status = Some(status);
        }
        self.write_at(at, more);
    }

    /// Names what ended the request, when it is legate's own doing rather than what its
    /// status says (a stream ended by shutdown is not the provider's failure).
    pub fn error_kind(&self, kind: &'static str) {
        if let Some(o) = &self.obs {
            o.update(|f| f.error_type = Some(kind));
        }
    }

    /// Marks the answer as cut short by the caller.
    pub fn client_gone(&mut self) {
        self.gone = true;
        self.status = None;
    }

    fn write(&mut self) {
        // Not after `finish_at`, as on every answered request: the clock read for nothing
        // cost about 30 ns (bench/README.md, "Clock reads").
        if !self.recorded {
            self.write_at(Instant::now(), |_| {});
        }
    }

    fn write_at(&mut self, at: Instant, more: impl FnOnce(&mut crate::observe::facts::Facts)) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        let status = status_label(self.status.unwrap_or(CLIENT_GONE));
        let m = &self.metrics;
        let series = m.series.request(self.api, self.model(), self.tenant());
        series.count_request(m, &status);
        let elapsed = at.saturating_duration_since(self.started);
        series.duration(m).observe(elapsed.as_secs_f64());
        if let Some(o) = self.obs.take() {
            let status = self.status;
            let tenant = &self.tenant;
            o.update(|f| {
                f.status = status;
                f.duration = Some(elapsed);
                if let Some(t) = tenant {
                    f.tenant = t.clone();
                }
                more(f);
            });
        }
    }

    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or("default")
    }

    fn model(&self) -> &str {
        self.model.as_deref().unwrap_or("other")
    }
}

/// The status as a label value, without formatting the common ones.
fn status_label(status: u16) -> std::borrow::Cow<'static, str> {
    let known = match status {
        200 => "200",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        413 => "413",
        429 => "429",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        529 => "529",
        other => return other.to_string().into(),
    };
    known.into()
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        // Not settled: no attempt served (or reported usage); what the failed ones reported
        // is charged all the same, the rest of the reservation refunded.
        if let Some(mut r) = self.reservation.take()
            && self.earlier != (0, 0)
        {
            r.settle(self.earlier.0, self.earlier.1);
        }
        self.write();
    }
}

/// One upstream exchange in `legate_inflight_requests`: counted while it lives, on every path
/// (a future dropped because the caller went away included).
pub struct InflightGuard(prometheus::IntGauge);

impl InflightGuard {
    pub fn new(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        InflightGuard(gauge)
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Where a response's usage goes once the response has been read to its end.
#[derive(Clone)]
pub struct UsageSink {
    pub metrics: Arc<Metrics>,
    pub ledger: Arc<Ledger>,
    pub tenant: Cow<'static, str>,
    /// The step's series (provider, upstream model as a bounded label).
    pub step: Arc<StepSeries>,
    /// The token and cost series of the tenant, provider and model label.
    pub series: Arc<UsageSeries>,
    /// `provider:model`, the ledger and price key (the step's own, shared).
    pub target: Arc<str>,
    /// Whether the config names the model (its ledger entry is kept apart from other names).
    pub named: crate::meter::Named,
    pub price: Option<Price>,
    /// The `max_tokens` the request asked for, if it named one: the most output it is
    /// counted for ([`Usage::bounded`]).
    pub max_output: Option<u64>,
    /// A generation (not a token count): an answer without usage counts as a request.
    pub generation: bool,
}

impl UsageSink {
    /// Records a served request's usage in metrics and the ledger; returns its cost in pico-USD.
    pub fn record(&self, usage: Usage) -> u128 {
        let cost = self.metrics(usage);
        self.ledger
            .record(&self.tenant, (&self.target, self.named), usage, cost);
        cost
    }

    /// Records a served request whose usage the provider did not report (a compatible server
    /// that ignores `include_usage`): counted in the ledger's requests, with no tokens or cost
    /// (the ledger counts reported usage only). It was left out of the ledger altogether.
    pub fn record_unreported(&self) {
        // A count is no generation: the ledger's requests are generations.
        if !self.generation {
            return;
        }
        self.ledger.record(
            &self.tenant,
            (&self.target, self.named),
            Usage::default(),
            0,
        );
    }

    /// Records the usage of an attempt that failed before its commit point (no request is
    /// counted for it); returns its cost in pico-USD.
    pub fn record_unserved(&self, usage: Usage) -> u128 {
        let cost = self.metrics(usage);
        self.ledger
            .record_unserved(&self.tenant, (&self.target, self.named), usage, cost);
        cost
    }

    /// The token and cost metrics for `usage`; returns its cost in pico-USD.
    fn metrics(&self, usage: Usage) -> u128 {
        let m = &self.metrics;
        let [input, output, cache_read, cache_write] = self.series.tokens(m);
        input.inc_by(usage.input);
        output.inc_by(usage.output);
        cache_read.inc_by(usage.cache_read);
        cache_write.inc_by(usage.cache_write);
        let cost = self.price.map(|p| usage.cost_pico(&p)).unwrap_or(0);
        if cost > 0 {
            self.series
                .cost(m)
                .inc_by(cost as f64 / crate::meter::PICO_PER_USD as f64);
        }
        cost
    }
}

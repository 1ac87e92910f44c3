//! The chain executor: the whole failure policy acted on in one place. For each step of the
//! model's chain: ask its breaker, fit the body, and make up to `max_attempts` exchanges with
//! the step's upstream. `policy::judge` says what each exchange's outcome means; this file
//! alone acts on it — commit the answer, wait (the upstream's retry-after or a jittered
//! backoff, within the deadline and the retry budget) and try again, move on to the next step,
//! or give up — and reports the outcome to the step's breaker. Availability failures (retries
//! spent on retryable errors, an open breaker, a retry-after longer than `max_retry_after`, a
//! timeout) move on to the next step; a final answer (success, or a 4xx that another try
//! would only repeat) is returned at once — a fallback must never route around a refusal.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use crate::api::Operation;
use crate::config::{ApiKind, ChainStep};
use crate::error::ProxyError;
use crate::policy::breaker::{Admission, Breaker, Outcome, Ticket};
use crate::policy::judge::{self, Action, Context, GiveUp, Report, Verdict};
use crate::policy::retry::Backoff;
use crate::proxy::answer;
use crate::proxy::conversation;
use crate::proxy::estimate;
use crate::proxy::exchange::{self, Call, Exchanged, Spent};
use crate::proxy::record::RequestRecord;
use crate::proxy::response::ProxyBody;
use crate::proxy::{Inbound, Proxy, Snapshot};
use crate::route;
use crate::translate::Xlate;

/// Looked up by name: a `&str` name is parsed on every lookup.
const FALLBACK: http::HeaderName = http::HeaderName::from_static("x-legate-fallback");

/// What failed last, to be reported if no step can answer.
enum Failure {
    /// An upstream error response, read whole (small), returned as it is.
    Response(Response<ProxyBody>),
    /// No usable response (connection, timeout, broken stream).
    Error(ProxyError),
}

/// Running state of one request's execution.
struct Exec {
    spent: Spent,
    last: Option<Failure>,
    any_admitted: bool,
    earliest_probe: Option<Instant>,
    /// The chain step being tried, from 1 (for the journal and traces).
    step_no: usize,
}

enum StepEnd {
    Answer(Response<ProxyBody>),
    Unavailable,
}

/// Runs the chain for one request; `spent` says what it cost, whatever the result.
pub(super) async fn run(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: &Inbound,
    record: &mut Option<RequestRecord>,
    spent: &mut Spent,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut exec = Exec {
        // What the request spent before the chain (the wait for its body) stays counted.
        spent: *spent,
        last: None,
        any_admitted: false,
        earliest_probe: None,
        step_no: 0,
    };
    // Past `shutdown_grace` a request still without an answer is given one (503), rather
    // than having its connection dropped; the attempts it made are still reported. Cost,
    // measured: about 60 instructions per request (registering on the token's waiter list, a
    // lock shared with the requests in flight, and leaving it), against the request's 43k.
    let result = tokio::select! {
        biased;
        r = execute(proxy, snap, inb, record, &mut exec) => r,
        () = proxy.abort_streams.cancelled() => {
            // The wait the abort cut short was the provider's, not legate's.
            exec.spent.come_back(Instant::now());
            Err(ProxyError::ShuttingDown)
        }
    };
    *spent = exec.spent;
    result
}

async fn execute(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: &Inbound,
    record: &mut Option<RequestRecord>,
    exec: &mut Exec,
) -> Result<Response<ProxyBody>, ProxyError> {
    let resolved = route::resolve(&snap.cfg, inb.endpoint.api, &inb.meta.model)?;
    let fallback_off = inb
        .headers
        .get(&FALLBACK)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"off"));
    let steps = if fallback_off {
        &resolved.steps()[..1]
    } else {
        resolved.steps()
    };
    let requested = snap.labels.model(&inb.meta.model);
    // One reading of the clock for the deposit and the first step's deadline check: nothing
    // waits between them.
    let first = Instant::now();
    proxy.budget.deposit_at(first);
    for (i, step) in steps.iter().enumerate() {
        // Nothing is sent once the deadline has passed: its answer could not be waited for,
        // and the provider would make it all the same (a later step after a slow failure, or
        // `x-legate-deadline-ms: 0`).
        let now = if i == 0 { first } else { Instant::now() };
        if now >= inb.deadline {
            return Err(ProxyError::DeadlineExceeded);
        }
        if i > 0 {
            let from = steps[i - 1].target();
            // A `provider:*` step's model is the caller's: labelled by the bounded model
            // label (the pattern it matched, or `other`), as every other series is.
            let label =
                |s: &ChainStep| format!("{}:{}", s.provider(), snap.labels.model(s.model()));
            proxy
                .metrics
                .fallbacks
                .with_label_values(&[requested, &label(&steps[i - 1]), &label(step)])
                .inc();
            tracing::info!(from = %from, to = %step.target(), "falling back to the next chain step");
        }
        exec.step_no = i + 1;
        let later = &steps[i + 1..];
        if let StepEnd::Answer(resp) =
            run_step(proxy, snap, inb, (step, later), exec, record).await?
        {
            return Ok(resp);
        }
    }
    if !exec.any_admitted {
        let until = exec.earliest_probe.unwrap_or_else(Instant::now);
        return Err(ProxyError::AllBreakersOpen {
            retry_after: until.saturating_duration_since(Instant::now()),
        });
    }
    match exec.last.take() {
        Some(Failure::Response(resp)) => Ok(resp),
        Some(Failure::Error(e)) => Err(e),
        None => Err(ProxyError::Internal),
    }
}

/// The caller's body in the step's API, fitted to the step (model and max_tokens, capped at
/// the model's output limit `limit`).
/// Bodies from this size on are translated on a blocking thread. A translation walks the
/// whole body and writes another (on the development VM from about 6 ms per MB for a few long
/// messages to 50 for many small items): on the worker it would hold up every other request
/// of the worker's connections for that long, as a coding agent's long context does on each
/// turn. Below it the hand-over costs more than it saves.
const TRANSLATE_APART: usize = 256 << 10;

async fn translated_body(
    proxy: &Proxy,
    inb: &Inbound,
    step: &ChainStep,
    (xl, upstream): (Xlate, ApiKind),
    limit: Option<u64>,
) -> Result<bytes::Bytes, String> {
    let (bytes, dropped) = if inb.body.len() < TRANSLATE_APART {
        conversation::translate_request(xl, inb, step.model())?
    } else {
        let (body, conv) = (inb.body.clone(), inb.conversation.clone());
        let model = step.model().to_owned();
        tokio::task::spawn_blocking(move || {
            conversation::translate_body(xl, conv.as_deref(), &body, &model)
        })
        .await
        .map_err(|_| "the translation was interrupted".to_owned())??
    };
    let (from, to) = (inb.endpoint.api.as_str(), upstream.as_str());
    for what in dropped {
        proxy
            .metrics
            .translation_drops
            .with_label_values(&[from, to, what])
            .inc();
    }
    let meta = upstream
        .dialect()
        .parse_request(&bytes)
        .map_err(|e| e.to_string())?;
    route::fit(&bytes::Bytes::from(bytes), &meta, step, upstream, limit).map_err(|e| e.message())
}

/// A step that cannot honour the request is not sent to: the next one may. If none can, the
/// caller learns why.
fn unfit(inb: &Inbound, exec: &mut Exec, step: &ChainStep, why: &str) -> StepEnd {
    tracing::info!(step = %step.target(), reason = %why, "request not translatable for this step");
    inb.obs.passed_over(exec.step_no, step, "unfit", why);
    exec.any_admitted = true;
    if exec.last.is_none() {
        // A translated step cannot continue a response legate does not hold: the caller is
        // told so as OpenAI tells it, whatever else the step could not honour.
        let error = match inb.conversation.as_deref() {
            Some(c) if c.prior.is_none() && c.prior_id.is_some() => {
                ProxyError::PreviousResponseNotFound {
                    id: c.prior_id.clone().unwrap_or_default(),
                }
            }
            _ => ProxyError::InvalidRequest {
                message: format!(
                    "this request cannot be served by {} (another API): {why}",
                    step.target()
                ),
            },
        };
        exec.last = Some(Failure::Error(error));
    }
    StepEnd::Unavailable
}

/// The body for a step speaking `upstream`: the caller's own, fitted, or translated into the
/// step's API; or how
/// the step ends without a call (count_tokens estimated locally for a step of another API, or
/// a step that cannot honour the request).
async fn step_body(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: &Inbound,
    (step, last): (&ChainStep, bool),
    (upstream, on_platform): (ApiKind, bool),
    exec: &mut Exec,
) -> Result<Result<bytes::Bytes, StepEnd>, ProxyError> {
    let xl = Xlate::between(inb.endpoint.api, upstream);
    // When legate chose the model (an alias, a fallback, a translated step), max_tokens is
    // capped at what that model accepts; a caller naming the model itself is sent as it asked.
    let limit = (xl.translating() || step.model() != &*inb.meta.model)
        .then(|| crate::limits::max_output_tokens(&snap.cfg.limits, step.model()))
        .flatten();
    // A cloud platform serves no count endpoint: its count is estimated, as a translated
    // step's is.
    let counting = inb.endpoint.op == Operation::CountTokens;
    let estimated = counting && on_platform;
    if !xl.translating() && !estimated {
        // Most requests go as they came; only a response this step's provider did not make
        // (a translated one, or another provider's) is rebuilt.
        let Some(conv) = conversation::rebuilding(inb, step.provider()) else {
            return route::fit(&inb.body, &inb.meta, step, upstream, limit).map(Ok);
        };
        let fitted = conversation::rebuilt_body(conv, inb, step, upstream, limit).await?;
        return Ok(fitted.map_err(|why| unfit(inb, exec, step, &why)));
    }
    if counting {
        return Ok(Err(
            match estimate::answer(inb, (step, last), upstream, &proxy.estimates).await? {
                Ok(resp) => StepEnd::Answer(resp),
                Err(why) => unfit(inb, exec, step, &why),
            },
        ));
    }
    Ok(translated_body(proxy, inb, step, (xl, upstream), limit)
        .await
        .map_err(|why| unfit(inb, exec, step, &why)))
}

/// An OpenAI stream whose caller did not ask for usage asks for it upstream, so that it is
/// metered (SPEC §6); true when the exchange must take it out of the caller's stream again.
/// A translated step asks for it on its own, and its translator consumes it.
fn ask_for_usage(inb: &Inbound, spoken: ApiKind, body: bytes::Bytes) -> (bytes::Bytes, bool) {
    let unasked = inb.endpoint.api == ApiKind::OpenAi
        && spoken == ApiKind::OpenAi
        && inb.endpoint.op == Operation::Generate
        && inb.meta.stream
        && !inb.meta.include_usage;
    if !unasked {
        return (body, false);
    }
    match crate::api::openai_chat::unasked::ask_for_usage(&body) {
        Some(asked) => (bytes::Bytes::from(asked), true),
        None => (body, false),
    }
}

/// One chain step: its body prepared (or the step passed over), then its attempts.
async fn run_step(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: &Inbound,
    (step, later): (&ChainStep, &[ChainStep]),
    exec: &mut Exec,
    record: &mut Option<RequestRecord>,
) -> Result<StepEnd, ProxyError> {
    let up = snap
        .upstreams
        .get(step.provider())
        .ok_or(ProxyError::Internal)?;
    let spoken = up.speaks(inb.endpoint.api);
    let on_platform = up.cloud.is_some();
    let last = later.is_empty();
    let body = match step_body(proxy, snap, inb, (step, last), (spoken, on_platform), exec).await? {
        Ok(body) => body,
        Err(end) => return Ok(end),
    };
    let (body, strip_usage) = ask_for_usage(inb, spoken, body);
    let model_label = snap.labels.model(step.model());
    let breaker = proxy
        .breakers
        .get(step.provider(), step.model(), model_label);
    let mut call = Call {
        proxy,
        snap,
        up,
        step,
        model_label,
        series: proxy.metrics.series.step(step.provider(), model_label),
        inb,
        body,
        strip_usage,
        traceparent: None,
        can_fall_back: up.cloud.is_some() && later_may_serve(proxy, snap, later),
        probe: false,
    };
    let end = attempts(&mut call, breaker.as_ref(), exec, record).await?;
    // Counted once the step answers: a translated request its breaker or its failures pass
    // over was not served by the other API.
    if matches!(end, StepEnd::Answer(_)) && Xlate::between(inb.endpoint.api, spoken).translating() {
        proxy
            .metrics
            .translated
            .with_label_values(&[inb.endpoint.api.as_str(), spoken.as_str()])
            .inc();
    }
    Ok(end)
}

/// Whether a later step's breaker would let a call through now. Only then is a platform
/// credential still being fetched for this step waited on briefly: with every later step's
/// breaker open, a slow first fetch is the request's only chance, and is waited for until the
/// deadline. (Checked once per step, and only for a platform step.)
fn later_may_serve(proxy: &Proxy, snap: &Snapshot, later: &[ChainStep]) -> bool {
    later.iter().any(|s| {
        proxy
            .breakers
            .get(s.provider(), s.model(), snap.labels.model(s.model()))
            .is_none_or(|b| b.would_admit())
    })
}

/// Up to `max_attempts` exchanges with the step's upstream, each let through by its breaker,
/// until one is committed or the judge, the deadline or the retry budget ends the step.
async fn attempts(
    call: &mut Call<'_>,
    breaker: Option<&Arc<Breaker>>,
    exec: &mut Exec,
    record: &mut Option<RequestRecord>,
) -> Result<StepEnd, ProxyError> {
    let (proxy, inb, step) = (call.proxy, call.inb, call.step);
    let retry = &call.snap.cfg.retry;
    // The upstream outlives `call`'s borrow: its host is read once for all attempts.
    let up: &crate::upstream::Upstream = call.up;
    let server = up.host.as_ref();
    let series = call.series.clone();
    let count = |label: &str| series.count_attempt(&proxy.metrics, label);
    let mut backoff = Backoff::new(retry);
    for n in 1..=retry.max_attempts {
        // The attempt's start, read once for its breaker and its journal entry.
        let now = Instant::now();
        let Some(ticket) = ticket((breaker, now), exec, inb, step, &count) else {
            return Ok(StepEnd::Unavailable);
        };
        if n > 1 {
            series.retries(&proxy.metrics).inc();
        }
        call.probe = ticket.is_probe();
        let server = server.cloned();
        let (exchanged, verdict, ended) =
            attempt(call, (n, now), server, exec, record, &count).await;
        let moved_on = MovedOn::after(&exchanged, n, retry.max_retry_after);
        let wait = match act(call, (exchanged, verdict, ended), ticket, exec, record)? {
            Next::Answer(resp) => return Ok(StepEnd::Answer(resp)),
            Next::Unavailable => {
                inb.obs.moved_on(moved_on.why());
                return Ok(StepEnd::Unavailable);
            }
            Next::Retry(wait) => wait,
        };
        let delay = wait.unwrap_or_else(|| backoff.next_delay());
        if !pause(proxy, inb, exec, delay).await {
            break;
        }
    }
    Ok(StepEnd::Unavailable)
}

/// Attempt `n`: one exchange, judged, counted and written to the journal; acting on the
/// verdict is the caller's.
async fn attempt(
    call: &mut Call<'_>,
    (n, started): (u32, Instant),
    server: Option<Arc<str>>,
    exec: &mut Exec,
    record: &mut Option<RequestRecord>,
    count: &(dyn Fn(&str) + Sync),
) -> (Exchanged, Verdict, Instant) {
    let (inb, retry) = (call.inb, &call.snap.cfg.retry);
    let mut scope = inb.obs.begin_attempt(
        (exec.step_no, call.step),
        call.up.kind,
        server,
        started.into_std(),
    );
    call.traceparent = scope.traceparent();
    let sent_before = exec.spent.attempts;
    exec.spent.take_back();
    let exchanged = exchange::run(call, &mut exec.spent, &mut scope, record).await;
    // The attempt's end, read once (by the exchange, as its wait ended, if it waited).
    let ended = exec.spent.take_back().unwrap_or_else(Instant::now);
    let verdict = judge::judge(
        exchanged.happened(),
        Context {
            deadline_passed: ended >= inb.deadline,
            last_attempt: n == retry.max_attempts,
            max_retry_after: retry.max_retry_after,
        },
    );
    if let Some(label) = verdict.label {
        count(label);
    }
    let (status, outcome, why) =
        crate::observe::request::journal_attempt(&exchanged, &verdict.action);
    // A call that never had a connection sent nothing, though it counts as an attempt.
    let never_connected = matches!(
        &exchanged,
        Exchanged::Unreachable(ProxyError::UpstreamUnreachable { failed, .. })
            if failed.never_connected()
    );
    scope.end(
        status,
        outcome,
        why,
        exec.spent.attempts > sent_before && !never_connected,
        ended.into_std(),
    );
    (exchanged, verdict, ended)
}

/// The step's breaker lets one more exchange through (its ticket), or it is open and the step
/// is passed over (None), remembering when it admits a probe again.
fn ticket(
    (breaker, now): (Option<&Arc<Breaker>>, Instant),
    exec: &mut Exec,
    inb: &Inbound,
    step: &ChainStep,
    count: &dyn Fn(&str),
) -> Option<Ticket> {
    let ticket = match breaker.map(|b| b.admit_at(now)) {
        Some(Admission::Refused { until }) => {
            count("breaker_open");
            exec.earliest_probe = Some(exec.earliest_probe.map_or(until, |e| e.min(until)));
            inb.obs.passed_over(
                exec.step_no,
                step,
                "breaker_open",
                "the circuit breaker is open",
            );
            return None;
        }
        Some(Admission::Pass(t)) => t,
        None => Ticket::unguarded(),
    };
    exec.any_admitted = true;
    Some(ticket)
}

/// Waits `delay` before the next try, if the deadline leaves time for it and the retry budget
/// pays for it; false (and why, in the journal) if not.
async fn pause(proxy: &Proxy, inb: &Inbound, exec: &mut Exec, delay: Duration) -> bool {
    if Instant::now() + delay >= inb.deadline {
        inb.obs
            .moved_on("the deadline leaves no time for another try");
        return false;
    }
    if !proxy.budget.try_withdraw() {
        inb.obs.moved_on("the retry budget is spent");
        return false;
    }
    exec.spent.leave(Instant::now());
    tokio::time::sleep(delay).await;
    exec.spent.come_back(Instant::now());
    true
}

/// What the step loop does after one verdict.
enum Next {
    Answer(Response<ProxyBody>),
    Retry(Option<Duration>),
    Unavailable,
}

/// Acts on one verdict: reports to the breaker, and commits the answer, keeps the failure for
/// later, or gives up.
fn act(
    call: &Call<'_>,
    (exchanged, verdict, ended): (Exchanged, Verdict, Instant),
    ticket: Ticket,
    exec: &mut Exec,
    record: &mut Option<RequestRecord>,
) -> Result<Next, ProxyError> {
    let report = |ticket: Ticket, outcome| {
        ticket.report_at(outcome, ended);
        None
    };
    let ticket = match verdict.breaker {
        // A committed stream's outcome is known when it ends: its body reports it.
        Report::AtStreamEnd => Some(ticket.committed()),
        Report::Success => report(ticket, Outcome::Success),
        Report::Failure => report(ticket, Outcome::Failure),
        Report::Neutral => report(ticket, Outcome::Neutral),
    };
    match verdict.action {
        Action::Commit => commit(call, exchanged, ticket, record).map(Next::Answer),
        Action::GiveUp(GiveUp::Deadline) => Err(ProxyError::DeadlineExceeded),
        Action::GiveUp(GiveUp::Shed) => Err(match exchanged {
            Exchanged::Shed(e) | Exchanged::Unheld { error: e, .. } => e,
            _ => ProxyError::Internal,
        }),
        Action::NextStep => {
            if let Exchanged::Unsendable(e) = &exchanged {
                tracing::warn!(step = %call.step.target(), error = e.kind(), "chain step cannot be called; trying the next");
            }
            exec.last = Some(failure(exchanged));
            Ok(Next::Unavailable)
        }
        Action::Retry { wait } => {
            exec.last = Some(failure(exchanged));
            Ok(Next::Retry(wait))
        }
    }
}

/// Why the chain leaves a step after this exchange, should the judge move on (journal): noted
/// before the exchange is acted on, written out only if the step is left.
enum MovedOn {
    Unsendable,
    /// Waiting that long is worse than a substitute answering now.
    RetryAfter(Duration),
    Spent(u32),
}

impl MovedOn {
    fn after(exchanged: &Exchanged, n: u32, max_retry_after: Duration) -> Self {
        match exchanged {
            Exchanged::Unsendable(_) => MovedOn::Unsendable,
            Exchanged::Error {
                retry_after: Some(w),
                ..
            } if *w > max_retry_after => MovedOn::RetryAfter(*w),
            _ => MovedOn::Spent(n),
        }
    }

    fn why(&self) -> String {
        match self {
            MovedOn::Unsendable => "this step cannot be called; trying the next".to_owned(),
            MovedOn::RetryAfter(w) => format!(
                "retry-after {}s is longer than max_retry_after",
                w.as_secs_f64().ceil()
            ),
            MovedOn::Spent(n) => format!("{n} attempts spent on retryable failures"),
        }
    }
}

/// The caller's response for a committed outcome.
fn commit(
    call: &Call<'_>,
    exchanged: Exchanged,
    ticket: Option<Ticket>,
    record: &mut Option<RequestRecord>,
) -> Result<Response<ProxyBody>, ProxyError> {
    match exchanged {
        Exchanged::Whole(resp) | Exchanged::Error { resp, .. } => Ok(resp),
        Exchanged::Stream(p) | Exchanged::WholeStreamed(p) => {
            Ok(answer::commit(call, *p, ticket, record))
        }
        // The judge commits answers only.
        _ => Err(ProxyError::Internal),
    }
}

/// What a failed exchange leaves to report if no later attempt or step answers.
fn failure(exchanged: Exchanged) -> Failure {
    match exchanged {
        Exchanged::Unsendable(e)
        | Exchanged::TimedOut(e)
        | Exchanged::Unreachable(e)
        | Exchanged::Broken(e) => Failure::Error(e),
        Exchanged::Error { resp, .. } => Failure::Response(resp),
        Exchanged::Deadline { .. } => Failure::Error(ProxyError::DeadlineExceeded),
        // The judge moves on from failures only; an answer here is legate's own error.
        Exchanged::Shed(_)
        | Exchanged::Unheld { .. }
        | Exchanged::Stream(_)
        | Exchanged::Whole(_)
        | Exchanged::WholeStreamed(_) => Failure::Error(ProxyError::Internal),
    }
}

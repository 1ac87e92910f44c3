//! One upstream exchange, and nothing but its I/O: build the request for the step's provider,
//! wait for pacing and a concurrency slot, send it within the first-byte timeout and the
//! deadline, and read the answer as far as a decision needs (a stream up to its commit point,
//! a whole success body, a small error body). It returns what happened as one enum; what that
//! means is `policy::judge`'s to say, and `proxy::chain` acts on it.

use std::time::{Duration, Instant as StdInstant, SystemTime};

use bytes::Bytes;
use http::response::Parts;
use http::{Method, Response, StatusCode, header};

use tokio::time::Instant;

use crate::api::{self, ApiKind, Operation};
use crate::cloud::cache::Wait;
use crate::config::ChainStep;
use crate::error::ProxyError;
use crate::policy::admission::Permit;
use crate::policy::judge::{self, Happened};
use crate::policy::retry;
use crate::proxy::answer::{self, Pending};
use crate::proxy::body::Mode;
use crate::proxy::buffers::{self, AnswerShare};
use crate::proxy::conversation;
use crate::proxy::record::{InflightGuard, RequestRecord};
use crate::proxy::response::ProxyBody;
use crate::proxy::upbody::{Raw, UpstreamBody};
use crate::proxy::upread::{self, PreCommit, Whole};
use crate::proxy::watch::SseWatch;
use crate::proxy::{Inbound, Proxy, Snapshot};
use crate::translate::Xlate;
use crate::upstream::{ResponseBody, Upstream};

/// What one exchange needs.
pub(crate) struct Call<'a> {
    pub(crate) proxy: &'a Proxy,
    pub(crate) snap: &'a Snapshot,
    pub(crate) up: &'a Upstream,
    pub(crate) step: &'a ChainStep,
    pub(crate) model_label: &'a str,
    /// The metric series of this step's provider and model label.
    pub(crate) series: std::sync::Arc<crate::series::StepSeries>,
    pub(crate) inb: &'a Inbound,
    pub(crate) body: Bytes,
    /// The upstream was asked for a usage chunk the caller did not ask for: it is taken out of
    /// the caller's stream.
    pub(crate) strip_usage: bool,
    /// `traceparent` for this attempt (export on): the attempt's span is the provider's parent.
    pub(crate) traceparent: Option<http::HeaderValue>,
    /// A later chain step may answer if this one cannot: a platform credential still being
    /// fetched is waited for only briefly (`cloud::cache::Wait::brief`).
    pub(crate) can_fall_back: bool,
    /// This attempt is its half-open breaker's one probe: it is not paced. Held in the
    /// pacer (a background call's wait may be minutes), the probe kept every other caller of
    /// the target refused, interactive ones included, until it went out.
    pub(crate) probe: bool,
}

/// Upstream attempts made and time spent outside legate (upstream waits, backoff), for the
/// response's headers and the overhead metric.
#[derive(Debug, Default, Clone, Copy)]
pub struct Spent {
    pub attempts: u32,
    pub outside: Duration,
    /// Since when the request has been waiting outside legate, if it is now: a wait cut short
    /// (by shutdown's grace) still counts as outside, not as legate's own time.
    away_since: Option<Instant>,
    /// When the last wait ended: the attempt's end, read once for its verdict, its breaker
    /// and its journal entry.
    back_at: Option<Instant>,
}

impl Spent {
    /// A wait outside legate begins (a turn at the provider, its answer, a backoff).
    pub(crate) fn leave(&mut self, at: Instant) {
        self.away_since = Some(at);
    }

    /// The wait begun by `leave` ends at `at`, and counts as outside.
    pub(crate) fn come_back(&mut self, at: Instant) {
        if let Some(since) = self.away_since.take() {
            self.outside += at.saturating_duration_since(since);
            self.back_at = Some(at);
        }
    }

    /// When the last wait ended, if one did since this was last asked.
    pub(crate) fn take_back(&mut self) -> Option<Instant> {
        self.back_at.take()
    }

    /// The wait begun by `leave` is not counted after all (a turn refused).
    pub(crate) fn stay(&mut self) {
        self.away_since = None;
    }
}

/// What happened in one exchange, with what the chain needs to act on it.
pub(crate) enum Exchanged {
    Unsendable(ProxyError),
    /// Shed by the provider's admission gate: given up, not retried.
    Shed(ProxyError),
    /// A success answer legate cannot hold (`BuffersFull`): the provider answered with
    /// `status`, and fetching it again would meet the same full memory; given up, not retried.
    Unheld {
        status: u16,
        error: ProxyError,
    },
    Deadline {
        in_flight: bool,
    },
    TimedOut(ProxyError),
    Unreachable(ProxyError),
    Broken(ProxyError),
    /// Boxed, as `WholeStreamed`'s: a pending stream is larger than a whole answer (240 bytes
    /// against 152), and the enum is moved a dozen times on its way to the chain, a copy of
    /// its full size each.
    Stream(Box<Pending>),
    Whole(Response<ProxyBody>),
    /// A success too large to hold: streamed through.
    WholeStreamed(Box<Pending>),
    /// An error answer, read whole: it may be retried, and a key the upstream echoes in it
    /// is removed before the caller sees it.
    Error {
        status: u16,
        quota: bool,
        retry_after: Option<Duration>,
        in_stream: bool,
        /// A cloud platform refused the credential, which is now renewed: the same call with
        /// the new one is not the refused call again.
        renewed: bool,
        resp: Response<ProxyBody>,
    },
}

// Moved about a dozen times per request on its way to the chain, each move a copy of its full
// size: kept to a whole answer's (152 bytes) and its error fields, under the 256 from which a
// copy takes the longer loop.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Exchanged>() <= 192);

impl Exchanged {
    /// The payload-free outcome the judge decides on.
    pub(crate) fn happened(&self) -> Happened {
        match self {
            Exchanged::Unsendable(_) => Happened::Unsendable,
            Exchanged::Shed(_) => Happened::Shed,
            Exchanged::Unheld { .. } => Happened::Unheld,
            Exchanged::Deadline { in_flight } => Happened::Deadline {
                in_flight: *in_flight,
            },
            Exchanged::TimedOut(_) => Happened::TimedOut,
            Exchanged::Unreachable(ProxyError::UpstreamUnreachable {
                failed: crate::error::Failed::Tls(_),
                ..
            }) => Happened::TlsRefused,
            Exchanged::Unreachable(_) => Happened::Unreachable,
            Exchanged::Broken(_) => Happened::Broken,
            Exchanged::Stream(_) => Happened::Stream,
            Exchanged::Whole(_) | Exchanged::WholeStreamed(_) => Happened::Whole,
            Exchanged::Error { renewed: true, .. } => Happened::CredentialRenewed,
            Exchanged::Error {
                status,
                quota,
                retry_after,
                in_stream,
                ..
            } => Happened::Error {
                status: *status,
                quota: *quota,
                retry_after: *retry_after,
                in_stream: *in_stream,
            },
        }
    }
}

/// The upstream's answer as received, before it is read.
struct Got {
    parts: Parts,
    incoming: Raw,
    permit: Permit,
    inflight: InflightGuard,
    /// The API the step speaks, and how the caller's API is reached from it.
    spoken: ApiKind,
    xl: Xlate,
    /// When the request was sent (its credential was put on before).
    sent: Instant,
}

/// Performs one exchange with the step's upstream.
pub(crate) async fn run(
    call: &Call<'_>,
    spent: &mut Spent,
    scope: &mut crate::observe::request::AttemptScope,
    record: &mut Option<RequestRecord>,
) -> Exchanged {
    let Call { proxy, up, inb, .. } = *call;
    // A step of another API is reached through translation (SPEC §10, §11).
    let spoken = up.speaks(inb.endpoint.api);
    let xl = Xlate::between(inb.endpoint.api, spoken);
    let mut req = match request(call, spoken, xl.translating()).await {
        Ok(r) => r,
        // The deadline passed waiting for a cloud credential.
        Err(ProxyError::DeadlineExceeded) => return Exchanged::Deadline { in_flight: false },
        Err(e) => return Exchanged::Unsendable(e),
    };
    if let Some(tp) = &call.traceparent {
        // The attempt's span is the provider's parent (W3C Trace Context).
        req.headers_mut().insert("traceparent", tp.clone());
    }
    // The wait for a turn and the upstream call both count as outside legate.
    let left = Instant::now();
    spent.leave(left);
    let (permit, waited) = match turn(call).await {
        Ok(p) => p,
        Err(refused) => {
            spent.stay();
            return refused;
        }
    };
    // A turn had at once (nearly always) is the same instant: the clock is not read again.
    let sent = if waited {
        if up.cloud.is_none() {
            // The key written when the request was made may have been rotated while it waited.
            up.renew_key(req.headers_mut());
        } else {
            // A platform's signature or token was made for the moment the request was built:
            // AWS refuses a signature more than five minutes old, and a token may have expired
            // meanwhile. The request is made (and signed) again for the moment it is sent.
            req = match request(call, spoken, xl.translating()).await {
                Ok(mut again) => {
                    if let Some(tp) = &call.traceparent {
                        again.headers_mut().insert("traceparent", tp.clone());
                    }
                    again
                }
                Err(e) => {
                    spent.stay();
                    return match e {
                        ProxyError::DeadlineExceeded => Exchanged::Deadline { in_flight: false },
                        e => Exchanged::Unsendable(e),
                    };
                }
            };
        }
        Instant::now()
    } else {
        left
    };
    let metrics = &proxy.metrics;
    // Decremented on every path, a dropped future (the caller went away) included.
    let inflight = InflightGuard::new(call.series.inflight(metrics).clone());
    // Counted here, once the request is really about to leave.
    spent.attempts += 1;
    scope.sending();
    let lines = verbatim(call, xl.translating());
    let result = upread::send(up, req, lines, sent, inb.deadline).await;
    call.series
        .upstream_duration(metrics)
        .observe(sent.elapsed().as_secs_f64());
    let out = match result {
        Ok(resp) => {
            up.pacer.observe(resp.headers());
            let (parts, incoming) = received(call, resp);
            let got = Got {
                parts,
                incoming,
                permit,
                inflight,
                spoken,
                xl,
                sent,
            };
            read(call, got, record).await
        }
        Err(ProxyError::DeadlineExceeded) => Exchanged::Deadline { in_flight: true },
        Err(e @ ProxyError::UpstreamTimeout { .. }) => Exchanged::TimedOut(e),
        Err(e @ ProxyError::UpstreamAnswerUnusable { .. }) => Exchanged::Broken(e),
        Err(e) => Exchanged::Unreachable(e),
    };
    spent.come_back(Instant::now());
    out
}

/// The price of the step `call` is at (None: unpriced).
fn step_price(call: &Call<'_>) -> Option<crate::meter::Price> {
    crate::meter::price_for(&call.snap.cfg.prices, call.step.target())
}

/// The step's path at a provider reached directly (not through a cloud platform).
fn direct_request(
    call: &Call<'_>,
    spoken: ApiKind,
    translating: bool,
) -> Result<http::Request<http_body_util::Full<Bytes>>, ProxyError> {
    let Call { up, inb, .. } = *call;
    let upstream_path = inb.endpoint.upstream_path(spoken);
    // The query string belongs to the caller's API (Anthropic's `?beta=true`): it reaches a
    // provider of that API only, never a translated request. Without one, the path is the
    // dialect's own static string, not a copy.
    let path: std::borrow::Cow<'_, str> = match &inb.query {
        Some(q) if !translating => format!("{upstream_path}?{q}").into(),
        _ => upstream_path.into(),
    };
    let mut req = up.build_request(
        Method::POST,
        &path,
        &inb.headers,
        verbatim(call, translating).is_some(),
        call.body.clone(),
        translating,
        true,
    )?;
    set_content_length(req.headers_mut(), &inb.headers, call.body.len());
    Ok(req)
}

/// The body's length as the upstream request's `content-length`, set here: left to hyper, it
/// is written into a new value (two allocations) on every request. The caller's own value is
/// taken, shared, when it is the same number written the plain way (as an HTTP/1 caller's is
/// for a body that went through unchanged); any other (absent, chunked, `012`) gets a value
/// of its own. An empty body is left to hyper, as before.
fn set_content_length(out: &mut http::HeaderMap, inbound: &http::HeaderMap, len: usize) {
    if len == 0 {
        return;
    }
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(len).as_bytes();
    let value = match inbound.get(header::CONTENT_LENGTH) {
        Some(v) if v.as_bytes() == digits => v.clone(),
        _ => match http::HeaderValue::from_bytes(digits) {
            Ok(v) => v,
            Err(_) => return,
        },
    };
    out.insert(header::CONTENT_LENGTH, value);
}

/// The caller's lines that go upstream as written ([`crate::verbatim`]), for a step whose
/// request carries the caller's lines as they came: one at a provider reached directly, in the
/// caller's own API. The request is built for them ([`direct_request`]) and sent with them.
fn verbatim<'a>(call: &Call<'a>, translating: bool) -> Option<&'a crate::verbatim::Verbatim> {
    let Call { up, inb, .. } = *call;
    inb.verbatim
        .as_deref()
        .filter(|_| !translating && up.cloud.is_none())
}

/// The upstream request: the step's path, or a cloud platform's own request for the model.
async fn request(
    call: &Call<'_>,
    spoken: ApiKind,
    translating: bool,
) -> Result<http::Request<http_body_util::Full<Bytes>>, ProxyError> {
    let Call { up, inb, .. } = *call;
    let Some(cloud) = &up.cloud else {
        return direct_request(call, spoken, translating);
    };
    if inb.endpoint.op != Operation::Generate {
        return Err(ProxyError::InvalidRequest {
            message: format!(
                "provider `{}` is a cloud platform that does not serve this endpoint",
                up.name
            ),
        });
    }
    // A credential that cannot be obtained fails before anything is sent: it counts against
    // neither the breaker nor the caller, and the next chain step may answer.
    // Boxed: signing and token refresh make a future of kilobytes, which would otherwise make
    // every attempt's future (and every one around it) that much larger, platform or not.
    Box::pin(up.build_cloud_request(
        cloud,
        (call.step.model(), inb.meta.stream, spoken),
        &inb.headers,
        call.body.clone(),
        translating,
        if call.can_fall_back {
            Wait::brief(inb.deadline)
        } else {
            Wait::until(inb.deadline)
        },
    ))
    .await
}

/// Pacing, then a concurrency slot in priority order, never past the deadline; whether it
/// waited for either.
async fn turn(call: &Call<'_>) -> Result<(Permit, bool), Exchanged> {
    let Call {
        up,
        inb,
        snap,
        proxy,
        ..
    } = *call;
    // When the provider's rate limit runs low, background and batch calls wait their slot so
    // that what is left lasts until the reset.
    // They wait in a place of the provider's queue: counted, bounded by `queue_limit`, and
    // shed lowest priority first.
    let paced = if call.probe {
        None
    } else {
        up.pacer.book(inb.priority, snap.cfg.shedding.pace_below)
    };
    let waited = paced.is_some();
    if let Some(booked) = paced {
        let wait = booked.wait;
        // A wait the deadline cannot cover is a refusal before any attempt: shed (529), with
        // the pacer's wait as its retry-after, not a 504 that tells the SDK not to retry. A
        // call shed gives its slot back, and so does one dropped while it waits (its caller
        // left); a shed one is told to come back at its slot.
        let held = up.pacer.hold(booked);
        let shed = Exchanged::Shed(ProxyError::Shed {
            retry_after: wait.max(Duration::from_secs(1)),
            counting: false,
        });
        if Instant::now() + wait >= inb.deadline {
            up.gate.count_shed(inb.priority);
            return Err(shed);
        }
        if up.gate.pace(inb.priority, wait).await.is_err() {
            return Err(shed);
        }
        held.used();
    }
    let shed = |_| {
        Exchanged::Shed(ProxyError::Shed {
            retry_after: Duration::from_secs(1),
            counting: false,
        })
    };
    let mut acquire = std::pin::pin!(up.gate.acquire(inb.priority));
    // Nearly always a turn is free at once, and nothing more is asked.
    if let Some(got) = futures_util::FutureExt::now_or_never(acquire.as_mut()) {
        return got.map(|p| (p, waited)).map_err(shed);
    }
    let got = match tokio::time::timeout_at(inb.deadline, acquire).await {
        Ok(got) => got.map_err(shed)?,
        Err(_) => return Err(Exchanged::Deadline { in_flight: false }),
    };
    // A turn waited for may come free because the shutdown's grace ran out and cut the
    // requests ahead: it is not taken (its answer could not be waited for), so the request
    // goes back unsent, one the SDK may send again to another replica. Asked only after a
    // wait: the token's flag is behind a lock that every request would share.
    if proxy.abort_streams.is_cancelled() {
        return Err(Exchanged::Shed(ProxyError::ShuttingDown));
    }
    Ok((got, true))
}

/// The answer's head and body; Bedrock's binary event stream is read as the SSE it carries
/// from here on.
fn received(call: &Call<'_>, resp: Response<ResponseBody>) -> (Parts, Raw) {
    let (mut parts, incoming) = resp.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim_start();
    let event_stream = parts.status.is_success()
        && call.up.cloud.as_ref().is_some_and(|c| c.event_stream())
        && content_type.starts_with(crate::cloud::eventstream::CONTENT_TYPE);
    if !event_stream {
        return (parts, Raw::Http(incoming));
    }
    parts.headers.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    let max_event = call.snap.cfg.server.limits.max_event_bytes;
    let sse = crate::cloud::eventstream::EventStreamSse::new(incoming, max_event);
    (parts, Raw::EventStream(Box::new(sse)))
}

async fn read(call: &Call<'_>, got: Got, record: &mut Option<RequestRecord>) -> Exchanged {
    if crate::proxy::response::opaque_coding(&got.parts.headers) {
        return Exchanged::Broken(crate::proxy::response::opaque_answer(&call.up.name));
    }
    let status = got.parts.status;
    // A success without content, or a redirection legate does not follow, answers nothing the
    // caller asked: an SDK handed it reads an empty success, or follows the redirection past
    // legate.
    if status == StatusCode::NO_CONTENT
        || status == StatusCode::RESET_CONTENT
        || status.is_redirection()
    {
        tracing::warn!(provider = %call.up.name, %status, "upstream answered a generation without an answer");
        return Exchanged::Broken(ProxyError::UpstreamAnswerUnusable {
            provider: call.up.name.clone(),
            reason: format!("it answered {status}, which carries no answer"),
        });
    }
    let is_sse = got
        .parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    match (status.is_success(), is_sse) {
        (true, true) if call.inb.meta.stream => stream(call, got, record).await,
        // The other way round: a caller that asked for a whole answer parses one JSON body,
        // and an event stream relayed to it is a success its SDK cannot read.
        (true, true) => {
            tracing::warn!(provider = %call.up.name, "upstream answered a request for a whole answer with an event stream");
            Exchanged::Broken(ProxyError::UpstreamAnswerUnusable {
                provider: call.up.name.clone(),
                reason:
                    "a whole answer was asked for, and it answered with an event stream instead"
                        .to_owned(),
            })
        }
        // A caller that asked for a stream reads events: a whole body handed to it would read
        // as a stream that ended cleanly with nothing in it (SPEC §7), so it is a failure.
        (true, false) if call.inb.meta.stream => {
            tracing::warn!(provider = %call.up.name, "upstream answered a stream request with a whole body");
            Exchanged::Broken(ProxyError::UpstreamAnswerUnusable {
                provider: call.up.name.clone(),
                reason: "a stream was asked for, and it answered with a whole body instead of an event stream".to_owned(),
            })
        }
        (true, false) => whole(call, got, record).await,
        (false, _) => error(call, got).await,
    }
}

/// The provider may bill what it reported before an attempt failed, or before the caller
/// left (the input tokens of an Anthropic `message_start`): metered on this attempt's provider
/// and model, and charged to the request.
fn meter_unserved(
    call: &Call<'_>,
    record: &mut Option<RequestRecord>,
    incoming: &UpstreamBody,
    watch: &SseWatch,
) {
    let usage = incoming.upstream_usage().or_else(|| watch.usage());
    if let (Some(u), Some(rec)) = (usage, record.as_mut()) {
        let u = u.bounded(&call.up.name, answer::output_bound(call.inb));
        let cost = answer::sink(call, rec).record_unserved(u);
        rec.charge_attempt(u, cost);
    }
}

/// A stream being read to its commit point; dropped with the stream still in it (the caller
/// left, and the request's future with it), it meters what the provider reported so far.
struct UnservedMeter<'c, 'a, 'r> {
    call: &'c Call<'a>,
    record: &'r mut Option<RequestRecord>,
    read: Option<(UpstreamBody, Box<SseWatch>)>,
}

impl Drop for UnservedMeter<'_, '_, '_> {
    fn drop(&mut self) {
        if let Some((incoming, watch)) = &self.read {
            meter_unserved(self.call, self.record, incoming, watch);
        }
    }
}

/// A stream read up to its commit point, its preamble held back.
async fn stream(call: &Call<'_>, got: Got, record: &mut Option<RequestRecord>) -> Exchanged {
    let Call { proxy, up, inb, .. } = *call;
    let api = inb.endpoint.api;
    let max_event = call.snap.cfg.server.limits.max_event_bytes;
    let incoming = match conversation::stream_translator(got.xl, inb) {
        Some(tr) => {
            UpstreamBody::translated(got.incoming, tr, got.spoken, max_event, up.idle_timeout)
        }
        None => UpstreamBody::Plain(got.incoming),
    };
    let watch = Box::new(
        SseWatch::new(api)
            .with_max_event(max_event)
            .strip_usage(call.strip_usage)
            .keeping(conversation::stream_keeper(
                got.xl,
                inb,
                &up.name,
                &proxy.unsettled,
            )),
    );
    // Read within a guard that meters what the provider reported if the caller leaves before
    // the commit point: the request's future is then dropped here, mid-read.
    let mut meter = UnservedMeter {
        call,
        record,
        read: Some((incoming, watch)),
    };
    let pre = {
        let Some((incoming, watch)) = meter.read.as_mut() else {
            return Exchanged::Broken(ProxyError::Internal);
        };
        upread::read_to_commit(incoming, watch, up.idle_timeout, inb.deadline).await
    };
    let Some((incoming, watch)) = meter.read.take() else {
        return Exchanged::Broken(ProxyError::Internal);
    };
    let record = &mut *meter.record;
    if pre.is_err() {
        meter_unserved(call, record, &incoming, &watch);
    }
    match pre {
        Ok(held) => {
            if watch.saw_content {
                if let Some(r) = record.as_ref() {
                    r.first_content();
                }
                let started = record
                    .as_ref()
                    .map_or_else(StdInstant::now, RequestRecord::started);
                call.series
                    .ttft(&proxy.metrics)
                    .observe(started.elapsed().as_secs_f64());
            }
            Exchanged::Stream(Box::new(Pending {
                status: got.parts.status,
                headers: got.parts.headers,
                incoming,
                mode: Mode::Sse(watch),
                held: (!held.is_empty()).then_some(held),
                permit: got.permit,
                inflight: got.inflight,
            }))
        }
        // The translator refused what the provider sent (no error of the provider's own): an
        // answer that cannot reach the caller, as a whole one would be (502, retried or
        // fallen back), not the error type the translator's event names.
        Err(PreCommit::ErrorEvent(data)) if incoming.translator_refused() => {
            let reason = api
                .dialect()
                .read_error(data.as_bytes())
                .and_then(|f| f.message)
                .unwrap_or_else(|| "the translated stream failed".to_owned());
            tracing::info!(provider = %up.name, reason = %reason, "translated stream refused before its first content");
            Exchanged::Broken(ProxyError::UpstreamAnswerUnusable {
                provider: up.name.clone(),
                reason,
            })
        }
        // Nothing reached the caller: the event becomes the error answer it stands for.
        Err(PreCommit::ErrorEvent(data)) => {
            let (status, body) = api.dialect().error_event_response(&data);
            let quota = status == StatusCode::TOO_MANY_REQUESTS && api::is_quota_exhaustion(&body);
            let resp = answer::buffered(call, status, got.parts.headers, body);
            Exchanged::Error {
                status: status.as_u16(),
                quota,
                retry_after: None,
                in_stream: true,
                renewed: false,
                resp,
            }
        }
        Err(PreCommit::Broken(why)) => {
            tracing::info!(provider = %up.name, reason = why, "stream failed before its first content");
            Exchanged::Broken(ProxyError::UpstreamStreamBroken {
                provider: up.name.clone(),
            })
        }
    }
}

/// A whole success answer, read before it is committed so that a cut mid-body is retried like
/// any other failure instead of reaching the caller as a broken response.
async fn whole(call: &Call<'_>, got: Got, record: &mut Option<RequestRecord>) -> Exchanged {
    let Call { up, inb, .. } = *call;
    let until_close = matches!(&got.incoming, Raw::Http(b) if b.until_close());
    let mut incoming = UpstreamBody::Plain(got.incoming);
    let max = call.snap.cfg.server.limits.max_buffered_bytes;
    let mut share = AnswerShare::new(&call.proxy.answers, max).within(inb.answer_part.clone());
    let read = upread::read_whole(&mut incoming, up.idle_timeout, inb.deadline, &mut share).await;
    // Translated: the caller's API shape, or an answer that cannot be carried across. A
    // Responses passthrough answer is read too: it is kept in the conversation store.
    // Reading the answer for the store reads its usage too.
    let mut usage_read = None;
    let read = match read {
        // A success answer of these APIs is JSON (nothing only with 204). Anything else, a
        // gateway's HTML page passed on with 200, is no answer: passed on, it reached the
        // caller as a success its SDK could not parse, and the breaker heard a success.
        Whole::Complete(body) if !answer::json_shaped(got.parts.status, &body) => {
            let kind = answer::media_type(&got.parts.headers);
            tracing::warn!(provider = %up.name, content_type = kind, "upstream success answer is not JSON");
            Whole::Unusable(format!(
                "the success answer is not JSON (content-type {kind})"
            ))
        }
        // A body that ended with its connection may have been cut there: only JSON that
        // ends is an answer (the usual framings, a length or chunks, say where it ends).
        Whole::Complete(body) if until_close && !answer::json_whole(&body) => {
            Whole::Broken("the answer ended with its connection before its JSON did")
        }
        Whole::Complete(body) if conversation::rewrites_whole(got.xl, inb) => {
            match conversation::translate_whole(got.xl, inb, &body, &up.name) {
                Ok(answer) => {
                    // A translated answer's usage is the provider's, read off its own body:
                    // the translation writes zeros where none came, which read back would
                    // meter a free answer and refund the whole reservation.
                    usage_read = answer.usage.or_else(|| {
                        got.xl
                            .translating()
                            .then(|| got.spoken.dialect().usage_of_body(&body))
                    });
                    Whole::Complete(answer.body)
                }
                Err(e) => {
                    tracing::warn!(provider = %up.name, error = %e, "upstream answer not translatable");
                    Whole::Unusable(e)
                }
            }
        }
        Whole::TooLarge(_) if got.xl.translating() => {
            Whole::Broken("the upstream answer is too large to translate")
        }
        // Retrying would fetch the same answer into the same full memory: the request is
        // shed, like one whose own body finds the bound reached.
        Whole::Full(_) if got.xl.translating() => {
            tracing::warn!(provider = %up.name, "answer refused: server.max_buffered_bytes is reached, and a translated answer must be held whole");
            // The provider did the work: the tenant pays the reservation, as for any answer
            // whose usage is unknown.
            if let Some(rec) = record.as_mut() {
                rec.keep_reservation(step_price(call));
            }
            return Exchanged::Unheld {
                status: got.parts.status.as_u16(),
                error: ProxyError::BuffersFull {
                    retry_after: Duration::from_secs(1),
                },
            };
        }
        w => w,
    };
    let share = share.into_share();
    match read {
        Whole::Complete(body) => {
            if let Some(rec) = record.as_mut() {
                let usage =
                    usage_read.unwrap_or_else(|| inb.endpoint.api.dialect().usage_of_body(&body));
                // A relayed response still running (a background one) has its usage to come,
                // whatever it shows now (zeros, or its input, from some servers): it comes with
                // the poll that finds it final (`background.rs`). An answer that reports output
                // is not looked at for it.
                let running = match usage {
                    Some(u) if u.output > 0 => None,
                    _ if inb.endpoint.api == ApiKind::Responses && !got.xl.translating() => {
                        super::background::running_id(&body)
                    }
                    _ => None,
                };
                match (usage, running) {
                    (_, Some(id)) => {
                        let sink = answer::sink(call, rec);
                        sink.record_unreported();
                        let budget = rec.keep_reservation_until_known(step_price(call));
                        call.proxy.unsettled.expect(&id, sink, budget);
                    }
                    (Some(u), None) => {
                        let u = u.bounded(&up.name, answer::output_bound(inb));
                        let sink = answer::sink(call, rec);
                        let cost = sink.record(u);
                        rec.settle(u, cost, &sink, false);
                    }
                    (None, None) => {
                        answer::sink(call, rec).record_unreported();
                        rec.keep_reservation(step_price(call));
                    }
                }
            }
            Exchanged::Whole(answer::buffered(
                call,
                got.parts.status,
                got.parts.headers,
                buffers::hold(body, share),
            ))
        }
        Whole::Full(prefix) => {
            tracing::warn!(provider = %up.name, "answer passed through as it comes, not held and not metered: server.max_buffered_bytes is reached");
            passed_through(
                got.parts,
                got.permit,
                got.inflight,
                incoming,
                buffers::hold(prefix, share),
            )
        }
        Whole::TooLarge(prefix) => passed_through(
            got.parts,
            got.permit,
            got.inflight,
            incoming,
            buffers::hold(prefix, share),
        ),
        // The error names what happened: a cut body, or an answer that arrived whole but
        // cannot be carried to the caller.
        Whole::Unusable(reason) => Exchanged::Broken(ProxyError::UpstreamAnswerUnusable {
            provider: up.name.clone(),
            reason,
        }),
        Whole::Broken(why) => {
            tracing::info!(provider = %up.name, reason = why, "response failed before it was complete");
            Exchanged::Broken(ProxyError::UpstreamStreamBroken {
                provider: up.name.clone(),
            })
        }
    }
}

/// An error answer, read whole (it is small; bounded). One that no retry could change is
/// passed on as it is, its content type kept (an HTML error page stays labelled as one); one
/// that may be retryable is classified and, for a translated step or a platform, put in the
/// caller's shape.
async fn error(call: &Call<'_>, got: Got) -> Exchanged {
    let Call { up, inb, .. } = *call;
    let status = got.parts.status;
    let headers = got.parts.headers;
    let max = call.snap.cfg.server.limits.max_buffered_bytes;
    let body = upread::read_small(
        UpstreamBody::Plain(got.incoming),
        up.idle_timeout,
        inb.deadline,
        AnswerShare::new(&call.proxy.answers, max).within(inb.answer_part.clone()),
    );
    let (body, replaced) = match body.await {
        Some(b) => (b, false),
        None => (unread_error(up, got.spoken, status, &inb.obs), true),
    };
    // The slot and the in-flight count are the upstream call's: it is over.
    drop((got.permit, got.inflight));
    // A platform that refuses the credential legate sent may have revoked it before the
    // expiry it was given with: set aside and fetched again (at most once a minute), and the
    // call tried again with the new one, so that a revocation costs the caller nothing.
    let renewed = matches!(status.as_u16(), 401 | 403)
        && up
            .cloud
            .as_ref()
            .is_some_and(|c| c.credential_refused(got.sent));
    // A platform's error answer is read to be put in the caller's shape.
    let platform_shape = up.cloud.as_ref().is_some_and(|c| c.maps_errors());
    if !judge::worth_reading(status.as_u16()) && !got.xl.translating() && !platform_shape {
        // The upstream's content type stays with its own body (an HTML page stays one), not
        // with legate's JSON in its place.
        let ct = headers
            .get(header::CONTENT_TYPE)
            .filter(|_| !replaced)
            .cloned();
        let mut resp = answer::buffered(call, status, headers, body);
        if let Some(ct) = ct {
            resp.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        return Exchanged::Error {
            status: status.as_u16(),
            quota: false,
            retry_after: None,
            in_stream: false,
            renewed,
            resp,
        };
    }
    let (status, body) = match up.cloud.as_ref() {
        Some(c) => c
            .map_error(status, &headers, &body)
            .unwrap_or((status, body)),
        None => (status, body),
    };
    let quota = status == StatusCode::TOO_MANY_REQUESTS && api::is_quota_exhaustion(&body);
    let retry_after = retry::retry_after(&headers, SystemTime::now());
    let resp = if got.xl.translating() {
        let (st, b) = conversation::translate_error(got.xl, status.as_u16(), &body);
        let st = StatusCode::from_u16(st).unwrap_or(status);
        answer::buffered(call, st, headers, Bytes::from(b))
    } else {
        answer::buffered(call, status, headers, body)
    };
    Exchanged::Error {
        status: status.as_u16(),
        quota,
        retry_after,
        in_stream: false,
        renewed,
        resp,
    }
}

/// A success answer not held whole: what was read of it goes first, the rest as it comes. Its
/// usage is not read (`body::JSON_USAGE_CAP`, or the memory bound that stopped the read).
fn passed_through(
    parts: Parts,
    permit: Permit,
    inflight: InflightGuard,
    incoming: UpstreamBody,
    prefix: Bytes,
) -> Exchanged {
    Exchanged::WholeStreamed(Box::new(Pending {
        status: parts.status,
        headers: parts.headers,
        incoming,
        mode: Mode::Json {
            buf: Vec::new(),
            overflow: true,
        },
        held: Some(prefix),
        permit,
        inflight,
    }))
}

/// The body that replaces an error body legate could not read whole (over 1 MiB, cut, late,
/// or past `max_buffered_bytes`): legate's own error, in the API the step speaks (so that it
/// is judged and translated like the provider's), naming the status, so that the caller
/// learns what happened instead of getting an empty body under a JSON content type.
fn unread_error(
    up: &Upstream,
    spoken: ApiKind,
    status: StatusCode,
    obs: &crate::observe::RequestObs,
) -> Bytes {
    tracing::warn!(provider = %up.name, status = status.as_u16(), "upstream error body not read whole (over 1 MiB, cut, late, or server.max_buffered_bytes reached): replaced");
    let dialect = spoken.dialect();
    let message = format!(
        "provider `{}` answered {} with an error body legate could not read whole (over 1 MiB, cut off, late, or with server.max_buffered_bytes reached)",
        up.name,
        status.as_u16()
    );
    dialect.error_body(
        api::LocalError {
            param: None,
            class: dialect.errors().class_for_status(status.as_u16()),
            code: "upstream_error_unreadable",
            message: &message,
        },
        // As every error legate writes names the request (the Anthropic shape carries it).
        &obs.request_id().map(|id| id.render()).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, header::CONTENT_LENGTH};

    use super::set_content_length;

    #[test]
    fn the_callers_length_is_shared_when_the_body_kept_its_length() {
        let mut inbound = HeaderMap::new();
        let callers = HeaderValue::from_maybe_shared(bytes::Bytes::from(b"1234".to_vec()))
            .expect("digits are a valid value");
        inbound.insert(CONTENT_LENGTH, callers.clone());
        let mut out = HeaderMap::new();
        set_content_length(&mut out, &inbound, 1234);
        let set = out.get(CONTENT_LENGTH).expect("a length is set");
        assert_eq!(set, "1234");
        // The same bytes, not a copy of them.
        assert_eq!(set.as_bytes().as_ptr(), callers.as_bytes().as_ptr());
    }

    #[test]
    fn a_changed_body_gets_its_own_length() {
        let mut inbound = HeaderMap::new();
        inbound.insert(CONTENT_LENGTH, HeaderValue::from_static("1234"));
        let mut out = HeaderMap::new();
        set_content_length(&mut out, &inbound, 1240);
        assert_eq!(out.get(CONTENT_LENGTH).expect("a length is set"), "1240");
        // No caller's value at all (a body legate made): written too.
        let mut out = HeaderMap::new();
        set_content_length(&mut out, &HeaderMap::new(), 7);
        assert_eq!(out.get(CONTENT_LENGTH).expect("a length is set"), "7");
    }

    #[test]
    fn an_empty_body_is_left_to_hyper() {
        let mut out = HeaderMap::new();
        set_content_length(&mut out, &HeaderMap::new(), 0);
        assert!(out.get(CONTENT_LENGTH).is_none());
    }
}

//! The response body legate returns for an upstream answer. It forwards the upstream body as it
//! arrives — for event streams exactly whole events, each as soon as it is complete, never
//! buffered further and never compressed — while watching it: usage for metering, the first
//! content event for time-to-first-token, the terminal event, the idle timeout between chunks,
//! and shutdown. A failure after bytes reached the caller becomes an explicit error event, never
//! a clean-looking end, and counts against the upstream's breaker. Dropping it early (the caller
//! went away) drops the upstream body, which cancels the upstream request, and is recorded as
//! 499 — never as a provider failure.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus::Histogram;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::api::{ApiKind, ErrorClass, LocalError};
use crate::meter::Usage;
use crate::policy::breaker::{Outcome, Ticket};
use crate::proxy::record::{InflightGuard, RequestRecord, UsageSink};
use crate::proxy::upbody::UpstreamBody;
use crate::proxy::watch::SseWatch;

pub use crate::server::listener::BoxError;

/// Why a stream still open when shutdown's grace ran out ends.
const SHUTDOWN: &str = "legate is shutting down and the stream outlived shutdown_grace";
/// How a failure mid-body is recorded, and what it tells the breaker: the caller's own
/// deadline is a 504 (SPEC §5) and says nothing about the provider (a short
/// `x-legate-deadline-ms` must not open the breaker for every caller); anything else is the
/// upstream's failure, 502.
fn fault_of(why: &str) -> (u16, Outcome) {
    if why == PAST_DEADLINE {
        (504, Outcome::Neutral)
    } else {
        (502, Outcome::Failure)
    }
}

const PAST_DEADLINE: &str = "the answer did not come within the request deadline (server.default_deadline or x-legate-deadline-ms)";

/// Non-streaming bodies larger than this are forwarded but not parsed for usage.
const JSON_USAGE_CAP: usize = 8 << 20;

pub enum Mode {
    Sse(Box<SseWatch>),
    Json { buf: Vec<u8>, overflow: bool },
}

impl Mode {
    pub fn json() -> Self {
        Mode::Json {
            buf: Vec::new(),
            overflow: false,
        }
    }
}

enum State {
    Streaming,
    /// One last frame (an error event) to send, then the end.
    Closing(Option<Bytes>),
    Done,
}

/// Everything a finished (or abandoned) response reports to.
pub struct Accounting {
    pub record: RequestRecord,
    pub sink: UsageSink,
    pub ttft: Histogram,
    pub inflight: InflightGuard,
    pub status: u16,
    /// The breaker's verdict waits for the end of a stream.
    pub ticket: Option<Ticket>,
}

pub struct TapBody {
    inner: UpstreamBody,
    api: ApiKind,
    mode: Mode,
    state: State,
    /// Bytes read before the response was committed (a stream's preamble and first content).
    held: Option<Bytes>,
    idle: Duration,
    /// When the upstream was first found with nothing to give since its last frame (`None`
    /// while frames keep coming): the idle timeout counts from it. Noted at that first wait,
    /// not per frame, so that frames that are there at once (a burst) cost no clock read.
    idle_from: Option<Instant>,
    /// Set for `idle_from + idle` as it was when the timer was last armed: a wait after a frame
    /// moves `idle_from` only, and the timer, when it fires early, is armed again for the new
    /// due time. Resetting a tokio timer on every frame costs a clock conversion and an update
    /// of its entry per event; a stream's frames come much more often than its idle timeout.
    /// Made at the body's first wait.
    timer: Option<Pin<Box<Sleep>>>,
    /// Shutdown's signal: read (one atomic load) on every poll, waited on (a waker registered
    /// under its lock) only when the upstream has nothing to give.
    stop: CancellationToken,
    abort: Pin<Box<WaitForCancellationFutureOwned>>,
    acct: Option<Accounting>,
    /// Held for the life of the upstream exchange: `max_concurrency` counts streams too.
    _permit: Option<crate::policy::admission::Permit>,
    /// A non-stream body failed: the next poll returns an error so hyper aborts the connection.
    failed_json: bool,
    /// The request's deadline, to obtain an answer: it still bounds a whole answer passed
    /// through before its end (too large to hold) until that end, and a stream committed
    /// before its first content (a long preamble) until that content.
    deadline: Option<Instant>,
    /// Removes the provider key from every forwarded chunk.
    redact: Option<crate::redact::Redactor>,
    /// The forwarded tail that may be the start of a key split across chunks (held back).
    carry: Vec<u8>,
    /// Once a stream's final event is relayed: until when the upstream body's own end is
    /// waited for ([`FINAL_GRACE`]).
    final_by: Option<Instant>,
}

/// How long a stream whose final event is relayed waits for the upstream body's end before it
/// ends the caller's stream itself (and drops the upstream connection): a provider writes the
/// end right after its last event, often in a write of its own (uvicorn, Go's net/http), which
/// arrives within milliseconds; waiting for it lets an HTTP/1 connection go back to the pool.
const FINAL_GRACE: Duration = Duration::from_millis(500);

impl TapBody {
    #[expect(clippy::too_many_arguments, reason = "one constructor wiring one body")]
    pub fn new(
        inner: UpstreamBody,
        api: ApiKind,
        mode: Mode,
        held: Option<Bytes>,
        idle: Duration,
        stop: CancellationToken,
        acct: Accounting,
        permit: Option<crate::policy::admission::Permit>,
    ) -> Self {
        TapBody {
            inner,
            api,
            mode,
            state: State::Streaming,
            held,
            idle,
            idle_from: None,
            timer: None,
            final_by: None,
            abort: Box::pin(stop.clone().cancelled_owned()),
            stop,
            acct: Some(acct),
            _permit: permit,
            failed_json: false,
            deadline: None,
            redact: None,
            carry: Vec::new(),
        }
    }

    /// Bounded by the request's deadline until it has delivered what that deadline is for
    /// (see [`TapBody::deadline`]).
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The deadline, while it still applies: until a whole answer's end, or a stream's first
    /// content.
    fn deadline_due(&self) -> Option<Instant> {
        match &self.mode {
            Mode::Sse(w) if w.saw_content => None,
            _ => self.deadline,
        }
    }

    /// Forwarded chunks are cleaned of the provider key (SPEC §14).
    pub fn with_redactor(mut self, redact: Option<crate::redact::Redactor>) -> Self {
        self.redact = redact;
        self
    }

    /// A chunk on its way to the caller.
    fn emit(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let data = match &self.redact {
            Some(r) => r.chunk(&mut self.carry, data),
            None => data,
        };
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    /// Watches one upstream chunk; returns the bytes that may be forwarded now.
    fn observe(&mut self, data: Bytes) -> Option<Bytes> {
        match &mut self.mode {
            Mode::Json { buf, overflow } => {
                if !*overflow {
                    if buf.len() + data.len() <= JSON_USAGE_CAP {
                        buf.extend_from_slice(&data);
                    } else {
                        *overflow = true;
                        buf.clear();
                    }
                }
                Some(data)
            }
            Mode::Sse(watch) => {
                let (out, started) = watch.feed(data);
                if started && let Some(acct) = &self.acct {
                    acct.record.first_content();
                    acct.ttft
                        .observe(acct.record.started().elapsed().as_secs_f64());
                }
                out
            }
        }
    }

    fn usage(&self) -> Option<Usage> {
        match &self.mode {
            // A translated stream's usage is the provider's, or none: the events legate wrote
            // for the caller carry zeros where the provider said nothing (a stream cut before
            // its usage), and zeros would be metered as a request that cost nothing.
            Mode::Sse(_) if self.inner.is_translated() => self.inner.upstream_usage(),
            Mode::Sse(watch) => watch.usage(),
            Mode::Json { buf, overflow } => {
                let ok = self.acct.as_ref().is_some_and(|a| a.status < 300);
                if *overflow || !ok {
                    return None;
                }
                self.api.dialect().usage_of_body(buf)
            }
        }
    }

    /// The upstream body ended. A stream without its terminal event is a failure.
    fn on_end(&mut self) -> State {
        let Mode::Sse(watch) = &mut self.mode else {
            self.complete(None, Outcome::Success);
            return State::Done;
        };
        let rest = watch.finish();
        if watch.saw_terminal || watch.error_data.is_some() {
            // An upstream error event passed through as it is: the stream failed, visibly.
            let errored = watch.error_data.is_some();
            self.complete_relayed(errored);
            return State::Closing(rest);
        }
        let err = self.fail_stream(if self.inner.event_too_large() {
            "the upstream sent an event larger than server.max_event_bytes"
        } else {
            "the upstream stream ended before its final event"
        });
        match (rest, err) {
            (Some(r), State::Closing(Some(e))) => {
                let mut joined = r.to_vec();
                joined.extend_from_slice(&e);
                State::Closing(Some(Bytes::from(joined)))
            }
            (_, s) => s,
        }
    }

    /// A failure mid-body: an explicit error event for event streams; for other bodies the
    /// connection is aborted, so the caller sees a broken response rather than a short one.
    fn fail(&mut self, why: &str) -> State {
        match &self.mode {
            // The final event was relayed: the answer is whole, and what went wrong behind it
            // (a body held open past idle_timeout, a cut, shutdown) takes nothing from it. It
            // ends as the end of the body would have, without an error event after the final
            // one (which an SDK reading to the end would raise).
            Mode::Sse(watch) if watch.saw_terminal || watch.error_data.is_some() => {
                tracing::debug!(reason = why, "upstream stream failed after its final event");
                let errored = watch.error_data.is_some();
                self.complete_relayed(errored);
                State::Closing(None)
            }
            Mode::Sse(_) => self.fail_stream(why),
            Mode::Json { .. } => {
                tracing::warn!(reason = why, "upstream response failed after it started");
                let (status, outcome) = fault_of(why);
                self.complete(Some(status), outcome);
                self.failed_json = true;
                State::Done
            }
        }
    }

    /// legate's shutdown outlived the answer: ended as a failure is (an error event, or a
    /// broken connection), but counted as legate's doing, not the provider's: 503
    /// `shutting_down`, and nothing told to the breaker.
    fn shut_down(&mut self) -> State {
        let cut = match &self.mode {
            Mode::Sse(watch) => !(watch.saw_terminal || watch.error_data.is_some()),
            Mode::Json { .. } => true,
        };
        if !cut {
            return self.fail(SHUTDOWN);
        }
        tracing::info!("an answer still open at the end of shutdown_grace is ended");
        if let Some(acct) = &self.acct {
            acct.record
                .error_kind(crate::error::ProxyError::ShuttingDown.kind());
        }
        self.complete(Some(503), Outcome::Neutral);
        match &self.mode {
            Mode::Sse(watch) => State::Closing(Some(watch.error_event(stream_failure(SHUTDOWN)))),
            Mode::Json { .. } => {
                self.failed_json = true;
                State::Done
            }
        }
    }

    fn fail_stream(&mut self, why: &str) -> State {
        tracing::warn!(
            reason = why,
            "upstream stream failed after the response started"
        );
        let (status, mut outcome) = fault_of(why);
        // A background response may sit queued at the provider, silent, for a long while: a
        // stall before its first content says nothing of the provider's health.
        if let Mode::Sse(w) = &self.mode
            && w.background().is_some()
            && !w.saw_content
        {
            outcome = Outcome::Neutral;
        }
        self.complete(Some(status), outcome);
        let event = match &self.mode {
            Mode::Sse(watch) => watch.error_event(stream_failure(why)),
            Mode::Json { .. } => stream_error_event(self.api, why),
        };
        State::Closing(Some(event))
    }

    /// A stream whose final event, or the provider's error event, reached the caller: it ends
    /// as the end of its body would have, however the connection then ends. One the provider
    /// ended with an error event failed after its 200 head, and counts as 502, as a stream
    /// legate cuts does.
    fn complete_relayed(&mut self, errored: bool) {
        if errored {
            self.complete(Some(502), Outcome::Failure);
        } else {
            self.complete(None, Outcome::Success);
        }
    }

    fn complete(&mut self, status_override: Option<u16>, outcome: Outcome) {
        if let Some(mut acct) = self.settle() {
            if let Some(t) = acct.ticket.take() {
                t.report(outcome);
            }
            acct.record.finish(status_override.unwrap_or(acct.status));
        }
    }

    /// Ends the accounting, if still open: the usage seen is recorded and settled; with none
    /// seen, an answer that reached the provider keeps its estimate (it may be billed: no
    /// refund), and counts as a request in the ledger, with no tokens. The accounting is
    /// handed back for the caller to close.
    fn settle(&mut self) -> Option<Accounting> {
        let usage = self.usage();
        // A background response's stream that ended before its final event: usage read off an
        // earlier event (zeros, or a part, from some servers) is not its usage, which the poll
        // that finds it final reports whole.
        let usage = match &self.mode {
            Mode::Sse(w) if !w.saw_terminal && w.background().is_some() => None,
            _ => usage,
        };
        // A stream's usage is final once its final event came; before it, what was reported
        // (the input, one output token) is a part of what the provider bills.
        let partial = matches!(&self.mode, Mode::Sse(watch) if !watch.saw_terminal);
        let mut acct = self.acct.take()?;
        match usage {
            Some(u) => {
                let u = u.bounded(&acct.sink.target, acct.sink.max_output);
                let cost = acct.sink.record(u);
                acct.record.settle(u, cost, &acct.sink, partial);
            }
            None if acct.status < 400 => {
                // Counted as a request the provider answered, as one that reported part of
                // its usage before a cut, or before its caller left, is.
                acct.sink.record_unreported();
                // A background response runs on without its stream: its usage comes with the
                // poll (or resumed stream) that finds it final (`background.rs`).
                if let Mode::Sse(watch) = &self.mode
                    && let Some((unsettled, id)) = watch.background()
                {
                    let budget = acct.record.keep_reservation_until_known(acct.sink.price);
                    unsettled.expect(id, acct.sink.clone(), budget);
                } else {
                    acct.record.keep_reservation(acct.sink.price);
                }
            }
            None => {}
        }
        Some(acct)
    }
}

impl Drop for TapBody {
    fn drop(&mut self) {
        // A stream whose final event was relayed is complete, whatever follows it: the
        // OpenAI SDKs close their connection at `[DONE]`, often before the provider's body
        // has ended behind it, and such a caller has not left early. Recorded as the end
        // of the stream would have been.
        if let Mode::Sse(watch) = &self.mode
            && self.acct.is_some()
            && (watch.saw_terminal || watch.error_data.is_some())
        {
            let errored = watch.error_data.is_some();
            self.complete_relayed(errored);
            return;
        }
        // Still accounting means the caller went away before the end: whatever usage was seen
        // is still billed by the provider, so it is recorded, and the request counts as 499.
        // The breaker ticket drops unreported: a disconnect is never a provider failure.
        if let Some(mut acct) = self.settle() {
            acct.record.client_gone();
        }
    }
}

/// An error event in the stream format of `api` (Anthropic `event: error`; OpenAI an error
/// chunk), which the SDKs raise as an exception.
pub fn stream_error_event(api: ApiKind, message: &str) -> Bytes {
    api.dialect().stream_error_event(stream_failure(message))
}

/// A stream that failed under legate, as the error its caller is told.
fn stream_failure(message: &str) -> LocalError<'_> {
    LocalError {
        param: None,
        class: ErrorClass::Server,
        code: "upstream_stream_error",
        message,
    }
}

impl Body for TapBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(held) = this.held.take() {
            return this.emit(held);
        }
        loop {
            if std::mem::take(&mut this.failed_json) {
                // A failed non-stream body: abort the connection so the caller sees it broken.
                return Poll::Ready(Some(Err("upstream response failed".into())));
            }
            match &mut this.state {
                State::Done => {
                    // The held-back tail was not a key after all: it goes out last.
                    return match crate::redact::Redactor::flush(&mut this.carry) {
                        Some(rest) => Poll::Ready(Some(Ok(Frame::data(rest)))),
                        None => Poll::Ready(None),
                    };
                }
                State::Closing(last) => {
                    let last = last.take();
                    this.state = State::Done;
                    if let Some(b) = last {
                        return this.emit(b);
                    }
                    continue;
                }
                State::Streaming => {}
            }
            if this.final_by.is_none()
                && matches!(&this.mode, Mode::Sse(w) if w.saw_terminal || w.error_data.is_some())
            {
                // The final event (or the provider's error event, which ends a stream) is
                // relayed: the answer is whole. The body's own end is waited for a moment
                // only: it comes at once from a provider that writes it after its last event
                // (the connection then goes back to the pool), and one that holds its body
                // open behind it kept the caller's stream open, and an SDK's stream helper
                // waiting, until idle_timeout.
                this.final_by = Some(Instant::now() + FINAL_GRACE);
            }
            if this.stop.is_cancelled() {
                this.state = this.shut_down();
                continue;
            }
            if this.deadline_due().is_some_and(|d| d <= Instant::now()) {
                this.state = this.fail(PAST_DEADLINE);
                continue;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    this.idle_from = None;
                    match frame.into_data() {
                        // Nothing after a stream's final event is passed on (a provider's
                        // junk, or keep-alives it sends while it holds the body open).
                        Ok(_) if matches!(&this.mode, Mode::Sse(w) if w.saw_terminal) => {
                            if this.final_by.is_some_and(|f| f <= Instant::now()) {
                                this.state = this.on_end();
                            }
                        }
                        Ok(data) => {
                            let out = this.observe(data);
                            if matches!(&this.mode, Mode::Sse(w) if w.oversize) {
                                // The complete events before it still go out, then the error.
                                this.state = this.fail_stream(
                                    "the upstream sent an event larger than server.max_event_bytes",
                                );
                                if let Some(out) = out {
                                    return this.emit(out);
                                }
                                continue;
                            }
                            // With a Content-Length the caller may have every byte before this
                            // body is polled again: account now, not at the next poll.
                            if this.inner.is_end_stream() {
                                this.state = this.on_end();
                            }
                            if let Some(out) = out {
                                return this.emit(out);
                            }
                        }
                        Err(other) => return Poll::Ready(Some(Ok(other))),
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "upstream body error");
                    this.state = this.fail("the upstream connection broke mid-response");
                }
                Poll::Ready(None) => this.state = this.on_end(),
                Poll::Pending => {
                    if this.abort.as_mut().poll(cx).is_ready() {
                        this.state = this.shut_down();
                        continue;
                    }
                    let idle_due = *this.idle_from.get_or_insert_with(Instant::now) + this.idle;
                    let due = this.deadline_due().map_or(idle_due, |d| d.min(idle_due));
                    let due = this.final_by.map_or(due, |f| f.min(due));
                    let timer = this
                        .timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                    // `passed` needs the timer armed no later than `due`: the final event's
                    // grace may come before the idle limit the timer is armed for.
                    if timer.deadline() > due {
                        timer.as_mut().reset(due);
                    }
                    if crate::proxy::upread::passed(timer.as_mut(), due, cx) {
                        if this.final_by.is_some() {
                            // The stream is whole; the body's end did not come in its moment.
                            this.state = this.on_end();
                            continue;
                        }
                        this.state = this.fail(if due < idle_due {
                            PAST_DEADLINE
                        } else {
                            // What stalled this stream would stall the next one put on its
                            // connection.
                            this.inner.retire_connection();
                            "the upstream sent nothing for longer than idle_timeout"
                        });
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.carry.is_empty() && matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.mode {
            // Redaction may change the length.
            Mode::Json { .. } if self.redact.is_none() => self.inner.size_hint(),
            Mode::Json { .. } => SizeHint::default(),
            Mode::Sse(_) => SizeHint::default(),
        }
    }
}

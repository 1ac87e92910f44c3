//! The response body of an API request: pre-rendered chunks (one per SSE event, or a JSON
//! document) sent with the scripted pacing and fault, settling the request's guard when the
//! last frame leaves or the client goes away.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::script::{Fault, FaultKind};
use super::state::RequestGuard;

/// The body error that makes hyper abort the connection: a scripted cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScriptedCut;

impl fmt::Display for ScriptedCut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection cut by the mock script")
    }
}

impl std::error::Error for ScriptedCut {}

/// A body of chunks, each sent as one frame, optionally spaced and interrupted by a fault.
pub(crate) struct MockBody {
    chunks: VecDeque<Bytes>,
    /// Chunks sent so far; a fault fires when this reaches its `after`.
    sent: usize,
    gap: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    fault: Option<Fault>,
    /// Sent in place of the rest when a `StreamError` fault fires.
    error_chunk: Bytes,
    /// Announced length (sets content-length); `None` streams with chunked framing.
    exact_len: Option<u64>,
    /// Set once the body has paused before a cut, so what was sent gets flushed first.
    cut_armed: bool,
    finished: bool,
    guard: Option<RequestGuard>,
}

impl MockBody {
    /// A whole document with a known length.
    pub(super) fn full(data: Bytes) -> MockBody {
        let len = data.len() as u64;
        MockBody::new(VecDeque::from([data]), Some(len))
    }

    /// A sequence of events with unknown total length.
    pub(super) fn events(events: Vec<Bytes>) -> MockBody {
        MockBody::new(VecDeque::from(events), None)
    }

    /// A whole document sent in two halves, with `fault` firing between them (`after` = 1):
    /// how a cut or hang looks on a non-streaming response.
    pub(super) fn halved(data: Bytes, kind: FaultKind) -> MockBody {
        let len = data.len() as u64;
        let mut first = data;
        let second = first.split_off(first.len() / 2);
        let mut body = MockBody::new(VecDeque::from([first, second]), Some(len));
        body.fault = Some(Fault { kind, after: 1 });
        body
    }

    fn new(chunks: VecDeque<Bytes>, exact_len: Option<u64>) -> MockBody {
        MockBody {
            chunks,
            sent: 0,
            gap: Duration::ZERO,
            sleep: None,
            fault: None,
            error_chunk: Bytes::new(),
            exact_len,
            cut_armed: false,
            finished: false,
            guard: None,
        }
    }

    /// Pause between chunks (not before the first).
    pub(super) fn with_gap(mut self, gap: Duration) -> MockBody {
        self.gap = gap;
        self
    }

    /// The fault to inject; `error_chunk` is what a `StreamError` fault sends.
    pub(super) fn with_fault(mut self, fault: Option<Fault>, error_chunk: Bytes) -> MockBody {
        self.fault = fault;
        self.error_chunk = error_chunk;
        self
    }

    /// Ties the request's counting to this body. An empty body counts as sent at once, since
    /// hyper may never poll it.
    pub(super) fn with_guard(mut self, mut guard: RequestGuard) -> MockBody {
        self.finished = self.chunks.iter().all(Bytes::is_empty) && self.fault.is_none();
        if self.finished {
            self.chunks.clear();
            guard.complete();
        }
        self.guard = Some(guard);
        self
    }

    fn fault_due(&self) -> Option<FaultKind> {
        self.fault.filter(|f| f.after == self.sent).map(|f| f.kind)
    }

    fn finish(&mut self) {
        self.finished = true;
        if let Some(guard) = &mut self.guard {
            guard.complete();
        }
    }

    /// Waits out the gap before every chunk but the first.
    fn poll_gap(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.sent == 0 || self.gap.is_zero() {
            return Poll::Ready(());
        }
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(self.gap)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.sleep = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = ScriptedCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ScriptedCut>>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(None);
        }
        match this.fault_due() {
            // Never woken: the connection stays open until the client leaves.
            Some(FaultKind::Hang) => return Poll::Pending,
            // hyper drops its unflushed write buffer when a body fails, so pause once first:
            // the head and the events before the cut reach the client, then the cut.
            Some(FaultKind::Cut) if !this.cut_armed => {
                this.cut_armed = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Some(FaultKind::Cut) => {
                this.finish();
                return Poll::Ready(Some(Err(ScriptedCut)));
            }
            Some(FaultKind::StreamError) => {
                if this.poll_gap(cx).is_pending() {
                    return Poll::Pending;
                }
                this.finish();
                let chunk = std::mem::take(&mut this.error_chunk);
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            None => {}
        }
        if this.chunks.is_empty() {
            this.finish();
            return Poll::Ready(None);
        }
        if this.poll_gap(cx).is_pending() {
            return Poll::Pending;
        }
        let Some(chunk) = this.chunks.pop_front() else {
            this.finish();
            return Poll::Ready(None);
        };
        this.sent += 1;
        if this.chunks.is_empty() && this.fault_due().is_none() {
            this.finish();
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(len) => SizeHint::with_exact(len),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn chunks(items: &[&'static str]) -> Vec<Bytes> {
        items
            .iter()
            .map(|s| Bytes::from_static(s.as_bytes()))
            .collect()
    }

    async fn drain(mut body: MockBody) -> (Vec<Bytes>, Option<ScriptedCut>) {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => out.extend(frame.into_data().ok()),
                Err(cut) => return (out, Some(cut)),
            }
        }
        (out, None)
    }

    #[tokio::test]
    async fn events_are_sent_in_order_then_end() {
        let (out, err) = drain(MockBody::events(chunks(&["a", "b", "c"]))).await;
        assert_eq!(out, chunks(&["a", "b", "c"]));
        assert_eq!(err, None);
    }

    #[tokio::test]
    async fn stream_error_replaces_the_rest() {
        let fault = Some(Fault {
            kind: FaultKind::StreamError,
            after: 1,
        });
        let body = MockBody::events(chunks(&["a", "b"])).with_fault(fault, Bytes::from("E"));
        let (out, err) = drain(body).await;
        assert_eq!(out, chunks(&["a", "E"]));
        assert_eq!(err, None);
    }

    #[tokio::test]
    async fn cut_yields_an_error_after_n_events() {
        for after in 0..=2 {
            let fault = Some(Fault {
                kind: FaultKind::Cut,
                after,
            });
            let body = MockBody::events(chunks(&["a", "b"])).with_fault(fault, Bytes::new());
            let (out, err) = drain(body).await;
            assert_eq!(out.len(), after);
            assert_eq!(err, Some(ScriptedCut));
        }
    }

    #[tokio::test]
    async fn fault_past_the_end_never_fires() {
        let fault = Some(Fault {
            kind: FaultKind::Cut,
            after: 3,
        });
        let body = MockBody::events(chunks(&["a", "b"])).with_fault(fault, Bytes::new());
        assert_eq!(drain(body).await, (chunks(&["a", "b"]), None));
    }

    #[tokio::test]
    async fn halved_body_announces_full_length_and_cuts_midway() {
        let body = MockBody::halved(Bytes::from("0123456789"), FaultKind::Cut);
        assert_eq!(body.size_hint().exact(), Some(10));
        let (out, err) = drain(body).await;
        assert_eq!(out, chunks(&["01234"]));
        assert_eq!(err, Some(ScriptedCut));
    }

    #[tokio::test]
    async fn gap_spaces_every_chunk_after_the_first() {
        let start = tokio::time::Instant::now();
        let body = MockBody::events(chunks(&["a", "b", "c"])).with_gap(Duration::from_millis(20));
        let (out, _) = drain(body).await;
        assert_eq!(out.len(), 3);
        assert!(start.elapsed() >= Duration::from_millis(40));
    }
}

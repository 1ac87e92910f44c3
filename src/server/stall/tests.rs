//! The stall watch on a paused clock: a body fed through a channel, whose drop is seen.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::*;

const LIMIT: Duration = Duration::from_secs(120);

/// The watch of an HTTP/2 connection idle-bounded at [`LIMIT`].
fn conn() -> Arc<ConnWatch> {
    let watch = ConnWatch::new(super::super::conn::ConnLimits {
        header_read_timeout: Duration::from_secs(10),
        connection_idle_timeout: LIMIT,
        body_read_timeout: Duration::from_secs(60),
    });
    watch.speaks_frames();
    watch
}

/// An endless answer: frames as the test sends them, and a flag set when it is dropped (as
/// an upstream stream is released).
struct Feed {
    rx: mpsc::UnboundedReceiver<Bytes>,
    dropped: Arc<AtomicBool>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl Body for Feed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

fn feed() -> (
    StallWatched<Feed>,
    mpsc::UnboundedSender<Bytes>,
    Arc<AtomicBool>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let dropped = Arc::new(AtomicBool::new(false));
    let body = Feed {
        rx,
        dropped: dropped.clone(),
    };
    (StallWatched::new(body, conn()), tx, dropped)
}

/// One poll of the body, as hyper makes it when the stream has credit.
async fn next(body: &mut StallWatched<Feed>) -> Option<Result<Frame<Bytes>, BoxError>> {
    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

#[tokio::test(start_paused = true)]
async fn a_frame_not_asked_for_again_within_the_limit_drops_the_body() {
    let (mut body, tx, dropped) = feed();
    tx.send(Bytes::from_static(b"a")).unwrap();
    assert!(next(&mut body).await.unwrap().is_ok());
    let handed = Instant::now();
    // hyper asks for nothing more (the stream has no credit): the body goes at the limit.
    tokio::time::sleep(LIMIT - Duration::from_secs(1)).await;
    assert!(!dropped.load(Ordering::SeqCst));
    while !dropped.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = handed.elapsed();
    assert!(
        took >= LIMIT && took <= LIMIT + Duration::from_millis(100),
        "{took:?}"
    );
    // Asked again later (credit came), the stream ends in an error.
    let err = next(&mut body).await.unwrap().unwrap_err();
    assert!(err.to_string().contains("flow-control credit"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_polled_in_time_or_waiting_on_its_provider_is_never_cut() {
    let (mut body, tx, dropped) = feed();
    // Frames taken every 100 s of a 120 s limit, for ten times the limit.
    for _ in 0..12 {
        tx.send(Bytes::from_static(b"a")).unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_secs(100)).await;
    }
    // Then the provider is slow: the body waits on it (Pending) for three times the limit.
    let waiting = tokio::spawn(async move {
        let frame = next(&mut body).await;
        (body, frame)
    });
    tokio::time::sleep(LIMIT * 3).await;
    assert!(!dropped.load(Ordering::SeqCst));
    tx.send(Bytes::from_static(b"late")).unwrap();
    let (_body, frame) = waiting.await.unwrap();
    let data = frame.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&data[..], b"late");
    assert!(!dropped.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_or_is_dropped_leaves_no_watcher_behind() {
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    for end in [true, false] {
        let (mut body, tx, _dropped) = feed();
        tx.send(Bytes::from_static(b"a")).unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        assert_eq!(alive(), 1, "a watcher once a frame is out");
        if end {
            drop(tx);
            assert!(next(&mut body).await.is_none());
        } else {
            drop(body);
        }
        // An aborted task is gone at the runtime's next turn, long before its limit.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(alive(), 0, "ended: {end}");
    }
}

/// A whole answer: one frame, after which it is at its end; a flag set when it is dropped.
struct Whole {
    data: Option<Bytes>,
    dropped: Arc<AtomicBool>,
}

impl Drop for Whole {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl Body for Whole {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().data.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }
}

#[tokio::test(start_paused = true)]
async fn a_whole_answer_held_for_credit_past_the_limit_is_dropped_and_one_sent_is_not() {
    for sent in [false, true] {
        let dropped = Arc::new(AtomicBool::new(false));
        let whole = Whole {
            data: Some(Bytes::from_static(b"the answer")),
            dropped: dropped.clone(),
        };
        let mut body = StallWatched::new(whole, conn());
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        assert_eq!(
            &frame.unwrap().unwrap().into_data().unwrap()[..],
            b"the answer"
        );
        assert!(body.is_end_stream());
        if sent {
            // Credit was there: hyper sends the frame and drops the body, and the watcher goes.
            drop(body);
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(
                tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks(),
                0
            );
            continue;
        }
        // hyper holds the frame, and the body, waiting for credit that does not come: the
        // body (and with it the request's count in flight) goes at the limit.
        tokio::time::sleep(LIMIT - Duration::from_secs(1)).await;
        assert!(!dropped.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(dropped.load(Ordering::SeqCst));
        drop(body);
    }
}

/// Whether the connection was asked to end with GOAWAY.
fn goaway_asked(watch: &ConnWatch) -> bool {
    let mut due = std::pin::pin!(watch.goaway_due());
    due.as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
        .is_ready()
}

/// A whole answer of `len` bytes, handed to hyper and never asked for again.
async fn starved_whole(
    watch: &Arc<ConnWatch>,
    len: usize,
) -> (StallWatched<Whole>, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    let whole = Whole {
        data: Some(Bytes::from(vec![b'x'; len])),
        dropped: dropped.clone(),
    };
    let mut body = StallWatched::new(whole, watch.clone());
    assert!(next_whole(&mut body).await.unwrap().is_ok());
    (body, dropped)
}

async fn next_whole(body: &mut StallWatched<Whole>) -> Option<Result<Frame<Bytes>, BoxError>> {
    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

/// What cut streams leave with hyper is counted per connection, each as its last frame and
/// the HTTP/2 layer's send buffer: up to `CUT_HELD_MAX` the connection goes on; past it, it is
/// asked for GOAWAY, with another request still in flight.
#[tokio::test(start_paused = true)]
async fn cut_streams_holding_more_than_the_cap_ask_their_connection_for_goaway() {
    use super::super::conn::{CUT_HELD_MAX, H2_SEND_BUF};
    let watch = conn();
    let _busy = watch.begin();
    // Thirty streams cut with a 1 KiB frame out: about 12 MiB counted, under the cap.
    let mut small = Vec::new();
    for _ in 0..30 {
        let (mut body, tx, dropped) = {
            let (tx, rx) = mpsc::unbounded_channel();
            let dropped = Arc::new(AtomicBool::new(false));
            let feed = Feed {
                rx,
                dropped: dropped.clone(),
            };
            (StallWatched::new(feed, watch.clone()), tx, dropped)
        };
        tx.send(Bytes::from(vec![b'x'; 1024])).unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        small.push((body, tx, dropped));
    }
    tokio::time::sleep(LIMIT + Duration::from_secs(1)).await;
    assert!(small.iter().all(|(_, _, d)| d.load(Ordering::SeqCst)));
    assert!(
        !goaway_asked(&watch),
        "30 small cut streams are under the cap"
    );
    // A whole answer that brings the count to the cap exactly: still not past it.
    let counted = 30 * (1024 + H2_SEND_BUF as u64);
    let fill = (CUT_HELD_MAX - counted - H2_SEND_BUF as u64) as usize;
    let (_first, dropped) = starved_whole(&watch, fill).await;
    tokio::time::sleep(LIMIT + Duration::from_secs(1)).await;
    assert!(dropped.load(Ordering::SeqCst));
    assert!(!goaway_asked(&watch), "at the cap is not past it");
    // Any further cut passes it: the connection is asked to end, a request in flight or not.
    let (_second, dropped) = starved_whole(&watch, 1).await;
    tokio::time::sleep(LIMIT - Duration::from_secs(1)).await;
    assert!(!goaway_asked(&watch), "not before the stream is cut");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(dropped.load(Ordering::SeqCst));
    assert!(goaway_asked(&watch), "past the cap: GOAWAY");
}

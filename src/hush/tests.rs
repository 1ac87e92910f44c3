//! The hold against fake channels (which wake-ups are dropped, which are passed on), and
//! against hyper's own HTTP/1 connections: one connection task poll fewer per answer read, the
//! connection still reused, and a body that comes in parts still read to its end.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A task waker that counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Count {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// What a fake channel answers to each poll after the first, which always hands out the
/// body's last chunk.
#[derive(Clone, Copy)]
enum Then {
    Closed,
    Open,
    More,
}

/// A body standing in for hyper's channel: taking a chunk wakes the sender's waker (`sender`),
/// as hyper's does.
struct FakeChan {
    sender: Arc<Mutex<Option<Waker>>>,
    chunks: VecDeque<Bytes>,
    then: Then,
}

impl Body for FakeChan {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            if let Some(w) = self.sender.lock().unwrap().take() {
                w.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match self.then {
            Then::Closed => Poll::Ready(None),
            Then::Open => Poll::Pending,
            Then::More => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"more"))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum())
    }
}

/// A connection task (polled through `quieted`) that has left its waker with `sender`, as
/// hyper's dispatcher does when it waits for the reader, and the counter of its wake-ups.
fn parked_task(sender: &Arc<Mutex<Option<Waker>>>) -> (Arc<Count>, Parked) {
    let count = Arc::new(Count::default());
    let task_waker = Waker::from(count.clone());
    let s = sender.clone();
    let fut = Box::pin(quieted(std::future::poll_fn(move |cx| {
        *s.lock().unwrap() = Some(cx.waker().clone());
        Poll::<()>::Pending
    })));
    let mut parked = Parked { fut, task_waker };
    parked.poll();
    (count, parked)
}

/// A parked connection task, kept so that it can be polled again.
struct Parked {
    fut: Pin<Box<dyn Future<Output = ()>>>,
    task_waker: Waker,
}

impl Parked {
    fn poll(&mut self) {
        let mut cx = Context::from_waker(&self.task_waker);
        assert!(self.fut.as_mut().poll(&mut cx).is_pending());
    }
}

/// Reads `chunks` from a fake channel through `Hushed` (`hush` as given) and returns the task's
/// wake-ups and what the second read saw.
fn read_once(hush: bool, chunks: &[&'static [u8]], then: Then) -> (usize, Poll<bool>) {
    let sender = Arc::new(Mutex::new(None));
    let (task, _parked) = parked_task(&sender);
    let chan = FakeChan {
        sender,
        chunks: chunks.iter().map(|c| Bytes::from_static(c)).collect(),
        then,
    };
    let mut body = Hushed::new(chan, hush);
    let reader = Waker::from(Arc::new(Count::default()));
    let mut cx = Context::from_waker(&reader);
    assert!(matches!(
        Pin::new(&mut body).poll_frame(&mut cx),
        Poll::Ready(Some(Ok(_)))
    ));
    let second = Pin::new(&mut body).poll_frame(&mut cx).map(|f| f.is_some());
    (task.get(), second)
}

#[test]
fn the_last_chunk_of_a_closed_channel_wakes_nobody() {
    let (wakes, second) = read_once(true, &[b"whole"], Then::Closed);
    assert_eq!(wakes, 0);
    // The end the channel told `Hushed` early is still handed out, once.
    assert_eq!(second, Poll::Ready(false));
}

#[test]
fn a_wake_up_someone_needs_is_passed_on() {
    // The sending end still open: it may be waiting to be told the chunk was taken.
    assert_eq!(read_once(true, &[b"whole"], Then::Open), (1, Poll::Pending));
    // A frame after the "last" chunk (trailers): kept for the next read, wake-up passed on.
    assert_eq!(
        read_once(true, &[b"whole"], Then::More),
        (1, Poll::Ready(true))
    );
    // Not the last chunk: the sender has more to send.
    assert_eq!(
        read_once(true, &[b"one", b"two"], Then::Closed),
        (1, Poll::Ready(true))
    );
    // Not hushed (HTTP/2): as hyper sends it.
    assert_eq!(
        read_once(false, &[b"whole"], Then::Closed),
        (1, Poll::Ready(false))
    );
}

#[test]
fn a_wake_up_outside_a_read_reaches_the_task() {
    let sender = Arc::new(Mutex::new(None));
    let (task, mut parked) = parked_task(&sender);
    let waker = sender.lock().unwrap().take().unwrap();
    waker.wake_by_ref();
    assert_eq!(task.get(), 1);
    // Woken, the task runs again and leaves its waker anew.
    parked.poll();
    waker.wake();
    assert_eq!(task.get(), 2);
    assert!(!OPEN.get());
}

/// Polls `fut` and counts how often.
async fn counting<F: Future>(fut: F, polls: Arc<AtomicUsize>) -> F::Output {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        polls.fetch_add(1, Ordering::SeqCst);
        fut.as_mut().poll(cx)
    })
    .await
}

/// A hyper server on one end of an in-memory pipe answering each request with its body's
/// length; a hyper client on the other, its connection task polled through `quieted` and
/// counted. Reads `requests` answers (hushed or not) on the one connection and returns the
/// connection task's polls.
async fn client_polls(hush: bool, requests: usize) -> usize {
    let (client_io, server_io) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        let svc = service_fn(|req: Request<Incoming>| async move {
            let n = req.into_body().collect().await.unwrap().to_bytes().len();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(n.to_string()))))
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), svc)
            .await
            .unwrap();
    });
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .unwrap();
    let polls = Arc::new(AtomicUsize::new(0));
    let driver = tokio::spawn(quieted(counting(conn, polls.clone())));
    for i in 0..requests {
        sender.ready().await.unwrap();
        let body = Full::new(Bytes::from(vec![b'x'; i + 1]));
        let resp = sender
            .send_request(Request::post("/").body(body).unwrap())
            .await
            .unwrap();
        let got = Hushed::new(resp.into_body(), hush)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(got, (i + 1).to_string());
        // The reader moves on to other work (legate writes the answer to its caller), and a
        // connection task woken meanwhile runs then, not merged with the next request's wake.
        tokio::task::yield_now().await;
    }
    drop(sender);
    driver.await.unwrap().unwrap();
    polls.load(Ordering::SeqCst)
}

#[tokio::test]
async fn each_answer_read_whole_costs_its_connection_one_poll_less() {
    const REQUESTS: usize = 5;
    let plain = client_polls(false, REQUESTS).await;
    let hushed = client_polls(true, REQUESTS).await;
    // Every answer came whole with its head: hyper woke the connection once per answer for
    // nothing. (If this fails with `plain == hushed`, hyper no longer sends that wake-up and
    // this module can go.)
    assert_eq!(plain - hushed, REQUESTS, "plain {plain}, hushed {hushed}");
}

#[tokio::test(start_paused = true)]
async fn a_known_length_in_two_parts_is_read_to_its_end() {
    // The body's second part arrives while its first still waits in the channel, untaken: the
    // connection cannot hand it over, and once the reader takes the first part, only the
    // reader's wake-up lets the connection go on (the socket's readiness was spent already).
    // A wake-up held and never passed on stalls the request; the paused clock then runs the
    // timeout out at once.
    let (mut client_io, server_io) = tokio::io::duplex(64 << 10);
    let (called_tx, mut called) = tokio::sync::mpsc::channel::<()>(1);
    let release = Arc::new(tokio::sync::Notify::new());
    let go = release.clone();
    tokio::spawn(quieted(async move {
        let svc = service_fn(move |req: Request<Incoming>| {
            let (called_tx, go) = (called_tx.clone(), go.clone());
            async move {
                called_tx.send(()).await.unwrap();
                go.notified().await;
                let mut body = Hushed::new(req.into_body(), true);
                let mut got = Vec::new();
                while let Some(frame) = body.frame().await {
                    got.extend_from_slice(&frame.unwrap().into_data().unwrap());
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(got))))
            }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), svc)
            .await
            .unwrap();
    }));
    client_io
        .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\n\r\nhalf")
        .await
        .unwrap();
    // The service was called: "half" is in the channel.
    called.recv().await.unwrap();
    client_io.write_all(b"rest").await.unwrap();
    // The connection sees "rest" readable but cannot hand it over yet.
    tokio::task::yield_now().await;
    release.notify_one();
    let read = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"halfrest") {
            let n = client_io.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "connection closed: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        got
    };
    let got = tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .expect("the server stalled on the body's second part");
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"));
}

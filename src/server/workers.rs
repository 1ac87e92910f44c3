//! The data plane's worker threads when `server.worker_threads` is more than one.
//!
//! Each worker is a thread with a current-thread runtime of its own, and each accepted caller
//! connection is handed to one worker for its whole life: its requests, the upstream
//! connections they open and the tasks they spawn all run on that thread. A request's tasks
//! then hand over to each other in place, as on one worker, and the workers share nothing per
//! request but the proxy's state (limits, breakers, metrics, stores), which is already
//! thread-safe. tokio's multi-thread scheduler would instead let any worker run any task: every
//! wake-up between a caller connection and its upstream connection may then wake another
//! thread, and each task switch pays for work stealing (bench/README.md: about a fifth more CPU
//! per request under load with one worker; with two, 8.8 system calls per request, of which
//! 2.5 wake-ups, where these workers make 6, as one does).
//!
//! The thread that runs [`super::start`] is worker 0 (it also runs the admin plane, reloads and
//! the other housekeeping); the others are started here. A new connection goes to the worker
//! with the fewest open connections. The price: one caller connection never uses more than one
//! core, which for HTTP/2 (many streams on one connection) caps that caller at one worker.
//!
//! Upstream connection pools keep one list per worker ([`current`]), so that a request never
//! takes a connection whose task runs on another thread.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The worker this thread belongs to (0 for any thread not started here).
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The worker the calling thread belongs to: 0 on the thread that started the server and on
/// any thread legate did not start as a worker.
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

/// Blocking threads per extra worker (DNS lookups of new upstream connections, token
/// estimates): each thread that allocates gets a malloc arena whose pages stay resident, so
/// the pool is small; the thread that started the server keeps its own, larger one.
const BLOCKING_THREADS: usize = 4;

/// How long a stopping worker waits for its blocking tasks.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// The workers connections are spread over. Dropping it stops the extra threads; tasks still
/// on them are dropped.
pub struct Workers {
    /// Open connections per worker; index 0 is the starting thread's.
    open: Vec<Arc<AtomicUsize>>,
    extra: Vec<Extra>,
}

struct Extra {
    handle: Handle,
    /// Dropped to stop the thread.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// Starts `total - 1` worker threads beside the calling one.
    pub async fn start(total: usize) -> std::io::Result<Workers> {
        let mut extra = Vec::with_capacity(total.saturating_sub(1));
        for index in 1..total {
            extra.push(Extra::start(index).await?);
        }
        Ok(Workers {
            open: (0..extra.len() + 1)
                .map(|_| Arc::new(AtomicUsize::new(0)))
                .collect(),
            extra,
        })
    }

    /// How many workers there are, the calling thread's included.
    pub fn count(&self) -> usize {
        self.open.len()
    }

    /// Runs `serve` on `stream` on the worker with the fewest open connections (the first of
    /// them on a tie, so that light load stays on one thread). The socket is registered again
    /// with that worker's I/O driver: left with the accepting thread's, every read and write
    /// readiness would be delivered there and wake the worker through it.
    pub fn spawn_conn<S, F>(&self, stream: TcpStream, serve: S)
    where
        S: FnOnce(TcpStream) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let (i, open) = self.pick();
        let Some(worker) = i.checked_sub(1).and_then(|e| self.extra.get(e)) else {
            tokio::spawn(async move {
                let _open = open;
                serve(stream).await;
            });
            return;
        };
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "connection dropped: cannot hand it to a worker");
                return;
            }
        };
        worker.handle.spawn(async move {
            let _open = open;
            match TcpStream::from_std(stream) {
                Ok(s) => serve(s).await,
                Err(e) => {
                    tracing::debug!(error = %e, "connection dropped: a worker cannot watch it")
                }
            }
        });
    }

    /// The worker with the fewest open connections, counted one more.
    fn pick(&self) -> (usize, Open) {
        let (i, open) = self
            .open
            .iter()
            .enumerate()
            .min_by_key(|(_, n)| n.load(Ordering::Relaxed))
            .map(|(i, n)| (i, n.clone()))
            .unwrap_or_else(|| (0, Arc::new(AtomicUsize::new(0))));
        open.fetch_add(1, Ordering::Relaxed);
        (i, Open(open))
    }
}

/// Counts a connection open until its task ends or is dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Extra {
    /// Starts worker `index`'s thread and waits until its runtime runs.
    async fn start(index: usize) -> std::io::Result<Extra> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("legate-worker-{index}"))
            .spawn(move || {
                INDEX.set(index);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .max_blocking_threads(BLOCKING_THREADS)
                    .thread_keep_alive(Duration::from_secs(2))
                    .on_thread_start(move || INDEX.set(index))
                    .enable_all()
                    .build();
                let rt = match rt {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if ready_tx.send(Ok(rt.handle().clone())).is_err() {
                    return;
                }
                let _ = rt.block_on(stop_rx);
                rt.shutdown_timeout(STOP_WAIT);
            })?;
        let handle = ready_rx
            .await
            .map_err(|_| std::io::Error::other("a worker thread ended before it started"))??;
        Ok(Extra {
            handle,
            _stop: stop_tx,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// What a served connection saw: its worker and thread, and the byte it read.
    type Seen = (usize, Option<String>, u8);

    /// Accepts one connection from a new client and serves it on `workers`: the task reads
    /// one byte, reports where it ran, then holds the connection until `hold` fires.
    async fn serve_one(
        workers: &Workers,
        listener: &TcpListener,
        hold: oneshot::Receiver<()>,
    ) -> (TcpStream, Seen) {
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let mut client = client.unwrap();
        let (stream, _) = accepted.unwrap();
        let (seen_tx, seen_rx) = oneshot::channel();
        workers.spawn_conn(stream, move |mut s: TcpStream| async move {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            let thread = std::thread::current().name().map(str::to_owned);
            let _ = seen_tx.send((current(), thread, b[0]));
            let _ = hold.await;
        });
        client.write_all(b"x").await.unwrap();
        (client, seen_rx.await.expect("served"))
    }

    #[tokio::test]
    async fn connections_go_to_the_least_busy_worker_and_are_served_there() {
        let workers = Workers::start(3).await.expect("workers");
        assert_eq!(workers.count(), 3);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut seen = Vec::new();
        let mut holds = Vec::new();
        for _ in 0..6 {
            let (hold_tx, hold_rx) = oneshot::channel::<()>();
            let (client, s) = serve_one(&workers, &listener, hold_rx).await;
            seen.push(s);
            holds.push((hold_tx, client));
        }
        let indexes: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(indexes, [0, 1, 2, 0, 1, 2]);
        assert_eq!(seen[1].1.as_deref(), Some("legate-worker-1"));
        assert_eq!(seen[2].1.as_deref(), Some("legate-worker-2"));
        assert!(seen.iter().all(|s| s.2 == b'x'), "each read its byte");

        // Worker 1's connections end: the next two go there.
        drop(holds.remove(4));
        drop(holds.remove(1));
        while workers.open[1].load(Ordering::Relaxed) != 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..2 {
            let (hold, hold_rx) = oneshot::channel::<()>();
            let (client, s) = serve_one(&workers, &listener, hold_rx).await;
            assert_eq!(s.0, 1);
            holds.push((hold, client));
        }
    }

    #[tokio::test]
    async fn dropping_the_workers_stops_their_threads() {
        let workers = Workers::start(2).await.expect("workers");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_hold0, rx0) = oneshot::channel::<()>();
        let (_client0, first) = serve_one(&workers, &listener, rx0).await;
        let (mut hold1, rx1) = oneshot::channel::<()>();
        let (_client1, second) = serve_one(&workers, &listener, rx1).await;
        assert_eq!((first.0, second.0), (0, 1));
        drop(workers);
        // The task on worker 1 was dropped with its runtime, and with it its end of `hold1`.
        tokio::time::timeout(Duration::from_secs(10), hold1.closed())
            .await
            .expect("the task was dropped");
    }
}

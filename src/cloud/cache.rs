//! A credential held between refreshes: used while comfortably valid, fetched again before it
//! expires, and described for `/admin/state` by its source and expiry — never its value.
//!
//! A fetch runs in its own task, one at a time, and every caller that needs the credential
//! meanwhile waits on that one fetch, each only as long as its own deadline allows: a hung
//! endpoint (bounded at 10 s by `fetch`) costs the callers that arrive during it one wait
//! together, not one each in turn. A refresh never holds a caller up while the credential in
//! hand still works: the caller uses it and the refresh goes on behind. After a failed fetch
//! the next one waits a second, doubling up to 30 s while they keep failing, and a caller
//! without a working credential gets the last failure at once, so that a chain falls back
//! without first waiting on an endpoint known to be down. The fetch that ends such a pause is
//! a probe of an endpoint that last failed: callers wait for it only until [`PROBE_WAIT`] after
//! it started (a healthy endpoint answers well within it), then get the last failure at once
//! while the probe goes on. Otherwise, with an endpoint that hangs, one request per pause would wait out the whole
//! fetch (10 s) before its chain fell back. A caller whose chain has a step after this one
//! ([`Wait::brief`]) waits as briefly on any fetch, the first of all too: a hung endpoint at
//! start-up would otherwise hold every request of its first 10 s before the fallback.
//!
//! What an endpoint says of a credential's life is not taken on trust: one that has expired,
//! or expires within a second, is a failed fetch, and one said to last longer than
//! [`MAX_LIFE`] is fetched again within it. A credential the platform refuses (401, 403) is
//! not sent again (at most once a minute: a refusal a new one does not cure costs a fetch a
//! minute): it may have been revoked before the expiry it came with.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;

/// A credential is refreshed once less than this is left of its life…
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// …or, for short-lived ones, once less than this share of its life is left.
const REFRESH_SHARE: u32 = 4;
/// A credential the platform refuses is fetched again, unless it is younger than this: a
/// refusal that a new credential does not cure (a missing permission) costs the endpoint one
/// fetch a minute, not one per request.
const REFUSED_REFETCH_AFTER: Duration = Duration::from_secs(60);
/// A credential with less life than this is taken as expired: using it would mean a fetch
/// per request.
const MIN_LIFE: Duration = Duration::from_secs(1);
/// The longest life taken from an endpoint (AWS's longest role session).
pub const MAX_LIFE: Duration = Duration::from_secs(12 * 3600);
/// The wait before the fetch after a failed one, doubling up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The longest a caller waits on a fetch made after a failed one, or on any fetch when it
/// has somewhere else to go ([`Wait::brief`]).
const PROBE_WAIT: Duration = Duration::from_secs(1);

const ENDED: &str = "the credential fetch ended without an outcome";

/// A fetched credential and when it stops working (`None`: it does not expire).
pub struct Fetched<T> {
    pub value: T,
    pub expires: Option<SystemTime>,
}

struct Held<T> {
    value: Arc<T>,
    expires: Option<SystemTime>,
    /// Refresh from this moment on.
    refresh_at: Option<SystemTime>,
    fetched_at: SystemTime,
    /// When it became the one held: calls sent before then carried an older one.
    held_since: Instant,
    /// The platform refused it (see [`Cached::refused`]): no request is sent with it again,
    /// while a new one can be fetched.
    refused: bool,
}

/// What `/admin/state` shows of a credential.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CredentialState {
    pub source: String,
    /// Seconds since the Unix epoch.
    pub expires_at: Option<u64>,
    pub refreshed_at: Option<u64>,
    /// Why the last fetch failed (no secret), until one succeeds.
    pub last_error: Option<String>,
}

/// Why no credential could be had.
#[derive(Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The fetch failed (why, with no secret).
    Failed(String),
    /// The caller's deadline came first.
    Deadline,
}

/// How long a caller without a working credential waits on the fetch in flight.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    deadline: Instant,
    /// The caller's chain has a step after this one: it waits on any fetch only until
    /// [`PROBE_WAIT`] after the fetch started, then falls back.
    brief: bool,
}

impl Wait {
    /// Until the caller's deadline (a probe after a failure still only [`PROBE_WAIT`]).
    pub fn until(deadline: Instant) -> Self {
        Wait {
            deadline,
            brief: false,
        }
    }

    /// Until `deadline`, and on any fetch only [`PROBE_WAIT`] after its start.
    pub fn brief(deadline: Instant) -> Self {
        Wait {
            deadline,
            brief: true,
        }
    }
}

impl From<Instant> for Wait {
    fn from(deadline: Instant) -> Self {
        Wait::until(deadline)
    }
}

/// A fetch's outcome, as every caller waiting on it sees it.
type Outcome<T> = Option<Result<Arc<T>, String>>;

/// The fetch in flight, and the pause after a failed one.
struct Flight<T> {
    pending: Option<watch::Receiver<Outcome<T>>>,
    /// When the fetch in flight started: callers wait for a probe, and brief ones for any
    /// fetch, until [`PROBE_WAIT`] after it.
    started: Instant,
    /// The fetch in flight follows a failed one.
    probing: bool,
    /// No fetch starts before this (after a failure).
    retry_at: Option<Instant>,
    backoff: Duration,
    last_error: Option<String>,
}

pub struct Cached<T> {
    held: Mutex<Option<Held<T>>>,
    /// The credential the last refresh replaced: it may still have been on a request out
    /// when the refresh landed (refreshes run ahead of expiry), and its answer is searched
    /// for it too (`redact`).
    previous: Mutex<Option<Arc<T>>>,
    flight: Mutex<Flight<T>>,
    state: Mutex<CredentialState>,
    /// Told of every fetch (`legate_credential_refreshes_total`).
    refreshed: Box<dyn Fn(bool) + Send + Sync>,
}

fn epoch(t: SystemTime) -> Option<u64> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

impl<T: Send + Sync + 'static> Cached<T> {
    pub fn new(source: String, refreshed: impl Fn(bool) + Send + Sync + 'static) -> Self {
        Cached {
            held: Mutex::new(None),
            previous: Mutex::new(None),
            flight: Mutex::new(Flight {
                pending: None,
                started: Instant::now(),
                probing: false,
                retry_at: None,
                backoff: Duration::ZERO,
                last_error: None,
            }),
            state: Mutex::new(CredentialState {
                source,
                ..Default::default()
            }),
            refreshed: Box::new(refreshed),
        }
    }

    pub fn state(&self) -> CredentialState {
        self.state.lock().clone()
    }

    /// The credential held now, expired or not: the one requests were last sent with.
    pub fn held(&self) -> Option<Arc<T>> {
        self.held.lock().as_ref().map(|h| h.value.clone())
    }

    /// The credential the last refresh replaced, if any.
    pub fn previous(&self) -> Option<Arc<T>> {
        self.previous.lock().clone()
    }

    /// The held credential if it needs no refresh at `now`.
    fn fresh(&self, now: SystemTime) -> Option<Arc<T>> {
        self.held_before(now, |h| h.refresh_at)
    }

    /// The held credential if it still works at `now`, refresh due or not: not expired, and
    /// not refused by the platform.
    fn usable(&self, now: SystemTime) -> Option<Arc<T>> {
        self.held_before(now, |h| {
            if h.refused {
                Some(h.fetched_at)
            } else {
                h.expires
            }
        })
    }

    /// The held credential if not expired at `now`, refused or not: what is used while no new
    /// one can be had (a refusal may have been of one call only, and none at all fails every
    /// call).
    fn unexpired(&self, now: SystemTime) -> Option<Arc<T>> {
        self.held_before(now, |h| h.expires)
    }

    /// The held credential if `now` is before the moment `until` picks of it (`None`: never).
    fn held_before(
        &self,
        now: SystemTime,
        until: fn(&Held<T>) -> Option<SystemTime>,
    ) -> Option<Arc<T>> {
        let held = self.held.lock();
        let h = held.as_ref()?;
        match until(h) {
            Some(at) if now >= at => None,
            _ => Some(h.value.clone()),
        }
    }

    /// The credential: the one held while it needs no refresh; when a refresh is due, the
    /// one held still (the refresh runs behind); with none that works, the outcome of the
    /// fetch in flight (started with `fetch` if there is none), waited for as `wait` says.
    pub async fn get<F, Fut>(
        self: &Arc<Self>,
        fetch: F,
        wait: impl Into<Wait>,
    ) -> Result<Arc<T>, Unavailable>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched<T>, String>> + Send + 'static,
    {
        let now = SystemTime::now();
        if let Some(v) = self.fresh(now) {
            return Ok(v);
        }
        let Wait { deadline, brief } = wait.into();
        let usable = self.usable(now);
        let (mut outcome, probe, started) = {
            let mut flight = self.flight.lock();
            // A fetch whose task is gone without an outcome (it panicked) is no longer waited on.
            let live = flight
                .pending
                .as_ref()
                .filter(|rx| rx.has_changed().is_ok())
                .cloned();
            // A fetch that ended since the look above left a credential: no second one.
            if live.is_none()
                && let Some(v) = self.fresh(SystemTime::now())
            {
                return Ok(v);
            }
            let last = flight.last_error.clone().filter(|_| usable.is_none());
            match live {
                Some(rx) => (rx, last.filter(|_| flight.probing), flight.started),
                None if flight.retry_at.is_some_and(|at| Instant::now() < at) => {
                    // The endpoint failed a moment ago and is not asked again yet: a refused
                    // credential not yet expired is used rather than none (every call a 502
                    // for the backoff's length, the credential perhaps still good).
                    return match usable.or_else(|| self.unexpired(now)) {
                        Some(v) => Ok(v),
                        None => Err(Unavailable::Failed(
                            flight.last_error.clone().unwrap_or_default(),
                        )),
                    };
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    flight.pending = Some(rx.clone());
                    flight.started = Instant::now();
                    flight.probing = flight.last_error.is_some();
                    let this = self.clone();
                    let fut = fetch();
                    tokio::spawn(async move {
                        let fetched_at = SystemTime::now();
                        let got = this.settle(fut.await, fetched_at);
                        let _ = tx.send(Some(got));
                    });
                    (rx, last.filter(|_| flight.probing), flight.started)
                }
            }
        };
        if let Some(v) = usable {
            return Ok(v);
        }
        // After a failure, the last one stands unless the probe answers soon; a caller that
        // can fall back waits as briefly on any fetch.
        let short = probe.is_some() || brief;
        let until = if short {
            deadline.min(started + PROBE_WAIT)
        } else {
            deadline
        };
        let waited = tokio::time::timeout_at(until, outcome.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(got)) => match got.as_ref() {
                Some(Ok(v)) => Ok(v.clone()),
                // The fetch failed: a refused credential not yet expired is used rather than
                // none, as it is while the endpoint is not asked again.
                Some(Err(e)) => self
                    .unexpired(SystemTime::now())
                    .ok_or_else(|| Unavailable::Failed(e.clone())),
                None => Err(Unavailable::Failed(ENDED.into())),
            },
            // The fetch's task ended without an outcome (it panicked).
            Ok(Err(_)) => Err(Unavailable::Failed(ENDED.into())),
            Err(_) => {
                // A fetch that kept its credential just before it sent its outcome.
                if let (true, Some(v)) = (short, self.usable(SystemTime::now())) {
                    return Ok(v);
                }
                if !short || Instant::now() >= deadline {
                    return Err(Unavailable::Deadline);
                }
                Err(Unavailable::Failed(probe.unwrap_or_else(|| {
                    format!(
                        "the credential endpoint has not answered within {}s (the fetch goes on)",
                        PROBE_WAIT.as_secs()
                    )
                })))
            }
        }
    }

    /// The platform refused the held credential (401, 403): it may have been revoked before
    /// its expiry, so it is not used again, unless it was fetched less than a minute ago. The
    /// next call waits for a new one, as a call with no credential does (so a chain with
    /// another step waits a second at most); it was used once more while the refresh ran
    /// behind, which failed that call too.
    ///
    ///
    /// `sent`: when the refused call was sent. True when the call may be tried again with
    /// another credential: this refusal set the held one aside, another call's refusal did
    /// already (every call in flight with a revoked key is refused at once), or a newer one
    /// is held than the call carried. False for a refusal of the credential held when the
    /// call was sent, under a minute old: a new one would not cure it.
    pub fn refused(&self, sent: Instant) -> bool {
        let now = SystemTime::now();
        let mut held = self.held.lock();
        let Some(h) = held.as_mut() else {
            return false;
        };
        if h.refused || sent < h.held_since {
            return true;
        }
        let age = now.duration_since(h.fetched_at).unwrap_or_default();
        if age < REFUSED_REFETCH_AFTER {
            return false;
        }
        h.refresh_at = Some(now);
        h.refused = true;
        true
    }

    /// Keeps a fetch's outcome: the credential, or the failure and the pause before the next
    /// fetch. A credential the endpoint says has expired, or expires within `MIN_LIFE`, is a
    /// failure.
    fn settle(
        &self,
        got: Result<Fetched<T>, String>,
        fetched_at: SystemTime,
    ) -> Result<Arc<T>, String> {
        let got = got.and_then(|f| match f.expires {
            Some(exp) if exp <= fetched_at + MIN_LIFE => Err(format!(
                "the endpoint sent a credential that has expired or expires within {}s",
                MIN_LIFE.as_secs()
            )),
            _ => Ok(f),
        });
        (self.refreshed)(got.is_ok());
        match got {
            Ok(f) => {
                let expires = f.expires.map(|exp| exp.min(fetched_at + MAX_LIFE));
                let refresh_at = expires.map(|exp| {
                    let life = exp.duration_since(fetched_at).unwrap_or_default();
                    let margin = REFRESH_MARGIN.min(life / REFRESH_SHARE);
                    exp.checked_sub(margin).unwrap_or(exp)
                });
                let value = Arc::new(f.value);
                let replaced = self.held.lock().replace(Held {
                    value: value.clone(),
                    expires,
                    refresh_at,
                    fetched_at,
                    held_since: Instant::now(),
                    refused: false,
                });
                if let Some(old) = replaced {
                    *self.previous.lock() = Some(old.value);
                }
                {
                    let mut s = self.state.lock();
                    s.expires_at = expires.and_then(epoch);
                    s.refreshed_at = epoch(fetched_at);
                    s.last_error = None;
                }
                let mut flight = self.flight.lock();
                flight.pending = None;
                flight.retry_at = None;
                flight.backoff = Duration::ZERO;
                flight.last_error = None;
                Ok(value)
            }
            Err(e) => {
                self.state.lock().last_error = Some(e.clone());
                // A refused credential is used again while no new one can be had: the refusal
                // may not have been the credential's (a permission one model lacks), and with
                // the endpoint down every call would otherwise fail.
                if let Some(h) = self.held.lock().as_mut() {
                    h.refused = false;
                }
                if self.usable(SystemTime::now()).is_some() {
                    tracing::warn!(error = %e, "credential refresh failed; the current one is still valid");
                }
                let mut flight = self.flight.lock();
                flight.pending = None;
                flight.backoff = (flight.backoff * 2).clamp(BACKOFF_FIRST, BACKOFF_MAX);
                flight.retry_at = Some(Instant::now() + flight.backoff);
                flight.last_error = Some(e.clone());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn cell() -> Arc<Cached<u32>> {
        Arc::new(Cached::new("test".into(), |_| {}))
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    type Fetch = std::pin::Pin<Box<dyn Future<Output = Result<Fetched<u32>, String>> + Send>>;

    /// A fetch that counts itself and gives `value` for `life`.
    fn giving(n: &Arc<AtomicU32>, value: u32, life: Duration) -> impl FnOnce() -> Fetch {
        let n = n.clone();
        move || {
            n.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                Ok(Fetched {
                    value,
                    expires: Some(SystemTime::now() + life),
                })
            })
        }
    }

    fn refresh_due(cell: &Cached<u32>) {
        if let Some(h) = cell.held.lock().as_mut() {
            h.refresh_at = Some(SystemTime::now() - Duration::from_secs(1));
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_due_refresh_runs_behind_while_the_held_credential_is_used() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        assert_eq!(
            cell.get(giving(&n, 1, HOUR), later()).await,
            Ok(Arc::new(1))
        );
        assert_eq!(
            cell.get(giving(&n, 9, HOUR), later()).await,
            Ok(Arc::new(1))
        );
        assert_eq!(n.load(Ordering::SeqCst), 1);
        refresh_due(&cell);
        // The refresh's fetch never ends: the caller still gets the held credential at once.
        let hung = || std::future::pending::<Result<Fetched<u32>, String>>();
        assert_eq!(cell.get(hung, later()).await, Ok(Arc::new(1)));
        // A refresh in flight is not started again.
        assert_eq!(
            cell.get(giving(&n, 9, HOUR), later()).await,
            Ok(Arc::new(1))
        );
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_refresh_behind_replaces_the_credential_once_it_comes() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        cell.get(giving(&n, 1, HOUR), later()).await.unwrap();
        refresh_due(&cell);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let slow = move || async move {
            let _ = rx.await;
            Ok(Fetched {
                value: 2,
                expires: Some(SystemTime::now() + HOUR),
            })
        };
        assert_eq!(cell.get(slow, later()).await, Ok(Arc::new(1)));
        tx.send(()).unwrap();
        let mut seen = cell.flight.lock().pending.clone().unwrap();
        seen.wait_for(Option::is_some).await.unwrap();
        assert_eq!(
            cell.get(giving(&n, 9, HOUR), later()).await,
            Ok(Arc::new(2))
        );
        // The one it replaced is kept, for answers to requests that carried it.
        assert_eq!(cell.held(), Some(Arc::new(2)));
        assert_eq!(cell.previous(), Some(Arc::new(1)));
    }

    #[tokio::test]
    async fn callers_without_a_credential_share_one_fetch() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let gated = {
            let n = n.clone();
            move || {
                n.fetch_add(1, Ordering::SeqCst);
                async move {
                    let _ = rx.await;
                    Ok(Fetched {
                        value: 5,
                        expires: Some(SystemTime::now() + HOUR),
                    })
                }
            }
        };
        let first = tokio::spawn({
            let cell = cell.clone();
            async move { cell.get(gated, later()).await }
        });
        // The first caller's fetch is in flight once its receiver is stored.
        while cell.flight.lock().pending.is_none() {
            tokio::task::yield_now().await;
        }
        let others: Vec<_> = (0..5)
            .map(|_| {
                let (cell, n) = (cell.clone(), n.clone());
                tokio::spawn(async move { cell.get(giving(&n, 9, HOUR), later()).await })
            })
            .collect();
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Ok(Arc::new(5)));
        for o in others {
            assert_eq!(o.await.unwrap(), Ok(Arc::new(5)));
        }
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_waits_for_a_fetch_no_longer_than_its_deadline() {
        let cell = cell();
        let hung = || std::future::pending::<Result<Fetched<u32>, String>>();
        let deadline = Instant::now() + Duration::from_secs(3);
        assert_eq!(cell.get(hung, deadline).await, Err(Unavailable::Deadline));
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_failed_fetch_callers_get_the_failure_at_once_until_the_pause_ends() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        let failing = |n: &Arc<AtomicU32>| {
            let n = n.clone();
            move || {
                n.fetch_add(1, Ordering::SeqCst);
                async { Err::<Fetched<u32>, _>("sts answered 403".to_string()) }
            }
        };
        let down = Err(Unavailable::Failed("sts answered 403".into()));
        assert_eq!(cell.get(failing(&n), later()).await, down);
        assert_eq!(cell.state().last_error.as_deref(), Some("sts answered 403"));
        // Within the first second: no fetch, the same failure.
        assert_eq!(cell.get(giving(&n, 1, HOUR), later()).await, down);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // Then one fetch; failing again doubles the pause.
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(cell.get(failing(&n), later()).await, down);
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(cell.get(giving(&n, 1, HOUR), later()).await, down);
        assert_eq!(n.load(Ordering::SeqCst), 2);
        tokio::time::advance(Duration::from_millis(501)).await;
        assert_eq!(
            cell.get(giving(&n, 1, HOUR), later()).await,
            Ok(Arc::new(1))
        );
        assert_eq!(cell.state().last_error, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_after_a_failed_one_is_waited_for_a_second_at_most() {
        let cell = cell();
        let failed = || async { Err::<Fetched<u32>, _>("sts answered 503".to_string()) };
        let down = || Err(Unavailable::Failed("sts answered 503".into()));
        assert_eq!(cell.get(failed, later()).await, down());
        tokio::time::advance(Duration::from_millis(1001)).await;
        // The endpoint now hangs: the probe goes on, the caller has the last failure after a
        // second (not its whole deadline), and so does one that joins the probe, at the same
        // moment; one that comes after that second has it at once.
        let hung = || std::future::pending::<Result<Fetched<u32>, String>>();
        let started = Instant::now();
        let (a, b) = tokio::join!(cell.get(hung, later()), async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            cell.get(hung, later()).await
        });
        assert_eq!((a, b), (down(), down()));
        assert_eq!(Instant::now() - started, Duration::from_millis(1000));
        assert_eq!(cell.get(hung, later()).await, down());
        assert_eq!(Instant::now() - started, Duration::from_millis(1000));
        // A caller whose deadline comes before the probe's second still gets the deadline.
        let cell = self::cell();
        assert_eq!(cell.get(failed, later()).await, down());
        tokio::time::advance(Duration::from_millis(1001)).await;
        let soon = Instant::now() + Duration::from_millis(300);
        assert_eq!(cell.get(hung, soon).await, Err(Unavailable::Deadline));
        // A probe that answers within the second is waited for.
        let cell = self::cell();
        assert_eq!(cell.get(failed, later()).await, down());
        tokio::time::advance(Duration::from_millis(1001)).await;
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            Ok(Fetched {
                value: 5,
                expires: None,
            })
        };
        assert_eq!(cell.get(slow, later()).await, Ok(Arc::new(5)));
        // The first fetch of all is waited for as long as the deadline allows.
        let cell = self::cell();
        let deadline = Instant::now() + Duration::from_secs(3);
        assert_eq!(cell.get(hung, deadline).await, Err(Unavailable::Deadline));
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_can_fall_back_waits_a_second_on_any_fetch() {
        let cell = cell();
        let hung = || std::future::pending::<Result<Fetched<u32>, String>>();
        let late = || {
            Err(Unavailable::Failed(
                "the credential endpoint has not answered within 1s (the fetch goes on)".into(),
            ))
        };
        // The first fetch of all hangs: a caller with a fallback has a failure after a second
        // (not its whole deadline), one joining at 600 ms at the same moment.
        let started = Instant::now();
        let (a, b) = tokio::join!(cell.get(hung, Wait::brief(later())), async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            cell.get(hung, Wait::brief(later())).await
        });
        assert_eq!((a, b), (late(), late()));
        assert_eq!(Instant::now() - started, Duration::from_millis(1000));
        // The fetch goes on, not started again; a caller with nowhere else to go waits on it
        // until its deadline.
        assert!(cell.flight.lock().pending.is_some());
        let deadline = Instant::now() + Duration::from_secs(3);
        let n = Arc::new(AtomicU32::new(0));
        assert_eq!(
            cell.get(giving(&n, 1, HOUR), Wait::until(deadline)).await,
            Err(Unavailable::Deadline)
        );
        assert_eq!(Instant::now(), deadline);
        assert_eq!(n.load(Ordering::SeqCst), 0);
        // A deadline within the second is still a deadline; a fetch answering within it is
        // waited for.
        let cell = self::cell();
        let soon = Instant::now() + Duration::from_millis(300);
        assert_eq!(
            cell.get(hung, Wait::brief(soon)).await,
            Err(Unavailable::Deadline)
        );
        let cell = self::cell();
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            Ok(Fetched {
                value: 5,
                expires: None,
            })
        };
        assert_eq!(cell.get(slow, Wait::brief(later())).await, Ok(Arc::new(5)));
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_a_valid_credential() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        cell.get(giving(&n, 7, Duration::from_secs(40)), later())
            .await
            .unwrap();
        refresh_due(&cell);
        let down = || async { Err::<Fetched<u32>, _>("down".to_string()) };
        assert_eq!(cell.get(down, later()).await, Ok(Arc::new(7)));
        let mut seen = cell.flight.lock().pending.clone().unwrap();
        seen.wait_for(Option::is_some).await.unwrap();
        assert_eq!(cell.state().last_error.as_deref(), Some("down"));
        assert_eq!(
            cell.get(giving(&n, 9, HOUR), later()).await,
            Ok(Arc::new(7))
        );
    }

    #[tokio::test]
    async fn an_expired_credential_is_a_failure_and_a_long_life_is_cut_to_the_most() {
        let cell = cell();
        let expired = || async {
            Ok(Fetched {
                value: 1u32,
                expires: Some(SystemTime::now() - Duration::from_secs(1)),
            })
        };
        assert_eq!(
            cell.get(expired, later()).await,
            Err(Unavailable::Failed(
                "the endpoint sent a credential that has expired or expires within 1s".into()
            ))
        );
        let cell = self::cell();
        let n = Arc::new(AtomicU32::new(0));
        let years = Duration::from_secs(30 * 365 * 86400);
        cell.get(giving(&n, 1, years), later()).await.unwrap();
        let most = epoch(SystemTime::now() + MAX_LIFE).unwrap();
        let said = cell.state().expires_at.unwrap();
        assert!(said <= most && said + 5 >= most, "{said} vs {most}");
    }

    #[tokio::test]
    async fn a_refused_credential_is_refreshed_unless_it_is_under_a_minute_old() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        cell.get(giving(&n, 1, HOUR), later()).await.unwrap();
        assert!(!cell.refused(Instant::now()), "under a minute old");
        assert_eq!(
            cell.get(giving(&n, 2, HOUR), later()).await,
            Ok(Arc::new(1))
        );
        assert_eq!(n.load(Ordering::SeqCst), 1);
        if let Some(h) = cell.held.lock().as_mut() {
            h.fetched_at -= Duration::from_secs(61);
        }
        let sent = Instant::now();
        assert!(cell.refused(sent));
        // Other calls in flight with it are refused too: each may try again.
        assert!(cell.refused(sent));
        // Never sent again: this caller waits for the new one.
        assert_eq!(
            cell.get(giving(&n, 2, HOUR), later()).await,
            Ok(Arc::new(2))
        );
        assert_eq!(
            cell.get(giving(&n, 3, HOUR), later()).await,
            Ok(Arc::new(2))
        );
        assert_eq!(n.load(Ordering::SeqCst), 2);
        // A late refusal of a call sent with the old one: tried again with the new one. A
        // refusal of the new one, under a minute old, is the platform's answer.
        assert!(cell.refused(sent));
        assert!(!cell.refused(Instant::now()));
    }

    #[tokio::test]
    async fn a_refused_credential_is_used_again_while_no_new_one_can_be_had() {
        let cell = cell();
        let n = Arc::new(AtomicU32::new(0));
        cell.get(giving(&n, 1, HOUR), later()).await.unwrap();
        if let Some(h) = cell.held.lock().as_mut() {
            h.fetched_at -= Duration::from_secs(61);
        }
        assert!(cell.refused(Instant::now()));
        let failing = || async { Err::<Fetched<u32>, _>("down".to_owned()) };
        // The fetch that fails, and every call while the endpoint is not asked again: the
        // refused credential, not yet expired, rather than none (it was an error for the
        // call that waited on the fetch, and for every call of the backoff after it).
        assert_eq!(cell.get(failing, later()).await, Ok(Arc::new(1)));
        assert_eq!(cell.get(failing, later()).await, Ok(Arc::new(1)));
        // Refused again during the backoff: still used, not an error for the backoff's length.
        if let Some(h) = cell.held.lock().as_mut() {
            h.fetched_at -= Duration::from_secs(61);
        }
        assert!(cell.refused(Instant::now()));
        assert_eq!(cell.get(failing, later()).await, Ok(Arc::new(1)));
    }
}

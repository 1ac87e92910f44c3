//! A credential held between refreshes: used while comfortably valid, fetched again before it
//! expires (one fetch at a time, whoever asks), and described for `/admin/state` by its source
//! and expiry — never its value.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

/// A credential is refreshed once less than this is left of its life…
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// …or, for short-lived ones, once less than this share of its life is left.
const REFRESH_SHARE: u32 = 4;

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

pub struct Cached<T> {
    held: Mutex<Option<Held<T>>>,
    /// One fetch at a time: callers that find the credential stale wait for it.
    fetching: tokio::sync::Mutex<()>,
    state: Mutex<CredentialState>,
}

fn epoch(t: SystemTime) -> Option<u64> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

impl<T> Cached<T> {
    pub fn new(source: String) -> Self {
        Cached {
            held: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
            state: Mutex::new(CredentialState {
                source,
                ..Default::default()
            }),
        }
    }

    pub fn state(&self) -> CredentialState {
        self.state.lock().clone()
    }

    /// The held credential if it needs no refresh at `now`.
    fn fresh(&self, now: SystemTime) -> Option<Arc<T>> {
        self.held_before(now, |h| h.refresh_at)
    }

    /// The held credential if it still works at `now`, refresh due or not.
    fn usable(&self, now: SystemTime) -> Option<Arc<T>> {
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

    /// The credential, fetched with `fetch` when none is held or its refresh is due. A failed
    /// refresh keeps using a credential that has not expired yet. `refreshed(ok)` is told of
    /// every fetch.
    pub async fn get<F, Fut>(&self, fetch: F, refreshed: impl Fn(bool)) -> Result<Arc<T>, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched<T>, String>>,
    {
        if let Some(v) = self.fresh(SystemTime::now()) {
            return Ok(v);
        }
        let _one = self.fetching.lock().await;
        // Someone else may have refreshed while this caller waited.
        if let Some(v) = self.fresh(SystemTime::now()) {
            return Ok(v);
        }
        let fetched_at = SystemTime::now();
        match fetch().await {
            Ok(f) => {
                refreshed(true);
                let refresh_at = f.expires.map(|exp| {
                    let life = exp.duration_since(fetched_at).unwrap_or_default();
                    let margin = REFRESH_MARGIN.min(life / REFRESH_SHARE);
                    exp.checked_sub(margin).unwrap_or(exp)
                });
                let value = Arc::new(f.value);
                {
                    let mut held = self.held.lock();
                    *held = Some(Held {
                        value: value.clone(),
                        expires: f.expires,
                        refresh_at,
                    });
                }
                {
                    let mut s = self.state.lock();
                    s.expires_at = f.expires.and_then(epoch);
                    s.refreshed_at = epoch(fetched_at);
                    s.last_error = None;
                }
                Ok(value)
            }
            Err(e) => {
                refreshed(false);
                {
                    let mut s = self.state.lock();
                    s.last_error = Some(e.clone());
                }
                match self.usable(SystemTime::now()) {
                    Some(v) => {
                        tracing::warn!(error = %e, "credential refresh failed; the current one is still valid");
                        Ok(v)
                    }
                    None => Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn valid_credential_is_reused_and_stale_one_refetched() {
        let cell: Cached<u32> = Cached::new("test".into());
        let n = AtomicU32::new(0);
        let fetch = |life: Duration| {
            let v = n.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok(Fetched {
                    value: v,
                    expires: Some(SystemTime::now() + life),
                })
            }
        };
        let a = cell.get(|| fetch(Duration::from_secs(3600)), |_| {}).await;
        let b = cell.get(|| fetch(Duration::from_secs(3600)), |_| {}).await;
        assert_eq!((*a.unwrap(), *b.unwrap()), (0, 0));
        assert!(cell.state().expires_at.is_some());
        // Force staleness: a credential that is already inside its refresh margin.
        {
            let mut h = cell.held.lock();
            if let Some(h) = h.as_mut() {
                h.refresh_at = Some(SystemTime::now() - Duration::from_secs(1));
            }
        }
        let c = cell.get(|| fetch(Duration::from_secs(3600)), |_| {}).await;
        assert_eq!(*c.unwrap(), 1);
    }

    #[tokio::test]
    async fn failed_refresh_keeps_a_valid_credential_and_fails_without_one() {
        let cell: Cached<u32> = Cached::new("test".into());
        let err = cell
            .get(
                || async { Err::<Fetched<u32>, _>("sts answered 403".to_string()) },
                |_| {},
            )
            .await;
        assert_eq!(err.err().as_deref(), Some("sts answered 403"));
        assert_eq!(cell.state().last_error.as_deref(), Some("sts answered 403"));
        let ok = cell
            .get(
                || async {
                    Ok(Fetched {
                        value: 7,
                        expires: Some(SystemTime::now() + Duration::from_secs(40)),
                    })
                },
                |_| {},
            )
            .await;
        assert_eq!(*ok.unwrap(), 7);
        {
            let mut h = cell.held.lock();
            if let Some(h) = h.as_mut() {
                h.refresh_at = Some(SystemTime::now() - Duration::from_secs(1));
            }
        }
        let kept = cell
            .get(
                || async { Err::<Fetched<u32>, _>("down".to_string()) },
                |_| {},
            )
            .await;
        assert_eq!(*kept.unwrap(), 7);
    }
}

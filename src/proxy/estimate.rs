//! `count_tokens` on a route whose step speaks the other API, or is a cloud platform (which
//! serves no count endpoint): answered locally, without an upstream call, with an estimate of
//! the request as that step would receive it (SPEC §3), in the caller's shape and marked
//! `x-legate-estimate: true`. Never a 400 for being translated or on a platform.
//!
//! Counting is CPU work on blocking threads: at most [`CONCURRENT`] run at once (SPEC §14).
//! A request waits for its turn up to [`WAIT`] (and its deadline), then is shed with 529
//! overloaded, like any other request legate has no room for. When `[[clients]]` name several
//! tenants, one tenant's counts take at most half of them: a count of a 30 MB body takes
//! seconds of CPU, and a tenant sending many would otherwise leave the others none.
//!
//! A tokio semaphore, not tower's `ConcurrencyLimit`: the permit has to travel into the
//! blocking task and outlive a caller that leaves, which a service wrapper does not give.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::{ApiKind, ChainStep};
use crate::error::ProxyError;
use crate::proxy::Inbound;
use crate::proxy::response::{self, ProxyBody};
use crate::{tokens, translate};

/// Estimates counted at once: a few blocking threads, never tokio's whole pool.
pub const CONCURRENT: usize = 4;
/// How long a request waits for a free count before it is shed.
pub const WAIT: Duration = Duration::from_secs(2);

/// The estimate for `step` (of kind `upstream`), or why this step cannot take the request;
/// shed (`Err`) when no count is free within `WAIT`. A request the `last` step of its chain
/// cannot take either is still counted, as the caller wrote it: a count is an estimate, never
/// a 400 (SPEC §3), and the request itself gets the refusal. Before the last step it moves on,
/// as the request would, to a step that may count it for real.
pub async fn answer(
    inb: &Inbound,
    (step, last): (&ChainStep, bool),
    upstream: ApiKind,
    gate: &Arc<Semaphore>,
) -> Result<Result<Response<ProxyBody>, String>, ProxyError> {
    let dir = if inb.endpoint.api == upstream {
        // A platform step of the caller's own API: the body as the caller sent it.
        None
    } else {
        let Some(dir) = translate::Dir::between(inb.endpoint.api, upstream) else {
            return Ok(Err(format!(
                "no translation from {} to {upstream}",
                inb.endpoint.api
            )));
        };
        Some(dir)
    };
    // The translation walks the whole body as the count does: both in the count's turn.
    let (body, model, caller) = (inb.body.clone(), step.model().to_owned(), inb.endpoint.api);
    let counted = counted(gate, inb, move || {
        let translated;
        let (kind, sent) = match dir {
            None => (upstream, &body[..]),
            Some(dir) => match translate::request(dir, &body, &model) {
                Ok((sent, _)) => {
                    translated = sent;
                    (upstream, &translated[..])
                }
                // A request this step could not be sent (a forced server tool, a Files-API
                // image).
                Err(_) if last => (caller, &body[..]),
                Err(e) => return Err(e.0),
            },
        };
        tokens::input_tokens(kind, &model, sent)
            .ok_or_else(|| "the translated request is not JSON".to_owned())
    })
    .await?;
    Ok(counted
        .map_err(|_| "the token count was interrupted".to_owned())
        .and_then(|c| c)
        .map(|tokens| estimate_response(step, tokens)))
}

/// Runs `count` in a count's turn (the tenant's, when it has a part, and a shared one), waited for up to [`WAIT`]
/// and the request's deadline, then shed. Off the async workers, so other requests are never
/// held up by it; the turns go with the count, which runs to its end even if the caller
/// leaves. `Err(())` inside: the count was interrupted.
pub async fn counted<T: Send + 'static>(
    gate: &Arc<Semaphore>,
    inb: &Inbound,
    count: impl FnOnce() -> T + Send + 'static,
) -> Result<Result<T, ()>, ProxyError> {
    let until = (Instant::now() + WAIT).min(inb.deadline);
    let permits = turns(gate, &inb.estimate_part, until).await?;
    let done = tokio::task::spawn_blocking(move || {
        let _permits = permits;
        count()
    })
    .await;
    Ok(done.map_err(|_| ()))
}

/// A turn to count in the tenant's part (when it has one) and in the shared gate. The tenant's
/// turn comes first, so that its requests waiting behind its own counts hold no shared turn.
async fn turns(
    gate: &Arc<Semaphore>,
    part: &Option<Arc<Semaphore>>,
    until: Instant,
) -> Result<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>), ProxyError> {
    let own = match part {
        Some(part) => Some(turn(part, until).await?),
        None => None,
    };
    Ok((turn(gate, until).await?, own))
}

/// A turn to count, waited for until `until`; shed after that.
async fn turn(gate: &Arc<Semaphore>, until: Instant) -> Result<OwnedSemaphorePermit, ProxyError> {
    match tokio::time::timeout_at(until, gate.clone().acquire_owned()).await {
        Ok(Ok(p)) => Ok(p),
        _ => Err(ProxyError::Shed {
            retry_after: Duration::from_secs(1),
            counting: true,
        }),
    }
}

fn estimate_response(step: &ChainStep, tokens: u64) -> Response<ProxyBody> {
    let body = serde_json::json!({ "input_tokens": tokens });
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response::set_header(&mut resp, "x-legate-estimate", "true");
    response::set_served_by(&mut resp, step.target());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_count_waits_its_turn_then_is_shed() {
        let gate = Arc::new(Semaphore::new(2));
        let start = Instant::now();
        let a = turn(&gate, start + WAIT).await;
        let b = turn(&gate, start + WAIT).await;
        assert!(a.is_ok() && b.is_ok());
        // Both counts busy: the third waits the whole time, then is shed (529 overloaded).
        let c = turn(&gate, start + WAIT).await;
        assert!(matches!(c, Err(ProxyError::Shed { .. })));
        assert_eq!(start.elapsed(), WAIT);
        assert_eq!(c.err().map(|e| e.status().as_u16()), Some(529));
        // One finishes while another waits: the waiter gets its turn.
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { turn(&gate, Instant::now() + WAIT).await.is_ok() }
        });
        tokio::time::sleep(WAIT / 2).await;
        drop(a);
        assert!(waiter.await.unwrap_or(false));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_takes_at_most_its_part_of_the_counts() {
        let gate = Arc::new(Semaphore::new(CONCURRENT));
        let a = Some(Arc::new(Semaphore::new(CONCURRENT / 2)));
        let b = Some(Arc::new(Semaphore::new(CONCURRENT / 2)));
        let start = Instant::now();
        let mut held = Vec::new();
        for _ in 0..CONCURRENT / 2 {
            held.push(turns(&gate, &a, start + WAIT).await);
        }
        assert!(held.iter().all(Result::is_ok));
        // Tenant a's part is full: its next count waits for it, and is shed, although half of
        // the shared counts are free; and it held none of them while it waited.
        let shed = turns(&gate, &a, start + WAIT).await;
        assert!(matches!(shed, Err(ProxyError::Shed { .. })));
        assert_eq!(start.elapsed(), WAIT);
        assert_eq!(gate.available_permits(), CONCURRENT - CONCURRENT / 2);
        // Tenant b gets its turn at once.
        let now = Instant::now();
        let other = turns(&gate, &b, now + WAIT).await;
        assert!(other.is_ok());
        assert_eq!(now.elapsed(), Duration::ZERO);
        // With one tenant (no part), all of the shared counts may be taken.
        drop((held, other));
        let mut all = Vec::new();
        for _ in 0..CONCURRENT {
            all.push(turns(&gate, &None, start + 2 * WAIT).await);
        }
        assert!(all.iter().all(Result::is_ok));
    }
}

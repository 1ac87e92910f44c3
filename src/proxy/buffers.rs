//! The global bound on request bodies held in memory (SPEC §14: `max_buffered_bytes`). Each
//! body counts from its first byte until its request is done (it is kept for retries and
//! fallback); a request whose body would pass the bound is refused with 529 instead of
//! pushing the process out of memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// Bytes of request bodies held by all requests together.
#[derive(Default)]
pub struct BufferBudget {
    used: AtomicUsize,
}

/// One request's share of the budget, returned when it drops.
pub struct BufferShare {
    budget: Arc<BufferBudget>,
    held: usize,
}

impl Drop for BufferShare {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

impl BufferShare {
    pub fn new(budget: Arc<BufferBudget>) -> Self {
        BufferShare { budget, held: 0 }
    }

    /// Takes `n` more bytes, unless that would pass `max` for everyone together.
    pub fn take(&mut self, n: usize, max: usize) -> bool {
        let taken = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= max)
            });
        if taken.is_ok() {
            self.held += n;
        }
        taken.is_ok()
    }
}

impl BufferShare {
    pub fn budget(&self) -> Arc<BufferBudget> {
        self.budget.clone()
    }

    /// Keeps at most `bytes`, giving back the rest (a body shorter than it declared).
    pub fn shrink_to(&mut self, bytes: usize) {
        if self.held > bytes {
            self.budget
                .used
                .fetch_sub(self.held - bytes, Ordering::AcqRel);
            self.held = bytes;
        }
    }
}

impl BufferBudget {
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Why a body could not be collected.
pub enum Collect {
    TooLarge,
    Full,
    Broken,
}

/// Reads `body` whole, within `limit` bytes for itself; bytes beyond what `share` already
/// holds are taken from the global budget as they arrive. With `h1` (HTTP/1), a body that came
/// in one frame is kept as that frame, a view of the connection's read buffer (which the
/// request's headers hold anyway), instead of being copied.
pub async fn collect(
    body: &mut crate::server::CallerBody,
    limit: usize,
    share: &mut BufferShare,
    max: usize,
    h1: bool,
) -> Result<Bytes, Collect> {
    // The first frame waits until a second comes: only then is a buffer needed.
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Collect::Broken)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = first.as_ref().map_or(buf.len(), Bytes::len);
        if len + data.len() > limit {
            return Err(Collect::TooLarge);
        }
        let need = (len + data.len()).saturating_sub(share.held.max(len));
        if need > 0 && !share.take(need, max) {
            return Err(Collect::Full);
        }
        if h1 && first.is_none() && buf.is_empty() {
            first = Some(data);
            continue;
        }
        if buf.capacity() == 0 {
            // A declared length is already held in the budget: reserve it at once, so a large
            // body lands in one allocation of its size instead of a chain of doublings whose
            // last one (up to twice the body) would be held with the body until the request
            // is done.
            buf.reserve(share.held.min(limit).max(len + data.len()));
        }
        if let Some(f) = first.take() {
            buf.extend_from_slice(&f);
        }
        buf.extend_from_slice(&data);
    }
    Ok(match first {
        Some(f) => f,
        None => buf.freeze(),
    })
}

/// Reads and throws away the rest of a refused HTTP/2 request body, in the background, up to
/// [`REFUSED_BODY_MAX`](crate::server::REFUSED_BODY_MAX) and within `within`.
///
/// An HTTP/2 stream answered before its body is in ends with RST_STREAM(NO_ERROR), which the
/// protocol allows but which some clients (curl among them) report as a failed transfer without
/// showing the answer. A client allowed to finish its upload reads the 413 like any other
/// answer; the bytes are counted, not kept, so this costs no memory. (Over HTTP/1 the
/// connection does the same itself, after the answer: `server::h1`.)
pub fn discard(mut body: crate::server::CallerBody, within: std::time::Duration) {
    tokio::spawn(async move {
        let drain = async {
            let mut seen = 0u64;
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    seen += data.len() as u64;
                    if seen > crate::server::REFUSED_BODY_MAX {
                        return;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(within, drain).await;
    });
}

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
/// holds are taken from the global budget as they arrive.
pub async fn collect(
    mut body: hyper::body::Incoming,
    limit: usize,
    share: &mut BufferShare,
    max: usize,
) -> Result<Bytes, Collect> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Collect::Broken)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > limit {
            return Err(Collect::TooLarge);
        }
        let need = (buf.len() + data.len()).saturating_sub(share.held.max(buf.len()));
        if need > 0 && !share.take(need, max) {
            return Err(Collect::Full);
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

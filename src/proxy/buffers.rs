//! The global bounds on bodies held in memory (SPEC §14: `max_buffered_bytes`).
//!
//! A request body counts from its first byte until its request is done (it is kept for retries
//! and fallback); a request whose body would pass the bound is refused with 529 instead of
//! pushing the process out of memory.
//!
//! Upstream answers held whole are bounded the same way, in a budget of the same size of their
//! own (SPEC's bound counts request bodies, and answers held for slow readers must not make
//! new requests 529), once they are larger than [`UNCHARGED`]: from the
//! read that passes that size until the connection has written its last byte, which can be long
//! after the request is done (hyper keeps the last frame of a body it has finished polling until
//! the socket takes it, and a caller that stops reading keeps it for `connection_idle_timeout`).
//! So the share travels inside the bytes themselves ([`hold`]): it is given back when the last
//! view of them is dropped, wherever that happens. Without it, callers that ask for large
//! answers and never read them held 16 MiB each past their request's end, beyond any bound but
//! the connection count. An answer that would pass the bound is not read further: a success is
//! passed through as it comes (as one over 16 MiB is), and anything that has to be whole is
//! refused (`proxy::exchange`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// Answers up to this size are not counted: a connection's write buffers hold about as much of
/// any answer, streamed ones included (ours for HTTP/1 up to 64 KiB before a flush, hyper's
/// HTTP/2 send buffer 400 KiB), so the connection count bounds them already, and the common
/// small answer pays one comparison instead of a shared counter.
pub const UNCHARGED: usize = 64 << 10;

/// Bytes of bodies held by all requests together.
#[derive(Default)]
pub struct BufferBudget {
    used: AtomicUsize,
}

/// One tenant's part of the request-body budget, or of the answers' budget, when `[[clients]]`
/// name several tenants: no tenant's bodies (answers) hold more than half of
/// `max_buffered_bytes` (or one whole body, or one whole answer, if that is more). The bound is
/// there for memory, and without a part per tenant one tenant could take all of it, with
/// bodies or only with declared lengths it never sends, or with large answers it asks for and
/// never reads, and every other tenant's requests (answers, already paid for) would be
/// refused 529.
pub struct TenantPart {
    used: AtomicUsize,
    /// Set again by a reload, which keeps the part (and what requests in flight hold of it).
    max: AtomicUsize,
}

impl TenantPart {
    pub fn new(max: usize) -> Arc<TenantPart> {
        Arc::new(TenantPart {
            used: AtomicUsize::new(0),
            max: AtomicUsize::new(max),
        })
    }

    /// The bound a reloaded config gives it.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Release);
    }

    /// Its bound now.
    pub fn max_now(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// One request's share of the budget (and of its tenant's part), returned when it drops.
pub struct BufferShare {
    budget: Arc<BufferBudget>,
    held: usize,
    part: Option<Arc<TenantPart>>,
}

impl Drop for BufferShare {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
        if let Some(p) = &self.part {
            p.used.fetch_sub(self.held, Ordering::AcqRel);
        }
    }
}

impl BufferShare {
    pub fn new(budget: Arc<BufferBudget>) -> Self {
        BufferShare {
            budget,
            held: 0,
            part: None,
        }
    }

    /// Also counted in, and bounded by, its tenant's part.
    pub fn within(mut self, part: Option<Arc<TenantPart>>) -> Self {
        self.part = part;
        self
    }

    /// Takes `n` more bytes, unless that would pass `max` for everyone together (or the
    /// tenant's part).
    pub fn take(&mut self, n: usize, max: usize) -> bool {
        if let Some(p) = &self.part {
            let mine = p
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_add(n).filter(|&total| total <= p.max_now())
                });
            if mine.is_err() {
                return false;
            }
        }
        let taken = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= max)
            });
        match taken {
            Ok(_) => self.held += n,
            Err(_) => {
                if let Some(p) = &self.part {
                    p.used.fetch_sub(n, Ordering::AcqRel);
                }
            }
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
            let back = self.held - bytes;
            self.budget.used.fetch_sub(back, Ordering::AcqRel);
            if let Some(p) = &self.part {
                p.used.fetch_sub(back, Ordering::AcqRel);
            }
            self.held = bytes;
        }
    }
}

impl BufferBudget {
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl BufferShare {
    /// Counts exactly `bytes`: bytes that are in memory already (a translated answer, the
    /// part of an answer read before the bound was reached) are counted even past the bound,
    /// since refusing them would not give the memory back.
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.held {
            let more = bytes - self.held;
            self.budget.used.fetch_add(more, Ordering::AcqRel);
            if let Some(p) = &self.part {
                p.used.fetch_add(more, Ordering::AcqRel);
            }
            self.held = bytes;
        } else {
            self.shrink_to(bytes);
        }
    }
}

/// A counted body and its share, given back when the last view of the bytes goes.
struct Held {
    bytes: Bytes,
    _share: BufferShare,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// `vec` as bytes, holding no more than it needs once it is large enough to be counted: a Vec
/// that grew by doubling can hold up to twice its length, and the share counts the length.
pub fn exact(mut vec: Vec<u8>) -> Bytes {
    if vec.len() > UNCHARGED && vec.capacity() - vec.len() > vec.len() / 8 {
        vec.shrink_to_fit();
    }
    Bytes::from(vec)
}

/// A read buffer frozen, holding no more than it needs (see [`exact`]).
pub fn exact_buf(buf: BytesMut) -> Bytes {
    if buf.len() > UNCHARGED && buf.capacity() - buf.len() > buf.len() / 8 {
        return Bytes::copy_from_slice(&buf);
    }
    buf.freeze()
}

/// `bytes`, counted as `share` (resized to their length) until the last view of them is
/// dropped; without a share (an answer that stayed under [`UNCHARGED`]), as they are.
pub fn hold(bytes: Bytes, share: Option<BufferShare>) -> Bytes {
    match share {
        Some(mut share) => {
            share.resize(bytes.len());
            Bytes::from_owner(Held {
                bytes,
                _share: share,
            })
        }
        None => bytes,
    }
}

/// An answer's share, taken when it is first needed (past [`UNCHARGED`]).
pub struct AnswerShare<'a> {
    budget: &'a Arc<BufferBudget>,
    max: usize,
    share: Option<BufferShare>,
    part: Option<Arc<TenantPart>>,
}

impl<'a> AnswerShare<'a> {
    pub fn new(budget: &'a Arc<BufferBudget>, max: usize) -> Self {
        AnswerShare {
            budget,
            max,
            share: None,
            part: None,
        }
    }

    /// Also counted in, and bounded by, its tenant's part of the answers' budget.
    pub fn within(mut self, part: Option<Arc<TenantPart>>) -> Self {
        self.part = part;
        self
    }

    /// Counts an answer now holding `size` bytes; false when that would pass the bound for
    /// everyone together (what was counted before stays counted).
    pub fn grow(&mut self, size: usize) -> bool {
        if size <= UNCHARGED {
            return true;
        }
        let share = self
            .share
            .get_or_insert_with(|| BufferShare::new(self.budget.clone()).within(self.part.take()));
        size <= share.held || share.take(size - share.held, self.max)
    }

    /// The share, if one was taken, for [`hold`].
    pub fn into_share(self) -> Option<BufferShare> {
        self.share
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_in_its_tenants_part_past_the_free_size() {
        let budget = Arc::new(BufferBudget::default());
        let part = TenantPart::new(3 * UNCHARGED);
        let mut a = AnswerShare::new(&budget, 10 * UNCHARGED).within(Some(part.clone()));
        assert!(a.grow(UNCHARGED), "not counted yet");
        assert_eq!(part.used(), 0);
        assert!(a.grow(2 * UNCHARGED));
        let mut b = AnswerShare::new(&budget, 10 * UNCHARGED).within(Some(part.clone()));
        assert!(!b.grow(2 * UNCHARGED), "past the tenant's part");
        let mut other = AnswerShare::new(&budget, 10 * UNCHARGED);
        assert!(
            other.grow(2 * UNCHARGED),
            "another tenant's answer still fits"
        );
        let held = hold(Bytes::from(vec![0u8; 2 * UNCHARGED]), a.into_share());
        assert_eq!(part.used(), 2 * UNCHARGED);
        drop(held);
        assert_eq!(part.used(), 0);
    }

    #[test]
    fn a_tenants_part_bounds_its_shares_and_is_given_back_with_them() {
        let budget = Arc::new(BufferBudget::default());
        let part = TenantPart::new(100);
        let mut a = BufferShare::new(budget.clone()).within(Some(part.clone()));
        assert!(a.take(60, 1000));
        let mut b = BufferShare::new(budget.clone()).within(Some(part.clone()));
        assert!(!b.take(50, 1000), "past the tenant's part");
        assert!(b.take(40, 1000));
        assert_eq!((part.used(), budget.used()), (100, 100));
        // Refused by the global bound: the part is not kept either.
        let mut c = BufferShare::new(budget.clone()).within(Some(TenantPart::new(1000)));
        assert!(!c.take(950, 1000));
        a.shrink_to(10);
        b.resize(45);
        assert_eq!((part.used(), budget.used()), (55, 55));
        drop((a, b, c));
        assert_eq!((part.used(), budget.used()), (0, 0));
    }

    #[test]
    fn an_answer_under_the_free_size_is_not_counted_and_not_wrapped() {
        let budget = Arc::new(BufferBudget::default());
        let mut share = AnswerShare::new(&budget, 1);
        assert!(share.grow(UNCHARGED));
        let share = share.into_share();
        assert!(share.is_none());
        let bytes = Bytes::from(vec![7u8; UNCHARGED]);
        let ptr = bytes.as_ptr();
        assert_eq!(hold(bytes, share).as_ptr(), ptr);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_held_answer_counts_until_its_last_view_is_dropped() {
        let budget = Arc::new(BufferBudget::default());
        let mut share = AnswerShare::new(&budget, 1 << 20);
        assert!(share.grow(200_000));
        assert_eq!(budget.used(), 200_000);
        // The answer came out shorter (translated): counted at its own length.
        let held = hold(Bytes::from(vec![1u8; 150_000]), share.into_share());
        assert_eq!(budget.used(), 150_000);
        let tail = held.slice(100_000..);
        drop(held);
        assert_eq!(budget.used(), 150_000);
        drop(tail);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn growth_past_the_bound_is_refused_and_what_was_counted_stays() {
        let budget = Arc::new(BufferBudget::default());
        let mut other = BufferShare::new(budget.clone());
        assert!(other.take(600_000, 1_000_000));
        let mut share = AnswerShare::new(&budget, 1_000_000);
        assert!(share.grow(300_000));
        assert!(share.grow(400_000));
        assert!(!share.grow(400_001));
        assert_eq!(budget.used(), 1_000_000);
        // What was read so far goes on, counted, though past the bound.
        let prefix = hold(Bytes::from(vec![0u8; 450_000]), share.into_share());
        assert_eq!(budget.used(), 1_050_000);
        drop(prefix);
        assert_eq!(budget.used(), 600_000);
    }

    #[test]
    fn a_large_buffer_with_room_to_spare_is_copied_to_its_length_and_others_kept() {
        let mut roomy = BytesMut::with_capacity(4 * UNCHARGED);
        roomy.resize(2 * UNCHARGED, 1);
        let ptr = roomy.as_ptr();
        let kept = exact_buf(roomy);
        assert_ne!(kept.as_ptr(), ptr);
        assert_eq!(kept.len(), 2 * UNCHARGED);
        let mut tight = BytesMut::with_capacity(2 * UNCHARGED);
        tight.resize(2 * UNCHARGED, 1);
        let ptr = tight.as_ptr();
        assert_eq!(exact_buf(tight).as_ptr(), ptr);
        let mut small = BytesMut::with_capacity(UNCHARGED);
        small.extend_from_slice(b"small");
        let ptr = small.as_ptr();
        assert_eq!(exact_buf(small).as_ptr(), ptr);
    }
}

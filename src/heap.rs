//! The process's allocator: the system's (glibc malloc), with a few of the data plane's freed
//! blocks kept per worker thread for the next allocation of the same size.
//!
//! Why: glibc's per-thread cache (tcache) takes blocks of at most 1,032 bytes. A proxied
//! request makes four larger ones and frees them again — hyper's 8 KiB read buffer on each
//! side (it reads ahead while the request's bytes still point into the last one), the
//! request's boxed future (about 6.5 KB) and the upstream request's header map (1,248 bytes)
//! — and each of those goes through `_int_malloc` and `_int_free`, which sort the freed chunk
//! through the unsorted bin and merge it with its neighbours: about a thousand instructions a
//! block, some 6 % of a request (bench/README.md, "Large blocks"). The same sizes come back
//! request after request, so a handful of freed blocks kept per thread, handed out to an
//! allocation of exactly their size, serves them without entering malloc at all.
//!
//! An allocator crate (mimalloc) was measured and not kept: fewer instructions, the same CPU
//! time under load, 3 MiB more resident memory and huge pages at start-up (bench/README.md).
//! This keeps glibc for everything and changes only where its per-thread cache stops.
//!
//! Bounds: only threads that asked for it keep blocks ([`keep_blocks_on_this_thread`]: the
//! data-plane workers, which live as long as the process); each keeps at most [`SLOTS`]
//! blocks of at most [`LARGEST`] bytes (128 KiB), the oldest given back to malloc when a
//! newer one needs its slot, so a size that stops coming back leaves the cache. A block kept
//! by one thread may have been allocated by another: every block is a plain `malloc` block,
//! which glibc frees from any thread.
//!
//! Nothing here may allocate, panic or touch a thread-local that needs a destructor: it runs
//! inside every allocation. The thread-local below is constant-initialised and has no
//! destructor, so reaching it never allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;

/// Blocks kept per thread.
pub const SLOTS: usize = 8;

/// Blocks this size or smaller are glibc's per-thread cache's own business.
const TCACHE_LARGEST: usize = 1032;

/// The largest block kept.
pub const LARGEST: usize = 16 * 1024;

/// What `malloc` aligns every block to (16 bytes on 64-bit Linux): `System` allocates any
/// layout aligned to at most this with plain `malloc`, so blocks of one size are
/// interchangeable.
const MALLOC_ALIGN: usize = std::mem::align_of::<libc::max_align_t>();

/// The global allocator of the `legate` binary.
pub struct Recycling;

struct Kept {
    on: Cell<bool>,
    len: Cell<usize>,
    /// The next slot to give back to malloc when all are taken (round robin: oldest first).
    evict: Cell<usize>,
    blocks: [Cell<(usize, *mut u8)>; SLOTS],
}

thread_local! {
    static KEPT: Kept = const {
        Kept {
            on: Cell::new(false),
            len: Cell::new(0),
            evict: Cell::new(0),
            blocks: [const { Cell::new((0, ptr::null_mut())) }; SLOTS],
        }
    };
}

/// From now on this thread keeps freed large blocks for reuse. For threads that live as long
/// as the process: what a thread keeps when it ends is not given back.
pub fn keep_blocks_on_this_thread() {
    let _ = KEPT.try_with(|k| k.on.set(true));
}

fn keepable(layout: &Layout) -> bool {
    layout.align() <= MALLOC_ALIGN && layout.size() > TCACHE_LARGEST && layout.size() <= LARGEST
}

impl Kept {
    fn take(&self, size: usize) -> Option<*mut u8> {
        let len = self.len.get();
        for i in 0..len {
            let (s, p) = self.blocks[i].get();
            if s == size {
                // The last kept block fills the hole: order does not matter for lookup.
                self.blocks[i].set(self.blocks[len - 1].get());
                self.len.set(len - 1);
                return Some(p);
            }
        }
        None
    }

    /// Keeps `(size, ptr)`; returns a block to give back to malloc, if one had to go.
    fn keep(&self, size: usize, block: *mut u8) -> Option<*mut u8> {
        let len = self.len.get();
        if len < SLOTS {
            self.blocks[len].set((size, block));
            self.len.set(len + 1);
            return None;
        }
        let victim = self.evict.get();
        self.evict.set((victim + 1) % SLOTS);
        let (_, old) = self.blocks[victim].replace((size, block));
        Some(old)
    }
}

#[expect(
    unsafe_code,
    reason = "a global allocator is an unsafe trait; every block still comes from System"
)]
// SAFETY: every block handed out is one `System` allocated with `malloc` (a layout aligned to
// at most `MALLOC_ALIGN`) for a layout of the same size, and is handed out to one caller only; every
// block given back to `System` is one it allocated.
unsafe impl GlobalAlloc for Recycling {
    // None of these is inlined: every allocation site in the program calls them, and inlined
    // (with link-time optimisation) they added 4 MB of code and pushed out other inlining;
    // each is one call, as the call to malloc was before.
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if keepable(&layout) {
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires of it.
            return unsafe { alloc_kept(layout) };
        }
        // SAFETY: as above.
        unsafe { System.alloc(layout) }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if keepable(&layout) {
            // SAFETY: `block` was allocated by this allocator for `layout`.
            return unsafe { dealloc_kept(block, layout) };
        }
        // SAFETY: `block` was allocated by this allocator, that is by `System`, for `layout`.
        unsafe { System.dealloc(block, layout) }
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout; calloc does the zeroing.
        unsafe { System.alloc_zeroed(layout) }
    }

    #[inline(never)]
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `block` is a `System` block for `layout` (kept blocks are handed out only
        // for their own size), so `System` may resize it.
        unsafe { System.realloc(block, layout, new_size) }
    }
}

/// A kept block of `layout`'s size, or a new one.
#[expect(unsafe_code, reason = "an allocator's entry point")]
unsafe fn alloc_kept(layout: Layout) -> *mut u8 {
    if let Ok(Some(p)) = KEPT.try_with(|k| k.take(layout.size())) {
        return p;
    }
    // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires of it.
    unsafe { System.alloc(layout) }
}

/// Keeps `block` if this thread keeps blocks, else (or for a block that had to make room)
/// gives it back to malloc.
#[expect(unsafe_code, reason = "an allocator's entry point")]
unsafe fn dealloc_kept(block: *mut u8, layout: Layout) {
    match KEPT.try_with(|k| k.on.get().then(|| k.keep(layout.size(), block))) {
        Ok(Some(None)) => {}
        Ok(Some(Some(old))) => {
            // SAFETY: `old` is a block `System` allocated with `malloc` (a keepable layout),
            // not handed out since it was kept: `free` is what `System::dealloc` calls for it.
            unsafe { libc::free(old.cast()) };
        }
        // SAFETY: `block` was allocated by this allocator, that is by `System`, for `layout`.
        _ => unsafe { System.dealloc(block, layout) },
    }
}

#[cfg(test)]
#[expect(unsafe_code, reason = "calls the allocator directly")]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    /// Runs `f` on a thread of its own, which keeps blocks if `keep`: the test harness's
    /// threads are shared by other tests.
    fn on_thread<T: Send + 'static>(keep: bool, f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            if keep {
                keep_blocks_on_this_thread();
            }
            f()
        })
        .join()
        .unwrap()
    }

    fn kept() -> usize {
        KEPT.with(|k| k.len.get())
    }

    #[test]
    fn a_freed_large_block_is_handed_to_the_next_allocation_of_its_size() {
        let (first, again, other, len_between) = on_thread(true, || unsafe {
            let first = Recycling.alloc(layout(8192));
            Recycling.dealloc(first, layout(8192));
            let len_between = kept();
            // Another size does not take it.
            let other = Recycling.alloc(layout(6544));
            let again = Recycling.alloc(layout(8192));
            Recycling.dealloc(other, layout(6544));
            Recycling.dealloc(again, layout(8192));
            (first as usize, again as usize, other as usize, len_between)
        });
        assert_eq!(len_between, 1);
        assert_eq!(again, first);
        assert_ne!(other, first);
    }

    #[test]
    fn small_huge_and_over_aligned_blocks_are_not_kept() {
        let counts = on_thread(true, || unsafe {
            let mut counts = Vec::new();
            for l in [
                layout(TCACHE_LARGEST),
                layout(LARGEST + 1),
                Layout::from_size_align(4096, 64).unwrap(),
            ] {
                let p = Recycling.alloc(l);
                assert!(!p.is_null());
                Recycling.dealloc(p, l);
                counts.push(kept());
            }
            let p = Recycling.alloc(layout(LARGEST));
            Recycling.dealloc(p, layout(LARGEST));
            counts.push(kept());
            counts
        });
        assert_eq!(counts, [0, 0, 0, 1]);
    }

    #[test]
    fn a_thread_that_did_not_ask_keeps_nothing() {
        let len = on_thread(false, || unsafe {
            let p = Recycling.alloc(layout(8192));
            Recycling.dealloc(p, layout(8192));
            kept()
        });
        assert_eq!(len, 0);
    }

    #[test]
    fn at_most_slots_blocks_are_kept_and_the_oldest_makes_room() {
        let (counts, newest_again) = on_thread(true, || unsafe {
            // SLOTS + 1 distinct sizes, all live at once, then freed oldest first.
            let sizes: Vec<usize> = (0..=SLOTS).map(|i| 2048 + 16 * i).collect();
            let blocks: Vec<*mut u8> = sizes.iter().map(|&s| Recycling.alloc(layout(s))).collect();
            for (&p, &s) in blocks.iter().zip(&sizes) {
                Recycling.dealloc(p, layout(s));
            }
            let full = kept();
            // The first freed went back to malloc: its size finds nothing kept.
            let oldest = Recycling.alloc(layout(sizes[0]));
            let after_oldest = kept();
            // The last freed is kept.
            let newest = Recycling.alloc(layout(sizes[SLOTS]));
            let after_newest = kept();
            let newest_again = newest == blocks[SLOTS];
            Recycling.dealloc(oldest, layout(sizes[0]));
            Recycling.dealloc(newest, layout(sizes[SLOTS]));
            ([full, after_oldest, after_newest], newest_again)
        });
        assert_eq!(counts, [SLOTS, SLOTS, SLOTS - 1]);
        assert!(newest_again);
    }

    #[test]
    fn a_kept_block_is_writable_whole_and_resizable() {
        let ok = on_thread(true, || unsafe {
            let p = Recycling.alloc(layout(4000));
            Recycling.dealloc(p, layout(4000));
            let q = Recycling.alloc(layout(4000));
            std::ptr::write_bytes(q, 0xA5, 4000);
            let r = Recycling.realloc(q, layout(4000), 12_000);
            let ok = (0..4000).all(|i| *r.add(i) == 0xA5);
            Recycling.dealloc(r, layout(12_000));
            ok
        });
        assert!(ok);
    }
}

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
//! blocks of at most [`LARGEST`] bytes, 128 KiB a worker, the oldest given back to malloc
//! when a newer one needs its slot, so a size that stops coming back leaves the cache. A block kept
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

/// The largest alignment for which `System` allocates with plain `malloc` (the standard
/// library's `MIN_ALIGN` on Unix: 16 on x86_64 and aarch64, 8 on the other targets, where it
/// trusts malloc for no more), so that blocks of one size kept from layouts aligned to at most
/// this are interchangeable.
const MALLOC_ALIGN: usize = if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
    16
} else {
    8
};

/// The global allocator of the `legate` binary.
pub struct Recycling;

struct Kept {
    on: Cell<bool>,
    len: Cell<usize>,
    /// `(size, block)`, oldest first: `blocks[..len]` are kept.
    blocks: [Cell<(usize, *mut u8)>; SLOTS],
}

thread_local! {
    static KEPT: Kept = const {
        Kept {
            on: Cell::new(false),
            len: Cell::new(0),
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
    /// The most recently kept block of `size` (its memory the likeliest still in a cache).
    fn take(&self, size: usize) -> Option<*mut u8> {
        let len = self.len.get();
        let i = (0..len).rev().find(|&i| self.blocks[i].get().0 == size)?;
        let (_, block) = self.blocks[i].get();
        // The newer ones move down a slot: the order stays oldest first.
        for j in i..len - 1 {
            self.blocks[j].set(self.blocks[j + 1].get());
        }
        self.len.set(len - 1);
        Some(block)
    }

    /// Keeps `(size, block)` as the newest; returns the oldest block when it had to make
    /// room, to be given back to malloc.
    fn keep(&self, size: usize, block: *mut u8) -> Option<*mut u8> {
        let len = self.len.get();
        if len < SLOTS {
            self.blocks[len].set((size, block));
            self.len.set(len + 1);
            return None;
        }
        let (_, oldest) = self.blocks[0].get();
        for j in 0..SLOTS - 1 {
            self.blocks[j].set(self.blocks[j + 1].get());
        }
        self.blocks[SLOTS - 1].set((size, block));
        Some(oldest)
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
        let (same, ok) = on_thread(true, || unsafe {
            let p = Recycling.alloc(layout(4000));
            Recycling.dealloc(p, layout(4000));
            let q = Recycling.alloc(layout(4000));
            std::ptr::write_bytes(q, 0xA5, 4000);
            let r = Recycling.realloc(q, layout(4000), 12_000);
            let ok = !r.is_null() && (0..4000).all(|i| *r.add(i) == 0xA5);
            Recycling.dealloc(r, layout(12_000));
            (p == q, ok)
        });
        assert!(same);
        assert!(ok);
    }

    #[test]
    fn a_zeroed_allocation_is_zeroed_even_when_a_block_of_its_size_is_kept() {
        let (kept_before, zeroed) = on_thread(true, || unsafe {
            let p = Recycling.alloc(layout(5000));
            std::ptr::write_bytes(p, 0xFF, 5000);
            Recycling.dealloc(p, layout(5000));
            let kept_before = kept();
            let z = Recycling.alloc_zeroed(layout(5000));
            let zeroed = !z.is_null() && (0..5000).all(|i| *z.add(i) == 0);
            Recycling.dealloc(z, layout(5000));
            (kept_before, zeroed)
        });
        assert_eq!(kept_before, 1);
        assert!(zeroed);
    }

    #[test]
    fn the_smallest_kept_size_and_malloc_alignment_are_kept_and_reused_aligned() {
        let (counts, reused, aligned) = on_thread(true, || unsafe {
            let smallest = layout(TCACHE_LARGEST + 1);
            let p = Recycling.alloc(smallest);
            Recycling.dealloc(p, smallest);
            let after_smallest = kept();
            let q = Recycling.alloc(smallest);
            Recycling.dealloc(q, smallest);
            // Freed with alignment 8, asked again with malloc's own alignment.
            let strict = Layout::from_size_align(TCACHE_LARGEST + 1, MALLOC_ALIGN).unwrap();
            let r = Recycling.alloc(strict);
            let aligned = (r as usize).is_multiple_of(MALLOC_ALIGN);
            Recycling.dealloc(r, strict);
            ([after_smallest, kept()], p == q && q == r, aligned)
        });
        assert_eq!(counts, [1, 1]);
        assert!(reused);
        assert!(aligned);
    }

    #[test]
    fn the_oldest_kept_block_makes_room_whatever_was_taken_in_between() {
        let sizes = on_thread(true, || unsafe {
            let size = |i: usize| 2048 + 16 * i;
            // Eight kept (sizes 0..8, 0 the oldest), two taken out of the middle and the end,
            // four more kept: the two oldest left (0 and 1) must be the ones given back.
            let blocks: Vec<*mut u8> = (0..12).map(|i| Recycling.alloc(layout(size(i)))).collect();
            for (i, &p) in blocks.iter().enumerate().take(8) {
                Recycling.dealloc(p, layout(size(i)));
            }
            let a = Recycling.alloc(layout(size(3)));
            let b = Recycling.alloc(layout(size(7)));
            for (i, &p) in blocks.iter().enumerate().skip(8) {
                Recycling.dealloc(p, layout(size(i)));
            }
            let sizes: Vec<usize> = KEPT.with(|k| {
                (0..k.len.get())
                    .map(|i| (k.blocks[i].get().0 - 2048) / 16)
                    .collect()
            });
            Recycling.dealloc(a, layout(size(3)));
            Recycling.dealloc(b, layout(size(7)));
            sizes
        });
        assert_eq!(sizes, [2, 4, 5, 6, 8, 9, 10, 11]);
    }
}

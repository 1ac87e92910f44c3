//! Header maps kept for reuse, per thread.
//!
//! A proxied HTTP/1 request makes three `HeaderMap`s: the caller's head, the upstream request's
//! and the upstream answer's (which becomes the caller's). Each is two allocations (its
//! entries, about 1 KiB for a head's dozen lines, and its index), made and freed again on every
//! request: glibc serves an entry list of that size from its general bins rather than its
//! per-thread cache, and the six calls were the largest part of a request's allocator time.
//! A map that is done with is emptied and kept here instead, and the next head takes it: its
//! room stays allocated, and only its values' references are let go.
//!
//! Bounded twice: each thread keeps at most [`KEPT`] maps, and a map that has grown past
//! [`MAX_ROOM`] lines is freed, not kept, so one request's huge head does not pin its room for
//! the thread's life. Maps are given back where a request is done with them on legate's own
//! HTTP/1 connections (the answer's head written, the upstream request answered, the caller's
//! request finished); one dropped anywhere else is freed as before, and a thread whose list is
//! empty makes a new one.

use std::cell::RefCell;

use http::HeaderMap;

/// The most maps one thread keeps: a request holds three at once, and a worker serves one
/// connection's request at a time, or a few interleaved.
const KEPT: usize = 8;

/// A map with room for more lines than this, or holding more values (repeated lines of one
/// name are kept apart from the room a map reports, so both are checked), is not kept: a head
/// of that many lines is rare. Maps grow in steps of 6, 12, 24, 48 and 96 lines' room, so the
/// largest kept has room for 48, about 5 KiB.
const MAX_ROOM: usize = 64;

thread_local! {
    static FREE: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for at least `room` lines: one kept on this thread when there is
/// one, else a new one.
pub(crate) fn take(room: usize) -> HeaderMap {
    // `try_with`: a map taken while the thread's storage is being torn down is a new one.
    let kept = FREE
        .try_with(|free| free.try_borrow_mut().ok().and_then(|mut f| f.pop()))
        .ok()
        .flatten();
    match kept {
        Some(mut map) => {
            map.reserve(room);
            map
        }
        None => HeaderMap::with_capacity(room),
    }
}

/// Empties `map` and keeps it for a later [`take`] on this thread, unless the thread keeps
/// enough already or the map has grown past [`MAX_ROOM`].
pub(crate) fn give(mut map: HeaderMap) {
    if map.capacity() > MAX_ROOM || map.len() > MAX_ROOM {
        return;
    }
    // A map given back while the thread's storage is being torn down is freed.
    let _ = FREE.try_with(|free| {
        let Ok(mut free) = free.try_borrow_mut() else {
            return;
        };
        if free.len() < KEPT {
            map.clear();
            if free.capacity() == 0 {
                free.reserve_exact(KEPT);
            }
            free.push(map);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http::header::{ACCEPT, HOST};

    fn kept() -> usize {
        FREE.with(|f| f.borrow().len())
    }

    #[test]
    fn a_map_given_back_is_taken_again_empty_with_its_room() {
        let mut map = take(4);
        map.insert(HOST, HeaderValue::from_static("a"));
        map.append(ACCEPT, HeaderValue::from_static("b"));
        let room = map.capacity();
        give(map);
        assert_eq!(kept(), 1);
        let again = take(2);
        assert_eq!(kept(), 0);
        assert!(again.is_empty(), "given back emptied");
        assert_eq!(again.capacity(), room, "with the room it had");
        // More room than it has is made.
        give(again);
        let wider = take(40);
        assert!(wider.capacity() >= 40);
        assert!(wider.is_empty());
    }

    #[test]
    fn a_map_with_repeated_lines_comes_back_without_them_and_too_many_are_not_kept() {
        let mut map = take(4);
        for v in ["1", "2", "3"] {
            map.append(ACCEPT, HeaderValue::from_static(v));
        }
        give(map);
        let mut again = take(4);
        assert!(again.is_empty());
        assert_eq!(again.get_all(ACCEPT).iter().count(), 0);
        again.append(ACCEPT, HeaderValue::from_static("4"));
        assert_eq!(again.get_all(ACCEPT).iter().collect::<Vec<_>>(), ["4"]);
        // Few names, many values: the room a map reports does not count them, its length does.
        for _ in 0..MAX_ROOM {
            again.append(ACCEPT, HeaderValue::from_static("x"));
        }
        assert!(again.capacity() <= MAX_ROOM);
        while kept() > 0 {
            take(0);
        }
        give(again);
        assert_eq!(
            kept(),
            0,
            "a map holding more values than the bound is freed"
        );
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_maps_none_of_them_huge() {
        for _ in 0..KEPT + 5 {
            give(HeaderMap::with_capacity(8));
        }
        assert_eq!(kept(), KEPT);
        let huge = HeaderMap::with_capacity(MAX_ROOM * 4);
        while kept() > 0 {
            take(0);
        }
        give(huge);
        assert_eq!(kept(), 0, "a map past the room bound is freed");
        // With none kept, a new one is made.
        assert!(take(3).capacity() >= 3);
    }
}

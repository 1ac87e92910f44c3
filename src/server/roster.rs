//! The open connections of one plane, for making room when it is full. A plane at its cap
//! (SPEC §14) closes its longest-idle connection for a new one, as nginx reuses idle keep-alive
//! connections when it runs out: otherwise a client that leaks idle connections (a new SDK
//! client per call, never closed) or a peer that opens them and sends nothing would hold every
//! slot until `connection_idle_timeout` (or `header_read_timeout`), and requests and health
//! probes would wait in the backlog behind them. A connection with a request in flight is never
//! chosen; one with nothing at all pending goes before one whose next head has begun to arrive.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::conn::ConnWatch;

pub struct Roster {
    watches: Mutex<Vec<Weak<ConnWatch>>>,
    /// The plane's cap: the list is swept of ended connections when it reaches it, so it
    /// holds at most about twice as many entries as open connections.
    cap: usize,
}

impl Roster {
    pub fn new(cap: usize) -> Self {
        Roster {
            watches: Mutex::new(Vec::new()),
            cap: cap.max(1),
        }
    }

    /// Lists an accepted connection.
    pub fn enlist(&self, watch: &Arc<ConnWatch>) {
        let mut watches = self.watches.lock();
        // Swept at twice the cap: with the plane full, a sweep at the cap would run at every
        // accept.
        if watches.len() >= 2 * self.cap {
            watches.retain(|w| w.strong_count() > 0);
        }
        watches.push(Arc::downgrade(watch));
    }

    /// Closes the open connection that has waited longest for a request (one with nothing
    /// pending first); whether there was one. While a connection closed this way is still
    /// open (an HTTP/2 one in its GOAWAY's short grace), none other is: its slot is coming,
    /// and a full plane asking again every [`EVICTABLE_AFTER`] would otherwise send every
    /// idle HTTP/2 connection GOAWAY in turn for one new peer.
    ///
    /// [`EVICTABLE_AFTER`]: super::conn::EVICTABLE_AFTER
    pub fn evict_longest_idle(&self) -> bool {
        let now = tokio::time::Instant::now();
        let mut watches = self.watches.lock();
        watches.retain(|w| w.strong_count() > 0);
        if watches
            .iter()
            .filter_map(Weak::upgrade)
            .any(|w| w.closing_for_room())
        {
            return false;
        }
        let chosen = watches
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|w| w.idleness(now).map(|key| (key, w)))
            .min_by_key(|(key, _)| *key);
        drop(watches);
        chosen.is_some_and(|(_, w)| w.evict_if_idle(now))
    }

    #[cfg(test)]
    fn listed(&self) -> usize {
        self.watches.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::server::conn::ConnLimits;

    fn watch() -> Arc<ConnWatch> {
        ConnWatch::new(ConnLimits {
            header_read_timeout: Duration::from_secs(10),
            connection_idle_timeout: Duration::from_secs(120),
            body_read_timeout: Duration::from_secs(60),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_connection_is_chosen_and_a_busy_or_new_one_never() {
        let now = tokio::time::Instant::now;
        let roster = Roster::new(8);
        let busy = watch();
        roster.enlist(&busy);
        let _inflight = busy.begin();
        tokio::time::advance(Duration::from_secs(1)).await;
        let older = watch();
        roster.enlist(&older);
        tokio::time::advance(Duration::from_secs(1)).await;
        let newer = watch();
        roster.enlist(&newer);
        // Just accepted: its first request may be on its way.
        assert!(newer.idleness(now()).is_none());
        assert!(roster.evict_longest_idle());
        assert!(
            older.idleness(now()).is_none(),
            "the oldest idle one was chosen"
        );
        // Neither the busy one nor the new one may be chosen yet.
        assert!(!roster.evict_longest_idle());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(newer.idleness(now()).is_some());
        // While the chosen one is still closing (an HTTP/2 one in its GOAWAY's grace), no
        // other is closed: its slot is on its way.
        assert!(!roster.evict_longest_idle());
        assert!(newer.idleness(now()).is_some());
        drop(older);
        assert!(roster.evict_longest_idle());
        assert!(newer.idleness(now()).is_none());
        // Only the busy one is left.
        drop(newer);
        assert!(!roster.evict_longest_idle());
    }

    #[test]
    fn ended_connections_are_swept_at_twice_the_cap() {
        let roster = Roster::new(4);
        let kept = watch();
        roster.enlist(&kept);
        for _ in 0..20 {
            roster.enlist(&watch());
        }
        assert!(roster.listed() <= 9, "{}", roster.listed());
    }
}

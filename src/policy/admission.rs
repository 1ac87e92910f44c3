//! The admission gate of one provider: at most `max_concurrency` requests in flight; beyond
//! that they wait in a queue served interactive, then background, then batch. Past
//! `queue_limit` waiting requests, batch work is shed first, then background; interactive work
//! is never shed here (it displaces lower-priority waiters instead), so the queue stays bounded
//! by `queue_limit` plus the interactive callers themselves.
//!
//! Why not tower's `ConcurrencyLimit` / `LoadShed`: they know one queue in arrival order and
//! shed whatever finds the service not ready, while this gate orders waiters by priority,
//! sheds the lowest priority first (an interactive call displaces a waiting batch call), and
//! its permit lives as long as the answer's body, not the service call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use prometheus::{IntCounterVec, IntGaugeVec};
use tokio::sync::oneshot;

use crate::config::Priority;

/// A request the gate refused: it should get 529 with retry-after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed;

type Grant = Result<(), Shed>;

/// One priority's waiters by arrival number: served from the first, shed from the last, and a
/// caller that gives up removes its own place in O(log n), so callers leaving in a mass (a
/// shared deadline) cost no scan each of the whole queue.
type Queue = BTreeMap<u64, oneshot::Sender<Grant>>;

struct State {
    inflight: usize,
    queues: [Queue; 3],
    /// Callers the provider's pacer holds back before they queue here (background and batch
    /// calls spaced out while its rate limit runs low): counted against `queue_limit` and in
    /// the depth gauge, and shed as queued ones are, but never handed a slot from here.
    paced: [Queue; 3],
    /// The next arrival number.
    next: u64,
}

pub struct Gate {
    /// Both change in place on reload: the gate (and who holds or waits for it) outlives
    /// config snapshots, so a reload can never let more than `max` through.
    max: AtomicUsize,
    queue_limit: AtomicUsize,
    state: Mutex<State>,
    depth: IntGaugeVec,
    shed: IntCounterVec,
}

/// A slot held for one upstream exchange; dropping it lets the next waiter in.
pub struct Permit {
    gate: Arc<Gate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// A queued caller's receiver. If the caller goes away after its slot was handed over but
/// before it saw it, the slot is passed on rather than lost; if it goes away still queued, it
/// leaves the queue at once.
struct Waiting {
    rx: Option<oneshot::Receiver<Grant>>,
    gate: Arc<Gate>,
    priority: Priority,
    place: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            match rx.try_recv() {
                Ok(Ok(())) => self.gate.release(),
                // Shed: its place was taken out of the queue then.
                Ok(Err(Shed)) => {}
                // Nothing was sent: its place is (or was until a moment ago) still queued. The
                // queue and its gauge count the callers waiting, so it is removed now rather
                // than when a slot next comes free, which may be a long stream later.
                Err(_) => self.gate.leave(self.priority, self.place),
            }
        }
    }
}

impl Gate {
    pub fn new(max: usize, queue_limit: usize, depth: IntGaugeVec, shed: IntCounterVec) -> Self {
        Gate {
            max: AtomicUsize::new(max.max(1)),
            queue_limit: AtomicUsize::new(queue_limit),
            state: Mutex::new(State {
                inflight: 0,
                queues: Default::default(),
                paced: Default::default(),
                next: 0,
            }),
            depth,
            shed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn gauge(&self, p: Priority, delta: i64) {
        self.depth.with_label_values(&[p.as_str()]).add(delta);
    }

    /// Waits for a slot in priority order, or is shed.
    pub async fn acquire(self: &Arc<Self>, p: Priority) -> Result<Permit, Shed> {
        let (rx, place) = {
            let mut st = self.lock();
            let max = self.max.load(Ordering::Relaxed);
            let queue_limit = self.queue_limit.load(Ordering::Relaxed);
            if st.inflight < max && st.queues.iter().all(Queue::is_empty) {
                st.inflight += 1;
                return Ok(Permit { gate: self.clone() });
            }
            if !self.make_room(&mut st, p, queue_limit) {
                return Err(Shed);
            }
            let (tx, rx) = oneshot::channel();
            let place = st.next;
            st.next += 1;
            st.queues[p as usize].insert(place, tx);
            self.gauge(p, 1);
            (rx, place)
        };
        let mut waiting = Waiting {
            rx: Some(rx),
            gate: self.clone(),
            priority: p,
            place,
        };
        let grant = match waiting.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(Shed),
        };
        waiting.rx = None;
        match grant {
            Ok(Ok(())) => Ok(Permit { gate: self.clone() }),
            _ => Err(Shed),
        }
    }

    /// Past `queue_limit` places (queued and paced), makes room for a caller of priority `p`
    /// by shedding the newest waiter of the lowest priority below it; false when there is none
    /// and `p` is shed itself (interactive never is: it is let past the limit). Callers that
    /// gave up (deadline, disconnect) hold no places: each left at once.
    fn make_room(&self, st: &mut State, p: Priority, queue_limit: usize) -> bool {
        let held: usize = st.queues.iter().chain(&st.paced).map(Queue::len).sum();
        if held < queue_limit {
            return true;
        }
        let victim = Priority::ALL.iter().rev().copied().find(|q| {
            *q > p && !(st.queues[*q as usize].is_empty() && st.paced[*q as usize].is_empty())
        });
        match victim {
            Some(q) => {
                let i = q as usize;
                let newest = |queue: &Queue| queue.last_key_value().map(|(k, _)| *k);
                let from = if newest(&st.paced[i]) > newest(&st.queues[i]) {
                    &mut st.paced[i]
                } else {
                    &mut st.queues[i]
                };
                if let Some((_, tx)) = from.pop_last() {
                    let _ = tx.send(Err(Shed));
                }
                self.gauge(q, -1);
                self.shed.with_label_values(&[q.as_str()]).inc();
                true
            }
            None if p != Priority::Interactive => {
                self.shed.with_label_values(&[p.as_str()]).inc();
                false
            }
            None => true,
        }
    }

    /// Holds a caller of priority `p` for `wait`, as the provider's pacer asks, in a place
    /// counted as queued: past `queue_limit` it is shed, or sheds a lower one, as a queued
    /// caller is; while it waits, a higher-priority caller may shed it. Without a place, the
    /// pacer's waiters were invisible (the depth gauge and `/admin/state` read 0) and
    /// unbounded. The caller queues for a slot afterwards ([`Gate::acquire`]).
    pub async fn pace(
        self: &Arc<Self>,
        p: Priority,
        wait: std::time::Duration,
    ) -> Result<(), Shed> {
        let (rx, place) = {
            let mut st = self.lock();
            let queue_limit = self.queue_limit.load(Ordering::Relaxed);
            if !self.make_room(&mut st, p, queue_limit) {
                return Err(Shed);
            }
            let (tx, rx) = oneshot::channel();
            let place = st.next;
            st.next += 1;
            st.paced[p as usize].insert(place, tx);
            self.gauge(p, 1);
            (rx, place)
        };
        // Leaves its place however the wait ends (over, shed, or the caller gone).
        struct Place<'a>(&'a Gate, Priority, u64);
        impl Drop for Place<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock();
                if st.paced[self.1 as usize].remove(&self.2).is_some() {
                    self.0.gauge(self.1, -1);
                }
            }
        }
        let _place = Place(self, p, place);
        let mut rx = rx;
        tokio::select! {
            // A shed sent as the wait ended still holds: it was counted as one.
            () = tokio::time::sleep(wait) => match rx.try_recv() {
                Ok(Err(Shed)) => Err(Shed),
                _ => Ok(()),
            },
            // Only a shed is ever sent; a closed channel cannot happen while the place holds
            // the sender, and is read as the wait being over.
            shed = &mut rx => match shed {
                Ok(Err(Shed)) => Err(Shed),
                _ => Ok(()),
            },
        }
    }

    /// Applies a reloaded `max_concurrency` and `queue_limit`; a larger cap lets waiters in, a
    /// smaller one takes effect as the slots held beyond it are released.
    pub fn resize(&self, max: usize, queue_limit: usize) {
        self.max.store(max.max(1), Ordering::Relaxed);
        self.queue_limit.store(queue_limit, Ordering::Relaxed);
        let mut st = self.lock();
        'grant: while st.inflight < self.max.load(Ordering::Relaxed) {
            for p in Priority::ALL {
                while let Some((_, tx)) = st.queues[p as usize].pop_first() {
                    self.gauge(p, -1);
                    if tx.send(Ok(())).is_ok() {
                        st.inflight += 1;
                        continue 'grant;
                    }
                }
            }
            break;
        }
    }

    /// A caller of priority `p` stopped waiting (deadline, disconnect) before it was served:
    /// its place goes, unless a release or a shed took it out a moment ago (and counted it).
    fn leave(&self, p: Priority, place: u64) {
        let mut st = self.lock();
        if st.queues[p as usize].remove(&place).is_some() {
            self.gauge(p, -1);
        }
    }

    /// Hands the slot to the first live waiter in priority order, or frees it. After a reload
    /// lowered `max`, slots are freed, not handed on, until no more than `max` are in flight.
    fn release(&self) {
        let mut st = self.lock();
        if st.inflight > self.max.load(Ordering::Relaxed) {
            st.inflight -= 1;
            return;
        }
        for p in Priority::ALL {
            while let Some((_, tx)) = st.queues[p as usize].pop_first() {
                self.gauge(p, -1);
                if tx.send(Ok(())).is_ok() {
                    return;
                }
            }
        }
        st.inflight = st.inflight.saturating_sub(1);
    }

    /// Counts a caller of priority `p` shed before it took a place (the pacer's wait would
    /// outlast its deadline).
    pub fn count_shed(&self, p: Priority) {
        self.shed.with_label_values(&[p.as_str()]).inc();
    }

    pub fn inflight(&self) -> usize {
        self.lock().inflight
    }

    /// Callers waiting, by priority: queued for a slot, and held by the pacer.
    pub fn queued(&self) -> [usize; 3] {
        let st = self.lock();
        std::array::from_fn(|i| st.queues[i].len() + st.paced[i].len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller waiting at `g` with priority `p`, leaving as soon as it is admitted.
    fn waiter(g: &Arc<Gate>, p: Priority) -> tokio::task::JoinHandle<Result<(), Shed>> {
        let g = g.clone();
        tokio::spawn(async move { g.acquire(p).await.map(drop) })
    }

    fn gate(max: usize, limit: usize) -> Arc<Gate> {
        let depth = IntGaugeVec::new(prometheus::Opts::new("d", "d"), &["priority"]).unwrap();
        let shed = IntCounterVec::new(prometheus::Opts::new("s", "s"), &["priority"]).unwrap();
        Arc::new(Gate::new(max, limit, depth, shed))
    }

    #[tokio::test]
    async fn waiters_are_served_interactive_then_background_then_batch() {
        let g = gate(1, 10);
        let first = g.acquire(Priority::Interactive).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for p in [Priority::Batch, Priority::Background, Priority::Interactive] {
            let g = g.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let permit = g.acquire(p).await.unwrap();
                tx.send(p).unwrap();
                drop(permit);
            });
        }
        // Wait until all three are queued.
        while g.queued().iter().sum::<usize>() < 3 {
            tokio::task::yield_now().await;
        }
        drop(first);
        let order: Vec<Priority> = vec![
            rx.recv().await.unwrap(),
            rx.recv().await.unwrap(),
            rx.recv().await.unwrap(),
        ];
        assert_eq!(
            order,
            vec![Priority::Interactive, Priority::Background, Priority::Batch]
        );
        assert_eq!(g.inflight(), 0);
    }

    #[tokio::test]
    async fn past_the_limit_batch_is_shed_first_and_interactive_displaces_it() {
        let g = gate(1, 2);
        let _busy = g.acquire(Priority::Interactive).await.unwrap();
        let b1 = waiter(&g, Priority::Batch);
        let b2 = waiter(&g, Priority::Background);
        while g.queued().iter().sum::<usize>() < 2 {
            tokio::task::yield_now().await;
        }
        // Queue full: another batch is shed at once.
        assert_eq!(g.acquire(Priority::Batch).await.err(), Some(Shed));
        // Interactive displaces the queued batch request.
        let i = waiter(&g, Priority::Interactive);
        assert_eq!(b1.await.unwrap(), Err(Shed));
        while g.queued()[0] < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(g.queued(), [1, 1, 0]);
        drop(_busy);
        assert_eq!(i.await.unwrap(), Ok(()));
        assert_eq!(b2.await.unwrap(), Ok(()));
        assert_eq!(g.inflight(), 0);
    }

    /// Callers the pacer holds back hold queue places: counted, bounded by `queue_limit`, and
    /// shed lowest priority first. They were invisible and unbounded.
    #[tokio::test(start_paused = true)]
    async fn paced_callers_hold_queue_places_and_are_shed_as_queued_ones() {
        let g = gate(1, 2);
        let wait = std::time::Duration::from_secs(5);
        let pace = |p: Priority| {
            let g = g.clone();
            tokio::spawn(async move { g.pace(p, wait).await })
        };
        let first = pace(Priority::Batch);
        let second = pace(Priority::Batch);
        while g.queued()[2] < 2 {
            tokio::task::yield_now().await;
        }
        // Full: another batch caller is shed at once, and a background one sheds the newest
        // paced batch caller.
        assert_eq!(g.pace(Priority::Batch, wait).await, Err(Shed));
        let background = pace(Priority::Background);
        assert_eq!(second.await.unwrap(), Err(Shed));
        while g.queued()[1] < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(g.queued(), [0, 1, 1]);
        let depth = |p: Priority| g.depth.with_label_values(&[p.as_str()]).get();
        assert_eq!(
            (depth(Priority::Background), depth(Priority::Batch)),
            (1, 1)
        );
        // The waits end, and their places go with them.
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(background.await.unwrap(), Ok(()));
        assert_eq!(g.queued(), [0, 0, 0]);
        assert_eq!(
            (depth(Priority::Background), depth(Priority::Batch)),
            (0, 0)
        );
    }

    #[tokio::test]
    async fn waiters_that_gave_up_do_not_hold_queue_places() {
        let g = gate(1, 2);
        let _busy = g.acquire(Priority::Interactive).await.unwrap();
        let gone: Vec<_> = (0..2).map(|_| waiter(&g, Priority::Batch)).collect();
        while g.queued()[2] < 2 {
            tokio::task::yield_now().await;
        }
        for h in gone {
            h.abort();
            let _ = h.await;
        }
        // The queue is nominally full of dead entries: a live batch caller still gets a place.
        let live = waiter(&g, Priority::Batch);
        while g.queued()[2] != 1 {
            tokio::task::yield_now().await;
        }
        drop(_busy);
        assert_eq!(live.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_lowered_cap_holds_once_the_slots_beyond_it_are_released() {
        let g = gate(3, 10);
        let held: Vec<Permit> = vec![
            g.acquire(Priority::Interactive).await.unwrap(),
            g.acquire(Priority::Interactive).await.unwrap(),
            g.acquire(Priority::Interactive).await.unwrap(),
        ];
        let (tx, mut admitted) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..4 {
            let (g, tx) = (g.clone(), tx.clone());
            tokio::spawn(async move {
                let permit = g.acquire(Priority::Interactive).await.unwrap();
                let _ = tx.send(permit);
            });
        }
        while g.queued()[0] < 4 {
            tokio::task::yield_now().await;
        }
        g.resize(1, 10);
        drop(held);
        // Two of the three released slots are freed, the third handed to one waiter.
        let first = admitted.recv().await.unwrap();
        assert_eq!((g.inflight(), g.queued()), (1, [3, 0, 0]));
        assert!(admitted.try_recv().is_err());
        // From then on one at a time.
        drop(first);
        let second = admitted.recv().await.unwrap();
        assert_eq!((g.inflight(), g.queued()), (1, [2, 0, 0]));
        drop(second);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_queue_and_its_gauge_at_once() {
        let g = gate(1, 10);
        let _busy = g.acquire(Priority::Interactive).await.unwrap();
        let mut waiters: Vec<_> = (0..3).map(|_| waiter(&g, Priority::Background)).collect();
        while g.queued()[1] < 3 {
            tokio::task::yield_now().await;
        }
        let _stays = waiters.pop();
        for w in waiters {
            w.abort();
            let _ = w.await;
        }
        assert_eq!(g.queued(), [0, 1, 0]);
        assert_eq!(g.depth.with_label_values(&["background"]).get(), 1);
    }

    #[tokio::test]
    async fn a_waiter_leaving_from_the_middle_keeps_the_others_in_arrival_order() {
        let g = gate(1, 10);
        let busy = g.acquire(Priority::Background).await.unwrap();
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (gate, order_tx) = (g.clone(), order_tx.clone());
            waiters.push(tokio::spawn(async move {
                let permit = gate.acquire(Priority::Background).await;
                order_tx.send((n, permit)).unwrap();
            }));
            while g.queued()[1] < n + 1 {
                tokio::task::yield_now().await;
            }
        }
        waiters[1].abort();
        while g.queued()[1] > 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(g.depth.with_label_values(&["background"]).get(), 2);
        drop(busy);
        let (first, permit) = order.recv().await.unwrap();
        assert_eq!(first, 0);
        drop(permit);
        let (second, permit) = order.recv().await.unwrap();
        assert_eq!(second, 2);
        drop(permit);
        assert_eq!((g.inflight(), g.queued()), (0, [0, 0, 0]));
        assert_eq!(g.depth.with_label_values(&["background"]).get(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_does_not_leak_its_slot() {
        let g = gate(1, 10);
        let busy = g.acquire(Priority::Interactive).await.unwrap();
        let w = waiter(&g, Priority::Batch);
        while g.queued()[2] < 1 {
            tokio::task::yield_now().await;
        }
        w.abort();
        let _ = w.await;
        drop(busy);
        assert_eq!(g.inflight(), 0);
        let again = g.acquire(Priority::Batch).await;
        assert!(again.is_ok());
    }
}

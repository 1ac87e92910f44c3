//! A Redis connection opened on first use and dropped after any failed call, so that the next
//! call connects afresh (after a dead socket, a timeout, or a server that turned replica in a
//! failover). Construction never connects: legate must start while Redis is down. The
//! rate-limit store and the conversation store each hold one.
//!
//! One connection attempt at a time, and after one fails (or a call times out), none for
//! [`PAUSE`]: callers meanwhile fail at once. A call on a connection that broke is not a reason
//! to pause: the next call connects afresh, and if Redis is down that attempt fails and pauses.
//! Without the pause, callers of a Redis that does not answer queued on the attempt and waited
//! its whole timeout each, one after another (16 lookups answered 0.5 s apart, up to 8 s).
//!
//! Each reply is bounded in size ([`reply_bound`]): a Redis that sends, or declares, a larger
//! one has its connection dropped, as one that broke off would, but without the pause (the
//! call got an answer). A connection Redis closed while idle is replaced before it is lent.

mod connect;
mod reply_bound;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError};
use tokio::sync::Mutex;
use tokio::time::Instant;

use connect::{Driver, Target};

/// How long a Redis that could not be reached is not tried again.
pub const PAUSE: Duration = Duration::from_secs(1);

pub struct LazyConnection {
    target: Target,
    config: AsyncConnectionConfig,
    timeout: Duration,
    max_reply: usize,
    conn: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    /// The connection, and its driver, ended when the slot and every lease let go of it.
    conn: Option<(MultiplexedConnection, Arc<Driver>)>,
    /// Counts the connections opened: a failure on an older one leaves a newer one alone.
    generation: u64,
    /// No attempt before this (after a failed one).
    paused_until: Option<Instant>,
}

/// An open connection, and which one it is (for [`LazyConnection::reset`]).
pub struct Leased {
    pub conn: MultiplexedConnection,
    generation: u64,
    _driver: Arc<Driver>,
}

impl LazyConnection {
    /// `timeout` bounds both the connection and each reply, so a missing Redis costs a
    /// request little; `max_reply` bounds the bytes of each reply. Fails only on an address
    /// legate does not connect to (`rediss://…#insecure`).
    pub fn new(client: &Client, timeout: Duration, max_reply: usize) -> Result<Self, RedisError> {
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
        Ok(LazyConnection {
            target: Target::new(client.get_connection_info().clone())?,
            config,
            timeout,
            max_reply,
            conn: Mutex::new(Slot::default()),
        })
    }

    /// The open connection, or a new one (none while paused after a failure).
    pub async fn get(&self) -> Result<Leased, RedisError> {
        let mut slot = self.conn.lock().await;
        // A connection Redis closed while it was idle is replaced, without a pause: it did not
        // fail a call.
        if slot.conn.as_ref().is_some_and(|(_, driver)| driver.ended()) {
            slot.conn = None;
        }
        if let Some((conn, driver)) = slot.conn.as_ref() {
            return Ok(Leased {
                conn: conn.clone(),
                generation: slot.generation,
                _driver: driver.clone(),
            });
        }
        if slot.paused_until.is_some_and(|at| Instant::now() < at) {
            return Err(RedisError::from((
                ErrorKind::Io,
                "Redis could not be reached a moment ago; not tried again yet",
            )));
        }
        match self
            .target
            .open(&self.config, self.timeout, self.max_reply)
            .await
        {
            Ok((conn, driver)) => {
                let driver = Arc::new(driver);
                slot.generation += 1;
                slot.conn = Some((conn.clone(), driver.clone()));
                slot.paused_until = None;
                Ok(Leased {
                    conn,
                    generation: slot.generation,
                    _driver: driver,
                })
            }
            Err(e) => {
                slot.paused_until = Some(Instant::now() + PAUSE);
                Err(e)
            }
        }
    }

    /// After a call on `leased` failed: the next call starts from a new connection, and after
    /// a timeout not before [`PAUSE`]. A broken connection (Redis closed it, even between the
    /// look for an ended one and the call) or a reply refused for its size (one entry too
    /// large, say one written by a replica with a larger bound) is no reason to wait: the next
    /// call connects at once, and pauses if that fails. A
    /// failure on a connection already replaced (a call still in flight on the old one when
    /// Redis came back) leaves the new one alone, and a pause is never extended by a failure
    /// seen during it.
    pub async fn reset(&self, leased: &Leased, after: &RedisError) {
        let mut slot = self.conn.lock().await;
        if slot.generation != leased.generation {
            return;
        }
        let Some((_, driver)) = slot.conn.take() else {
            return;
        };
        // Whichever call saw it first: the one given the size error, or another given a
        // closed connection.
        if driver.refused_a_reply() {
            return;
        }
        if after.is_timeout() {
            slot.paused_until = Some(Instant::now() + PAUSE);
        }
    }

    /// Whether attempts are paused now.
    #[cfg(test)]
    pub async fn paused(&self) -> bool {
        let slot = self.conn.lock().await;
        slot.paused_until.is_some_and(|at| Instant::now() < at)
    }

    /// Ends a pause now, as if it had run out.
    #[cfg(test)]
    pub async fn end_pause(&self) {
        self.conn.lock().await.paused_until = None;
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) mod test_server;

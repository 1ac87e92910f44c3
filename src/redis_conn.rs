//! A Redis connection opened on first use and dropped after any failed call, so that the next
//! call connects afresh (after a dead socket, a timeout, or a server that turned replica in a
//! failover). Construction never connects: legate must start while Redis is down. The
//! rate-limit store and the conversation store each hold one.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::Mutex;

pub struct LazyConnection {
    client: Client,
    config: AsyncConnectionConfig,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl LazyConnection {
    /// `timeout` bounds both the connection and each reply, so a missing Redis costs a
    /// request little.
    pub fn new(client: Client, timeout: Duration) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        LazyConnection {
            client,
            config,
            conn: Mutex::new(None),
        }
    }

    /// The open connection, or a new one.
    pub async fn get(&self) -> Result<MultiplexedConnection, RedisError> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// After a failed call: whatever went wrong, the next call starts from a new connection.
    pub async fn reset(&self) {
        *self.conn.lock().await = None;
    }
}

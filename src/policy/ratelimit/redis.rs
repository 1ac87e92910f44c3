//! The shared store: tenant buckets in Redis, changed only by server-side scripts so that every
//! replica's admission and settlement is atomic. (Placeholder until the Redis store lands:
//! every call fails, so the limiter serves on its local buckets.)

use super::{Ask, BoxFuture, Decision, Now, Settlement, Store, StoreError};

pub struct RedisStore {
    _url: String,
}

impl RedisStore {
    pub fn new(url: &str) -> Result<Self, StoreError> {
        Ok(RedisStore {
            _url: url.to_string(),
        })
    }
}

impl Store for RedisStore {
    fn admit<'a>(
        &'a self,
        _ask: &'a Ask,
        _now: Now,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async {
            Err(StoreError(
                "the Redis store is not available in this build".into(),
            ))
        })
    }

    fn settle<'a>(
        &'a self,
        _s: &'a Settlement,
        _now: Now,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async {
            Err(StoreError(
                "the Redis store is not available in this build".into(),
            ))
        })
    }
}

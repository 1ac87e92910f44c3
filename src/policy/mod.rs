//! The failure policy: what one attempt's outcome means (`judge`, pure and table-tested), what
//! is retried and how long to wait (`retry`), when an upstream is given a rest (`breaker`, `breakers`), how
//! much each tenant may send (`ratelimit`), and in which order waiting work reaches a provider
//! (`admission`, `pacer`). The decisions that use them are acted on in one place,
//! `proxy::chain`.

pub mod admission;
pub mod breaker;
pub mod breakers;
pub mod judge;
pub mod pacer;
pub mod ratelimit;
pub mod retry;

//! The failure policy: what is retried and how long to wait (`retry`), when an upstream is
//! given a rest (`breaker`). The decisions that use them are made in one place,
//! `proxy::chain`.

pub mod breaker;
pub mod retry;

//! Black-box tests: legate (in-process or the real binary) against the scripted mock provider,
//! both on 127.0.0.1:0, driven by a real HTTP client.

// A test that cannot set itself up should fail loudly at that line.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod harness;
mod key_echo;

mod access_log;
mod admission;
mod agents;
mod background;
mod binary;
mod bounded_state;
mod breaker_metrics;
mod buffers;
mod catalog;
mod check;
mod cloud;
mod cloud_responses;
mod cloud_secrets;
mod connections;
mod errors;
mod h2_evict;
mod h2_head;
mod h2_limits;
mod h2_upstream;
mod metering;
mod observe;
mod origin;
mod otlp;
mod oversize;
mod passthrough;
mod pgo_wrapper;
mod provider_gate;
mod rawup;
mod redis_store;
mod reload;
mod resilience;
mod responses;
mod responses_tenants;
mod robustness;
mod runtime;
mod shared_limits;
mod stale_connection;
mod streaming;
mod tls;
mod translation;
mod unasked_usage;
mod upstream_pool;

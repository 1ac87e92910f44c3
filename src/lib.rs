//! legate: a model ambassador. A localhost proxy that owns the connection from agents to LLM
//! providers: keys, TLS, timeouts, streaming, metering and metrics (see SPEC in the README).

pub mod agent;
pub mod api;
pub mod cli;
pub mod cloud;
pub mod config;
pub mod error;
pub(crate) mod header_maps;
#[cfg(test)]
mod json_gen;
pub(crate) mod key_shapes;
pub mod limits;
pub mod loopback;
pub mod lru;
pub mod meter;
pub mod mock;
pub mod names;
pub mod observe;
pub mod policy;
pub mod proxy;
pub mod redact;
pub mod redis_conn;
pub mod responses;
pub mod route;
pub mod series;
pub mod server;
pub mod splice;
pub mod sse;
pub mod telemetry;
pub mod tokens;
pub mod translate;
pub mod upstream;
pub mod usage;
pub mod verbatim;

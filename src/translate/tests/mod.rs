//! Tests of the translation as a whole, through the public functions: request shapes and
//! refusals, round-trip properties, and stream translation.

mod requests;
mod roundtrip_anthropic;
mod roundtrip_openai;
mod roundtrip_response;
mod strategies;
mod stream_cases;
mod stream_props;
mod stream_support;

//! Identity of what serves a request and of who sent it.
//!
//! * `model_version` — what an engine serves, learnt once per process from
//!   /proc (never per request) and put on records by an enricher;
//!   `serving_config` (its flags, normalised, secrets dropped) and
//!   `engine_info` (its build, from its info endpoint or package metadata)
//!   likewise.
//! * `caller` (tenant, peer, API-key id) and `request_type` — pure rules and
//!   bounded values the decoder applies to each request
//!   (`decode::exchange`); the metrics sink caps them (`metrics`).
//!
//! Must not: run /proc reads on the data path, or keep payload text.

pub mod caller;
pub mod engine_info;
pub mod model_version;
pub mod request_type;
pub mod serving_config;
pub mod tokenizer;
pub mod trace;

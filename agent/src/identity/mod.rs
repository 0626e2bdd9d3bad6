//! Identity of a request beyond timing: who sent it (`caller`: tenant,
//! peer, API-key id) and what kind of request it is (`request_type`).
//! Pure rules and bounded values; the decoder applies them to each request
//! (`decode::exchange`) and the metrics sink caps them (`metrics`).

pub mod caller;
pub mod request_type;

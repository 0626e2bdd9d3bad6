//! tokentap: measures LLM inference services from the kernel.
//!
//! Stages (see docs/architecture.md): `capture` (kernel → typed socket
//! events) and `replay` (capture file → the same events) feed everything
//! downstream through [`source::EventSource`].

pub mod capfile;
pub mod capture;
pub mod console;
pub mod decode;
pub mod discover;
pub mod event;
pub mod metrics;
pub mod requests;
pub mod source;

//! tokentap: measures LLM inference services from the kernel.
//!
//! One pipeline (see [`pipeline`] and docs/architecture.md): a source
//! (`capture`, live kernel capture; or `capfile`, a capture file) yields
//! typed socket events through [`source::EventSource`]; `decode` turns them
//! into [`record::RequestRecord`]s; enrichers add identity; sinks (request
//! log, console, OTLP metrics) write them out.

pub mod capfile;
pub mod capture;
pub mod decode;
pub mod enginemetrics;
pub mod engines;
pub mod event;
pub mod gpu;
pub mod host;
pub mod identity;
pub mod pipeline;
pub mod record;
pub mod selftraffic;
pub mod sinks;
pub mod source;
pub mod stage;
pub mod timeline;
pub mod tokenize;
pub mod vocab;

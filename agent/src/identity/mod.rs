//! Identity of what serves a request, learnt once per process from /proc
//! (never per request) and put on records by the pipeline's enrichers.
//!
//! Owns: reading a process's identity (command line, environment, model
//! files). Must not: run on the data path, or keep anything per request.

pub mod model_version;

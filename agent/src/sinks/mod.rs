//! The sinks wing: every output of the pipeline, one file each — the
//! request log, the events log, the console view, and `otlp/` (metrics and
//! timeline events over OTLP, from one exporter builder).
//!
//! Owns: how records and events leave the process. Must not: decide what a
//! record says (decode, enrichers) or what an event is (timeline); nothing
//! below the drivers imports a sink.

pub mod console;
pub mod events_log;
pub mod otlp;
pub mod requests_log;

/// A JSON Lines output: stdout for `-`, else `path` opened for appending
/// (a log survives restarts); `what` names it in the error.
pub fn append_or_stdout(
    path: &std::path::Path,
    what: &str,
) -> anyhow::Result<Box<dyn std::io::Write + Send>> {
    use anyhow::Context as _;
    Ok(if path.as_os_str() == "-" {
        Box::new(std::io::stdout())
    } else {
        Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open {what} {}", path.display()))?,
        )
    })
}

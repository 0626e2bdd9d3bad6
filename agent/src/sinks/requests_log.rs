//! `--requests-log PATH|-`: the request log, one [`RequestRecord`] per
//! finished LLM request and line (with `--log-all-requests`, the other
//! requests too, `operation: null`). No prompt or completion text: records
//! carry none.

use crate::{
    record::{Finished, RequestRecord, RouteClass},
    stage::{Sink, Tick},
};

/// Writes the request log: JSON Lines, one [`RequestRecord`] per line.
/// It holds no prompt or completion text, only metadata and numbers.
pub struct RequestLog {
    out: std::io::BufWriter<Box<dyn std::io::Write + Send>>,
    pub records: u64,
    /// Also write requests that are not LLM requests (`--log-all-requests`),
    /// with `operation: null`.
    all: bool,
}

impl RequestLog {
    /// `-` writes to stdout; a path is appended to (a log survives restarts).
    pub fn create(path: &std::path::Path) -> anyhow::Result<Self> {
        Ok(Self {
            out: std::io::BufWriter::new(super::append_or_stdout(path, "request log")?),
            records: 0,
            all: false,
        })
    }

    /// Writes every request, LLM or not (`--log-all-requests`).
    pub fn all_requests(mut self, all: bool) -> Self {
        self.all = all;
        self
    }

    pub fn write(&mut self, r: &RequestRecord) -> anyhow::Result<()> {
        use std::io::Write as _;
        serde_json::to_writer(&mut self.out, r)?;
        self.out.write_all(b"\n")?;
        self.records += 1;
        Ok(())
    }

    pub fn flush(&mut self) -> anyhow::Result<()> {
        use std::io::Write as _;
        self.out.flush()?;
        Ok(())
    }
}

impl Sink for RequestLog {
    fn record(&mut self, f: &Finished) -> anyhow::Result<()> {
        self.write(&f.record)
    }

    fn other_request(&mut self, f: &Finished, _: RouteClass) -> anyhow::Result<()> {
        if !self.all {
            return Ok(());
        }
        // `operation: null` marks it as no LLM request (a 404 on a chat
        // path had one by its path).
        let r = RequestRecord {
            operation: None,
            ..f.record.clone()
        };
        self.write(&r)
    }

    fn tick(&mut self, _: &Tick<'_>) -> anyhow::Result<()> {
        self.flush()
    }

    fn shutdown(mut self: Box<Self>, _: &Tick<'_>) -> anyhow::Result<()> {
        self.flush()
    }
}

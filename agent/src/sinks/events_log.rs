//! `--events-log PATH|-`: one JSON object per timeline event and line
//! (`{"ts", "kind", "message", "attributes"}`), appended to PATH or written
//! to stdout; flushed at every pipeline tick and as events come, since
//! events are rare and read by people and scripts as they happen.

use std::io::Write as _;

use anyhow::Result;

use crate::{
    record::Finished,
    stage::events::Event,
    stage::{Sink, Tick},
};

pub struct EventLog {
    out: std::io::BufWriter<Box<dyn std::io::Write + Send>>,
    pub events: u64,
}

impl EventLog {
    /// `-` writes to stdout; a path is appended to.
    pub fn create(path: &std::path::Path) -> Result<Self> {
        Ok(Self {
            out: std::io::BufWriter::new(crate::sinks::append_or_stdout(path, "events log")?),
            events: 0,
        })
    }
}

impl Sink for EventLog {
    fn record(&mut self, _: &Finished) -> Result<()> {
        Ok(())
    }

    fn event(&mut self, e: &Event) -> Result<()> {
        serde_json::to_writer(&mut self.out, e)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        self.events += 1;
        Ok(())
    }

    fn tick(&mut self, _: &Tick<'_>) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }

    fn shutdown(mut self: Box<Self>, _: &Tick<'_>) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

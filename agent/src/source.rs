//! One typed stream of socket events, live or replayed: the boundary
//! between capture and everything downstream (decode, requests, …).

use std::{fs::File, io::BufReader, path::Path};

use anyhow::{Context, Result};

use crate::{
    capfile::{BadLine, Reader},
    capture::{Capture, CaptureStats},
    event::SocketEvent,
};

pub enum EventSource {
    Live(Box<Capture>),
    Replay(Reader<BufReader<File>>),
}

impl EventSource {
    pub fn replay(path: &Path) -> Result<Self> {
        let f = File::open(path)
            .with_context(|| format!("cannot open capture file {}", path.display()))?;
        Ok(Self::Replay(Reader::new(BufReader::with_capacity(
            1 << 16,
            f,
        ))))
    }

    /// Appends the next events to `out`. Returns false when a replay has
    /// reached the end of its file (a live source never ends by itself).
    pub async fn next_batch(&mut self, out: &mut Vec<SocketEvent>) -> Result<bool> {
        match self {
            Self::Live(c) => {
                c.next_events(out).await?;
                Ok(true)
            }
            Self::Replay(r) => r.next_batch(4096, out),
        }
    }

    /// Last events at shutdown (live: drain the ring buffer and deliver
    /// partial calls).
    pub fn finish(&mut self, out: &mut Vec<SocketEvent>) {
        if let Self::Live(c) = self {
            c.finish(out);
        }
    }

    /// The live capture, to add targets to.
    pub fn live_mut(&mut self) -> Option<&mut Capture> {
        match self {
            Self::Live(c) => Some(c),
            Self::Replay(_) => None,
        }
    }

    pub fn capture_stats(&self) -> Option<CaptureStats> {
        match self {
            Self::Live(c) => Some(c.stats()),
            Self::Replay(_) => None,
        }
    }

    pub fn bad_lines(&self) -> &[BadLine] {
        match self {
            Self::Live(_) => &[],
            Self::Replay(r) => &r.bad,
        }
    }
}

//! What the kernel programs report about their rare conditions (a full
//! map, a user-memory read fault, a record that did not fit: `rare` in
//! `agent-ebpf/src/ctx.rs`, through aya-log's ring buffer) into the
//! agent's log (`tokentap::kernel`, warn level) and the capture counters.
//!
//! The kernel already limits each condition to one report a second; here
//! each distinct text is said once a minute at most, with how many times
//! it came since it was last said, and at most [`MAX_TEXTS`] distinct texts
//! are kept a minute (the rest are counted only).
//!
//! Owns: the per-text limit. Must not: block (the capture loop flushes it),
//! or drop a report from the count.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// How long one text stays said before it is said again.
const WINDOW: Duration = Duration::from_secs(60);

/// Distinct texts kept per window (pids vary; the texts are few).
pub const MAX_TEXTS: usize = 64;

/// The log target the kernel's reports are written under.
pub const TARGET: &str = "tokentap::kernel";

/// A `log::Log` for aya-log's reader: counts every report, writes each
/// text at most once per [`WINDOW`].
pub struct KernelLog {
    reports: Arc<AtomicU64>,
    seen: Mutex<Seen>,
    /// Where the lines go (the agent's logger; a test's collector).
    out: Box<dyn Fn(&str) + Send + Sync>,
}

struct Seen {
    since: Instant,
    /// Text → reports of it since it was last written.
    texts: HashMap<String, u64>,
}

impl KernelLog {
    /// Writes to the agent's log at warn level.
    pub fn new(reports: Arc<AtomicU64>) -> Self {
        Self::with_output(
            reports,
            Box::new(|line| log::warn!(target: TARGET, "{line}")),
        )
    }

    pub fn with_output(reports: Arc<AtomicU64>, out: Box<dyn Fn(&str) + Send + Sync>) -> Self {
        Self {
            reports,
            seen: Mutex::new(Seen {
                since: Instant::now(),
                texts: HashMap::new(),
            }),
            out,
        }
    }

    fn report(&self, text: String, now: Instant) {
        self.reports.fetch_add(1, Ordering::Relaxed);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if now.duration_since(seen.since) >= WINDOW {
            for (t, n) in seen.texts.drain() {
                if n > 0 {
                    (self.out)(&format!("kernel: {t} ({n} more times in the last minute)"));
                }
            }
            seen.since = now;
        }
        let full = seen.texts.len() >= MAX_TEXTS;
        match seen.texts.get_mut(&text) {
            Some(n) => *n += 1,
            None if full => {}
            None => {
                (self.out)(&format!("kernel: {text}"));
                seen.texts.insert(text, 0);
            }
        }
    }
}

impl log::Log for KernelLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        self.report(record.args().to_string(), Instant::now());
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector() -> (KernelLog, Arc<Mutex<Vec<String>>>, Arc<AtomicU64>) {
        let lines = Arc::new(Mutex::new(vec![]));
        let l2 = lines.clone();
        let reports = Arc::new(AtomicU64::new(0));
        let k = KernelLog::with_output(
            reports.clone(),
            Box::new(move |s| l2.lock().unwrap().push(s.to_string())),
        );
        (k, lines, reports)
    }

    #[test]
    fn a_repeated_report_is_said_once_a_minute_with_its_count() {
        let (k, lines, reports) = collector();
        let t0 = Instant::now();
        for i in 0..5 {
            k.report(
                "the CONNS map is full (pid 7)".into(),
                t0 + Duration::from_secs(i),
            );
        }
        k.report("user memory could not be read (pid 7)".into(), t0);
        assert_eq!(
            *lines.lock().unwrap(),
            [
                "kernel: the CONNS map is full (pid 7)",
                "kernel: user memory could not be read (pid 7)"
            ]
        );
        assert_eq!(reports.load(Ordering::Relaxed), 6);
        // A minute on: the count of the repeats, then the text again.
        k.report("the CONNS map is full (pid 7)".into(), t0 + WINDOW);
        let l = lines.lock().unwrap().clone();
        assert_eq!(l.len(), 4, "{l:?}");
        assert_eq!(
            l[2],
            "kernel: the CONNS map is full (pid 7) (4 more times in the last minute)"
        );
        assert_eq!(l[3], "kernel: the CONNS map is full (pid 7)");
    }

    #[test]
    fn distinct_texts_are_bounded_and_every_report_counted() {
        let (k, lines, reports) = collector();
        let t0 = Instant::now();
        for pid in 0..(MAX_TEXTS + 10) {
            k.report(format!("x (pid {pid})"), t0);
        }
        assert_eq!(lines.lock().unwrap().len(), MAX_TEXTS);
        assert_eq!(reports.load(Ordering::Relaxed), (MAX_TEXTS + 10) as u64);
    }
}

//! The live console view: per (engine, model), over a sliding window,
//! requests per minute, in-flight streams, TTFT and TPOT percentiles
//! (exact, from HDR histograms rebuilt over the window), token rates and
//! the error rate. A redrawn table on a terminal, plain lines otherwise.
//!
//! Owns: the window of recent records (bounded by the window length).
//! Must not: show prompt or completion text (records carry none).

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use hdrhistogram::Histogram;

use crate::{
    record::{Finished, RequestRecord},
    stage::{Sink, Tick},
};

/// How the console view is shown.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsolePlan {
    /// A redrawn table (stdout is a terminal) or plain `key=value` lines.
    pub table: bool,
    /// Lines go to stderr (the request log took stdout).
    pub to_stderr: bool,
    pub every: Duration,
    pub window_s: u64,
}

/// What one finished request contributes to the view.
#[derive(Clone, Debug)]
struct Sample {
    end_ns: u64,
    ttft_us: Option<u64>,
    tpot_us: Option<u64>,
    input_tokens: u64,
    output_tokens: u64,
    error: bool,
}

/// One table row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub engine: String,
    pub model: String,
    pub rpm: f64,
    pub ttft_ms: [Option<f64>; 3],
    pub tpot_ms: [Option<f64>; 3],
    pub input_tps: f64,
    pub output_tps: f64,
    pub error_rate: f64,
}

pub struct Console {
    window_ns: u64,
    by_key: BTreeMap<(String, String), VecDeque<Sample>>,
}

fn pct(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0)
}

impl Console {
    pub fn new(window_s: u64) -> Self {
        Self {
            window_ns: window_s.max(1) * 1_000_000_000,
            by_key: BTreeMap::new(),
        }
    }

    pub fn record(&mut self, r: &RequestRecord) {
        let key = (
            r.provider.clone().unwrap_or_else(|| "-".into()),
            r.response_model
                .clone()
                .or_else(|| r.request_model.clone())
                .unwrap_or_else(|| "-".into()),
        );
        let end_ns = r.t0_ns + (r.duration_s.unwrap_or(0.0) * 1e9) as u64;
        self.by_key.entry(key).or_default().push_back(Sample {
            end_ns,
            ttft_us: r.ttft_s.map(|s| (s * 1e6) as u64),
            tpot_us: r.tpot_s.map(|s| (s * 1e6) as u64),
            input_tokens: r.input_tokens.unwrap_or(0),
            output_tokens: r.output_tokens.unwrap_or(0),
            error: r.error_type.is_some(),
        });
    }

    /// Rows for the window ending at `now_ns` (older samples are dropped).
    pub fn rows(&mut self, now_ns: u64) -> Vec<Row> {
        let horizon = now_ns.saturating_sub(self.window_ns);
        let window_s = self.window_ns as f64 / 1e9;
        let mut rows = vec![];
        self.by_key.retain(|_, q| {
            while q.front().is_some_and(|s| s.end_ns < horizon) {
                q.pop_front();
            }
            !q.is_empty()
        });
        for ((engine, model), q) in &self.by_key {
            let mut ttft = Histogram::<u64>::new(3).expect("3 significant digits is valid");
            let mut tpot = Histogram::<u64>::new(3).expect("3 significant digits is valid");
            let (mut inp, mut out, mut errs) = (0u64, 0u64, 0usize);
            for s in q {
                if let Some(v) = s.ttft_us {
                    let _ = ttft.record(v.max(1));
                }
                if let Some(v) = s.tpot_us {
                    let _ = tpot.record(v.max(1));
                }
                inp += s.input_tokens;
                out += s.output_tokens;
                errs += s.error as usize;
            }
            let qs = [0.5, 0.95, 0.99];
            rows.push(Row {
                engine: engine.clone(),
                model: model.clone(),
                rpm: q.len() as f64 * 60.0 / window_s,
                ttft_ms: qs.map(|p| pct(&ttft, p)),
                tpot_ms: qs.map(|p| pct(&tpot, p)),
                input_tps: inp as f64 / window_s,
                output_tps: out as f64 / window_s,
                error_rate: errs as f64 / q.len() as f64,
            });
        }
        rows
    }

    /// The table as text. `in_flight` is the agent-wide number of requests
    /// waiting for or receiving a response.
    pub fn render(rows: &[Row], in_flight: usize, health: &str) -> String {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
        let mut s = format!(
            "{:<10} {:<28} {:>7} {:>22} {:>22} {:>9} {:>9} {:>6}\n",
            "ENGINE",
            "MODEL",
            "RPM",
            "TTFT ms p50/p95/p99",
            "TPOT ms p50/p95/p99",
            "IN tok/s",
            "OUT tok/s",
            "ERR%"
        );
        for r in rows {
            let model: String = r.model.chars().take(28).collect();
            s += &format!(
                "{:<10} {:<28} {:>7.1} {:>22} {:>22} {:>9.1} {:>9.1} {:>6.1}\n",
                r.engine,
                model,
                r.rpm,
                format!(
                    "{}/{}/{}",
                    f(r.ttft_ms[0]),
                    f(r.ttft_ms[1]),
                    f(r.ttft_ms[2])
                ),
                format!(
                    "{}/{}/{}",
                    f(r.tpot_ms[0]),
                    f(r.tpot_ms[1]),
                    f(r.tpot_ms[2])
                ),
                r.input_tps,
                r.output_tps,
                r.error_rate * 100.0
            );
        }
        if rows.is_empty() {
            s += "(no finished requests in the window yet)\n";
        }
        s += &format!("in flight: {in_flight}   {health}\n");
        s
    }

    /// One plain line per row (for logs, when stdout is not a terminal).
    pub fn lines(rows: &[Row], in_flight: usize) -> Vec<String> {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
        rows.iter()
            .map(|r| {
                format!(
                    "engine={} model={} rpm={:.1} in_flight={in_flight} ttft_ms_p50={} ttft_ms_p95={} ttft_ms_p99={} tpot_ms_p50={} tpot_ms_p95={} tpot_ms_p99={} in_tok_s={:.1} out_tok_s={:.1} error_rate={:.3}",
                    r.engine,
                    r.model,
                    r.rpm,
                    f(r.ttft_ms[0]),
                    f(r.ttft_ms[1]),
                    f(r.ttft_ms[2]),
                    f(r.tpot_ms[0]),
                    f(r.tpot_ms[1]),
                    f(r.tpot_ms[2]),
                    r.input_tps,
                    r.output_tps,
                    r.error_rate
                )
            })
            .collect()
    }
}

/// The console as a pipeline sink: a redrawn table on a terminal, plain
/// lines (stdout, or stderr when the request log has stdout) otherwise, at
/// the plan's interval.
pub struct ConsoleSink {
    view: Console,
    plan: ConsolePlan,
    next_draw_ns: u64,
    /// The latest timeline events (table mode shows them under the table).
    events: VecDeque<String>,
}

/// Timeline events the table shows.
const EVENTS_SHOWN: usize = 6;

/// One event as a console line: time, kind, message.
pub fn event_line(e: &crate::stage::events::Event) -> String {
    let time = e.ts.get(11..19).unwrap_or(&e.ts);
    format!("{time}  {:<22} {}", e.kind, e.message)
}

impl ConsoleSink {
    pub fn new(plan: ConsolePlan) -> Self {
        Self {
            view: Console::new(plan.window_s),
            plan,
            next_draw_ns: 0,
            events: VecDeque::new(),
        }
    }

    fn draw(&mut self, t: &Tick<'_>) {
        let rows = self.view.rows(t.now_ns);
        let in_flight = t.health.in_flight.max(0) as usize;
        if self.plan.table {
            let mut events = String::new();
            if !self.events.is_empty() {
                events.push_str("\nevents (latest last):\n");
                for l in &self.events {
                    events.push_str("  ");
                    events.push_str(l);
                    events.push('\n');
                }
            }
            print!(
                "\x1b[2J\x1b[H{}{events}",
                Console::render(&rows, in_flight, &t.health.line())
            );
            let _ = std::io::Write::flush(&mut std::io::stdout());
        } else {
            for line in Console::lines(&rows, in_flight) {
                if self.plan.to_stderr {
                    eprintln!("{line}")
                } else {
                    println!("{line}")
                }
            }
        }
    }
}

impl Sink for ConsoleSink {
    fn record(&mut self, f: &Finished) -> anyhow::Result<()> {
        self.view.record(&f.record);
        Ok(())
    }

    fn event(&mut self, e: &crate::stage::events::Event) -> anyhow::Result<()> {
        let line = event_line(e);
        if self.plan.table {
            if self.events.len() == EVENTS_SHOWN {
                self.events.pop_front();
            }
            self.events.push_back(line);
        } else if self.plan.to_stderr {
            eprintln!("event {line}");
        } else {
            println!("event {line}");
        }
        Ok(())
    }

    fn tick(&mut self, t: &Tick<'_>) -> anyhow::Result<()> {
        if t.now_ns >= self.next_draw_ns {
            // Interval from the plan; the pipeline ticks every second.
            self.next_draw_ns = t.now_ns + self.plan.every.as_nanos() as u64 - 50_000_000;
            self.draw(t);
        }
        Ok(())
    }

    fn shutdown(self: Box<Self>, _: &Tick<'_>) -> anyhow::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t0_s: u64, ttft: f64, err: bool) -> RequestRecord {
        RequestRecord {
            pid: 1,
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            status: Some(200),
            operation: Some(crate::vocab::Operation::Chat),
            provider: Some("vllm".into()),
            request_model: Some("m".into()),
            stream: true,
            ttft_s: Some(ttft),
            tpot_s: Some(0.01),
            duration_s: Some(1.0),
            chunks: Some(10),
            input_tokens: Some(100),
            output_tokens: Some(10),
            tokens_exact: true,
            error_type: err.then_some(crate::vocab::ErrorType::Http5xx),
            t0_ns: t0_s * 1_000_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn percentiles_rates_and_window_expiry() {
        let mut c = Console::new(60);
        for i in 0..100 {
            c.record(&rec(1000 + i % 50, 0.001 * (i + 1) as f64, i % 10 == 0));
        }
        let rows = c.rows(1060 * 1_000_000_000);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.engine.as_str(), r.model.as_str()), ("vllm", "m"));
        assert!((r.rpm - 100.0).abs() < 1e-9);
        assert!(
            (r.ttft_ms[0].unwrap() - 50.0).abs() < 0.1,
            "{:?}",
            r.ttft_ms
        );
        assert!(
            (r.ttft_ms[2].unwrap() - 99.0).abs() < 0.1,
            "{:?}",
            r.ttft_ms
        );
        assert!((r.error_rate - 0.1).abs() < 1e-9);
        assert!((r.output_tps - 1000.0 / 60.0).abs() < 1e-9);
        assert!(
            c.rows(1200 * 1_000_000_000).is_empty(),
            "old samples leave the window"
        );
    }
}

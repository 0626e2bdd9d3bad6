//! The tokenizer's own thread: jobs in, counts out, never on the
//! pipeline's thread, within a CPU budget (`--tokenize-cpu`, a share of
//! one core). The budget is a bucket of CPU time refilled at that share
//! of the wall clock, holding at most [`BURST_S`] seconds of it; a job
//! that finds it empty is not run (the request keeps its estimate) and is
//! counted. The queue is bounded in jobs and in the bytes they hold; a
//! job that does not fit is refused at once, counted too.
//!
//! Owns: the thread, the queue bounds and the budget. Must not: block
//! the caller, or keep a job's text after the job.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
        mpsc, Arc,
    },
    time::Instant,
};

use super::{Failure, Tokenizer};
use crate::engines::Engine;
use crate::vocab::Operation;

/// Jobs waiting at most.
pub const MAX_QUEUED: usize = 1024;
/// Bytes of text the waiting jobs hold at most.
pub const MAX_QUEUED_BYTES: usize = 32 << 20;
/// The budget's bucket holds this many seconds of its rate.
pub const BURST_S: f64 = 2.0;

/// One request to count.
pub struct Job {
    pub id: u64,
    pub tokenizer: Arc<Tokenizer>,
    pub engine: Option<Engine>,
    pub op: Operation,
    /// The request body (for its input, or a tool-calling answer's
    /// markup).
    pub body: Option<Vec<u8>>,
    /// Count the input.
    pub count_input: bool,
    /// The answer's tool calls (name, arguments): the output is counted
    /// through the chat template (`Tokenizer::tool_call_output_tokens`).
    pub calls: Option<Vec<(String, String)>>,
    /// The generated text per choice, when the output is to be counted
    /// (the count is their sum).
    pub output: Option<Vec<String>>,
    pub finish_reason: Option<String>,
}

impl Job {
    fn bytes(&self) -> usize {
        self.body.as_ref().map_or(0, Vec::len)
            + self.output.iter().flatten().map(String::len).sum::<usize>()
            + self
                .calls
                .iter()
                .flatten()
                .map(|(n, a)| n.len() + a.len())
                .sum::<usize>()
    }
}

/// What a job gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub id: u64,
    /// None: not asked.
    pub input: Option<Result<u64, Failure>>,
    pub output: Option<Result<u64, Failure>>,
    /// Not run: the CPU budget was spent.
    pub over_budget: bool,
    /// CPU time the job took (ns).
    pub cpu_ns: u64,
}

/// What the worker did since the start.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub jobs: AtomicU64,
    pub over_budget: AtomicU64,
    pub queue_full: AtomicU64,
    pub cpu_ns: AtomicU64,
    /// Tokens counted, input and output together.
    pub tokens: AtomicU64,
}

/// The handle the pipeline holds.
pub struct Worker {
    tx: mpsc::SyncSender<Job>,
    rx: mpsc::Receiver<Done>,
    queued_bytes: Arc<AtomicUsize>,
    pub stats: Arc<WorkerStats>,
}

impl Worker {
    /// Starts the thread; `cpu_share`: the budget, in cores (0.25 = a
    /// quarter of one core).
    pub fn start(cpu_share: f64) -> std::io::Result<Self> {
        let (tx, jobs) = mpsc::sync_channel::<Job>(MAX_QUEUED);
        let (done_tx, rx) = mpsc::channel();
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(WorkerStats::default());
        let (qb, st) = (queued_bytes.clone(), stats.clone());
        std::thread::Builder::new()
            .name("tokentap-tokenize".into())
            .spawn(move || {
                let rate = cpu_share.max(0.0) * 1e9;
                let cap = rate * BURST_S;
                let mut bucket = cap;
                let mut last = Instant::now();
                for job in jobs {
                    qb.fetch_sub(job.bytes(), Relaxed);
                    let now = Instant::now();
                    bucket = (bucket + now.duration_since(last).as_secs_f64() * rate).min(cap);
                    last = now;
                    let done = if bucket <= 0.0 {
                        st.over_budget.fetch_add(1, Relaxed);
                        Done {
                            id: job.id,
                            input: None,
                            output: None,
                            over_budget: true,
                            cpu_ns: 0,
                        }
                    } else {
                        let done = run(&job);
                        bucket -= done.cpu_ns as f64;
                        st.jobs.fetch_add(1, Relaxed);
                        st.cpu_ns.fetch_add(done.cpu_ns, Relaxed);
                        let n = [&done.input, &done.output]
                            .into_iter()
                            .flatten()
                            .filter_map(|r| r.as_ref().ok())
                            .sum::<u64>();
                        st.tokens.fetch_add(n, Relaxed);
                        done
                    };
                    drop(job);
                    if done_tx.send(done).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            tx,
            rx,
            queued_bytes,
            stats,
        })
    }

    /// Queues `job`; gives it back when the queue is full (in jobs or
    /// bytes) or the thread is gone.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        let n = job.bytes();
        if self.queued_bytes.load(Relaxed) + n > MAX_QUEUED_BYTES {
            self.stats.queue_full.fetch_add(1, Relaxed);
            return Err(job);
        }
        self.queued_bytes.fetch_add(n, Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(j) | mpsc::TrySendError::Disconnected(j)) => {
                self.queued_bytes.fetch_sub(n, Relaxed);
                self.stats.queue_full.fetch_add(1, Relaxed);
                Err(j)
            }
        }
    }

    /// Results ready now.
    pub fn try_recv(&self) -> Option<Done> {
        self.rx.try_recv().ok()
    }

    /// The next result, waiting at most `d`.
    pub fn recv_timeout(&self, d: std::time::Duration) -> Option<Done> {
        self.rx.recv_timeout(d).ok()
    }
}

/// Counts one job (on the worker's thread; also the benchmark's and the
/// tests' way in).
pub fn run(job: &Job) -> Done {
    let start = crate::host::thread_cpu_ns();
    let t = &job.tokenizer;
    let input = job
        .body
        .as_ref()
        .filter(|_| job.count_input)
        .map(|b| t.input_tokens(job.engine, job.op, b));
    let output = match (&job.calls, &job.body) {
        (Some(calls), Some(body)) => {
            let content = job.output.as_ref().and_then(|o| o.first());
            Some(t.tool_call_output_tokens(body, content.map_or("", String::as_str), calls))
        }
        (Some(_), None) => Some(Err(Failure::Body)),
        _ => job.output.as_ref().map(|choices| {
            choices.iter().try_fold(0u64, |n, o| {
                Ok(n + t.output_tokens(job.engine, o, job.finish_reason.as_deref())?)
            })
        }),
    };
    Done {
        id: job.id,
        input,
        output,
        over_budget: false,
        cpu_ns: crate::host::thread_cpu_ns().saturating_sub(start),
    }
}

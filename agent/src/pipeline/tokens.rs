//! The tokenizer stage: a finished request whose response carried no
//! token counts (`tokens_source` estimate) — and a sample of those that
//! did, to check — is counted with the tokenizer its engine loaded
//! (`identity::tokenizer`, held in `ProcessInfo::tokenizer`), on the
//! tokenizer's own thread (`tokenize::worker`, within `--tokenize-cpu`).
//! The record waits here until its counts come back, at most [`WAIT`];
//! then it goes on (to the GPU join, then the sinks) with
//! `tokens_source` `tokenizer`, or with its estimate and the reason
//! counted. The request's kept text never leaves this stage.
//!
//! Owns: which requests are counted or checked, the waiting records, the
//! `tokentap.tokens.*` counts. Must not: tokenize on the pipeline's thread,
//! or hold a record longer than [`WAIT`].

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    record::{Finished, KeptText},
    stage::{health::Health, NodeState},
    tokenize::{
        worker::{Done, Job, Worker},
        Failure,
    },
    vocab::{Operation, TokenSource, TokenSources},
};

/// A record waits for its counts at most this long (a queue behind a
/// 100k-token prompt, a starved thread): then it goes on with its
/// estimate (`timeout`).
pub const WAIT: Duration = Duration::from_secs(5);

/// What a job was asked for one record.
struct Waiting {
    f: Finished,
    since: Instant,
    /// The input's / output's count is to be set (else checked, if asked).
    set_input: bool,
    set_output: bool,
}

pub struct TokensStage {
    worker: Worker,
    health: Arc<Health>,
    check_ratio: f64,
    /// The checks' running share (a check each time it passes 1).
    check_acc: f64,
    waiting: HashMap<u64, Waiting>,
    order: VecDeque<u64>,
    next_id: u64,
    /// Engines whose first disagreement was said.
    said: HashSet<(String, &'static str)>,
    /// The text-keeping set last handed to the decoder.
    text_pids: HashSet<u32>,
}

impl TokensStage {
    /// `cpu`: the budget in cores (above 0); `check_ratio`: the share of
    /// requests with engine counts checked.
    pub fn start(cpu: f64, check_ratio: f64, health: Arc<Health>) -> std::io::Result<Self> {
        Ok(Self {
            worker: Worker::start(cpu)?,
            health,
            check_ratio,
            check_acc: 0.0,
            waiting: HashMap::new(),
            order: VecDeque::new(),
            next_id: 0,
            said: HashSet::new(),
            text_pids: HashSet::new(),
        })
    }

    /// The processes whose requests' text the decoder should keep (those
    /// with a tokenizer), when that set changed since the last call.
    pub fn text_pids(&mut self, node: &NodeState) -> Option<HashSet<u32>> {
        let now: HashSet<u32> = node
            .processes
            .iter()
            .filter(|(_, p)| p.tokenizer.is_some())
            .map(|(pid, _)| *pid)
            .collect();
        let mut states = std::collections::BTreeMap::new();
        for p in node.processes.values() {
            if let Some(s) = p.tokenizer_state {
                *states.entry(s.as_str()).or_default() += 1;
            }
        }
        self.counts(|c| c.tokenizer = states);
        (now != self.text_pids).then(|| {
            self.text_pids = now.clone();
            now
        })
    }

    fn counts(&self, f: impl FnOnce(&mut crate::stage::health::TokenCounts)) {
        f(&mut self.health.tokens.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn failed(&self, reason: &'static str) {
        self.counts(|c| *c.failed.entry(reason).or_default() += 1);
    }

    /// A finished LLM request: handed back at once (nothing to count), or
    /// kept until its counts come ([`TokensStage::poll`]).
    pub fn on_finished(&mut self, mut f: Finished, node: &NodeState) -> Option<Finished> {
        let Some(text) = f.text.take() else {
            return Some(f);
        };
        let Some(op) = f.record.operation else {
            return Some(f);
        };
        let r = &f.record;
        let estimated = |s: Option<TokenSource>| s.is_none_or(|s| s == TokenSource::Estimate);
        let src = r.tokens_source.unwrap_or(TokenSources {
            input: None,
            output: None,
        });
        let set_input = estimated(src.input) && op != Operation::Responses;
        let engine = r
            .provider
            .as_deref()
            .and_then(crate::engines::Engine::from_name);
        let set_output = estimated(src.output)
            && !matches!(op, Operation::Embeddings | Operation::Responses)
            && r.error_type.is_none()
            && !one_token_per_event(engine);
        let check = !set_input && !set_output && {
            self.check_acc += self.check_ratio;
            let due = self.check_acc >= 1.0;
            if due {
                self.check_acc -= 1.0;
            }
            due
        };
        if !(set_input || set_output || check) {
            return Some(f);
        }
        let Some(tok) = node.process(r.pid).and_then(|p| p.tokenizer.as_ref()) else {
            return Some(f);
        };
        let want_input = set_input || (check && r.input_tokens.is_some());
        let want_output =
            set_output || (check && r.output_tokens.is_some() && op != Operation::Embeddings);
        let KeptText {
            body,
            outputs,
            output_lost,
            tool_calls,
            calls,
            content_span_s,
            types_by_input,
        } = *text;
        // A tool-calling answer is counted through the chat template,
        // which needs the request body.
        let calls =
            (want_output && tool_calls && !output_lost && !calls.is_empty()).then_some(calls);
        let output =
            (want_output && !output_lost && (!tool_calls || calls.is_some())).then_some(outputs);
        let body = (want_input || calls.is_some()).then_some(body).flatten();
        let want_body = want_input && body.is_some();
        let want_out = output.is_some() && (calls.is_none() || body.is_some());
        if want_input && !want_body {
            self.failed("text_lost");
        }
        if want_output && !want_out {
            self.failed("text_lost");
        }
        if !want_body && !want_out {
            return Some(f);
        }
        self.next_id += 1;
        let id = self.next_id;
        let job = Job {
            id,
            tokenizer: tok.0.clone(),
            engine,
            op,
            body,
            count_input: want_body,
            calls: calls.filter(|_| want_out),
            output: output.filter(|_| want_out),
            finish_reason: r.finish_reason.clone(),
        };
        // The waiting record keeps only what TPOT needs; the job has the
        // text (counted against the queue's bytes).
        f.text = Some(Box::new(KeptText {
            content_span_s,
            types_by_input,
            ..Default::default()
        }));
        match self.worker.submit(job) {
            Ok(()) => {
                self.waiting.insert(
                    id,
                    Waiting {
                        f,
                        since: Instant::now(),
                        set_input: set_input && want_body,
                        set_output: set_output && want_out,
                    },
                );
                self.order.push_back(id);
                None
            }
            Err(_) => {
                self.failed("queue_full");
                f.text = None;
                Some(f)
            }
        }
    }

    /// Records whose counts came, and those that waited past [`WAIT`].
    pub fn poll(&mut self, out: &mut Vec<Finished>) {
        while let Some(done) = self.worker.try_recv() {
            self.apply(done, out);
        }
        let now = Instant::now();
        while let Some(id) = self.order.front().copied() {
            match self.waiting.get(&id) {
                None => {
                    self.order.pop_front();
                }
                Some(w) if now.duration_since(w.since) > WAIT => {
                    self.order.pop_front();
                    let mut w = self.waiting.remove(&id).expect("present");
                    self.failed("timeout");
                    w.f.text = None;
                    out.push(w.f);
                }
                Some(_) => break,
            }
        }
        let st = &self.worker.stats;
        let cpu = st.cpu_ns.load(std::sync::atomic::Ordering::Relaxed);
        self.counts(|c| c.cpu_ns = cpu);
    }

    /// Waits (at most [`WAIT`]) for every record still counting.
    pub fn flush(&mut self, out: &mut Vec<Finished>) {
        let until = Instant::now() + WAIT;
        while !self.waiting.is_empty() {
            let left = until.saturating_duration_since(Instant::now());
            match self.worker.recv_timeout(left) {
                Some(done) => self.apply(done, out),
                None => break,
            }
        }
        let left: Vec<Waiting> = self.waiting.drain().map(|(_, w)| w).collect();
        for mut w in left {
            self.failed("timeout");
            w.f.text = None;
            out.push(w.f);
        }
        self.order.clear();
        let c = self.health.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if !c.tokenized.is_empty() || !c.agreement.is_empty() || !c.failed.is_empty() {
            eprintln!("tokentap: {}", summary(&c));
        }
    }

    fn apply(&mut self, done: Done, out: &mut Vec<Finished>) {
        let Some(mut w) = self.waiting.remove(&done.id) else {
            return;
        };
        let text = w.f.text.take();
        let r = &mut w.f.record;
        if done.over_budget {
            if w.set_input {
                self.failed("budget");
            }
            if w.set_output {
                self.failed("budget");
            }
            out.push(w.f);
            return;
        }
        let engine = r
            .provider
            .clone()
            .unwrap_or_else(|| crate::vocab::UNKNOWN.to_string());
        let mut input = None;
        let mut output = None;
        for (dir, got, set, theirs) in [
            ("input", done.input, w.set_input, r.input_tokens),
            ("output", done.output, w.set_output, r.output_tokens),
        ] {
            let Some(got) = got else { continue };
            match got {
                Ok(n) if set => {
                    self.counts(|c| *c.tokenized.entry(dir).or_default() += 1);
                    if dir == "input" {
                        input = Some(n);
                    } else {
                        output = Some(n);
                    }
                }
                Ok(n) => {
                    let theirs = theirs.unwrap_or(0);
                    let result = if n == theirs { "agree" } else { "disagree" };
                    self.counts(|c| {
                        *c.agreement
                            .entry((engine.clone(), dir, result))
                            .or_default() += 1
                    });
                    if result == "disagree" && self.said.insert((engine.clone(), dir)) {
                        eprintln!(
                            "tokentap: pid {} ({engine}): its tokenizer counts {n} {dir} tokens where the engine says {theirs} (first disagreement; tokentap.tokens.agreement counts them)",
                            r.pid
                        );
                    }
                }
                Err(e) => self.failed(failure_name(e)),
            }
        }
        let text = text.map(|t| *t).unwrap_or_default();
        // A configured rule on input tokens decides again with the count.
        if let (Some(n), Some(types)) = (input, &text.types_by_input) {
            r.request_type = types.pick(n);
        }
        set_counts(r, input, output, text.content_span_s);
        out.push(w.f);
    }
}

/// Engines that stream one generated token per event (llama.cpp's
/// `llama-server` and llama-cpp-python): their event count is their
/// output count, truer than the text encoded again — a model need not
/// generate the canonical tokenization of its text (a small or
/// random-weight one often does not: the fidelity test's TPOT moved by up
/// to 0.8 ms when these outputs were re-encoded). Their input is counted.
fn one_token_per_event(engine: Option<crate::engines::Engine>) -> bool {
    matches!(engine, Some(crate::engines::Engine::LlamaCpp))
}

fn failure_name(f: Failure) -> &'static str {
    f.as_str()
}

/// Sets the tokenizer's counts on a record: sources, exactness, TPOT.
pub fn set_counts(
    r: &mut crate::record::RequestRecord,
    input: Option<u64>,
    output: Option<u64>,
    content_span_s: Option<f64>,
) {
    if input.is_none() && output.is_none() {
        return;
    }
    let mut src = r.tokens_source.unwrap_or(TokenSources {
        input: None,
        output: None,
    });
    if let Some(n) = input {
        r.input_tokens = Some(n);
        src.input = Some(TokenSource::Tokenizer);
    }
    if let Some(n) = output {
        r.output_tokens = Some(n);
        src.output = Some(TokenSource::Tokenizer);
        if r.stream {
            r.tpot_s = match (content_span_s, n) {
                (Some(span), n) if n > 1 => Some(span / (n - 1) as f64),
                _ => None,
            };
        }
    }
    r.tokens_source = TokenSources::of(src.input, src.output);
    let exact = |s: Option<TokenSource>| s.is_some_and(|s| s != TokenSource::Estimate);
    r.tokens_exact =
        exact(src.input) && (exact(src.output) || r.operation == Some(Operation::Embeddings));
}

/// The tokenizer's run in one line (said at shutdown): counts set, the
/// sampled checks by engine and direction, the fallbacks by reason.
fn summary(c: &crate::stage::health::TokenCounts) -> String {
    let join = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let tokenized = join(
        c.tokenized
            .iter()
            .map(|(d, n)| format!("{d} {n}"))
            .collect(),
    );
    let checks = join(
        c.agreement
            .iter()
            .map(|((e, d, r), n)| format!("{e} {d} {r} {n}"))
            .collect(),
    );
    let failed = join(c.failed.iter().map(|(r, n)| format!("{r} {n}")).collect());
    format!(
        "tokenizer: counted {tokenized}; checked against the engines' counts: {checks}; left estimated: {failed}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RequestRecord;

    #[test]
    fn the_shutdown_line_says_counts_checks_and_fallbacks() {
        let mut c = crate::stage::health::TokenCounts::default();
        c.tokenized.insert("input", 3);
        c.agreement
            .insert(("llama.cpp".into(), "input", "agree"), 4);
        c.agreement
            .insert(("llama.cpp".into(), "output", "disagree"), 1);
        assert_eq!(
            summary(&c),
            "tokenizer: counted input 3; checked against the engines' counts: llama.cpp input agree 4, llama.cpp output disagree 1; left estimated: none"
        );
    }

    /// A record with no kept text (no tokenizer for its engine, or no
    /// operation) goes on at once, whole.
    #[test]
    fn records_without_text_pass_through() {
        let mut st = TokensStage::start(0.25, 1.0, Arc::new(Health::default())).unwrap();
        let node = NodeState::default();
        let f = Finished {
            record: RequestRecord {
                operation: Some(Operation::Chat),
                ..Default::default()
            },
            seq: 1,
            content_events: 0,
            self_request: false,
            chunk_gaps_s: vec![],
            prompt_fp: None,
            text: None,
        };
        assert_eq!(st.on_finished(f.clone(), &node), Some(f.clone()));
        let no_op = Finished {
            record: RequestRecord::default(),
            text: Some(Box::default()),
            ..f.clone()
        };
        let back = st.on_finished(no_op, &node).expect("passed through");
        assert!(back.text.is_none());
        // Text, but no tokenizer for its process: back at once.
        let with_text = Finished {
            text: Some(Box::default()),
            ..f.clone()
        };
        assert!(st.on_finished(with_text, &node).is_some());
    }

    #[test]
    fn the_tokenizers_counts_replace_the_estimate_and_tpot_follows() {
        let mut r = RequestRecord {
            stream: true,
            operation: Some(Operation::Chat),
            input_tokens: Some(10),
            output_tokens: Some(4),
            tpot_s: Some(0.1),
            tokens_source: TokenSources::of(
                Some(TokenSource::Estimate),
                Some(TokenSource::Estimate),
            ),
            ..Default::default()
        };
        set_counts(&mut r, Some(37), Some(10), Some(0.3));
        assert_eq!((r.input_tokens, r.output_tokens), (Some(37), Some(10)));
        assert!((r.tpot_s.unwrap() - 0.3 / 9.0).abs() < 1e-12);
        assert!(r.tokens_exact);
        assert_eq!(
            serde_json::to_string(&r.tokens_source).unwrap(),
            "\"tokenizer\""
        );
        // Input from usage, output from the tokenizer: per direction.
        let mut r = RequestRecord {
            operation: Some(Operation::Chat),
            input_tokens: Some(5),
            tokens_source: TokenSources::of(Some(TokenSource::Usage), Some(TokenSource::Estimate)),
            ..Default::default()
        };
        set_counts(&mut r, None, Some(3), None);
        assert!(r.tokens_exact);
        assert_eq!(
            serde_json::to_string(&r.tokens_source).unwrap(),
            r#"{"input":"usage","output":"tokenizer"}"#
        );
    }
}

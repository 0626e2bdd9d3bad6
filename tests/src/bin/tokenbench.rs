//! Workload for `cargo xtask bench tokens`: what the engine's tokenizer
//! costs the agent, on one thread, and prints one JSON line.
//!
//! `tokenbench PEERS_DIR SECS`:
//! - `tokens_per_s.<name>`: encoding throughput per core of the real
//!   tokenizer.json files the peers fetched (`tokenizer_vectors.py`):
//!   `claude` (byte-level BPE, 65k), `llama2` (Metaspace BPE with byte
//!   fallback, 32k), on a mixed English/code/multilingual text; and
//!   `gguf-<name>`: llama.cpp's vocabularies from the sdist
//!   (`ggml-vocab-llama-spm`, `-llama-bpe`, `-qwen2`) through the agent's
//!   GGUF tokenizer (what llama-server's requests are counted with);
//! - `cpu_ms_per_1k.<2k|32k>.<cached|uncached>`: CPU per 1,000 streamed
//!   chat requests counted as the agent counts them (`worker::run`: the
//!   body parsed, the chat template rendered, the prompt encoded, the
//!   generated text encoded), with prompts of about 2,000 and 32,000
//!   tokens — a conversation whose history repeats and grows by one turn
//!   a request (what multi-turn traffic sends) — with the prefix cache and
//!   without it; Llama-2's tokenizer in the Llama-2 chat format (system
//!   prompt first, turns closed by the `</s>` special token);
//! - `budget.*`: the worker at `--tokenize-cpu 0.25` fed 10× the 32k
//!   uncached rate it can sustain, for SECS: jobs counted vs refused, and
//!   the CPU its thread used per second of wall time.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokentap::{
    tokenize::{
        gguf::GgufVocab,
        worker::{self, Job, Worker},
        HfFiles, Tokenizer,
    },
    vocab::Operation,
};

const TEXT: &str = "The agent reads what the engine wrote: every streamed chunk, every \
prompt. fn main() { let v: Vec<u32> = (0..1024).map(|i| i * 7).collect(); println!(\"{v:?}\"); } \
Les arcs-en-ciel ont sept couleurs — rouge, orange, jaune, vert, bleu, indigo, violet. \
東京の天気は晴れです。 Числа: 3.14159, 2.71828, 1234567. ";

fn tokenizer(peers: &Path, name: &str, template: Option<&str>) -> Tokenizer {
    let config = json!({"bos_token": "<s>", "eos_token": "</s>"});
    Tokenizer::from_hf(&HfFiles {
        tokenizer_json: std::fs::read(peers.join(format!(".tokenizers/tok/{name}/tokenizer.json")))
            .expect("the peers' tokenizer files (cargo xtask peers)"),
        config: Some(config.to_string().into_bytes()),
        template: template.map(str::to_string),
    })
    .expect("tokenizer builds")
}

/// The GGUF vocabularies measured: SentencePiece (Llama 2), and BPE with
/// the llama3 and qwen2 pre-tokenizers.
pub const GGUF: [&str; 3] = ["llama-spm", "llama-bpe", "qwen2"];

/// Tokens per second of CPU encoding `TEXT` repeated (about 20 kB a call).
fn tokens_per_s(tok: &Tokenizer, secs: f64) -> f64 {
    let text = TEXT.repeat(80);
    let (t0, c0) = (Instant::now(), tokentap::host::thread_cpu_s());
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        n += tok.encode_len(&text, false).unwrap();
    }
    n as f64 / (tokentap::host::thread_cpu_s() - c0)
}

/// The Llama-2 chat format (system prompt first, each turn closed by the
/// `</s>` special token), as a chat template.
const LLAMA2_CHAT: &str = "{% for m in messages %}{% if m.role == 'system' %}{{ bos_token }}[INST] <<SYS>>\n{{ m.content }}\n<</SYS>>\n\n{% elif m.role == 'user' %}{% if not loop.first and messages[loop.index0 - 1].role != 'system' %}{{ bos_token }}[INST] {% endif %}{{ m.content }} [/INST]{% else %} {{ m.content }} {{ eos_token }}{% endif %}{% endfor %}";

/// `requests` chat bodies of one conversation: a system prompt of about
/// `tokens` tokens (`per_text`: tokens of one `TEXT`), then one more short
/// user/assistant turn per request.
fn conversation(tokens: usize, per_text: usize, requests: usize) -> Vec<Vec<u8>> {
    let system = TEXT.repeat((tokens / per_text).max(1));
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut out = Vec::with_capacity(requests);
    for i in 0..requests {
        messages.push(json!({"role": "user", "content": format!("And now, {i}?")}));
        out.push(
            json!({"model": "m", "stream": true, "messages": messages})
                .to_string()
                .into_bytes(),
        );
        messages.push(json!({"role": "assistant", "content": format!("{}.", i * 7)}));
    }
    out
}

fn job(tok: &Arc<Tokenizer>, body: Vec<u8>, id: u64) -> Job {
    Job {
        id,
        tokenizer: tok.clone(),
        engine: Some(tokentap::engines::Engine::Vllm),
        op: Operation::Chat,
        body: Some(body),
        count_input: true,
        calls: None,
        output: Some(vec![TEXT.to_string()]),
        finish_reason: Some("stop".into()),
    }
}

/// CPU ms per 1,000 requests of `bodies`, and the prompt's tokens.
fn per_1k(tok: &Arc<Tokenizer>, bodies: &[Vec<u8>]) -> (f64, u64) {
    let c0 = tokentap::host::thread_cpu_s();
    let mut input = 0;
    for (i, b) in bodies.iter().enumerate() {
        let d = worker::run(&job(tok, b.clone(), i as u64));
        input = d.input.unwrap().unwrap();
    }
    (
        (tokentap::host::thread_cpu_s() - c0) * 1e3 * 1000.0 / bodies.len() as f64,
        input,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let peers = Path::new(args.get(1).expect("tokenbench PEERS_DIR SECS"));
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let template = LLAMA2_CHAT;
    let per_text = tokenizer(peers, "llama2", None)
        .encode_len(TEXT, false)
        .unwrap() as usize;
    let mut out = serde_json::Map::new();
    for name in ["claude", "llama2"] {
        let tok = tokenizer(peers, name, None);
        out.insert(
            format!("tokens_per_s.{name}"),
            json!(tokens_per_s(&tok, secs)),
        );
    }
    // llama.cpp's GGUF vocabularies, as llama-server's tokenizer.
    let models = tokentap_tests::peers::Peers {
        dir: peers.to_path_buf(),
    }
    .sdist()
    .join("vendor/llama.cpp/models");
    for name in GGUF {
        let bytes = std::fs::read(models.join(format!("ggml-vocab-{name}.gguf")))
            .expect("the sdist's vocabularies (cargo xtask peers)");
        let vocab = GgufVocab::from_gguf(&bytes).expect("vocabulary builds");
        let tok = Tokenizer::from_gguf(vocab, None).expect("tokenizer builds");
        out.insert(
            format!("tokens_per_s.gguf-{name}"),
            json!(tokens_per_s(&tok, secs)),
        );
    }
    let mut rate_32k = 0.0;
    for (label, tokens, n) in [("2k", 1800, 40), ("32k", 31500, 40)] {
        let bodies = conversation(tokens, per_text, n);
        for cached in [false, true] {
            let mut tok = tokenizer(peers, "llama2", Some(template));
            tok.set_prefix_cache(cached);
            let tok = Arc::new(tok);
            let (ms, input) = per_1k(&tok, &bodies);
            let st = tok.prefix_stats();
            let key = format!("{label}.{}", if cached { "cached" } else { "uncached" });
            out.insert(format!("cpu_ms_per_1k.{key}"), json!(ms));
            out.insert(format!("prompt_tokens.{key}"), json!(input));
            out.insert(format!("prefix.{key}"), json!(format!("{st:?}")));
            if label == "32k" && !cached {
                rate_32k = 1000.0 / ms * 1000.0 * 0.25;
            }
        }
    }
    // The budget at 10× what a quarter core sustains (32k, uncached).
    let mut tok = tokenizer(peers, "llama2", Some(template));
    tok.set_prefix_cache(false);
    let tok = Arc::new(tok);
    let bodies = conversation(31500, per_text, 40);
    let w = Worker::start(0.25).unwrap();
    let offered = rate_32k * 10.0;
    let (t0, mut sent, mut refused) = (Instant::now(), 0u64, 0u64);
    let (mut counted, mut over) = (0u64, 0u64);
    while t0.elapsed().as_secs_f64() < secs.max(6.0) {
        let due = (t0.elapsed().as_secs_f64() * offered) as u64;
        while sent < due {
            if w.submit(job(
                &tok,
                bodies[sent as usize % bodies.len()].clone(),
                sent,
            ))
            .is_err()
            {
                refused += 1;
            }
            sent += 1;
        }
        while let Some(d) = w.try_recv() {
            if d.over_budget {
                over += 1;
            } else {
                counted += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = w.stats.cpu_ns.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9;
    out.insert("budget.offered_per_s".into(), json!(offered));
    out.insert("budget.sent".into(), json!(sent));
    out.insert("budget.counted".into(), json!(counted));
    out.insert("budget.over_budget".into(), json!(over));
    out.insert("budget.queue_full".into(), json!(refused));
    out.insert("budget.cores".into(), json!(cpu / wall));
    println!("{}", Value::Object(out));
}

//! Token counts of a chat llama-server answers from its prompt cache
//! (issue 36): a multi-turn conversation sends the same history again,
//! llama-server evaluates only what is new and says so in `timings`
//! (`prompt_n` evaluated, `cache_n` from the cache). The record's input is
//! the whole prompt — what the engine's own `usage.prompt_tokens` says —
//! and its cached count is part of it, never more.
//!
//! Root: the agent captures a real llama-server (from the peers).

use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, http, interrupt,
    peers::{Engine, Peers},
    read_jsonl, scratch_dir, RunAgent,
};

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn a_chat_answered_from_the_prompt_cache_counts_its_whole_prompt() {
    const TEST: &str = "promptcache";
    assert_root(TEST);
    let peers = Peers::installed(TEST);
    let dir = scratch_dir(TEST);
    let log = dir.join("requests.jsonl");
    let port = free_port();
    let (engine, _engine_out) = peers.start_engine(Engine::Native, port, 1);
    let (mut agent, agent_out) = RunAgent::new()
        .pid(engine.0.id())
        .no_gpu()
        .requests_log(&log)
        .start();

    let messages = json!([
        {"role": "system", "content": "You are a terse assistant who answers in very few words."},
        {"role": "user", "content": "Name three colours of the rainbow, please."},
        {"role": "assistant", "content": "Red, green, blue."},
        {"role": "user", "content": "And two more?"}
    ]);
    let ask = |stream: bool| -> Value {
        let body = json!({"model": "m", "messages": messages, "max_tokens": 4,
            "temperature": 0, "stream": stream})
        .to_string();
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = http::round_trip(&mut s, "/v1/chat/completions", &body).expect("answer");
        assert_eq!(
            r.status(),
            Some(200),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        if stream {
            Value::Null
        } else {
            serde_json::from_slice(&r.body).expect("a JSON answer")
        }
    };
    // The engine's own count of this prompt (and the cache filled).
    let whole = ask(false);
    let prompt = whole["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("usage.prompt_tokens in {whole}"));
    // The same chat streamed without usage, three times: answered from
    // the cache, counted from `timings`.
    for _ in 0..3 {
        ask(true);
    }
    std::thread::sleep(Duration::from_millis(500));
    let (ok, lines) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {lines:?}");
    drop(engine);

    let records = read_jsonl(&log);
    assert_eq!(records.len(), 4, "{records:?}");
    assert_eq!(records[0]["stream"], false);
    assert_eq!(records[0]["input_tokens"], prompt);
    assert_eq!(records[0]["tokens_source"], "usage", "{}", records[0]);
    let mut from_cache = 0;
    for r in &records[1..] {
        assert_eq!(r["stream"], true);
        assert_eq!(r["input_tokens"], prompt, "the whole prompt: {r}");
        assert_eq!(r["tokens_source"], "engine", "llama.cpp's timings: {r}");
        assert_eq!(r["tokens_exact"], true, "{r}");
        let cached = r["cached_input_tokens"].as_u64().unwrap_or(0);
        assert!(cached <= prompt, "cached {cached} > input {prompt}: {r}");
        if cached > 0 {
            from_cache += 1;
        }
    }
    assert!(
        from_cache >= 2,
        "the repeated chats were answered from the prompt cache: {records:?}"
    );
}

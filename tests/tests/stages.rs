//! The engine's own account of where a request's time went, as root,
//! against the real llama.cpp `llama-server` streaming to the `openai` SDK:
//! each record's `prefill_s`, `decode_s` and `cached_input_tokens` equal
//! the `timings` object the server put in the stream's last chunk (which
//! the client reads too: `tests/peers/client.py` writes it out), and TTFT
//! covers at least the socket wait plus the engine's prefill
//! (`ttft_s ≥ queue_s + prefill_s`: the engine's clock starts after the
//! read, tokentap's at the arrival).

use serde_json::Value;
use tokentap_tests::{
    assert_root, interrupt,
    peers::{free_port, Engine, Peers},
    read_jsonl, scratch_dir, RunAgent,
};

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn llama_server_timings_are_each_records_prefill_decode_and_cached_tokens() {
    let test = "stages_llama_server";
    assert_root(test);
    let peers = Peers::installed(test);
    let dir = scratch_dir(test);
    let port = free_port();
    let (_engine, _engine_out) = peers.start_engine(Engine::Native, port, 1);
    let log = dir.join("requests.jsonl");
    let (mut agent, agent_out) = RunAgent::new()
        .port(port)
        .no_gpu()
        .requests_log(&log)
        .start();
    // Streamed chats with usage, one at a time: prompts that share their
    // start, so the server's prompt cache serves part of each.
    let sent = peers.client(
        &format!("http://127.0.0.1:{port}/v1"),
        &[
            "--n",
            "8",
            "--cancel-every",
            "0",
            "--max-tokens",
            "8",
            "--only",
            "chat-stream-usage",
            "--think-ms",
            "20",
            "--tag",
            "stg",
        ],
        &dir.join("client.jsonl"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (ok, lines) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {lines:#?}");
    let records = read_jsonl(&log);
    assert_eq!(sent.len(), 8);
    let mut cached_seen = 0;
    for c in &sent {
        let tag = c["tag"].as_str().unwrap();
        let r = records
            .iter()
            .find(|r| r["request_model"] == tag)
            .unwrap_or_else(|| panic!("{tag} not recorded: {records:#?}"));
        let t = &c["timings"];
        assert!(t.is_object(), "{tag}: the server sent timings: {c}");
        let ms = |k: &str| {
            t[k].as_f64()
                .unwrap_or_else(|| panic!("{tag}: timings.{k}: {t}"))
        };
        let close = |got: &Value, want_s: f64, what: &str| {
            let got = got
                .as_f64()
                .unwrap_or_else(|| panic!("{tag}: {what} missing: {r}"));
            // The record keeps microseconds.
            assert!(
                (got - want_s).abs() <= 1e-6,
                "{tag}: {what} {got} vs the server's {want_s}: {r}"
            );
        };
        close(&r["prefill_s"], ms("prompt_ms") / 1e3, "prefill_s");
        close(&r["decode_s"], ms("predicted_ms") / 1e3, "decode_s");
        assert_eq!(r["cached_input_tokens"], t["cache_n"], "{tag}: {r}");
        if t["cache_n"].as_u64() > Some(0) {
            cached_seen += 1;
        }
        assert_eq!(r["engine_queue_s"], Value::Null, "{r}");
        assert!(
            r["stages_source"]
                .as_str()
                .is_some_and(|s| s.contains("llamacpp_timings")),
            "{r}"
        );
        let ttft = r["ttft_s"].as_f64().unwrap();
        // Timed from the arrival, the wait unread is known: never taken as 0.
        let queue = if r["t0_source"] == "arrival" {
            r["queue_s"]
                .as_f64()
                .unwrap_or_else(|| panic!("{tag}: t0 at the arrival and no queue_s: {r}"))
        } else {
            0.0
        };
        let prefill = r["prefill_s"].as_f64().unwrap();
        assert!(
            ttft >= queue + prefill,
            "{tag}: ttft {ttft} < queue {queue} + prefill {prefill}: {r}"
        );
    }
    assert!(
        cached_seen >= 1,
        "the prompt cache served some prompt tokens: {sent:#?}"
    );
}

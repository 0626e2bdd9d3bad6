//! Workload for `cargo xtask bench decode`: decodes an in-memory, realistic
//! SSE mix on one thread and prints one JSON line of rates.
//!
//! The mix: 64 keep-alive connections, OpenAI-compatible chat streams
//! (vLLM-shaped chunks, one SSE event per write, chunked framing, usage on
//! every other request) with 256 content events each, interleaved across
//! connections like a busy engine's writes; one request in ten is a
//! non-streamed JSON completion.
//!
//! Runs the decoder as shipped and with the chat-chunk pre-scan off
//! (`sse_events_per_s_serde_only`: every event through serde, the decoder
//! before the pre-scan), alternating, each for half of SECS; or only one
//! of them (`decodebench SECS fast|serde`, to profile it).

use std::time::Instant;

use tokentap::{
    decode::Decoder,
    event::{DataEvent, Dir, OpenEvent, Role, SocketEvent},
};

fn data(ts: u64, fd: i32, dir: Dir, bytes: Vec<u8>) -> SocketEvent {
    SocketEvent::Data(DataEvent {
        ts_ns: ts,
        pid: 1,
        tid: 1,
        fd,
        dir,
        ret: bytes.len() as i64,
        data: bytes,
        syscall: None,
    })
}

fn chunk(s: &str) -> Vec<u8> {
    format!("{:x}\r\n{s}\r\n", s.len()).into_bytes()
}

/// Events for one request on `fd`, and how many SSE events it holds.
fn request(fd: i32, i: usize, t: &mut u64) -> (Vec<SocketEvent>, u64) {
    let mut evs = vec![];
    let body = r#"{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a long story about a lighthouse keeper."}],"max_tokens":256,"temperature":0.7}"#;
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: openai-python/1.0\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-x\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    evs.push(data(*t, fd, Dir::In, req.into_bytes()));
    *t += 1000;
    if i % 10 == 9 {
        let resp = r#"{"id":"cmpl-1","object":"chat.completion","created":1,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"A short answer."},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":4,"total_tokens":44}}"#;
        let wire = format!("HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{resp}", resp.len());
        evs.push(data(*t, fd, Dir::Out, wire.into_bytes()));
        return (evs, 0);
    }
    evs.push(data(*t, fd, Dir::Out, b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()));
    let head = r#"{"id":"chatcmpl-8f1c2b","object":"chat.completion.chunk","created":1764460800,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"#;
    evs.push(data(*t, fd, Dir::Out, chunk(&format!("data: {head}\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"))));
    let words = [
        "The", " keeper", " climbed", " the", " stairs", " again", ",", " lantern", " in", " hand",
        " — ", "ночь",
    ];
    for k in 0..256 {
        *t += 20_000;
        let w = words[k % words.len()];
        evs.push(data(*t, fd, Dir::Out, chunk(&format!("data: {head}\"content\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"))));
    }
    evs.push(data(
        *t,
        fd,
        Dir::Out,
        chunk(&format!(
            "data: {head}}},\"logprobs\":null,\"finish_reason\":\"length\"}}]}}\n\n"
        )),
    ));
    let mut n = 258;
    if i.is_multiple_of(2) {
        evs.push(data(*t, fd, Dir::Out, chunk("data: {\"id\":\"chatcmpl-8f1c2b\",\"object\":\"chat.completion.chunk\",\"created\":1764460800,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"total_tokens\":296,\"completion_tokens\":256}}\n\n")));
        n += 1;
    }
    let mut end = chunk("data: [DONE]\n\n");
    end.extend(b"0\r\n\r\n");
    evs.push(data(*t, fd, Dir::Out, end));
    (evs, n + 1)
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    // Which decoders run: both alternating (the benchmark), or one alone
    // (to profile it: `perf record decodebench 5 fast`).
    let modes: &[usize] = match std::env::args().nth(2).as_deref() {
        None | Some("both") => &[0, 1],
        Some("fast") => &[0],
        Some("serde") => &[1],
        Some(other) => {
            eprintln!("decodebench: unknown mode {other:?} (both, fast or serde)");
            std::process::exit(2);
        }
    };
    let conns = 64;
    let per_conn = 10;
    // Build per-connection streams, then interleave them round-robin.
    let mut t = 1_000_000_000u64;
    let mut streams: Vec<Vec<SocketEvent>> = vec![];
    let mut sse_events = 0u64;
    let mut bytes = 0u64;
    for c in 0..conns {
        let fd = 10 + c;
        let mut evs = vec![SocketEvent::Open(OpenEvent {
            ts_ns: t,
            pid: 1,
            fd,
            role: Role::Server,
            local: Some("127.0.0.1:8000".parse().unwrap()),
            peer: Some(format!("127.0.0.1:{}", 40000 + c).parse().unwrap()),
            joined: false,
        })];
        for i in 0..per_conn {
            let (e, n) = request(fd, i, &mut t);
            sse_events += n;
            evs.extend(e);
        }
        streams.push(evs);
    }
    let mut events = vec![];
    let longest = streams.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for s in &streams {
            if let Some(e) = s.get(i) {
                if let SocketEvent::Data(d) = e {
                    bytes += d.data.len() as u64;
                }
                events.push(e.clone());
            }
        }
    }
    // The decoder as shipped, and with the chat-chunk pre-scan off (every
    // event through serde, as before it existed), alternating in slices of
    // a tenth of the time so both see the same machine.
    let mut passes = [0u64; 2];
    let mut records = [0u64; 2];
    let mut spent = [0f64; 2];
    let mut out = Vec::new();
    let slice = secs / 10.0;
    for round in 0..20 {
        let mode = modes[round % modes.len()]; // 0: pre-scan on, 1: off
        tokentap::decode::formats::set_fast_path(mode == 0);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < slice {
            let mut d = Decoder::new();
            for e in &events {
                d.on_event(e, &mut out);
            }
            d.finish(&mut out);
            records[mode] += out.len() as u64;
            out.clear();
            passes[mode] += 1;
        }
        spent[mode] += start.elapsed().as_secs_f64();
    }
    tokentap::decode::formats::set_fast_path(true);
    // A mode that did not run has no rate (null).
    let per_s = |n: u64, m: usize| (spent[m] > 0.0).then(|| (n as f64 / spent[m]).round());
    let v = serde_json::json!({
        "sse_events_per_s": per_s(sse_events * passes[0], 0),
        "sse_events_per_s_serde_only": per_s(sse_events * passes[1], 1),
        "socket_events_per_s": per_s(events.len() as u64 * passes[0], 0),
        "records_per_s": per_s(records[0], 0),
        "mb_per_s": per_s(bytes * passes[0], 0).map(|b| (b / 1e5).round() / 10.0),
        "passes": passes[0],
        "socket_events": events.len(),
        "sse_events": sse_events,
    });
    println!("{v}");
}

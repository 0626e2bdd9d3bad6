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
//!
//! Two HTTP/2 mixes run in the same rounds (`decodebench SECS grpc|h2`
//! alone): 64 connections each holding one Triton `ModelStreamInfer`
//! stream with 10 requests of 256 responses (one gRPC message per DATA
//! frame, one frame per write, as grpcio writes them), and 64 h2c
//! connections carrying the same OpenAI chat streams as the HTTP/1.1 mix,
//! each SSE event in its own DATA frame, 4 streams at once per connection.

use std::{collections::HashMap, time::Instant};

use prost::Message;
use tokentap::{
    decode::grpc::proto,
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

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut v = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    v.extend_from_slice(&stream.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// An HPACK block of literals without indexing (names and values short).
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut v = vec![];
    for (n, val) in fields {
        v.push(0);
        v.push(n.len() as u8);
        v.extend_from_slice(n.as_bytes());
        v.push(val.len() as u8);
        v.extend_from_slice(val.as_bytes());
    }
    v
}

fn open(t: u64, fd: i32, c: i32) -> SocketEvent {
    SocketEvent::Open(OpenEvent {
        ts_ns: t,
        pid: 1,
        fd,
        role: Role::Server,
        local: Some("127.0.0.1:8001".parse().unwrap()),
        peer: Some(format!("127.0.0.1:{}", 40000 + c).parse().unwrap()),
        joined: false,
    })
}

fn preface() -> Vec<u8> {
    let mut v = tokentap::decode::HTTP2_PREFACE.to_vec();
    v.extend(h2_frame(4, 0, 0, &[0, 3, 0, 0, 0, 100]));
    v
}

fn grpc_msg(m: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&(m.len() as u32).to_be_bytes());
    v.extend_from_slice(m);
    v
}

/// One Triton connection: a ModelStreamInfer stream with `reqs` requests
/// of `per` responses each, two requests in flight at a time. Returns the
/// events and the response messages.
fn triton_conn(fd: i32, c: i32, reqs: usize, per: usize, t: &mut u64) -> (Vec<SocketEvent>, u64) {
    let mut evs = vec![open(*t, fd, c), data(*t, fd, Dir::In, preface())];
    evs.push(data(*t, fd, Dir::Out, h2_frame(4, 0, 0, &[])));
    let headers = hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
        (":authority", "localhost:8001"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    evs.push(data(*t, fd, Dir::In, h2_frame(1, 4, 1, &headers)));
    evs.push(data(
        *t,
        fd,
        Dir::Out,
        h2_frame(
            1,
            4,
            1,
            &hpack(&[(":status", "200"), ("content-type", "application/grpc")]),
        ),
    ));
    let mut n = 0;
    for pair in (0..reqs).collect::<Vec<_>>().chunks(2) {
        let ids: Vec<String> = pair.iter().map(|i| format!("req-{c}-{i}")).collect();
        for id in &ids {
            let text = b"Write a long story about a lighthouse keeper.";
            let mut raw = (text.len() as u32).to_le_bytes().to_vec();
            raw.extend_from_slice(text);
            let r = proto::ModelInferRequest {
                model_name: "llama3".into(),
                model_version: String::new(),
                id: id.clone(),
                parameters: HashMap::new(),
                inputs: vec![proto::InferInputTensor {
                    name: "text_input".into(),
                    datatype: "BYTES".into(),
                    shape: vec![1],
                }],
                raw_input_contents: vec![raw],
            };
            *t += 1000;
            evs.push(data(
                *t,
                fd,
                Dir::In,
                h2_frame(0, 0, 1, &grpc_msg(&r.encode_to_vec())),
            ));
        }
        for k in 0..per {
            for id in &ids {
                let mut parameters = HashMap::new();
                parameters.insert(
                    "triton_final_response".to_string(),
                    proto::InferParameter {
                        choice: Some(proto::ParameterChoice::BoolParam(k + 1 == per)),
                    },
                );
                let resp = proto::ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(proto::ModelInferResponse {
                        model_name: "llama3".into(),
                        model_version: "1".into(),
                        id: id.clone(),
                        parameters,
                        outputs: vec![proto::InferOutputTensor {
                            name: "text_output".into(),
                            datatype: "BYTES".into(),
                            shape: vec![1],
                        }],
                    }),
                };
                *t += 20_000;
                evs.push(data(
                    *t,
                    fd,
                    Dir::Out,
                    h2_frame(0, 0, 1, &grpc_msg(&resp.encode_to_vec())),
                ));
                n += 1;
            }
        }
    }
    (evs, n)
}

/// One h2c connection of OpenAI chat streams, 4 at a time, each SSE event
/// its own DATA frame. Returns the events and the SSE events.
fn h2_sse_conn(fd: i32, c: i32, reqs: usize, t: &mut u64) -> (Vec<SocketEvent>, u64) {
    let mut evs = vec![open(*t, fd, c), data(*t, fd, Dir::In, preface())];
    evs.push(data(*t, fd, Dir::Out, h2_frame(4, 0, 0, &[])));
    let body = r#"{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Write a long story about a lighthouse keeper."}],"max_tokens":256}"#;
    let head = r#"{"id":"chatcmpl-8f1c2b","object":"chat.completion.chunk","created":1764460800,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"#;
    let mut n = 0;
    let mut sid = 1u32;
    for group in (0..reqs).collect::<Vec<_>>().chunks(4) {
        let sids: Vec<u32> = group
            .iter()
            .map(|_| {
                let s = sid;
                sid += 2;
                s
            })
            .collect();
        for s in &sids {
            let h = hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/v1/chat/completions"),
                (":authority", "localhost:8000"),
                ("content-type", "application/json"),
            ]);
            evs.push(data(*t, fd, Dir::In, h2_frame(1, 4, *s, &h)));
            evs.push(data(*t, fd, Dir::In, h2_frame(0, 1, *s, body.as_bytes())));
            evs.push(data(
                *t,
                fd,
                Dir::Out,
                h2_frame(
                    1,
                    4,
                    *s,
                    &hpack(&[(":status", "200"), ("content-type", "text/event-stream")]),
                ),
            ));
        }
        for k in 0..256 {
            for s in &sids {
                *t += 20_000;
                let e = format!("data: {head}\"content\":\" word{k}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n");
                evs.push(data(*t, fd, Dir::Out, h2_frame(0, 0, *s, e.as_bytes())));
                n += 1;
            }
        }
        for s in &sids {
            evs.push(data(
                *t,
                fd,
                Dir::Out,
                h2_frame(0, 1, *s, b"data: [DONE]\n\n"),
            ));
        }
    }
    (evs, n)
}

/// Round-robin interleaving of per-connection event lists.
fn interleave(streams: &[Vec<SocketEvent>]) -> Vec<SocketEvent> {
    let mut events = vec![];
    let longest = streams.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for s in streams {
            if let Some(e) = s.get(i) {
                events.push(e.clone());
            }
        }
    }
    events
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    // Which decoders run: both alternating (the benchmark), or one alone
    // (to profile it: `perf record decodebench 5 fast`).
    let modes: &[usize] = match std::env::args().nth(2).as_deref() {
        None | Some("all") => &[0, 1, 2, 3],
        Some("both") => &[0, 1],
        Some("fast") => &[0],
        Some("serde") => &[1],
        Some("grpc") => &[2],
        Some("h2") => &[3],
        Some(other) => {
            eprintln!("decodebench: unknown mode {other:?} (all, both, fast, serde, grpc or h2)");
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
    let (mut grpc_streams, mut grpc_msgs) = (vec![], 0u64);
    let (mut h2_streams, mut h2_events) = (vec![], 0u64);
    for c in 0..conns {
        let (e, n) = triton_conn(200 + c, c, 10, 256, &mut t);
        grpc_msgs += n;
        grpc_streams.push(e);
        let (e, n) = h2_sse_conn(400 + c, c, 8, &mut t);
        h2_events += n;
        h2_streams.push(e);
    }
    let workloads = [
        &events,
        &events,
        &interleave(&grpc_streams),
        &interleave(&h2_streams),
    ];
    // The decoder as shipped, and with the chat-chunk pre-scan off (every
    // event through serde, as before it existed), and the HTTP/2 mixes,
    // alternating in slices so all see the same machine.
    let mut passes = [0u64; 4];
    let mut records = [0u64; 4];
    let mut spent = [0f64; 4];
    let mut out = Vec::new();
    let slice = secs / 10.0;
    for round in 0..10 * modes.len() {
        // 0: HTTP/1.1 pre-scan on, 1: off, 2: gRPC, 3: h2 SSE.
        let mode = modes[round % modes.len()];
        tokentap::decode::formats::set_fast_path(mode != 1);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < slice / modes.len() as f64 * 2.0 {
            let mut d = Decoder::new();
            for e in workloads[mode] {
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
        "grpc_messages_per_s": per_s(grpc_msgs * passes[2], 2),
        "grpc_records_per_s": per_s(records[2], 2),
        "h2_sse_events_per_s": per_s(h2_events * passes[3], 3),
        "h2_records_per_s": per_s(records[3], 3),
    });
    println!("{v}");
}

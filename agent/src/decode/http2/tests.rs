//! The HTTP/2 machine on conversations with a known schedule: concurrent
//! SSE streams, Triton's many-requests stream, joining mid-connection,
//! hostile input. Header blocks are built with a small HPACK encoder
//! (literals, incremental indexing, indexed references); messages with
//! the `proto` types.

use std::collections::HashMap;

use proptest::prelude::*;
use prost::Message;

use super::frame::{
    self, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM,
};
use crate::decode::grpc::proto::{self, InferParameter, ParameterChoice};
use crate::decode::{Decoder, HTTP2_PREFACE};
use crate::event::{CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent};
use crate::record::Finished;
use crate::vocab::ErrorType;

const T0: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut v = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    v.extend_from_slice(&stream.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// An HPACK header block: each field a literal (`index: false`: without
/// indexing; `true`: with incremental indexing) or, given as `(name,
/// None)` with a number name, an indexed reference.
#[derive(Default)]
pub struct Block(Vec<u8>);

impl Block {
    fn int(&mut self, prefix_bits: u8, first: u8, mut v: usize) {
        let max = (1usize << prefix_bits) - 1;
        if v < max {
            self.0.push(first | v as u8);
            return;
        }
        self.0.push(first | max as u8);
        v -= max;
        while v >= 128 {
            self.0.push((v % 128) as u8 | 0x80);
            v /= 128;
        }
        self.0.push(v as u8);
    }
    fn string(&mut self, s: &[u8]) {
        self.int(7, 0, s.len());
        self.0.extend_from_slice(s);
    }
    pub fn lit(mut self, name: &str, value: &str) -> Self {
        self.0.push(0);
        self.string(name.as_bytes());
        self.string(value.as_bytes());
        self
    }
    pub fn indexed_lit(mut self, name: &str, value: &str) -> Self {
        self.0.push(0x40);
        self.string(name.as_bytes());
        self.string(value.as_bytes());
        self
    }
    pub fn idx(mut self, i: usize) -> Self {
        self.int(7, 0x80, i);
        self
    }
    pub fn bytes(self) -> Vec<u8> {
        self.0
    }
}

fn settings() -> Vec<u8> {
    frame(frame::SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100])
}

/// A conversation: (ms, direction, bytes) calls of one server connection.
#[derive(Default, Clone)]
pub struct Conv {
    calls: Vec<(u64, Dir, Vec<u8>)>,
}

impl Conv {
    pub fn start() -> Self {
        let mut c = Conv::default();
        let mut first = HTTP2_PREFACE.to_vec();
        first.extend(settings());
        c.calls.push((0, Dir::In, first));
        c.calls.push((0, Dir::Out, settings()));
        c
    }
    pub fn at(mut self, ms: u64, dir: Dir, bytes: Vec<u8>) -> Self {
        self.calls.push((ms, dir, bytes));
        self
    }
    /// Socket events: an open (unless `joined`), the calls, a close.
    pub fn events(&self, joined: bool) -> Vec<SocketEvent> {
        let mut evs = vec![];
        if !joined {
            evs.push(SocketEvent::Open(OpenEvent {
                ts_ns: T0,
                pid: 7,
                fd: 3,
                role: Role::Server,
                local: Some("127.0.0.1:8001".parse().unwrap()),
                peer: Some("127.0.0.1:40000".parse().unwrap()),
                joined: false,
            }));
        }
        let mut last = 0;
        for (ms, dir, bytes) in &self.calls {
            last = *ms;
            evs.push(data_event(*ms, *dir, bytes));
        }
        evs.push(SocketEvent::Close(CloseEvent {
            ts_ns: T0 + (last + 10) * MS,
            pid: 7,
            fd: 3,
        }));
        evs
    }
}

fn data_event(ms: u64, dir: Dir, bytes: &[u8]) -> SocketEvent {
    SocketEvent::Data(DataEvent {
        ts_ns: T0 + ms * MS,
        pid: 7,
        tid: 7,
        fd: 3,
        dir,
        ret: bytes.len() as i64,
        data: bytes.to_vec(),
        syscall: None,
    })
}

fn run(evs: &[SocketEvent]) -> (Decoder, Vec<Finished>) {
    let mut d = Decoder::new();
    let mut out = vec![];
    for e in evs {
        d.on_event(e, &mut out);
    }
    d.finish(&mut out);
    out.sort_by_key(|f| f.record.t0_ns);
    (d, out)
}

fn chat_headers(model_tag: &str) -> Vec<u8> {
    Block::default()
        .idx(3) // :method POST
        .idx(6) // :scheme http
        .lit(":path", "/v1/chat/completions")
        .lit(":authority", "127.0.0.1:8001")
        .lit("content-type", "application/json")
        .lit("x-request-tag", model_tag)
        .bytes()
}

fn sse(id: &str, text: &str) -> Vec<u8> {
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    )
    .into_bytes()
}

fn sse_usage(id: &str, prompt: u64, completion: u64) -> Vec<u8> {
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
        prompt + completion
    )
    .into_bytes()
}

fn ok_sse_headers() -> Vec<u8> {
    Block::default()
        .idx(8) // :status 200
        .lit("content-type", "text/event-stream")
        .bytes()
}

/// Three chat streams opened at 0/1/2 ms on streams 1/3/5; stream k's
/// first token at 10·k ms, `k + 2` tokens 3 ms apart, interleaved.
fn three_streams() -> Conv {
    let mut c = Conv::start();
    for (k, sid) in [1u32, 3, 5].iter().enumerate() {
        let body = format!(
            r#"{{"model":"m{k}","stream":true,"messages":[{{"role":"user","content":"hello {k}"}}]}}"#
        );
        let mut b = frame(HEADERS, END_HEADERS, *sid, &chat_headers(&format!("t{k}")));
        b.extend(frame(DATA, END_STREAM, *sid, body.as_bytes()));
        c = c.at(k as u64, Dir::In, b);
    }
    let mut writes: Vec<(u64, u32, Vec<u8>)> = vec![];
    for (k, sid) in [1u32, 3, 5].iter().enumerate() {
        let id = format!("chatcmpl-{k}");
        let first = 10 * (k as u64 + 1);
        writes.push((
            first - 1,
            *sid,
            frame(HEADERS, END_HEADERS, *sid, &ok_sse_headers()),
        ));
        let n = k as u64 + 2;
        for i in 0..n {
            writes.push((first + 3 * i, *sid, frame(DATA, 0, *sid, &sse(&id, "tok"))));
        }
        let end = first + 3 * n;
        writes.push((
            end,
            *sid,
            frame(DATA, END_STREAM, *sid, &sse_usage(&id, 7, n)),
        ));
    }
    writes.sort_by_key(|w| (w.0, w.1));
    for (ms, _, bytes) in writes {
        c = c.at(ms, Dir::Out, bytes);
    }
    c
}

fn check_three(out: &[Finished]) {
    assert_eq!(out.len(), 3, "{out:#?}");
    for (k, f) in out.iter().enumerate() {
        let r = &f.record;
        assert_eq!(r.request_model.as_deref(), Some(format!("m{k}").as_str()));
        assert_eq!(r.protocol, Some("h2"));
        assert_eq!(r.status, Some(200));
        assert_eq!(r.error_type, None, "{r:#?}");
        assert_eq!(
            r.request_id.as_deref(),
            Some(format!("chatcmpl-{k}").as_str())
        );
        let want_ttft = (10.0 * (k as f64 + 1.0) - k as f64) / 1e3;
        assert!(
            (r.ttft_s.unwrap() - want_ttft).abs() < 1e-9,
            "{k}: {:?}",
            r.ttft_s
        );
        assert_eq!(r.output_tokens, Some(k as u64 + 2));
        assert_eq!(r.input_tokens, Some(7));
        assert_eq!(r.chunks, Some(k as u64 + 2));
        assert!((r.tpot_s.unwrap() - 0.003).abs() < 1e-9);
    }
}

#[test]
fn three_concurrent_sse_streams_are_recorded_exactly_and_never_mixed() {
    let (d, out) = run(&three_streams().events(false));
    check_three(&out);
    assert_eq!(d.stats.desyncs, 0);
    assert_eq!(d.stats.http2, 1);
    assert_eq!(d.buffered_bytes(), 0);
}

/// Every call of the conversation re-cut: each direction's bytes as one
/// stream, cut at the given points (times are kept per original call).
fn recut(c: &Conv, cuts: &[usize]) -> Conv {
    let mut out = Conv::default();
    for (ms, dir, bytes) in &c.calls {
        let mut at = 0;
        for cut in cuts.iter().map(|c| c % (bytes.len() + 1)) {
            if cut > at {
                out.calls.push((*ms, *dir, bytes[at..cut].to_vec()));
                at = cut;
            }
        }
        out.calls.push((*ms, *dir, bytes[at..].to_vec()));
        out.calls.retain(|(_, _, b)| !b.is_empty());
    }
    out
}

proptest! {
    #[test]
    fn frames_cut_anywhere_decode_as_the_whole(mut cuts in proptest::collection::vec(0usize..400, 0..6)) {
        cuts.sort_unstable();
        let (_, out) = run(&recut(&three_streams(), &cuts).events(false));
        check_three(&out);
    }
}

#[test]
fn frames_cut_at_every_byte_decode_as_the_whole() {
    let c = three_streams();
    let longest = c.calls.iter().map(|x| x.2.len()).max().unwrap();
    for cut in 0..=longest {
        let (_, out) = run(&recut(&c, &[cut]).events(false));
        check_three(&out);
    }
}

// ---- gRPC: Triton ----

fn grpc(msg: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

fn triton_request(id: &str, model: &str) -> Vec<u8> {
    let text = b"hello world";
    let mut raw = (text.len() as u32).to_le_bytes().to_vec();
    raw.extend_from_slice(text);
    proto::ModelInferRequest {
        model_name: model.into(),
        model_version: String::new(),
        id: id.into(),
        parameters: HashMap::new(),
        inputs: vec![proto::InferInputTensor {
            name: "text_input".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
        }],
        raw_input_contents: vec![raw],
    }
    .encode_to_vec()
}

fn triton_response(id: &str, model: &str, output: bool, last: bool) -> Vec<u8> {
    let mut parameters = HashMap::new();
    parameters.insert(
        "triton_final_response".to_string(),
        InferParameter {
            choice: Some(ParameterChoice::BoolParam(last)),
        },
    );
    let outputs = if output {
        vec![proto::InferOutputTensor {
            name: "text_output".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
        }]
    } else {
        vec![]
    };
    proto::ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(proto::ModelInferResponse {
            model_name: model.into(),
            model_version: "1".into(),
            id: id.into(),
            parameters,
            outputs,
        }),
    }
    .encode_to_vec()
}

fn triton_error(id: &str) -> Vec<u8> {
    proto::ModelStreamInferResponse {
        error_message: "model failed".into(),
        infer_response: Some(proto::ModelInferResponse {
            id: id.into(),
            model_name: "fail".into(),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

const STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

fn grpc_headers(path: &str) -> Vec<u8> {
    Block::default()
        .idx(3)
        .idx(6)
        .indexed_lit(":path", path)
        .lit(":authority", "127.0.0.1:8001")
        .indexed_lit("content-type", "application/grpc")
        .lit("te", "trailers")
        .bytes()
}

fn grpc_response_headers() -> Vec<u8> {
    Block::default()
        .idx(8)
        .lit("content-type", "application/grpc")
        .bytes()
}

/// One ModelStreamInfer stream (id 1): requests r1 (t=5), r2 (t=6), r3
/// (t=7, model `fail`); r1 gets 3 outputs from t=20 every 2 ms plus an
/// empty final, r2 two outputs from t=21 (the last one final), r3 an
/// error at t=30. Then, on stream 3, one unary ModelInfer.
fn triton_session(open_stream: bool) -> Conv {
    let mut c = Conv::start();
    if open_stream {
        c = c.at(
            1,
            Dir::In,
            frame(HEADERS, END_HEADERS, 1, &grpc_headers(STREAM_INFER)),
        );
        c = c.at(
            2,
            Dir::Out,
            frame(HEADERS, END_HEADERS, 1, &grpc_response_headers()),
        );
    }
    c = c
        .at(
            5,
            Dir::In,
            frame(DATA, 0, 1, &grpc(&triton_request("r1", "llm"))),
        )
        .at(
            6,
            Dir::In,
            frame(DATA, 0, 1, &grpc(&triton_request("r2", "llm"))),
        )
        .at(
            7,
            Dir::In,
            frame(DATA, 0, 1, &grpc(&triton_request("r3", "fail"))),
        )
        .at(
            20,
            Dir::Out,
            frame(
                DATA,
                0,
                1,
                &grpc(&triton_response("r1", "llm", true, false)),
            ),
        )
        .at(
            21,
            Dir::Out,
            frame(
                DATA,
                0,
                1,
                &grpc(&triton_response("r2", "llm", true, false)),
            ),
        )
        .at(
            22,
            Dir::Out,
            frame(
                DATA,
                0,
                1,
                &grpc(&triton_response("r1", "llm", true, false)),
            ),
        )
        .at(
            23,
            Dir::Out,
            frame(DATA, 0, 1, &grpc(&triton_response("r2", "llm", true, true))),
        )
        .at(
            24,
            Dir::Out,
            frame(
                DATA,
                0,
                1,
                &grpc(&triton_response("r1", "llm", true, false)),
            ),
        )
        .at(
            25,
            Dir::Out,
            frame(
                DATA,
                0,
                1,
                &grpc(&triton_response("r1", "llm", false, true)),
            ),
        )
        .at(30, Dir::Out, frame(DATA, 0, 1, &grpc(&triton_error("r3"))));
    c
}

fn check_triton(out: &[Finished]) {
    let by_id = |id: &str| {
        out.iter()
            .find(|f| f.record.request_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("{id} not recorded: {out:#?}"))
    };
    let r1 = &by_id("r1").record;
    assert_eq!(r1.protocol, Some("grpc"));
    assert_eq!(r1.path, STREAM_INFER);
    assert_eq!(r1.request_model.as_deref(), Some("llm"));
    assert_eq!(r1.response_model.as_deref(), Some("llm"));
    assert_eq!(r1.provider.as_deref(), Some("triton"));
    assert_eq!(r1.operation, Some(crate::vocab::Operation::Generate));
    assert!((r1.ttft_s.unwrap() - 0.015).abs() < 1e-9, "{:?}", r1.ttft_s);
    assert_eq!(r1.output_tokens, Some(3));
    assert!((r1.tpot_s.unwrap() - 0.002).abs() < 1e-9);
    assert!((r1.duration_s.unwrap() - 0.020).abs() < 1e-9);
    assert_eq!(r1.error_type, None);
    let r2 = &by_id("r2").record;
    assert!((r2.ttft_s.unwrap() - 0.015).abs() < 1e-9);
    assert_eq!(r2.output_tokens, Some(2));
    assert_eq!(r2.error_type, None);
    let r3 = &by_id("r3").record;
    assert_eq!(r3.error_type, Some(ErrorType::StreamError));
    assert_eq!(r3.request_model.as_deref(), Some("fail"));
    assert_eq!(r3.ttft_s, None);
}

#[test]
fn triton_requests_on_one_stream_are_one_record_each_matched_by_id() {
    let (d, out) = run(&triton_session(true).events(false));
    assert_eq!(out.len(), 3, "{out:#?}");
    check_triton(&out);
    assert_eq!(d.stats.desyncs, 0);
    assert_eq!(d.stats.grpc, Default::default());
}

#[test]
fn a_triton_stream_opened_before_the_agent_is_decoded_from_its_next_message() {
    // The agent joins after the preface, SETTINGS and the stream's
    // HEADERS: the first call it sees starts mid-frame.
    let mut c = triton_session(true);
    c.calls.drain(..4);
    let mut first = c.calls[0].2.clone();
    first.drain(..3);
    c.calls[0].2 = first; // r1's request is cut: not recorded
    let (d, out) = run(&c.events(true));
    assert_eq!(d.stats.desyncs, 0, "{:?}", d.stats);
    assert_eq!(out.len(), 2, "{out:#?}");
    let r2 = out
        .iter()
        .find(|f| f.record.request_id.as_deref() == Some("r2"))
        .unwrap();
    assert_eq!(r2.record.request_model.as_deref(), Some("llm"));
    assert_eq!(r2.record.output_tokens, Some(2));
    assert!((r2.record.ttft_s.unwrap() - 0.015).abs() < 1e-9);
    assert_eq!(r2.record.path, STREAM_INFER);
    assert_eq!(d.stats.grpc.orphan_responses, 4, "r1's responses");
}

#[test]
fn a_unary_call_whose_path_was_indexed_before_the_agent_is_recognised_by_its_messages() {
    // Stream 1 inserted `:path` and content-type into the client's table
    // before the agent joined; stream 3 refers to them (62, 63).
    let block = Block::default()
        .idx(3)
        .idx(6)
        .idx(63)
        .idx(62)
        .lit("te", "trailers")
        .bytes();
    let unary = proto::ModelInferResponse {
        model_name: "llm".into(),
        model_version: "1".into(),
        id: "u1".into(),
        parameters: HashMap::new(),
        outputs: vec![proto::InferOutputTensor {
            name: "output_ids".into(),
            datatype: "INT32".into(),
            shape: vec![1, 4],
        }],
    }
    .encode_to_vec();
    let trailers = Block::default().lit("grpc-status", "0").bytes();
    let c = Conv::default()
        .at(1, Dir::In, frame(HEADERS, END_HEADERS, 3, &block))
        .at(
            1,
            Dir::In,
            frame(DATA, END_STREAM, 3, &grpc(&triton_request("u1", "llm"))),
        )
        .at(
            9,
            Dir::Out,
            frame(HEADERS, END_HEADERS, 3, &grpc_response_headers()),
        )
        .at(9, Dir::Out, frame(DATA, 0, 3, &grpc(&unary)))
        .at(
            9,
            Dir::Out,
            frame(HEADERS, END_HEADERS | END_STREAM, 3, &trailers),
        );
    let (d, out) = run(&c.events(true));
    assert_eq!(out.len(), 1, "{out:#?} {:?}", d.stats);
    let r = &out[0].record;
    assert_eq!(r.path, "/inference.GRPCInferenceService/ModelInfer");
    assert_eq!(r.request_id.as_deref(), Some("u1"));
    assert_eq!(r.output_tokens, Some(4));
    assert!(!r.stream);
    assert_eq!(r.error_type, None);
    assert!(d.stats.unresolved_headers >= 2);
}

#[test]
fn grpc_status_in_trailers_is_the_error_and_health_calls_are_not_llm_requests() {
    let trailers = Block::default()
        .lit("grpc-status", "5")
        .lit("grpc-message", "no model")
        .bytes();
    let health = Block::default()
        .idx(3)
        .idx(6)
        .lit(":path", "/grpc.health.v1.Health/Check")
        .lit("content-type", "application/grpc")
        .bytes();
    let ok = Block::default().lit("grpc-status", "0").bytes();
    let c = Conv::start()
        .at(
            1,
            Dir::In,
            frame(
                HEADERS,
                END_HEADERS,
                1,
                &grpc_headers("/inference.GRPCInferenceService/ModelInfer"),
            ),
        )
        .at(
            1,
            Dir::In,
            frame(DATA, END_STREAM, 1, &grpc(&triton_request("m1", "missing"))),
        )
        .at(
            2,
            Dir::Out,
            frame(HEADERS, END_HEADERS | END_STREAM, 1, &{
                let mut b = grpc_response_headers();
                b.extend(trailers.clone());
                b
            }),
        )
        .at(3, Dir::In, frame(HEADERS, END_HEADERS, 3, &health))
        .at(3, Dir::In, frame(DATA, END_STREAM, 3, &grpc(b"")))
        .at(
            4,
            Dir::Out,
            frame(HEADERS, END_HEADERS, 3, &grpc_response_headers()),
        )
        .at(4, Dir::Out, frame(DATA, 0, 3, &grpc(b"\x08\x01")))
        .at(
            4,
            Dir::Out,
            frame(HEADERS, END_HEADERS | END_STREAM, 3, &ok),
        );
    let (_, out) = run(&c.events(false));
    assert_eq!(out.len(), 2, "{out:#?}");
    assert_eq!(out[0].record.error_type, Some(ErrorType::Grpc(5)));
    assert_eq!(out[0].record.request_model.as_deref(), Some("missing"));
    assert!(out[0].non_llm_route().is_none());
    assert_eq!(out[1].record.path, "/grpc.health.v1.Health/Check");
    assert_eq!(
        out[1].non_llm_route(),
        Some(crate::record::RouteClass::Health)
    );
}

#[test]
fn goaway_ends_the_streams_the_server_never_took_and_lets_the_others_finish() {
    let mut c = three_streams();
    // After the first token of stream 1 (t=10), the server says it took
    // streams up to 3: stream 5 was never answered.
    let pos = c.calls.iter().position(|x| x.0 >= 10).unwrap();
    let mut goaway = 3u32.to_be_bytes().to_vec();
    goaway.extend_from_slice(&0u32.to_be_bytes());
    c.calls
        .insert(pos, (10, Dir::Out, frame(GOAWAY, 0, 0, &goaway)));
    let (_, out) = run(&c.events(false));
    assert_eq!(out.len(), 3);
    let s5 = out
        .iter()
        .find(|f| f.record.request_model.as_deref() == Some("m2"))
        .unwrap();
    assert_eq!(s5.record.error_type, Some(ErrorType::UpstreamReset));
    assert!(out.iter().filter(|f| f.record.error_type.is_none()).count() == 2);
}

#[test]
fn a_client_reset_is_a_disconnect_and_keeps_the_first_token() {
    let mut c = three_streams();
    let pos = c.calls.iter().position(|x| x.0 >= 14).unwrap();
    c.calls.insert(
        pos,
        (14, Dir::In, frame(RST_STREAM, 0, 1, &8u32.to_be_bytes())),
    );
    let (_, out) = run(&c.events(false));
    let s1 = out
        .iter()
        .find(|f| f.record.request_model.as_deref() == Some("m0"))
        .unwrap();
    assert_eq!(s1.record.error_type, Some(ErrorType::ClientDisconnect));
    assert!(s1.record.ttft_s.is_some());
}

// ---- hostile input: each counted by reason, the connection dropped ----

fn hostile(after: Vec<u8>, dir: Dir) -> (Decoder, Vec<Finished>) {
    let c = Conv::start()
        .at(
            1,
            Dir::In,
            frame(HEADERS, END_HEADERS, 1, &chat_headers("x")),
        )
        .at(2, dir, after)
        // Later bytes are ignored, whatever they are.
        .at(
            3,
            Dir::In,
            frame(HEADERS, END_HEADERS, 3, &chat_headers("y")),
        );
    run(&c.events(false))
}

fn dropped(d: &Decoder, reason: &str) {
    assert_eq!(d.stats.http2_dropped.get(reason), Some(&1), "{:?}", d.stats);
    assert_eq!(d.stats.desyncs, 1);
    assert_eq!(d.buffered_bytes(), 0);
}

#[test]
fn malformed_frames_drop_the_connection() {
    let (d, out) = hostile(frame(DATA, frame::PADDED, 1, b"\x09abc"), Dir::In);
    dropped(&d, "frame_padding");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].record.error_type, Some(ErrorType::DecodeError));
}

#[test]
fn a_header_block_that_never_ends_is_dropped_at_the_head_limit() {
    let mut b = frame(HEADERS, 0, 3, &[0x82]);
    for _ in 0..5 {
        b.extend(frame(CONTINUATION, 0, 3, &[0u8; 16_000]));
    }
    let (d, _) = hostile(b, Dir::In);
    dropped(&d, "headers_too_large");
}

#[test]
fn a_table_size_update_beyond_settings_is_dropped() {
    // 0x3f e1 ff 03 = size update to 65,536 + 31 … past the 4,096 default.
    let block = [0x3f, 0xe1, 0xff, 0x03, 0x88];
    let (d, _) = hostile(frame(HEADERS, END_HEADERS, 1, &block), Dir::Out);
    dropped(&d, "hpack_size_update_too_large");
}

#[test]
fn a_huffman_string_that_does_not_decode_is_dropped() {
    // Literal name `x`, Huffman value of all-zero bits (not a code with
    // valid padding).
    let block = [0x00, 0x01, b'x', 0x82, 0x00, 0x00];
    let (d, _) = hostile(frame(HEADERS, END_HEADERS, 3, &block), Dir::In);
    dropped(&d, "hpack_huffman");
}

#[test]
fn a_4_gib_grpc_length_prefix_is_dropped() {
    let c = Conv::start()
        .at(
            1,
            Dir::In,
            frame(HEADERS, END_HEADERS, 1, &grpc_headers(STREAM_INFER)),
        )
        .at(
            2,
            Dir::In,
            frame(DATA, 0, 1, b"\0\xff\xff\xff\xff\x0a\x01x"),
        );
    let (d, _) = run(&c.events(false));
    dropped(&d, "grpc_length");
}

#[test]
fn a_reused_stream_id_is_dropped() {
    let mut b = frame(HEADERS, END_HEADERS | END_STREAM, 5, &chat_headers("a"));
    b.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &chat_headers("b"),
    ));
    let (d, _) = hostile(b, Dir::In);
    dropped(&d, "stream_reused");
}

#[test]
fn a_flood_of_streams_is_bounded() {
    let mut b = vec![];
    for i in 0..(super::MAX_STREAMS as u32 + 1) {
        b.extend(frame(HEADERS, END_HEADERS, 3 + 2 * i, &chat_headers("f")));
    }
    let (d, out) = hostile(b, Dir::In);
    dropped(&d, "too_many_streams");
    assert_eq!(out.len(), super::MAX_STREAMS);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Any bytes after a valid start: no panic, memory bounded.
    #[test]
    fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8), joined in any::<bool>()) {
        let mut c = if joined { Conv::default() } else { Conv::start() };
        for (i, ch) in chunks.into_iter().enumerate() {
            let dir = if i % 2 == 0 { Dir::In } else { Dir::Out };
            c = c.at(i as u64 + 1, dir, ch);
        }
        let evs = c.events(joined);
        let mut d = Decoder::new();
        let mut out = vec![];
        for e in &evs {
            d.on_event(e, &mut out);
            prop_assert!(d.buffered_bytes() < 1 << 20);
        }
    }
}

#[test]
fn an_upgrade_to_h2c_continues_the_request_as_stream_1() {
    let body = r#"{"model":"up","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut switch =
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n".to_vec();
    switch.extend(settings());
    let mut preface = HTTP2_PREFACE.to_vec();
    preface.extend(settings());
    let mut first = frame(HEADERS, END_HEADERS, 1, &ok_sse_headers());
    first.extend(frame(DATA, 0, 1, &sse("chatcmpl-up", "a")));
    let c = Conv::default()
        .at(0, Dir::In, req.into_bytes())
        .at(1, Dir::Out, switch)
        .at(2, Dir::In, preface)
        .at(30, Dir::Out, first)
        .at(40, Dir::Out, frame(DATA, 0, 1, &sse("chatcmpl-up", "b")))
        .at(
            41,
            Dir::Out,
            frame(DATA, END_STREAM, 1, &sse_usage("chatcmpl-up", 3, 2)),
        );
    let (d, out) = run(&c.events(false));
    assert_eq!(out.len(), 1, "{out:#?}");
    let r = &out[0].record;
    assert_eq!(r.protocol, Some("h2"));
    assert_eq!(r.request_model.as_deref(), Some("up"));
    assert_eq!(r.status, Some(200));
    assert_eq!(r.error_type, None);
    assert!((r.ttft_s.unwrap() - 0.030).abs() < 1e-9);
    assert_eq!(r.output_tokens, Some(2));
    assert_eq!(
        (d.stats.http2, d.stats.unsupported_protocol, d.stats.desyncs),
        (1, 0, 0)
    );
}

// ---- gRPC: vLLM and SGLang Generate ----

fn generate_request(id: &str, ids: Vec<u32>) -> Vec<u8> {
    proto::VllmGenerateRequest {
        request_id: id.into(),
        tokenized: Some(proto::TokenizedInput {
            original_text: "hello".into(),
            input_ids: ids,
        }),
        text: None,
        stream: true,
    }
    .encode_to_vec()
}

fn vllm_chunk(ids: Vec<u32>, completion: u32) -> Vec<u8> {
    proto::VllmGenerateResponse {
        response: Some(proto::VllmResponse::Chunk(proto::GenerateStreamChunk {
            token_ids: ids,
            prompt_tokens: 4,
            completion_tokens: completion,
            cached_tokens: 0,
        })),
    }
    .encode_to_vec()
}

fn vllm_complete(n: u32) -> Vec<u8> {
    proto::VllmGenerateResponse {
        response: Some(proto::VllmResponse::Complete(proto::VllmGenerateComplete {
            output_ids: (0..n).collect(),
            finish_reason: "length".into(),
            prompt_tokens: 4,
            completion_tokens: n,
            cached_tokens: 0,
        })),
    }
    .encode_to_vec()
}

fn sglang_complete(id: &str, n: u32) -> Vec<u8> {
    proto::SglangGenerateResponse {
        request_id: id.into(),
        response: Some(proto::SglangResponse::Complete(
            proto::VllmGenerateComplete {
                output_ids: (0..n).collect(),
                finish_reason: "length".into(),
                prompt_tokens: 4,
                completion_tokens: n,
                cached_tokens: 0,
            },
        )),
    }
    .encode_to_vec()
}

fn sglang_chunk(id: &str, ids: Vec<u32>, completion: u32) -> Vec<u8> {
    proto::SglangGenerateResponse {
        request_id: id.into(),
        response: Some(proto::SglangResponse::Chunk(proto::GenerateStreamChunk {
            token_ids: ids,
            prompt_tokens: 4,
            completion_tokens: completion,
            cached_tokens: 0,
        })),
    }
    .encode_to_vec()
}

/// A Generate call on stream 1: request at t=1, chunks of 1, 2 and 1
/// token ids at 10, 12, 14, the completion and trailers at 15.
fn generate_call(path: Option<&str>, sglang: bool) -> Conv {
    let block = match path {
        Some(p) => grpc_headers(p),
        // The path and content type were indexed before the agent joined.
        None => Block::default().idx(3).idx(6).idx(63).idx(62).bytes(),
    };
    let chunk = |ids: Vec<u32>, n: u32| {
        if sglang {
            sglang_chunk("g1", ids, n)
        } else {
            vllm_chunk(ids, n)
        }
    };
    let ok = Block::default().lit("grpc-status", "0").bytes();
    let start = if path.is_some() {
        Conv::start()
    } else {
        Conv::default()
    };
    start
        .at(1, Dir::In, frame(HEADERS, END_HEADERS, 3, &block))
        .at(
            1,
            Dir::In,
            frame(
                DATA,
                END_STREAM,
                3,
                &grpc(&generate_request("g1", vec![1, 2, 3, 4])),
            ),
        )
        .at(
            9,
            Dir::Out,
            frame(HEADERS, END_HEADERS, 3, &grpc_response_headers()),
        )
        .at(10, Dir::Out, frame(DATA, 0, 3, &grpc(&chunk(vec![7], 1))))
        .at(
            12,
            Dir::Out,
            frame(DATA, 0, 3, &grpc(&chunk(vec![8, 9], 3))),
        )
        .at(14, Dir::Out, frame(DATA, 0, 3, &grpc(&chunk(vec![10], 4))))
        .at(
            15,
            Dir::Out,
            frame(
                DATA,
                0,
                3,
                &grpc(&if sglang {
                    sglang_complete("g1", 4)
                } else {
                    vllm_complete(4)
                }),
            ),
        )
        .at(
            15,
            Dir::Out,
            frame(HEADERS, END_HEADERS | END_STREAM, 3, &ok),
        )
}

fn check_generate(out: &[Finished], provider: &str, path: &str) {
    assert_eq!(out.len(), 1, "{out:#?}");
    let r = &out[0].record;
    assert_eq!(r.provider.as_deref(), Some(provider));
    assert_eq!(r.path, path);
    assert_eq!(r.request_id.as_deref(), Some("g1"));
    assert_eq!(r.protocol, Some("grpc"));
    assert!(r.stream);
    assert!((r.ttft_s.unwrap() - 0.009).abs() < 1e-9, "{:?}", r.ttft_s);
    assert_eq!(r.input_tokens, Some(4));
    assert_eq!(r.output_tokens, Some(4));
    assert!(r.tokens_exact);
    assert_eq!(r.chunks, Some(4));
    assert!((r.tpot_s.unwrap() - 0.004 / 3.0).abs() < 1e-9);
    assert_eq!(r.finish_reason.as_deref(), Some("length"));
    assert_eq!(r.error_type, None);
}

const VLLM: &str = "/vllm.grpc.engine.VllmEngine/Generate";
const SGLANG: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";

#[test]
fn vllm_and_sglang_generate_count_token_ids_exactly() {
    let (_, out) = run(&generate_call(Some(VLLM), false).events(false));
    check_generate(&out, "vllm", VLLM);
    let (_, out) = run(&generate_call(Some(SGLANG), true).events(false));
    check_generate(&out, "sglang", SGLANG);
}

#[test]
fn a_generate_call_whose_path_is_unknown_is_told_vllm_or_sglang_by_its_response() {
    let (_, out) = run(&generate_call(None, false).events(true));
    check_generate(&out, "vllm", VLLM);
    let (_, out) = run(&generate_call(None, true).events(true));
    check_generate(&out, "sglang", SGLANG);
}

#[test]
fn gzip_messages_are_inflated_and_other_encodings_counted() {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&triton_request("z1", "llm")).unwrap();
    let packed = gz.finish().unwrap();
    let mut msg = vec![1u8];
    msg.extend_from_slice(&(packed.len() as u32).to_be_bytes());
    msg.extend_from_slice(&packed);
    let headers = |enc: &str| {
        Block::default()
            .idx(3)
            .idx(6)
            .lit(":path", "/inference.GRPCInferenceService/ModelInfer")
            .lit("content-type", "application/grpc")
            .lit("grpc-encoding", enc)
            .bytes()
    };
    let c = Conv::start()
        .at(1, Dir::In, frame(HEADERS, END_HEADERS, 1, &headers("gzip")))
        .at(1, Dir::In, frame(DATA, END_STREAM, 1, &msg))
        .at(
            2,
            Dir::In,
            frame(HEADERS, END_HEADERS, 3, &headers("snappy")),
        )
        .at(2, Dir::In, frame(DATA, END_STREAM, 3, &msg))
        .at(
            3,
            Dir::Out,
            frame(
                HEADERS,
                END_HEADERS | END_STREAM,
                1,
                &Block::default().idx(8).lit("grpc-status", "0").bytes(),
            ),
        )
        .at(
            3,
            Dir::Out,
            frame(
                HEADERS,
                END_HEADERS | END_STREAM,
                3,
                &Block::default().idx(8).lit("grpc-status", "0").bytes(),
            ),
        );
    let (d, out) = run(&c.events(false));
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].record.request_id.as_deref(), Some("z1"));
    assert_eq!(out[0].record.request_model.as_deref(), Some("llm"));
    assert_eq!(out[1].record.request_id, None, "snappy: not read");
    assert_eq!(d.stats.grpc.unsupported_compression, 1);
}

#[test]
fn a_client_goaway_does_not_end_the_clients_own_streams() {
    let mut c = three_streams();
    let pos = c.calls.iter().position(|x| x.0 >= 10).unwrap();
    let goaway = [0u8; 8]; // last stream 0, NO_ERROR: the client shuts down gracefully
    c.calls
        .insert(pos, (10, Dir::In, frame(GOAWAY, 0, 0, &goaway)));
    let (_, out) = run(&c.events(false));
    check_three(&out);
}

#[test]
fn late_frames_on_ended_streams_of_a_joined_connection_do_not_pile_up() {
    // Joined mid-way; 300 streams each reset by the client, then the
    // engine's queued DATA and the client's trailers on them: the
    // connection stays decoded and a later request is recorded.
    let mut c = Conv::default();
    for i in 0..300u32 {
        let id = 1001 + 2 * i;
        let ms = u64::from(i);
        c = c
            .at(
                ms,
                Dir::In,
                frame(HEADERS, END_HEADERS, id, &chat_headers("r")),
            )
            .at(ms, Dir::In, frame(RST_STREAM, 0, id, &8u32.to_be_bytes()))
            .at(ms, Dir::Out, frame(DATA, 0, id, &grpc(b"\x0a\x01x")))
            .at(
                ms,
                Dir::In,
                frame(
                    HEADERS,
                    END_HEADERS | END_STREAM,
                    id,
                    &Block::default().lit("x-t", "1").bytes(),
                ),
            );
    }
    let body = r#"{"model":"after","stream":true,"messages":[]}"#;
    let mut req = frame(HEADERS, END_HEADERS, 2001, &chat_headers("z"));
    req.extend(frame(DATA, END_STREAM, 2001, body.as_bytes()));
    let mut resp = frame(HEADERS, END_HEADERS, 2001, &ok_sse_headers());
    resp.extend(frame(
        DATA,
        END_STREAM,
        2001,
        &sse_usage("chatcmpl-z", 1, 0),
    ));
    c = c.at(400, Dir::In, req).at(401, Dir::Out, resp);
    let (d, out) = run(&c.events(true));
    assert_eq!(d.stats.desyncs, 0, "{:?}", d.stats);
    assert_eq!(out.len(), 301);
    assert_eq!(out[300].record.request_model.as_deref(), Some("after"));
    assert!(d.buffered_bytes() < 64 << 10);
}

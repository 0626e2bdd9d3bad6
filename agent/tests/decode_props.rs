//! Property and hostile-input tests of the decoder (pure; no root).
//!
//! Random conversations (keep-alive sequences of streamed and non-streamed
//! requests in several engine formats, random chunk counts and gaps, usage
//! on or off, multi-byte UTF-8 content) must decode to the records the
//! generator knows are true, and to the *same* records however the byte
//! stream is cut into events: inside `data:` lines, chunk-size lines,
//! UTF-8 sequences, heads.

use proptest::prelude::*;
use tokentap::{
    decode::{Decoder, MAX_HEAD_BYTES},
    event::{CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent},
    record::RequestRecord,
};

const T0: u64 = 1_800_000_000_000_000_000;

#[derive(Clone, Debug)]
enum Kind {
    ChatSse { usage: bool },
    OllamaNdjson,
    NonStream,
}

#[derive(Clone, Debug)]
struct Spec {
    kind: Kind,
    /// Gaps (µs) before each content chunk; the first is the TTFT.
    gaps_us: Vec<u64>,
    words: Vec<String>,
    chunked: bool,
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("hello".to_string()),
        Just(" é".to_string()),
        Just("日本".to_string()),
        Just("🦀!".to_string()),
        Just(" \\\"q\\\"".to_string()),
        "[a-z]{1,6}",
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![
            any::<bool>().prop_map(|usage| Kind::ChatSse { usage }),
            Just(Kind::OllamaNdjson),
            Just(Kind::NonStream)
        ],
        prop::collection::vec(1u64..50_000, 1..12),
        prop::collection::vec(word(), 12),
        any::<bool>(),
    )
        .prop_map(|(kind, gaps_us, words, chunked)| Spec {
            kind,
            gaps_us,
            words,
            chunked,
        })
}

struct Built {
    events: Vec<SocketEvent>,
    truth: Vec<Truth>,
}

struct Truth {
    /// Index in `Built::events` of the request's (only) inbound event.
    request_event: usize,
    /// Index of the event that completes its response.
    last_event: usize,
    ttft_ns: Option<u64>,
    chunks: Option<u64>,
    output_tokens: Option<u64>,
    duration_ns: u64,
}

fn data(ts: u64, dir: Dir, bytes: Vec<u8>) -> SocketEvent {
    SocketEvent::Data(DataEvent {
        ts_ns: ts,
        pid: 7,
        tid: 7,
        fd: 3,
        dir,
        ret: bytes.len() as i64,
        data: bytes,
        syscall: None,
    })
}

/// A streamed chat request (`model: m`) read by the engine at `ts`.
fn streamed_chat_request(ts: u64) -> SocketEvent {
    let req = r#"{"model":"m","stream":true}"#;
    data(
        ts,
        Dir::In,
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{req}",
            req.len()
        )
        .into_bytes(),
    )
}

fn frame(chunked: bool, s: &str) -> Vec<u8> {
    if chunked {
        format!("{:x}\r\n{s}\r\n", s.len()).into_bytes()
    } else {
        s.as_bytes().to_vec()
    }
}

fn build(specs: &[Spec]) -> Built {
    let mut events = vec![SocketEvent::Open(OpenEvent {
        ts_ns: T0,
        pid: 7,
        fd: 3,
        role: Role::Server,
        local: Some("127.0.0.1:8000".parse().unwrap()),
        peer: Some("127.0.0.1:40000".parse().unwrap()),
        joined: false,
    })];
    let mut truth = vec![];
    let mut t = T0 + 1_000;
    for s in specs {
        let t0 = t;
        let (path, body) = match s.kind {
            Kind::OllamaNdjson => (
                "/api/chat",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_string(),
            ),
            Kind::ChatSse { usage } => (
                "/v1/chat/completions",
                format!(
                    r#"{{"model":"m","stream":true,"stream_options":{{"include_usage":{usage}}},"messages":[{{"role":"user","content":"hi"}}]}}"#
                ),
            ),
            Kind::NonStream => (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_string(),
            ),
        };
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let request_event = events.len();
        events.push(data(t, Dir::In, req.into_bytes()));
        t += 500;
        let n = s.gaps_us.len() as u64;
        match s.kind {
            Kind::NonStream => {
                let text: String = s.words.iter().take(n as usize).cloned().collect();
                let b = format!(
                    r#"{{"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":{n}}}}}"#
                );
                t += s.gaps_us.iter().sum::<u64>() * 1000;
                let head = if s.chunked {
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_string()
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        b.len()
                    )
                };
                let mut bytes = head.into_bytes();
                bytes.extend(frame(s.chunked, &b));
                if s.chunked {
                    bytes.extend(b"0\r\n\r\n");
                }
                events.push(data(t, Dir::Out, bytes));
                truth.push(Truth {
                    request_event,
                    last_event: events.len() - 1,
                    ttft_ns: None,
                    chunks: None,
                    output_tokens: Some(n),
                    duration_ns: t - t0,
                });
            }
            Kind::ChatSse { .. } | Kind::OllamaNdjson => {
                let sse = matches!(s.kind, Kind::ChatSse { .. });
                let ctype = if sse {
                    "text/event-stream"
                } else {
                    "application/x-ndjson"
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n\r\n"
                );
                events.push(data(t, Dir::Out, head.into_bytes()));
                if sse {
                    events.push(data(
                        t,
                        Dir::Out,
                        frame(
                            true,
                            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
                        ),
                    ));
                }
                let mut first = None;
                for (i, g) in s.gaps_us.iter().enumerate() {
                    t += g * 1000;
                    first.get_or_insert(t);
                    let w = &s.words[i % s.words.len()];
                    let ev = if sse {
                        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w}\"}}}}]}}\n\n")
                    } else {
                        format!("{{\"model\":\"m\",\"message\":{{\"role\":\"assistant\",\"content\":\"{w}\"}},\"done\":false}}\n")
                    };
                    events.push(data(t, Dir::Out, frame(true, &ev)));
                }
                t += 100;
                let (tail, out_tokens) = match s.kind {
                    Kind::ChatSse { usage: true } => (
                        format!(
                            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
                            n + 1
                        ),
                        n + 1,
                    ),
                    Kind::ChatSse { usage: false } => ("data: [DONE]\n\n".to_string(), n),
                    _ => (
                        format!(
                            "{{\"model\":\"m\",\"message\":{{\"role\":\"assistant\",\"content\":\"\"}},\"done\":true,\"prompt_eval_count\":3,\"eval_count\":{n}}}\n"
                        ),
                        n,
                    ),
                };
                let mut bytes = frame(true, &tail);
                bytes.extend(b"0\r\n\r\n");
                events.push(data(t, Dir::Out, bytes));
                truth.push(Truth {
                    request_event,
                    last_event: events.len() - 1,
                    ttft_ns: first.map(|f| f - t0),
                    chunks: Some(n),
                    output_tokens: Some(out_tokens),
                    duration_ns: t - t0,
                });
            }
        }
        t += 1_000;
    }
    events.push(SocketEvent::Close(CloseEvent {
        ts_ns: t,
        pid: 7,
        fd: 3,
    }));
    Built { events, truth }
}

fn decode(events: &[SocketEvent]) -> (Vec<RequestRecord>, Decoder) {
    let mut d = Decoder::new();
    let mut out = vec![];
    for e in events {
        d.on_event(e, &mut out);
    }
    d.finish(&mut out);
    (out.into_iter().map(|f| f.record).collect(), d)
}

/// Cut every data event at three of the given fractions (same timestamp
/// for all pieces).
fn resplit(events: &[SocketEvent], cuts: &[f64]) -> Vec<SocketEvent> {
    let mut out = vec![];
    let mut k = 0usize;
    for e in events {
        match e {
            SocketEvent::Data(d) if d.data.len() > 1 => {
                let mut at = vec![];
                for _ in 0..3 {
                    let c = cuts[k % cuts.len()];
                    k += 1;
                    at.push(((d.data.len() as f64) * c) as usize);
                }
                at.sort_unstable();
                at.dedup();
                let mut last = 0;
                for p in at.into_iter().chain(std::iter::once(d.data.len())) {
                    if p <= last {
                        continue;
                    }
                    let mut piece = d.clone();
                    piece.data = d.data[last..p].to_vec();
                    piece.ret = piece.data.len() as i64;
                    out.push(SocketEvent::Data(piece));
                    last = p;
                }
            }
            other => out.push(other.clone()),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn records_match_the_generated_truth_and_ignore_event_boundaries(
        specs in prop::collection::vec(spec(), 1..5),
        cuts in prop::collection::vec(0.0f64..1.0, 1..16),
    ) {
        let built = build(&specs);
        let (whole, _) = decode(&built.events);
        prop_assert_eq!(whole.len(), built.truth.len());
        for (r, t) in whole.iter().zip(&built.truth) {
            prop_assert_eq!(r.error_type, None);
            prop_assert_eq!(r.chunks, t.chunks);
            prop_assert_eq!(r.output_tokens, t.output_tokens);
            prop_assert_eq!(r.ttft_s, t.ttft_ns.map(|n| n as f64 / 1e9));
            prop_assert!((r.duration_s.unwrap() - t.duration_ns as f64 / 1e9).abs() < 1e-9);
        }
        let (split, _) = decode(&resplit(&built.events, &cuts));
        prop_assert_eq!(split, whole);
    }

    #[test]
    fn garbage_never_panics_and_memory_stays_bounded(
        chunks in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..2048)), 0..64),
    ) {
        let mut d = Decoder::new();
        let mut out = vec![];
        for (i, (inbound, bytes)) in chunks.into_iter().enumerate() {
            let dir = if inbound { Dir::In } else { Dir::Out };
            d.on_event(&data(T0 + i as u64, dir, bytes), &mut out);
            prop_assert!(d.buffered_bytes() <= 8 << 20);
        }
        d.finish(&mut out);
    }

    #[test]
    fn a_conversation_cut_by_the_engine_closing_keeps_what_finished_and_resets_the_rest(
        specs in prop::collection::vec(spec(), 1..3),
        stop_at in 0.0f64..1.0,
    ) {
        let built = build(&specs);
        let (whole, _) = decode(&built.events);
        let n = ((built.events.len() as f64) * stop_at) as usize;
        let mut evs: Vec<SocketEvent> = built.events[..n].to_vec();
        evs.push(SocketEvent::Close(CloseEvent { ts_ns: T0 + 10_000_000_000, pid: 7, fd: 3 }));
        let (recs, _) = decode(&evs);
        // One record per request the engine had read before it closed; none
        // for requests it never saw.
        let started: Vec<usize> = (0..built.truth.len())
            .filter(|&i| built.truth[i].request_event < n)
            .collect();
        prop_assert_eq!(recs.len(), started.len());
        for (r, &i) in recs.iter().zip(&started) {
            if built.truth[i].last_event < n {
                // Its response was complete before the close: exactly the
                // record of the uncut conversation, a success.
                prop_assert_eq!(r.error_type, None);
                prop_assert_eq!(r, &whole[i]);
            } else {
                // Cut off mid-response (or before it began): never a
                // success.
                prop_assert_eq!(r.error_type.map(|e| e.as_str()), Some("upstream_reset"));
            }
        }
    }
}

#[test]
fn a_one_mebibyte_header_line_is_refused_with_bounded_memory() {
    let mut d = Decoder::new();
    let mut out = vec![];
    d.on_event(
        &data(T0, Dir::In, b"GET /x HTTP/1.1\r\nX-Big: ".to_vec()),
        &mut out,
    );
    for i in 0..16 {
        d.on_event(&data(T0 + i, Dir::In, vec![b'a'; 64 * 1024]), &mut out);
        assert!(d.buffered_bytes() <= 2 * MAX_HEAD_BYTES + 1024);
    }
    assert!(out.is_empty());
    assert_eq!(d.stats.desyncs, 1);
}

#[test]
fn a_response_without_a_request_yields_nothing() {
    let response = || {
        data(
            T0,
            Dir::Out,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi".to_vec(),
        )
    };
    // On a connection seen accepted: an orphan response.
    let mut d = Decoder::new();
    let mut out = vec![];
    d.on_event(&build(&[]).events[0], &mut out);
    d.on_event(&response(), &mut out);
    d.finish(&mut out);
    assert!(out.is_empty());
    assert_eq!(d.stats.orphan_responses, 1);
    // On one known only by its data (open before the agent): joined
    // mid-way, skipped up to its next request, no error of any kind.
    let mut d = Decoder::new();
    d.on_event(&response(), &mut out);
    d.finish(&mut out);
    assert!(out.is_empty());
    assert_eq!(
        (d.stats.orphan_responses, d.stats.desyncs, d.stats.joined),
        (0, 0, 1)
    );
}

#[test]
fn a_truncated_request_body_still_yields_a_record_with_what_its_head_said() {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(300_000)
    );
    let wire = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut ev = match data(T0, Dir::In, wire.into_bytes()) {
        SocketEvent::Data(d) => d,
        _ => unreachable!(),
    };
    ev.data.truncate(100_000); // the capture kept only the first 100 kB
    let mut d = Decoder::new();
    let mut out = vec![];
    d.on_event(&SocketEvent::Data(ev), &mut out);
    let resp = r#"{"model":"m","choices":[{"message":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":75000,"completion_tokens":1}}"#;
    d.on_event(
        &data(
            T0 + 1_000_000,
            Dir::Out,
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{resp}",
                resp.len()
            )
            .into_bytes(),
        ),
        &mut out,
    );
    assert_eq!(out.len(), 1);
    // The model came before the cut; the prompt's length did not finish.
    assert_eq!(out[0].request_model.as_deref(), Some("m"));
    assert_eq!(out[0].input_tokens, Some(75000));
    assert_eq!(out[0].error_type, None);
    assert_eq!(d.stats.truncated_calls, 1);
}

#[test]
fn a_connection_closed_mid_chunk_is_an_upstream_reset() {
    let mut d = Decoder::new();
    let mut out = vec![];
    d.on_event(&streamed_chat_request(T0), &mut out);
    d.on_event(
        &data(
            T0 + 10,
            Dir::Out,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n40\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n".to_vec(),
        ),
        &mut out,
    );
    d.on_event(
        &SocketEvent::Close(CloseEvent {
            ts_ns: T0 + 20,
            pid: 7,
            fd: 3,
        }),
        &mut out,
    );
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].error_type.map(|e| e.as_str()),
        Some("upstream_reset")
    );
    assert_eq!(out[0].status, Some(200));
}

#[test]
fn invalid_json_events_are_not_content_for_known_formats() {
    let mut d = Decoder::new();
    let mut out = vec![];
    d.on_event(&streamed_chat_request(T0), &mut out);
    let body: &[u8] = b"data: {not json\n\ndata: \xff\xfe\x00\x01\n\n";
    let mut resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    resp.extend_from_slice(body);
    d.on_event(&data(T0 + 10, Dir::Out, resp), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].chunks, Some(0));
    assert_eq!(out[0].ttft_s, None);
    assert_eq!(out[0].output_tokens, None);
}

/// uvicorn (llama-cpp-python) writes the chunked body's last chunk after
/// `data: [DONE]`, and the openai SDK closes the connection as soon as it
/// reads `[DONE]`: the engine then reads EOF with the HTTP response still
/// open. The client got its whole answer: not a disconnect.
#[test]
fn a_client_that_hangs_up_after_done_got_its_answer() {
    for after_done in [true, false] {
        let mut d = Decoder::new();
        let mut out = vec![];
        d.on_event(&streamed_chat_request(T0), &mut out);
        let ev =
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n";
        d.on_event(
            &data(
                T0 + 10,
                Dir::Out,
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{ev}\r\n",
                    ev.len()
                )
                .into_bytes(),
            ),
            &mut out,
        );
        if after_done {
            d.on_event(
                &data(T0 + 20, Dir::Out, b"e\r\ndata: [DONE]\n\n\r\n".to_vec()),
                &mut out,
            );
        }
        d.on_event(&data(T0 + 30, Dir::In, vec![]), &mut out);
        assert_eq!(out.len(), 1);
        let want = if after_done {
            None
        } else {
            Some("client_disconnect")
        };
        assert_eq!(
            out[0].error_type.map(|e| e.as_str()),
            want,
            "after_done={after_done}"
        );
        // The first token was written either way: TTFT is kept (the
        // outcome is in error_type).
        assert_eq!(out[0].ttft_s, Some(10e-9));
    }
}

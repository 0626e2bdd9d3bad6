//! A simulated OpenAI-compatible engine over HTTP/2 cleartext (h2c, prior
//! knowledge) on the `h2` crate — the HTTP/2 stack under hyper and axum,
//! which Rust routers such as TGI's are built on. Each stream's JSON body
//! says how to answer in a `sim` object (`ttft_ms`, `gap_ms`, `tokens`,
//! `prompt_tokens`), as simengine's do; the answer is an SSE stream of
//! `tokens` content chunks, a usage chunk and `[DONE]`, many streams at
//! once on one connection.
//!
//! `--truth PATH` appends one JSON line per stream with the engine's own
//! wall clock: `recv` (the request's body complete in the handler — after
//! the bytes reached the socket, so never before the agent's arrival),
//! `first`/`last` (right after the first/last content chunk was queued —
//! before its write, so never after the agent's), the model and the token
//! count.
//!
//! Usage: h2engine [--port N] [--addr IP] [--truth PATH]; prints
//! `listening PORT`.

use std::{io::Write, sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{json, Value};
use tokentap_tests::now_ns;

fn opt(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("h2engine: a simulated OpenAI-compatible engine over h2c.\n\nUsage: h2engine [--port N] [--addr IP] [--truth PATH]");
        return;
    }
    let port: u16 = opt(&args, "--port")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let addr = opt(&args, "--addr").unwrap_or_else(|| "127.0.0.1".into());
    let truth = opt(&args, "--truth").map(|p| {
        Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .expect("open the truth file"),
        ))
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((addr.as_str(), port))
            .await
            .expect("bind");
        println!("listening {}", listener.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let truth = truth.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(sock).await else {
                    return;
                };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(answer(req, respond, truth.clone()));
                }
            });
        }
    });
}

type Truth = Option<Arc<std::sync::Mutex<std::fs::File>>>;

async fn answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    truth: Truth,
) {
    let (head, mut body) = req.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return };
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let recv = now_ns();
    if head.method != http::Method::POST || head.uri.path() != "/v1/chat/completions" {
        let resp = http::Response::builder().status(404).body(()).unwrap();
        let _ = respond.send_response(resp, true);
        return;
    }
    let v: Value = serde_json::from_slice(&data).unwrap_or(Value::Null);
    let sim = &v["sim"];
    let ms = |k: &str, d: u64| sim[k].as_u64().unwrap_or(d);
    let (ttft, gap, tokens, prompt) = (
        ms("ttft_ms", 20),
        ms("gap_ms", 5),
        ms("tokens", 6),
        ms("prompt_tokens", 7),
    );
    let model = v["model"].as_str().unwrap_or("h2-sim").to_string();
    let resp = http::Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(resp, false) else {
        return;
    };
    tokio::time::sleep(Duration::from_millis(ttft)).await;
    let (mut first, mut last) = (0, 0);
    for i in 0..tokens {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(gap)).await;
        }
        let c = json!({"id":"h2","object":"chat.completion.chunk","model":model,
            "choices":[{"index":0,"delta":{"content":format!("t{i} ")},"finish_reason":null}]});
        if send
            .send_data(Bytes::from(format!("data: {c}\n\n")), false)
            .is_err()
        {
            return;
        }
        last = now_ns();
        if i == 0 {
            first = last;
        }
    }
    let fin = json!({"id":"h2","object":"chat.completion.chunk","model":model,
        "choices":[{"index":0,"delta":{},"finish_reason":"stop"}],
        "usage":{"prompt_tokens":prompt,"completion_tokens":tokens,"total_tokens":prompt+tokens}});
    let _ = send.send_data(
        Bytes::from(format!("data: {fin}\n\ndata: [DONE]\n\n")),
        true,
    );
    if let Some(t) = truth {
        let line =
            json!({"model": model, "recv": recv, "first": first, "last": last, "tokens": tokens});
        let mut f = t.lock().unwrap();
        let _ = writeln!(f, "{line}");
    }
}

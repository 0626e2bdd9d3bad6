//! `--health-addr`: the agent's liveness and readiness over HTTP, for
//! Kubernetes probes.
//!
//! - `GET /healthz` — 200 while the main loop runs (it beats at every pass
//!   and tick); 503 when it has not for [`STALL`].
//! - `GET /readyz` — 200 once the eBPF programs are attached; 503 with a
//!   one-line reason before, and when attaching failed.
//!
//! Owns: the listener and the two answers. Must not: do anything that
//! could block the main loop (it only reads [`Health`] atomics).

use std::{
    net::SocketAddr,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use crate::stage::health::{uptime_ms, Health};

/// A main loop silent this long is reported dead (the loop ticks at least
/// every second; a GPU or scrape stall does not block it).
pub const STALL: Duration = Duration::from_secs(30);
/// A request head larger than this, or slower than [`READ_TIMEOUT`], is
/// answered 400 / dropped.
const MAX_HEAD: usize = 4096;
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Binds `addr` now (a taken port fails the start) and serves probes on
/// the current tokio runtime until the process ends.
pub async fn serve(addr: SocketAddr, health: Arc<Health>) -> Result<SocketAddr> {
    health.beat();
    let l = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--health-addr {addr}: cannot listen"))?;
    let local = l.local_addr()?;
    tokio::spawn(async move {
        loop {
            match l.accept().await {
                Ok((s, _)) => {
                    let h = health.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(READ_TIMEOUT, answer(s, &h)).await;
                    });
                }
                // Out of descriptors and the like: wait, do not spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Ok(local)
}

async fn answer(mut s: TcpStream, h: &Health) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > MAX_HEAD {
            return reply(&mut s, 400, "request head too large", false).await;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let (method, path) = match req.parse(&buf) {
        Ok(httparse::Status::Complete(_)) => (req.method.unwrap_or(""), req.path.unwrap_or("")),
        _ => return reply(&mut s, 400, "not an HTTP/1.x request", false).await,
    };
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return reply(&mut s, 405, "only GET and HEAD", head_only).await;
    }
    let (code, body) = status(path.split('?').next().unwrap_or(""), h, uptime_ms());
    reply(&mut s, code, &body, head_only).await
}

/// The answer to a probe path at `now_ms` (agent uptime).
fn status(path: &str, h: &Health, now_ms: u64) -> (u16, String) {
    match path {
        "/healthz" => {
            let silent_ms = now_ms.saturating_sub(h.heartbeat_ms.load(Relaxed));
            if silent_ms <= STALL.as_millis() as u64 {
                (200, "ok".into())
            } else {
                (
                    503,
                    format!("main loop silent for {:.0} s", silent_ms as f64 / 1e3),
                )
            }
        }
        "/readyz" => {
            if h.attached.load(Relaxed) {
                (200, "ready: eBPF programs attached".into())
            } else {
                let why = h.not_ready.lock().unwrap_or_else(|p| p.into_inner());
                let why = if why.is_empty() {
                    "attaching eBPF programs"
                } else {
                    why.as_str()
                };
                (503, format!("not ready: {why}"))
            }
        }
        _ => (404, "not found (try /healthz or /readyz)".into()),
    }
}

async fn reply(s: &mut TcpStream, code: u16, body: &str, head_only: bool) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    // One line: a reason that spans lines (an error chain) is joined.
    let body = body.replace('\n', " ");
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len() + 1
    );
    if !head_only {
        out.push_str(&body);
        out.push('\n');
    }
    s.write_all(out.as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn readyz_is_503_with_the_reason_until_attached_and_healthz_follows_the_heartbeat() {
        let h = Arc::new(Health::default());
        let addr = serve("127.0.0.1:0".parse().unwrap(), h.clone())
            .await
            .unwrap();
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.ends_with("not ready: attaching eBPF programs\n"), "{r}");
        h.set_ready(Err(
            "cannot load eBPF programs: Operation not permitted\n(needs CAP_BPF)".into(),
        ));
        let r = get(addr, "/readyz").await;
        assert!(r.contains("503") && r.contains("Operation not permitted (needs CAP_BPF)"));
        h.set_ready(Ok(()));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_silent_main_loop_is_reported_with_how_long() {
        let h = Health::default();
        h.heartbeat_ms.store(1_000, Relaxed);
        assert_eq!(status("/healthz", &h, 1_000 + 29_000).0, 200);
        let (code, body) = status("/healthz", &h, 1_000 + 35_000);
        assert_eq!(code, 503);
        assert_eq!(body, "main loop silent for 35 s");
    }
}

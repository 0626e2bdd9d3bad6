#!/usr/bin/env python3
"""An OpenAI-style chat completions endpoint as a plain ASGI app (no
framework), served by Hypercorn over cleartext HTTP/2 with prior knowledge
(h2c: the client starts with the HTTP/2 preface on a plain TCP connection;
Hypercorn's HTTP/1.1 parser sees `PRI * HTTP/2.0` and switches to h2).

  python h2_app.py --port P [--host 127.0.0.1] [--log FILE]
      runs Hypercorn on it (one process, asyncio) and prints `READY <port>`
      once the socket listens (`--port 0` picks a free port); SIGTERM/SIGINT
      stop it gracefully
  python -m hypercorn h2_app:app --bind 127.0.0.1:P
      the same app under Hypercorn's own CLI (then mind its 5 s keep-alive
      timeout, which closes idle HTTP/2 connections; the launcher sets 1 h)

Routes
  GET  /health                 200 text/plain "ok"
  POST /v1/chat/completions    body: an OpenAI chat request plus extra fields
                               tokens (default 5), ttft_ms (20), gap_ms (10),
                               role_chunk (true)
    stream: true  -> 200 text/event-stream, events `data: <json>\\n\\n`:
        role chunk   delta {"role":"assistant","content":""}, sent at once
                     (unless role_chunk is false)
        token k      delta {"content":"tok<k> "}, at arrival + ttft + k*gap
        finish       delta {}, finish_reason "stop", right after the last token
        usage        choices [], usage {prompt_tokens, completion_tokens:
                     tokens, total_tokens}, only with stream_options.include_usage
        done         data: [DONE]
    stream: false -> 200 application/json chat.completion (content "tok0 tok1 ...",
                     usage), at arrival + ttft + (tokens-1)*gap
  The response id is "chatcmpl-<seq>" (seq counts requests from 1 in this
  process); `model` is echoed (clients put a unique tag there).
  Deadlines are absolute (arrival + ttft + k*gap).

Ground-truth log (env H2_APP_LOG or --log; JSON Lines, one flushed write
per line, CLOCK_REALTIME ns from time.time_ns()):
  {"ev":"recv","id":"chatcmpl-N","model":M,"stream":B,"http_version":"2",
   "peer":"127.0.0.1:PORT","t_ns":T}          request body fully read
  {"ev":"headers","id":...,"status":200,"peer":...,"t_ns":T}
                                              right before http.response.start
  {"ev":"send","id":...,"k":K,"kind":KIND,"final":B,"peer":...,"t_ns":T}
      right before `await send(...)` of each body chunk; KIND is role,
      token (K = 0..tokens-1), finish, usage, done, or json (non-streamed,
      K = 0); final is true on the last body chunk of the response
`peer` is the client's address and port (ASGI scope["client"]), so the log
tells which requests shared a TCP connection; `http_version` is Hypercorn's
("2" for h2/h2c).
"""
import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import threading
import time

_seq = itertools.count(1)


class Log:
    def __init__(self, path):
        self._f = open(path, "a", buffering=1) if path else None
        self._lock = threading.Lock()

    def write(self, **rec):
        if self._f is None:
            return
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()


LOG = Log(os.environ.get("H2_APP_LOG"))


async def read_body(receive):
    body = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        body += msg.get("body", b"")
        if not msg.get("more_body", False):
            return bytes(body)


async def sleep_until(deadline):
    left = deadline - time.monotonic()
    if left > 0:
        await asyncio.sleep(left)


def chunk(rid, model, created, delta=None, finish=None, usage=None):
    c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
         "choices": [] if usage else [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage:
        c["usage"] = usage
    return b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"


async def respond(send, status, ctype, body):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def chat(scope, receive, send, body, peer):
    t_recv = time.monotonic()
    rid = f"chatcmpl-{next(_seq)}"
    try:
        req = json.loads(body)
    except ValueError:
        await respond(send, 400, b"application/json", b'{"error":{"message":"invalid JSON"}}')
        return
    model = str(req.get("model", ""))
    stream = bool(req.get("stream", False))
    tokens = max(0, int(req.get("tokens", 5)))
    ttft = float(req.get("ttft_ms", 20)) / 1000
    gap = float(req.get("gap_ms", 10)) / 1000
    include_usage = bool((req.get("stream_options") or {}).get("include_usage", False))
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", []))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
    created = int(time.time())
    LOG.write(ev="recv", id=rid, model=model, stream=stream, http_version=scope.get("http_version"), peer=peer,
              t_ns=time.time_ns())

    if not stream:
        await sleep_until(t_recv + ttft + max(0, tokens - 1) * gap)
        out = {"id": rid, "object": "chat.completion", "created": created, "model": model,
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "".join(f"tok{k} " for k in range(tokens))}}],
               "usage": usage}
        data = json.dumps(out, separators=(",", ":")).encode()
        LOG.write(ev="headers", id=rid, status=200, peer=peer, t_ns=time.time_ns())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        LOG.write(ev="send", id=rid, k=0, kind="json", final=True, peer=peer, t_ns=time.time_ns())
        await send({"type": "http.response.body", "body": data})
        return

    # (kind, k, deadline or None for "right away", bytes)
    events = []
    if req.get("role_chunk", True):
        events.append(("role", 0, None, chunk(rid, model, created, {"role": "assistant", "content": ""})))
    for k in range(tokens):
        events.append(("token", k, t_recv + ttft + k * gap, chunk(rid, model, created, {"content": f"tok{k} "})))
    events.append(("finish", 0, t_recv + ttft if tokens == 0 else None, chunk(rid, model, created, {}, "stop")))
    if include_usage:
        events.append(("usage", 0, None, chunk(rid, model, created, usage=usage)))
    events.append(("done", 0, None, b"data: [DONE]\n\n"))

    LOG.write(ev="headers", id=rid, status=200, peer=peer, t_ns=time.time_ns())
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    for i, (kind, k, deadline, data) in enumerate(events):
        if deadline is not None:
            await sleep_until(deadline)
        last = i == len(events) - 1
        LOG.write(ev="send", id=rid, k=k, kind=kind, final=last, peer=peer, t_ns=time.time_ns())
        await send({"type": "http.response.body", "body": data, "more_body": not last})


async def app(scope, receive, send):
    """The ASGI application."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    client = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else None
    body = await read_body(receive)
    if body is None:
        return
    path, method = scope["path"], scope["method"]
    if path == "/health" and method == "GET":
        await respond(send, 200, b"text/plain", b"ok")
    elif path == "/v1/chat/completions" and method == "POST":
        await chat(scope, receive, send, body, peer)
    else:
        await respond(send, 404, b"application/json", b'{"error":{"message":"not found"}}')


def main():
    global LOG
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="TCP port (0: any free one; printed as READY <port>)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log", help="ground-truth JSON Lines log (appended; overrides H2_APP_LOG)")
    a = ap.parse_args()
    if a.log:
        LOG = Log(a.log)

    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    # Bind here, so READY is printed only once connections are accepted
    # (queued in the backlog until Hypercorn's loop takes them).
    sock = socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((a.host, a.port))
    sock.listen(128)
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.keep_alive_timeout = 3600  # an idle h2 connection stays open (hold modes)
    config.graceful_timeout = 1
    config.accesslog = None
    config.errorlog = "-"

    async def run():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"READY {sock.getsockname()[1]}", flush=True)
        await serve(app, config, shutdown_trigger=stop.wait)

    asyncio.run(run())


if __name__ == "__main__":
    main()

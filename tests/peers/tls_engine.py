#!/usr/bin/env python3
"""A simulated OpenAI-compatible engine as a plain ASGI app, for servers
such as uvicorn (`uvicorn tls_engine:app --ssl-keyfile ... --ssl-certfile
...`: asyncio's TLS, OpenSSL driven through memory BIOs). It streams on a
known schedule and writes down what it did, so a test knows exactly what
tokentap should report:

  POST /v1/chat/completions, /v1/completions   (stream or not,
      stream_options.include_usage honoured)
  GET  /health                                  a probe: {"status":"ok"}

Schedule: the first token FIRST_MS after the request body was read, then
one every GAP_MS until `max_tokens` (default 8) tokens. Prompt tokens are
the prompt's whitespace-separated words.

Log (TLS_ENGINE_LOG, JSON Lines, one object per LLM request):
  tag          the request's `model`
  recv_ns      CLOCK_REALTIME when the app had the whole request
  first_ns     just before the first content chunk was handed to the server
  first_sent_ns  just after the server took it (uvicorn writes to the socket
               before `send` returns, unless the socket is full): the moment
               its bytes left lies between the two
  last_ns      just before the last content chunk was handed to the server
  prompt_tokens, completion_tokens
"""
import asyncio
import json
import os
import time

FIRST_MS = float(os.environ.get("TLS_ENGINE_FIRST_MS", "15"))
GAP_MS = float(os.environ.get("TLS_ENGINE_GAP_MS", "4"))
LOG = os.environ.get("TLS_ENGINE_LOG")
_log = open(LOG, "a", buffering=1) if LOG else None


def _words(body):
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    return len(text.split())


async def _read_body(receive):
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            return body


async def _send_json(send, status, obj):
    data = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _chunk(chat, tag, i, text, finish=None):
    if chat:
        choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
        return {"id": f"cmpl-{tag}", "object": "chat.completion.chunk", "created": 0, "model": tag,
                "choices": [choice]}
    return {"id": f"cmpl-{tag}", "object": "text_completion", "created": 0, "model": tag,
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if scope["method"] == "GET" and path == "/health":
        await _send_json(send, 200, {"status": "ok"})
        return
    if scope["method"] != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
        await _send_json(send, 404, {"error": "not found"})
        return
    body = json.loads(await _read_body(receive) or b"{}")
    recv_ns = time.time_ns()
    chat = path.endswith("chat/completions")
    tag = body.get("model", "")
    n = int(body.get("max_tokens") or 8)
    prompt = _words(body)
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    start = time.monotonic()
    rec = {"tag": tag, "recv_ns": recv_ns, "prompt_tokens": prompt, "completion_tokens": n}

    async def at(k):  # waits until token k's time on the schedule
        due = start + (FIRST_MS + k * GAP_MS) / 1000
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    if not body.get("stream"):
        await at(n - 1)
        text = " ".join(f"t{k}" for k in range(n))
        rec["first_ns"] = rec["last_ns"] = time.time_ns()
        if chat:
            obj = {"id": f"cmpl-{tag}", "object": "chat.completion", "created": 0, "model": tag,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "finish_reason": "length"}], "usage": usage}
        else:
            obj = {"id": f"cmpl-{tag}", "object": "text_completion", "created": 0, "model": tag,
                   "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}
        await _send_json(send, 200, obj)
        if _log:
            _log.write(json.dumps(rec) + "\n")
        return

    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

    async def event(obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": True})

    if chat:
        await event({"id": f"cmpl-{tag}", "object": "chat.completion.chunk", "created": 0, "model": tag,
                     "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    for k in range(n):
        await at(k)
        stamp = time.time_ns()
        if k == 0:
            rec["first_ns"] = stamp
        rec["last_ns"] = stamp
        await event(_chunk(chat, tag, k, f" t{k}"))
        if k == 0:
            rec["first_sent_ns"] = time.time_ns()
    await event(_chunk(chat, tag, n, "", "length"))
    if (body.get("stream_options") or {}).get("include_usage"):
        final = _chunk(chat, tag, n, "")
        final["choices"] = []
        final["usage"] = usage
        await event(final)
    await event(b"[DONE]")
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    if _log:
        _log.write(json.dumps(rec) + "\n")

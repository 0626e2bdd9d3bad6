#!/usr/bin/env python3
"""Drives a real OpenAI-compatible engine with the official `openai` SDK and
writes what the client measured, one JSON line per request.

Each request carries a unique `model` tag (`<prefix>-<i>`) so a request-log
record can be matched to the client's request without any other shared
state. The plan cycles through streamed chat and completions (with and
without `stream_options.include_usage`), non-streamed requests, and every
`--cancel-every`-th request is cancelled by the client after three content
chunks (it closes the connection mid-stream).

Client timing, per request (time.perf_counter_ns, one clock):
  t_send   httpx `request` event hook: the SDK has built the request and is
           about to write it (the closest the SDK lets a caller get to send)
  ttft_s   first content-bearing chunk parsed − t_send (streams)
  tpot_s   (last − first content chunk) / (N − 1), N = usage completion
           tokens when the server reported them, else content chunks
           (tokentap's definition, so the two are comparable)
  duration_s  last byte of the response parsed − t_send
"""
import argparse
import json
import sys
import threading
import time

import httpx
import openai

_local = threading.local()


def _on_request(_req):
    _local.send_ns = time.perf_counter_ns()


KINDS = [
    ("chat", True, True),
    ("completion", True, False),
    ("chat", True, False),
    ("completion", True, True),
    ("chat", False, False),
    ("completion", False, False),
]


def plan(n, cancel_every):
    for i in range(n):
        endpoint, stream, usage = KINDS[i % len(KINDS)]
        cancel = cancel_every > 0 and i % cancel_every == cancel_every - 1
        if cancel:
            endpoint, stream, usage = ("chat" if i % 2 else "completion"), True, False
        yield i, endpoint, stream, usage, cancel


def content_of(endpoint, chunk):
    if not chunk.choices:
        return ""
    c = chunk.choices[0]
    if endpoint == "chat":
        return (c.delta.content or "") if c.delta else ""
    return c.text or ""


def run_one(client, a, i, endpoint, stream, usage, cancel):
    tag = f"{a.tag}-{i}"
    prompt = f"Request {i}: tell me a long story about measuring things."
    kw = dict(model=tag, max_tokens=a.max_tokens, temperature=1.0, seed=i, stream=stream)
    if stream and usage:
        kw["stream_options"] = {"include_usage": True}
    rec = {"i": i, "tag": tag, "endpoint": endpoint, "stream": stream, "include_usage": usage,
           "cancelled": cancel, "epoch_ns": time.time_ns()}
    if endpoint == "chat":
        call = lambda: client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)
    else:
        call = lambda: client.completions.create(prompt=prompt, **kw)
    if not stream:
        resp = call()
        t_end = time.perf_counter_ns()
        rec.update(status=200, duration_s=(t_end - _local.send_ns) / 1e9,
                   prompt_tokens=resp.usage.prompt_tokens if resp.usage else None,
                   completion_tokens=resp.usage.completion_tokens if resp.usage else None)
        return rec
    times = []
    prompt_tokens = completion_tokens = None
    s = call()
    t_send = _local.send_ns
    for chunk in s:
        now = time.perf_counter_ns()
        if getattr(chunk, "usage", None):
            prompt_tokens = chunk.usage.prompt_tokens
            completion_tokens = chunk.usage.completion_tokens
        if content_of(endpoint, chunk):
            times.append(now)
            if cancel and len(times) == 3:
                s.close()  # drops the connection mid-stream
                break
    t_end = time.perf_counter_ns()
    n = completion_tokens if completion_tokens is not None else len(times)
    rec.update(
        status=200,
        content_chunks=len(times),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_s=(times[0] - t_send) / 1e9 if times else None,
        tpot_s=((times[-1] - times[0]) / 1e9 / (n - 1)) if len(times) > 1 and n > 1 and not cancel else None,
        duration_s=(t_end - t_send) / 1e9,
    )
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--n", type=int, default=60, help="requests (default 60)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default 32)")
    ap.add_argument("--cancel-every", type=int, default=12, help="cancel every k-th request mid-stream (0: never)")
    ap.add_argument("--tag", default="fid", help="model tag prefix (default fid)")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="requests in flight, one connection each (default 1: sequential, the most precise timing)")
    ap.add_argument("--only", choices=["mix", "chat-stream-usage"], default="mix",
                    help="mix: the plan above; chat-stream-usage: only streamed chat with usage (load runs)")
    ap.add_argument("--out", required=True, help="JSON Lines output ('-' for stdout)")
    a = ap.parse_args()

    out = sys.stdout if a.out == "-" else open(a.out, "w")
    lock = threading.Lock()
    todo = iter(plan(a.n, a.cancel_every))
    if a.only == "chat-stream-usage":
        todo = ((i, "chat", True, True, False) for i in range(a.n))
    failures = []

    def worker():
        http = httpx.Client(event_hooks={"request": [_on_request]}, timeout=120.0)
        client = openai.OpenAI(base_url=a.base_url, api_key="not-needed", http_client=http, max_retries=0)
        while True:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            try:
                rec = run_one(client, a, *job)
            except Exception as e:  # reported, and the run fails at the end
                rec = {"i": job[0], "tag": f"{a.tag}-{job[0]}", "error": repr(e)}
                failures.append(rec)
            with lock:
                out.write(json.dumps(rec) + "\n")
                out.flush()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(max(1, a.concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    print(f"client: {a.n} requests in {wall:.2f}s, {len(failures)} failed", file=sys.stderr)
    if failures:
        print(f"client: first failure: {failures[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Drives an OpenAI-compatible server over cleartext HTTP/2 with prior
knowledge (h2c) with the official `openai` SDK: its http_client is
httpx.Client(http1=False, http2=True), and with HTTP/1.1 off httpx/httpcore
open http:// connections straight as HTTP/2 (the client preface, no
Upgrade). All requests share ONE client, hence one connection pool holding
one HTTP/2 connection: concurrent requests become concurrent streams on it
(httpcore counts a prior-knowledge HTTP/2 connection as available while it
is still connecting, so even the first burst does not open a second one).

  python h2_client.py --base-url http://127.0.0.1:P/v1 --concurrent N [--out FILE]
  python h2_client.py --base-url http://127.0.0.1:P/v1 --hold [--out FILE]

--concurrent N  N requests at once from N threads (released together),
                model tags h2-1..h2-N; request i asks (extra_body) for
                tokens = --tokens + (i-1), ttft_ms = --ttft-ms + 5*(i-1),
                gap_ms = --gap-ms, so the streams interleave.
--hold          one request (h2-1), then prints HELD and reads stdin:
                `go K` sends K concurrent requests (tags continue) on the
                same client and connection, waits, prints DONE; `quit` (or
                end of input) closes the client and exits.
--stream        on (default): stream=True with
                stream_options={"include_usage": true}; off: non-streamed;
                alternate: even-numbered requests non-streamed.

Output (--out, default stdout; in --hold HELD/DONE go to stdout too, JSON
lines start with "{"), one line per request: model (the tag), id (the
response id), stream, http_version (httpx's, "HTTP/2"), h2_stream_id
(httpcore's), local_port (the client's end of the TCP connection), chunks
(all chunks the SDK yielded), content_chunks, finish_reason, usage, text,
error, and client times in CLOCK_REALTIME ns (time.time_ns()): t_send_ns
just before the SDK call, t_first_ns at the first content-bearing chunk the
SDK yields, t_last_ns at the last chunk, ttft_s. These are SDK-level times
(after httpx, SSE and JSON parsing), not socket times, and with several
streams on one connection they can lag by a token gap or more: httpcore's
sync HTTP/2 reads the socket under one lock that the thread holding it
re-takes before a waiting one wakes up, so a stream's data can sit parsed
in its queue while another thread blocks in the next read. Hence also
t_first_rx_ns / ttft_rx_s: when the socket read that returned the
stream's first DATA frame holding a non-empty "content" came back (in
whichever thread; stamped on httpcore's HTTP2Connection._read_incoming_data,
httpcore pinned in requirements.txt), and data_frames / data_reads: the
stream's DATA frames and the socket reads they came in. Exit status 1 when
a request failed.
"""
import argparse
import json
import re
import sys
import threading
import time

import h2.events
import httpx
import openai
from httpcore._sync.http2 import HTTP2Connection

# (id(network stream), h2 stream id) -> [(read time ns, read number, DATA payload)]
_rx = {}
_rx_lock = threading.Lock()
_reads = iter(range(1, 1 << 62))
_orig_read = HTTP2Connection._read_incoming_data
CONTENT = re.compile(rb'"content":"[^"]')


def _stamped_read(self, request):
    """httpcore's HTTP/2 socket read, stamping the DATA frames it returned."""
    events = _orig_read(self, request)
    now, n = time.time_ns(), next(_reads)
    with _rx_lock:
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                _rx.setdefault((id(self._network_stream), ev.stream_id), []).append((now, n, ev.data))
    return events


HTTP2Connection._read_incoming_data = _stamped_read


class Runner:
    def __init__(self, a):
        self.a = a
        # keepalive_expiry=None: httpx drops a connection idle for 5 s by
        # default, which would make --hold open a new one after a pause.
        self.http = httpx.Client(http1=False, http2=True, timeout=a.timeout,
                                 limits=httpx.Limits(keepalive_expiry=None))
        self.client = openai.OpenAI(base_url=a.base_url, api_key="x", http_client=self.http, max_retries=0)
        self.out = sys.stdout if a.out in (None, "-") else open(a.out, "a")
        self.lock = threading.Lock()
        self.next_tag = 1
        self.failed = []

    def write(self, rec):
        with self.lock:
            if rec.get("error"):
                self.failed.append(rec)
            self.out.write(json.dumps(rec) + "\n")
            self.out.flush()

    def streamed(self, i):
        return {"on": True, "off": False, "alternate": i % 2 == 1}[self.a.stream]

    def one(self, i, j):
        """Request number i (tag h2-i), j-th of its batch (sets its schedule)."""
        a = self.a
        tag = f"{a.tag_prefix}{i}"
        sched = {"tokens": a.tokens + j, "ttft_ms": a.ttft_ms + 5 * j, "gap_ms": a.gap_ms}
        stream = self.streamed(i)
        rec = {"model": tag, "id": None, "stream": stream, **sched, "http_version": None, "h2_stream_id": None,
               "local_port": None, "chunks": 0, "content_chunks": 0, "finish_reason": None, "usage": None,
               "text": "", "error": None, "t_send_ns": None, "t_first_ns": None, "t_last_ns": None, "ttft_s": None,
               "t_first_rx_ns": None, "ttft_rx_s": None, "data_frames": 0, "data_reads": 0}
        msgs = [{"role": "user", "content": f"say something {i}"}]
        try:
            rec["t_send_ns"] = time.time_ns()
            if stream:
                s = self.client.chat.completions.create(model=tag, messages=msgs, stream=True,
                                                        stream_options={"include_usage": True}, extra_body=sched)
                self._conn_info(rec, s.response)
                for ch in s:
                    now = time.time_ns()
                    rec["chunks"] += 1
                    rec["id"] = ch.id
                    rec["t_last_ns"] = now
                    if ch.usage is not None:
                        rec["usage"] = ch.usage.model_dump()
                    for c in ch.choices:
                        if c.delta.content:
                            rec["content_chunks"] += 1
                            rec["text"] += c.delta.content
                            if rec["t_first_ns"] is None:
                                rec["t_first_ns"] = now
                                rec["ttft_s"] = (now - rec["t_send_ns"]) / 1e9
                        if c.finish_reason:
                            rec["finish_reason"] = c.finish_reason
            else:
                raw = self.client.chat.completions.with_raw_response.create(model=tag, messages=msgs, extra_body=sched)
                self._conn_info(rec, raw.http_response)
                r = raw.parse()
                now = time.time_ns()
                rec.update(id=r.id, chunks=1, content_chunks=1, finish_reason=r.choices[0].finish_reason,
                           usage=r.usage.model_dump() if r.usage else None, text=r.choices[0].message.content,
                           t_first_ns=now, t_last_ns=now, ttft_s=(now - rec["t_send_ns"]) / 1e9)
        except Exception as e:  # reported per request; the run then exits 1
            rec["error"] = repr(e)
        self._rx_info(rec)
        self.write(rec)

    @staticmethod
    def _rx_info(rec):
        with _rx_lock:
            frames = _rx.pop(rec.pop("_rx_key", None), [])
        rec["data_frames"] = len(frames)
        rec["data_reads"] = len({n for _t, n, _d in frames})
        first = next((t for t, _n, d in frames if CONTENT.search(d)), None)
        if first is not None and rec["t_send_ns"] is not None:
            rec["t_first_rx_ns"] = first
            rec["ttft_rx_s"] = (first - rec["t_send_ns"]) / 1e9

    @staticmethod
    def _conn_info(rec, resp):
        rec["http_version"] = resp.http_version
        ext = resp.extensions
        rec["h2_stream_id"] = ext.get("stream_id")
        ns = ext.get("network_stream")
        addr = ns.get_extra_info("client_addr") if ns is not None else None
        rec["local_port"] = addr[1] if addr else None
        rec["_rx_key"] = (id(ns), rec["h2_stream_id"])

    def batch(self, n):
        """n requests at once from n threads, released together."""
        first = self.next_tag
        self.next_tag += n
        gate = threading.Barrier(n)

        def run(j):
            gate.wait()
            self.one(first + j, j)

        threads = [threading.Thread(target=run, args=(j,)) for j in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def hold(self):
        self.batch(1)
        print("HELD", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                break
            if words[0] == "go":
                self.batch(int(words[1]) if len(words) > 1 else 1)
                print("DONE", flush=True)
            else:
                print(f"h2_client.py: unknown command {line.strip()!r}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrent", type=int, help="requests at once on the one connection")
    mode.add_argument("--hold", action="store_true", help="hold the connection; see above")
    ap.add_argument("--out", default="-", help="JSON Lines output, appended (default '-': stdout)")
    ap.add_argument("--tag-prefix", default="h2-", help="model tag prefix: tags are PREFIX1..PREFIXN (default h2-)")
    ap.add_argument("--tokens", type=int, default=5, help="base tokens per request (default 5)")
    ap.add_argument("--ttft-ms", type=int, default=20, help="base server-side time to first token (default 20)")
    ap.add_argument("--gap-ms", type=int, default=10, help="server-side gap between tokens (default 10)")
    ap.add_argument("--stream", choices=["on", "off", "alternate"], default="on")
    ap.add_argument("--timeout", type=float, default=60.0, help="httpx timeout in seconds (default 60)")
    a = ap.parse_args()

    r = Runner(a)
    t0 = time.perf_counter()
    if a.hold:
        r.hold()
    else:
        r.batch(a.concurrent)
    r.http.close()
    print(f"h2_client: done in {time.perf_counter() - t0:.3f}s, {len(r.failed)} failed", file=sys.stderr)
    if r.failed:
        print(f"h2_client: first failure: {r.failed[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

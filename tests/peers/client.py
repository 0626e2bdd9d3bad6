#!/usr/bin/env python3
"""Drives a real OpenAI-compatible engine with the official `openai` SDK and
writes what the client measured, one JSON line per request.

Each request carries a unique `model` tag (`<prefix>-<i>`) so a request-log
record can be matched to the client's request without any other shared
state. The plan cycles through streamed chat and completions (with and
without `stream_options.include_usage`), non-streamed requests, and every
`--cancel-every`-th request is cancelled by the client after three content
chunks (it closes the connection mid-stream).

Client timing, per request, taken at the client's socket (CLOCK_REALTIME
ns): a wrapper around httpcore's network stream stamps the first write of
each request with the kernel's transmit timestamp of its bytes (t_send:
SO_TIMESTAMPING's software stamp, taken as the segment leaves for the
device, so a client descheduled between its clock read and the send does
not add that pause to its TTFT; the clock just before the send when no
stamp comes, `send_stamp: "clock"`), and every read with the
kernel's receive timestamp of the data it returned (SO_TIMESTAMPNS, the
arrival of the newest segment read), so a client busy parsing the previous
event does not delay the next one's time; an event the SDK yields carries
the time of the read that delivered its bytes. A read never goes past the
first line end among the bytes waiting (it peeks, then takes up to and
including that newline, at most 64 bytes): when a client that fell behind
finds several events queued, a read that ran on into the next event would
carry that event's arrival, later by up to a token gap (CI saw +6 ms).
Ending each read at a line end, the read that completes an event (its
blank line) holds no byte of a later write. That is not enough alone: the
kernel appends a segment that arrives while earlier data still waits
unread to that data's buffer (TCP receive coalescing) and gives the whole
buffer the newest arrival time. So after the first content event the
client checks, right after each read that ends a line, whether the
bytes that follow it share its buffer (`stamp_is_own`); when they do, or
when that cannot be told (no stamp, or a segment arrived while it
looked), the event's arrival is unknown (only bounded by the stamp) and
the request says `first_rx_own: false` — the fidelity test compares TTFT
only where the client's own clock is exact, and bounds how often it is
not. The kernel stamps received segments only while some socket asks for
stamps (and turns that on a moment later), so the client holds one such
socket open from its start and waits until stamps arrive. Load generators such as AIPerf take their
time when their reader gets the bytes, which equals this when the client
keeps up.

  ttft_s      first content-bearing chunk's read − t_send (streams)
  tpot_s      (last − first content chunk) / (N − 1), N = usage completion
              tokens when the server reported them, else content chunks
              (tokentap's definition, so the two are comparable)
  duration_s  last read of the response − t_send
  send_stamp  "kernel" (t_send is the transmit timestamp) or "clock"
              (none came within 50 ms; the clock before the send)
  first_rx_own  false when the first content event's receive timestamp
              is a later segment's (see above): ttft_s is then an upper
              bound, not the event's arrival
  timings     llama.cpp's own `timings` object from the stream's last chunk
              (prompt_ms, predicted_ms, cache_n, …), as the SDK received it
  ttft_sdk_s  first content chunk as the SDK hands it over (after its SSE
              and JSON parsing and model construction) − t_send: what an
              application timing around the SDK would see
"""
import argparse
import fcntl
import json
import os
import select
import socket
import ssl
import struct
import sys
import termios
import threading
import time

import httpcore
import httpx
import openai

_local = threading.local()
# Linux SO_TIMESTAMPNS (= SCM_TIMESTAMPNS; struct timespec of two longs on 64-bit); Python has no constant.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
# Largest read (see the module doc: keeps per-event arrival times in bursts).
READ_BYTES = 64
# Transmit timestamps (linux/net_tstamp.h, linux/errqueue.h): SO_TIMESTAMPING
# (the 64-bit-timespec form on x86-64 and arm64), software transmit stamps
# reported, one per send call (OPT_ID), without the data echoed back (OPT_TSONLY).
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SOF_TX_STAMPS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
SO_EE_ORIGIN_TIMESTAMPING = 4
SCM_TSTAMP_SND = 0
# How long a send's stamp may take to be queued (it is queued within the
# send on loopback; TCP may hold a segment back, e.g. for its window).
TX_STAMP_WAIT_S = 0.05


def _waiting(sock):
    """Bytes in the socket's receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def read_to_line_end(sock, max_bytes):
    """Receives what is waiting up to and including its first newline (at
    most `max_bytes`). Returns (data, the kernel's receive timestamp of the
    newest segment those bytes came from or None, own): `own` says whether
    that stamp is the arrival of the read's own last byte (`stamp_is_own`);
    None when the read does not end a line (it cannot complete an event)."""
    peeked = sock.recv(max_bytes, socket.MSG_PEEK)
    if not peeked:
        return b"", None, None
    end = peeked.find(b"\n")
    n = end + 1 if end >= 0 else len(peeked)
    before = _waiting(sock)
    data, ts = _recv_stamped(sock, n, 0)
    own = stamp_is_own(sock, ts, before - len(data)) if data.endswith(b"\n") else None
    return data, ts, own


def _recv_stamped(sock, n, flags):
    data, anc, _flags, _addr = sock.recvmsg(n, 256, flags)
    ts = None
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", payload[:16])
            ts = sec * 1_000_000_000 + nsec
    return data, ts


def stamp_is_own(sock, ts, left):
    """Asked right after a read stamped `ts` that left `left` bytes waiting:
    is `ts` the arrival of the read's own bytes? No when the first byte
    waiting after them (past CR LF framing written with them) came in the
    same receive buffer, which then carries that later segment's time, and
    no when it cannot be told: no stamp, or a segment arrived while this
    looked (it may have joined that buffer and moved its stamp)."""
    if ts is None:
        return False
    now = _waiting(sock)
    if now != left:
        return False
    if now == 0:
        return True
    head = sock.recv(min(now, 64), socket.MSG_PEEK)
    framing = len(head) - len(head.lstrip(b"\r\n"))
    if framing == len(head):
        return True
    _data, later = _recv_stamped(sock, framing + 1, socket.MSG_PEEK)
    return _waiting(sock) == now and later is not None and later != ts


def tx_stamp_on(sock, on):
    """Turns the kernel's transmit timestamps for `sock`'s sends on or off
    (receive stamps, SO_TIMESTAMPNS, are a separate switch)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SOF_TX_STAMPS if on else 0)


def take_tx_stamp(sock):
    """The transmit timestamp (CLOCK_REALTIME ns) of the first send since
    `tx_stamp_on(sock, True)`, from the socket's error queue, or None when
    none is queued within TX_STAMP_WAIT_S. Drains the queue: a stamp left
    there would make the socket report an error condition to its poller."""
    # A socket with a timeout would wait for readable data before reading;
    # the error queue is read without waiting, and polled (POLLERR) between.
    timeout = sock.gettimeout()
    sock.settimeout(0)
    try:
        return _drain_tx_stamps(sock)
    finally:
        sock.settimeout(timeout)


def _drain_tx_stamps(sock):
    deadline = time.monotonic() + TX_STAMP_WAIT_S
    stamp = None
    waiter = select.poll()
    waiter.register(sock, select.POLLPRI)
    while True:
        try:
            # (the plain socket's call: an SSLSocket refuses recvmsg)
            _data, anc, _f, _a = socket.socket.recvmsg(sock, 0, 512, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            if stamp is not None or time.monotonic() > deadline:
                return stamp
            waiter.poll(1)
            continue
        ts = err = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                sec, nsec = struct.unpack("qq", payload[:16])
                ts = sec * 1_000_000_000 + nsec
            elif len(payload) >= 16:
                # struct sock_extended_err: errno, origin, type, code, pad, info, data
                _errno, origin, _t, _c, _p, info, key = struct.unpack("IBBBBII", payload[:16])
                err = (origin, info, key)
        # The first queued is the first send's (its key is that send's
        # last byte's offset since the stamps were turned on).
        if stamp is None and ts and err is not None and err[:2] == (SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_SND):
            stamp = ts


def _keep_timestamps_on():
    """Holds a socket with SO_TIMESTAMPNS open for the process's life (so
    receive stamping never goes off between connections) and waits until a
    loopback probe gets a stamp; returns the socket."""
    keeper = socket.socket()
    keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    deadline = time.monotonic() + 5
    while True:
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(srv.getsockname())
        eng, _ = srv.accept()
        cli.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        eng.sendall(b"x")
        _data, ts = _recv_stamped(cli, 1, 0)
        for s_ in (cli, eng, srv):
            s_.close()
        if ts is not None:
            return keeper
        if time.monotonic() > deadline:
            raise SystemExit("client.py: the kernel gives no receive timestamps (SO_TIMESTAMPNS)")
        time.sleep(0.01)


def _on_request(_req):
    _local.send_ns = None  # stamped by the request's first socket write


class _TimedStream(httpcore.NetworkStream):
    """httpcore's socket stream, with a clock on each read and write."""

    def __init__(self, inner):
        self._s = inner
        self._sock = inner.get_extra_info("socket")
        self._tls = isinstance(self._sock, ssl.SSLSocket)
        self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._tls_stamp = (None, False)

    def _tls_peek(self, timeout):
        """Over TLS the socket's bytes are ciphertext, and one SSL read
        returns one TLS record's plaintext. Before OpenSSL reads the next
        record from the socket, peek at its 5-byte header on the raw socket:
        the kernel's receive timestamp of the segment holding it is that
        record's arrival — its own only when nothing else waits behind the
        record (a later segment joining its buffer would carry its stamp)."""
        self._sock.settimeout(timeout)
        try:
            head, anc, _f, _a = socket.socket.recvmsg(self._sock, 5, 256, socket.MSG_PEEK)
        except OSError:
            return (None, False)
        ts = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", payload[:16])
                ts = sec * 1_000_000_000 + nsec
        if len(head) < 5:
            return (ts, False)
        record = 5 + struct.unpack(">H", head[3:5])[0]
        return (ts, ts is not None and _waiting(self._sock) == record)

    def read(self, max_bytes, timeout=None):
        if self._tls:
            if self._sock.pending() == 0:
                self._tls_stamp = self._tls_peek(timeout)
            data = self._s.read(max_bytes, timeout)
            ts, own = self._tls_stamp
            _local.recv_ns = ts if ts is not None else time.time_ns()
            _local.recv_own = own
            return data
        try:
            self._sock.settimeout(timeout)
            data, ts, own = read_to_line_end(self._sock, min(max_bytes, READ_BYTES))
        except socket.timeout as e:
            raise httpcore.ReadTimeout(e) from e
        except OSError as e:
            raise httpcore.ReadError(e) from e
        _local.recv_ns = ts if ts is not None else time.time_ns()
        _local.recv_own = bool(own)
        return data

    def write(self, buffer, timeout=None):
        if getattr(_local, "send_ns", None) is not None:
            self._s.write(buffer, timeout)
            return
        try:
            tx_stamp_on(self._sock, True)
            stamping = True
        except OSError:  # e.g. a connection the peer already reset
            stamping = False
        clock = time.time_ns()
        sent = False
        try:
            self._s.write(buffer, timeout)
            sent = True
        finally:
            stamp = take_tx_stamp(self._sock) if stamping and sent else None
            if stamping:
                try:
                    tx_stamp_on(self._sock, False)
                except OSError:
                    pass
        _local.send_ns = stamp if stamp is not None else clock
        _local.send_stamp = "kernel" if stamp is not None else "clock"

    def close(self):
        self._s.close()

    def start_tls(self, *a, **kw):
        return _TimedStream(self._s.start_tls(*a, **kw))

    def get_extra_info(self, info):
        return self._s.get_extra_info(info)


class _TimedBackend(httpcore.SyncBackend):
    def connect_tcp(self, *a, **kw):
        return _TimedStream(super().connect_tcp(*a, **kw))


CA_FILE = None


def timed_http_client():
    verify = True
    if CA_FILE:
        # The test CA's leaf names 127.0.0.1/localhost; engines in a
        # network namespace answer on another address.
        verify = ssl.create_default_context(cafile=CA_FILE)
        verify.check_hostname = False
        verify.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    transport = httpx.HTTPTransport(verify=verify)
    # httpx 0.28 has no public hook for the network backend; the pool's
    # attribute is pinned with httpx/httpcore in requirements.txt.
    transport._pool._network_backend = _TimedBackend()
    return httpx.Client(transport=transport, event_hooks={"request": [_on_request]}, timeout=120.0)


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
        rec.update(status=200, duration_s=(_local.recv_ns - _local.send_ns) / 1e9,
                   prompt_tokens=resp.usage.prompt_tokens if resp.usage else None,
                   completion_tokens=resp.usage.completion_tokens if resp.usage else None)
        return rec
    times = []
    sdk_first = None
    first_own = None
    prompt_tokens = completion_tokens = None
    timings = None
    s = call()
    t_send = _local.send_ns
    for chunk in s:
        now = _local.recv_ns
        if getattr(chunk, "usage", None):
            prompt_tokens = chunk.usage.prompt_tokens
            completion_tokens = chunk.usage.completion_tokens
        # llama.cpp's server adds its own `timings` to the last chunk.
        extra = getattr(chunk, "model_extra", None) or {}
        if extra.get("timings") is not None:
            timings = extra["timings"]
        if content_of(endpoint, chunk):
            if sdk_first is None:
                sdk_first = time.time_ns()
                first_own = _local.recv_own
            times.append(now)
            if cancel and len(times) == 3:
                s.close()  # drops the connection mid-stream
                break
    t_end = _local.recv_ns
    n = completion_tokens if completion_tokens is not None else len(times)
    rec.update(
        status=200,
        content_chunks=len(times),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_s=(times[0] - t_send) / 1e9 if times else None,
        tpot_s=((times[-1] - times[0]) / 1e9 / (n - 1)) if len(times) > 1 and n > 1 and not cancel else None,
        duration_s=(t_end - t_send) / 1e9,
        ttft_sdk_s=(sdk_first - t_send) / 1e9 if sdk_first else None,
        send_ns=t_send,
        send_stamp=_local.send_stamp,
        first_rx_ns=times[0] if times else None,
        first_rx_own=first_own,
        timings=timings,
    )
    return rec


def self_test():
    """Checks the timestamp rules above on real loopback sockets. The engine
    side writes chunked SSE events 20 ms apart. When the client reads the
    first before the second is sent, its stamp must be its own and judged
    so; when the client fell behind (both wait), it must be judged own
    exactly when the stamp precedes the second send (the kernel usually
    merges the two into one buffer stamped with the second's arrival); and
    a segment arriving after the read makes a later look say "cannot tell"."""
    def event(text):
        body = b"data: " + text + b"\n\n"
        return b"%x\r\n" % len(body) + body + b"\r\n"

    def first_event(behind):
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(srv.getsockname())
        eng, _ = srv.accept()
        eng.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cli.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        eng.sendall(event(b'{"a":1}'))
        got = b""

        def read_event():
            nonlocal got
            while b"\n\n" not in got:
                data, ts, own = read_to_line_end(cli, READ_BYTES)
                got += data
            return ts, own, _waiting(cli)

        if not behind:
            time.sleep(0.005)
            ts, own, left = read_event()
        time.sleep(0.02)
        t_second = time.time_ns()
        eng.sendall(event(b'{"b":2}'))
        time.sleep(0.01)
        if behind:
            ts, own, left = read_event()
        # A third event after the read: a look now cannot vouch for `ts`.
        eng.sendall(event(b'{"c":3}'))
        time.sleep(0.005)
        late_look = stamp_is_own(cli, ts, left)
        for s_ in (cli, eng, srv):
            s_.close()
        assert ts is not None, "no receive timestamp"
        assert late_look is False, "a look after a later segment arrived vouched for the stamp"
        return ts, t_second, own

    # The send stamp: the kernel's transmit time of the first send after
    # stamps are turned on, between the clock before and after that send,
    # and no later than the receiver's arrival stamp.
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    eng, _ = srv.accept()
    eng.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    for k in range(3):
        tx_stamp_on(cli, True)
        before = time.time_ns()
        cli.sendall(b"GET / HTTP/1.1\r\n\r\n")
        after = time.time_ns()
        cli.sendall(b"x" * 100)  # a second send: its stamp must not be the one taken
        tx = take_tx_stamp(cli)
        tx_stamp_on(cli, False)
        got, rx = _recv_stamped(eng, 4096, 0)
        while len(got) < 118:
            got += eng.recv(4096)
        assert tx is not None, "no transmit timestamp (SO_TIMESTAMPING)"
        assert before <= tx <= after, f"transmit stamp outside its send: {tx - before} ns after the clock before, {after - tx} ns before the clock after"
        assert rx is not None and rx >= tx, f"arrival stamp {rx} before the transmit stamp {tx}"
    for s_ in (cli, eng, srv):
        s_.close()

    ts, t_second, own = first_event(behind=False)
    assert ts < t_second and own, f"a client that kept up: stamp {ts - t_second} ns after the second send, own={own}"
    merged = 0
    for _ in range(5):
        ts, t_second, own = first_event(behind=True)
        assert own == (ts < t_second), f"a client that fell behind: stamp {ts - t_second} ns after the second send, own={own}"
        merged += not own
    print(f"client self-test: transmit stamps taken; receive stamps judged right; the kernel merged the queued events {merged} of 5 times")


def main():
    global _STAMPS
    _STAMPS = _keep_timestamps_on()
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="client.py --self-test checks the read-timestamp rule on loopback and exits.")
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--n", type=int, default=60, help="requests (default 60)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default 32)")
    ap.add_argument("--cancel-every", type=int, default=12, help="cancel every k-th request mid-stream (0: never)")
    ap.add_argument("--tag", default="fid", help="model tag prefix (default fid)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="streamed requests sent first and not written out (tag warmup-<i>): "
                         "the client's first requests pay its own lazy imports and connection set-up")
    ap.add_argument("--think-ms", type=float, default=0.0,
                    help="pause after each response before the next request (default 0): lets the engine "
                         "finish its own clean-up, so a request does not wait unread in its socket")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="requests in flight, one connection each (default 1: sequential, the most precise timing)")
    ap.add_argument("--only", choices=["mix", "chat-stream-usage"], default="mix",
                    help="mix: the plan above; chat-stream-usage: only streamed chat with usage (load runs)")
    ap.add_argument("--ca", help="CA file for an https:// base URL (hostname not checked)")
    ap.add_argument("--hold", metavar="FILE",
                    help="with --concurrency 1: send one request (tag hold-0, not written out) on the "
                         "connection the plan will use, print 'held', and start the plan once FILE exists "
                         "(a connection opened before the agent)")
    ap.add_argument("--out", required=True, help="JSON Lines output ('-' for stdout)")
    a = ap.parse_args()
    global CA_FILE
    CA_FILE = a.ca
    if a.hold and a.concurrency != 1:
        ap.error("--hold needs --concurrency 1")

    out = sys.stdout if a.out == "-" else open(a.out, "w")
    lock = threading.Lock()
    todo = iter(plan(a.n, a.cancel_every))
    if a.only == "chat-stream-usage":
        todo = ((i, "chat", True, True, False) for i in range(a.n))
    failures = []

    def worker(client=None):
        if client is None:
            http = timed_http_client()
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
            if a.think_ms:
                time.sleep(a.think_ms / 1000)

    if a.warmup:
        http = timed_http_client()
        client = openai.OpenAI(base_url=a.base_url, api_key="not-needed", http_client=http, max_retries=0)
        wa = argparse.Namespace(**{**vars(a), "tag": "warmup"})
        for i in range(a.warmup):
            run_one(client, wa, i, "chat" if i % 2 else "completion", True, False, False)
        http.close()

    held = None
    if a.hold:
        held = openai.OpenAI(base_url=a.base_url, api_key="not-needed", http_client=timed_http_client(),
                             max_retries=0)
        run_one(held, argparse.Namespace(**{**vars(a), "tag": "hold"}), 0, "chat", True, False, False)
        print("held", flush=True)
        while not os.path.exists(a.hold):
            time.sleep(0.01)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(held,)) for _ in range(max(1, a.concurrency))]
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

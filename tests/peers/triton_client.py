#!/usr/bin/env python3
"""Drives a Triton gRPC server (triton_server.py, or a real Triton) with
tritonclient.grpc's own client (InferenceServerClient: start_stream /
async_stream_infer / stop_stream, infer, the health calls) and writes one
JSON line per request result.

  python triton_client.py --url 127.0.0.1:P --plan PLAN [--out FILE]

Plans
  stream:N    one channel, one ModelStreamInfer stream, N requests sent
              back to back (in flight together) with ids r1..rN; request i
              asks for tokens = --tokens + (i-1) responses, ttft_ms =
              --ttft-ms + 5*(i-1), gap_ms = --gap-ms, so their responses
              interleave on the stream; waits for all, stops the stream.
  hold        opens the channel and the stream, sends r1 and waits for it,
              prints HELD; then reads stdin: `go K` sends K more requests
              (ids continue) concurrently on the SAME stream and connection,
              waits for them, prints DONE; `quit` (or end of input) stops
              the stream and exits. For starting a tracer while a
              connection (and an HTTP/2 stream) is already open.
              Every InferenceServerClient here has its own TCP connection
              (see new_client: grpcio would otherwise share one among all
              channels to the same address).
  hold-new    like hold, but each `go K` opens a NEW InferenceServerClient
              (new channel, new TCP connection) with its own stream for
              those K requests, and stops and closes it before DONE; the
              first client stays open until quit.
  unary:N     N ModelInfer calls one after another (ids u1..uN).
  unary-par:N N ModelInfer calls in flight together on one channel
              (async_infer; one HTTP/2 stream each), ids p1..pN.
  error       ModelInfer to model "missing" (id e1: the server answers
              grpc-status NOT_FOUND, caught), then one stream request to
              model "fail" (id e2: a stream response with error_message).
  health      ServerLive, ServerReady, ModelReady, ModelMetadata (ids
              health-live, health-ready, health-model-ready, health-metadata).

Streams ask for triton_enable_empty_final_response per --empty-final:
none (default), all, or alternate (even-numbered requests).

Output (--out, default stdout; in hold modes HELD/DONE go to stdout too,
JSON lines start with "{"), one line per request:
  id, model, rpc ("stream"|"unary"|"health"), plan, tokens/ttft_ms/gap_ms
  and empty_final asked, n_responses (all responses seen),
  n_responses_with_output, got_final_flag (a response said
  triton_final_response=true), final_empty (that response had no
  outputs), error (message or null), expected_error, text (outputs joined),
  t_send_ns (just before async_stream_infer / infer), t_first_ns and
  t_last_ns (first / last response with output), t_final_ns, ttft_s.
Client times are CLOCK_REALTIME ns (time.time_ns()) taken in
tritonclient's response callback, i.e. after grpcio received and
tritonclient parsed the message (for unary: when infer returned / its
callback ran). Exit status 1 when a request failed unexpectedly, an
expected error did not come, or a request timed out (--timeout).
"""
import argparse
import json
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "llm"


def new_client(url):
    """An InferenceServerClient on a channel of its own. grpcio shares
    subchannels (TCP connections) among channels to the same target with
    the same arguments, process-wide; grpc.use_local_subchannel_pool gives
    each client its own connection. The other arguments are tritonclient's
    defaults (KeepAliveOptions())."""
    ka = grpcclient.KeepAliveOptions()
    args = [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", ka.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", ka.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", ka.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", ka.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    return grpcclient.InferenceServerClient(url=url, channel_args=args)


def text_input(text="hello"):
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return inp


def outputs_text(result):
    arr = result.as_numpy("text_output")
    return "" if arr is None else "".join(x.decode() if isinstance(x, bytes) else str(x) for x in arr.ravel())


class Out:
    def __init__(self, path, plan):
        self.f = sys.stdout if path in (None, "-") else open(path, "w")
        self.plan = plan
        self.lock = threading.Lock()
        self.bad = []

    def write(self, rec):
        rec = {"plan": self.plan, **rec}
        if (rec.get("error") is not None) != rec.get("expected_error", False):
            self.bad.append(rec)
        with self.lock:
            self.f.write(json.dumps(rec) + "\n")
            self.f.flush()


def new_record(rid, model, rpc, **kw):
    return {"id": rid, "model": model, "rpc": rpc, **kw, "n_responses": 0, "n_responses_with_output": 0,
            "got_final_flag": False, "final_empty": None, "error": None, "expected_error": False, "text": "",
            "t_send_ns": None, "t_first_ns": None, "t_last_ns": None, "t_final_ns": None, "ttft_s": None}


class StreamSession:
    """One InferenceServerClient (one channel) with one open stream; keeps
    a record per request id, completed on its final flag or an error."""

    def __init__(self, url, out):
        self.client = new_client(url)
        self.out = out
        self.lock = threading.Lock()
        self.recs = {}      # id -> record (in flight)
        self.done = {}      # id -> threading.Event
        self.failed = None  # the gRPC error that ended the stream, if any
        self.client.start_stream(callback=self._callback)

    def _finish(self, rid):
        rec = self.recs.pop(rid)
        self.out.write(rec)
        self.done.pop(rid).set()

    def _callback(self, result, error):
        now = time.time_ns()
        with self.lock:
            if result is None:
                # error_message responses carry no InferResult, so tritonclient
                # cannot say whose they are: the single request in flight (the
                # error plan sends one at a time); a gRPC stream failure (it has
                # a status) ends every request in flight.
                grpc_failure = error is not None and error.status() is not None
                if grpc_failure:
                    self.failed = str(error)
                    if not self.recs:
                        self.out.write({"id": None, "rpc": "stream", "error": f"stream failed: {error}",
                                        "expected_error": False})
                if len(self.recs) == 1 or grpc_failure:
                    for rid in list(self.recs):
                        self.recs[rid]["error"] = str(error)
                        self.recs[rid]["t_final_ns"] = now
                        self._finish(rid)
                else:
                    self.out.write({"id": None, "rpc": "stream", "error": f"unattributed: {error}",
                                    "expected_error": False})
                return
            resp = result.get_response()
            rec = self.recs.get(resp.id)
            if rec is None:
                self.out.write({"id": resp.id, "rpc": "stream", "error": "response for unknown id",
                                "expected_error": False})
                return
            rec["n_responses"] += 1
            if len(resp.outputs):
                rec["n_responses_with_output"] += 1
                rec["text"] += outputs_text(result)
                if rec["t_first_ns"] is None:
                    rec["t_first_ns"] = now
                    rec["ttft_s"] = (now - rec["t_send_ns"]) / 1e9
                rec["t_last_ns"] = now
            p = resp.parameters.get("triton_final_response")
            if p is not None and p.bool_param:
                rec["got_final_flag"] = True
                rec["final_empty"] = len(resp.outputs) == 0
                rec["t_final_ns"] = now
                self._finish(resp.id)

    def send(self, rid, model=MODEL, tokens=5, ttft_ms=20, gap_ms=10, empty_final=False, expected_error=False):
        with self.lock:
            rec = new_record(rid, model, "stream", tokens=tokens, ttft_ms=ttft_ms, gap_ms=gap_ms,
                             empty_final=empty_final)
            rec["expected_error"] = expected_error
            self.recs[rid] = rec
            ev = self.done[rid] = threading.Event()
            rec["t_send_ns"] = time.time_ns()
            if self.failed is not None or self.stream_ended():  # tritonclient would take it, never to answer
                rec["error"] = f"stream failed earlier: {self.failed or 'ended by the server'}"
                self._finish(rid)
                return ev
            try:
                self.client.async_stream_infer(model, inputs=[text_input()], request_id=rid,
                                               parameters={"tokens": tokens, "ttft_ms": ttft_ms, "gap_ms": gap_ms},
                                               enable_empty_final_response=empty_final)
            except InferenceServerException as e:
                rec["error"] = str(e)
                self._finish(rid)
        return ev

    def stream_ended(self):
        """True once tritonclient's response thread has exited: the server
        ended the stream (e.g. status OK without being asked) and no error
        callback came; tritonclient would still queue requests on it."""
        handler = getattr(getattr(self.client, "_stream", None), "_handler", None)
        return handler is not None and not handler.is_alive()

    def wait(self, events, timeout):
        deadline = time.monotonic() + timeout
        for rid, ev in events:
            while not ev.wait(0.1):
                ended = self.stream_ended()
                if ended or time.monotonic() > deadline:
                    with self.lock:
                        if rid in self.recs:
                            self.recs[rid]["error"] = ("stream ended before the final response" if ended
                                                       else f"timeout after {timeout}s")
                            self._finish(rid)
                    break

    def close(self):
        self.client.stop_stream()
        self.client.close()


class Plan:
    def __init__(self, a, out):
        self.a, self.out, self.next_id = a, out, 1

    def empty_final(self, i):
        return {"none": False, "all": True, "alternate": i % 2 == 0}[self.a.empty_final]

    def send_batch(self, sess, n):
        """Sends n requests back to back on `sess`'s stream and waits for them."""
        evs = []
        for j in range(n):
            i = self.next_id
            self.next_id += 1
            rid = f"r{i}"
            evs.append((rid, sess.send(rid, tokens=self.a.tokens + j, ttft_ms=self.a.ttft_ms + 5 * j,
                                       gap_ms=self.a.gap_ms, empty_final=self.empty_final(i))))
        sess.wait(evs, self.a.timeout)

    def stream(self, n):
        sess = StreamSession(self.a.url, self.out)
        self.send_batch(sess, n)
        sess.close()

    def hold(self, new_channel):
        sess = StreamSession(self.a.url, self.out)
        self.send_batch(sess, 1)
        print("HELD", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                break
            if words[0] == "go":
                k = int(words[1]) if len(words) > 1 else 1
                if new_channel:
                    extra = StreamSession(self.a.url, self.out)
                    self.send_batch(extra, k)
                    extra.close()
                else:
                    self.send_batch(sess, k)
                print("DONE", flush=True)
            else:
                print(f"triton_client.py: unknown command {line.strip()!r}", file=sys.stderr)
        sess.close()

    def unary_record(self, rid, model, expected_error=False):
        a = self.a
        rec = new_record(rid, model, "unary", tokens=a.tokens, ttft_ms=a.ttft_ms, gap_ms=a.gap_ms)
        rec["expected_error"] = expected_error
        rec["t_send_ns"] = time.time_ns()
        return rec, {"tokens": a.tokens, "ttft_ms": a.ttft_ms, "gap_ms": a.gap_ms}

    @staticmethod
    def unary_done(rec, result, error):
        now = time.time_ns()
        rec["t_final_ns"] = now
        if error is not None:
            rec["error"] = str(error)
            return
        rec["n_responses"] = 1
        text = outputs_text(result)
        rec["n_responses_with_output"] = 1 if result.get_response().outputs else 0
        rec["text"] = text
        rec["t_first_ns"] = rec["t_last_ns"] = now
        rec["ttft_s"] = (now - rec["t_send_ns"]) / 1e9

    def unary(self, n, model=MODEL, prefix="u", expected_error=False, client=None):
        own = client is None
        client = client or new_client(self.a.url)
        for i in range(1, n + 1):
            rid = f"{prefix}{i}" if n > 1 or prefix == "u" else prefix
            rec, params = self.unary_record(rid, model, expected_error)
            try:
                res = client.infer(model, inputs=[text_input()], request_id=rid, parameters=params,
                                   client_timeout=self.a.timeout)
                self.unary_done(rec, res, None)
            except InferenceServerException as e:
                self.unary_done(rec, None, e)
                rec["grpc_status"] = e.status()
            self.out.write(rec)
        if own:
            client.close()

    def unary_par(self, n):
        client = new_client(self.a.url)
        pending = []
        for i in range(1, n + 1):
            rid = f"p{i}"
            rec, params = self.unary_record(rid, MODEL)
            ev = threading.Event()

            def cb(result, error, rec=rec, ev=ev):
                self.unary_done(rec, result, error)
                ev.set()

            client.async_infer(MODEL, inputs=[text_input()], callback=cb, request_id=rid, parameters=params,
                               client_timeout=self.a.timeout)
            pending.append((rec, ev))
        for rec, ev in pending:
            if not ev.wait(self.a.timeout + 5):
                rec["error"] = f"timeout after {self.a.timeout}s"
            self.out.write(rec)
        client.close()

    def error(self):
        client = new_client(self.a.url)
        self.unary(1, model="missing", prefix="e1", expected_error=True, client=client)
        client.close()
        sess = StreamSession(self.a.url, self.out)
        sess.wait([("e2", sess.send("e2", model="fail", expected_error=True))], self.a.timeout)
        sess.close()

    def health(self):
        client = new_client(self.a.url)
        calls = [("health-live", client.is_server_live), ("health-ready", client.is_server_ready),
                 ("health-model-ready", lambda: client.is_model_ready(MODEL)),
                 ("health-metadata", lambda: client.get_model_metadata(MODEL, as_json=True))]
        for rid, call in calls:
            rec = new_record(rid, MODEL, "health")
            rec["t_send_ns"] = time.time_ns()
            try:
                v = call()
                rec["result"] = v
                if v is False:
                    rec["error"] = "returned false"
            except InferenceServerException as e:
                rec["error"] = str(e)
            rec["t_final_ns"] = time.time_ns()
            self.out.write(rec)
        client.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="host:port of the gRPC server, e.g. 127.0.0.1:8001")
    ap.add_argument("--plan", required=True,
                    help="stream:N | hold | hold-new | unary:N | unary-par:N | error | health")
    ap.add_argument("--out", default="-", help="JSON Lines output (default '-': stdout)")
    ap.add_argument("--tokens", type=int, default=5, help="base token responses per request (default 5)")
    ap.add_argument("--ttft-ms", type=int, default=20, help="base server-side time to first response (default 20)")
    ap.add_argument("--gap-ms", type=int, default=10, help="server-side gap between responses (default 10)")
    ap.add_argument("--empty-final", choices=["none", "all", "alternate"], default="none",
                    help="which stream requests ask for an empty final response (default none)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a batch (default 60)")
    a = ap.parse_args()

    out = Out(a.out, a.plan)
    plan = Plan(a, out)
    name, _, arg = a.plan.partition(":")
    t0 = time.perf_counter()
    if name == "stream" and arg:
        plan.stream(int(arg))
    elif name in ("hold", "hold-new") and not arg:
        plan.hold(new_channel=name == "hold-new")
    elif name == "unary" and arg:
        plan.unary(int(arg))
    elif name == "unary-par" and arg:
        plan.unary_par(int(arg))
    elif name == "error" and not arg:
        plan.error()
    elif name == "health" and not arg:
        plan.health()
    else:
        ap.error(f"unknown plan {a.plan!r}")
    print(f"triton_client: plan {a.plan} in {time.perf_counter() - t0:.3f}s, {len(out.bad)} unexpected",
          file=sys.stderr)
    if out.bad:
        print(f"triton_client: first unexpected: {out.bad[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

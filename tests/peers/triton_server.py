#!/usr/bin/env python3
"""A Triton-compatible gRPC inference server on the real Triton stubs
(`tritonclient.grpc.service_pb2_grpc`, served by grpcio), standing in for a
decoupled LLM model: the wire protocol is Triton's own (package
`inference`, service `GRPCInferenceService`), only the "model" is a
timer.

  python triton_server.py --port P [--host 127.0.0.1] [--log FILE] [--max-workers 32]

Prints `READY <port>` on stdout once serving (`--port 0` picks a free
port). SIGTERM/SIGINT stop it gracefully: new RPCs are refused, running ones
get 1 s, then are cancelled.

RPCs
  ServerLive, ServerReady     live/ready = true
  ModelReady                  ready = true for any model name
  ModelMetadata               name, versions ["1"], platform "python",
                              input text_input BYTES [-1], output text_output BYTES [-1]
  ModelInfer (unary)          one ModelInferResponse (model_name, model_version
                              "1", id = request id, output text_output BYTES
                              shape [1] holding "tok0 tok1 ... "), sent after
                              ttft_ms + (tokens-1)*gap_ms. model_name "missing":
                              the call fails with grpc-status NOT_FOUND.
  ModelStreamInfer (bidi)     decoupled LLM style, see below.

Request parameters (ModelInferRequest.parameters, int64_param), read by
both inference RPCs: `tokens` (default 5), `ttft_ms` (default 20, from the
request's arrival to its first response), `gap_ms` (default 10, between
responses). Deadlines are absolute (arrival + ttft + k*gap), so a slow
iteration does not shift later responses.

ModelStreamInfer: every request taken from the request stream gets its own
worker thread; the workers push responses into one queue that the RPC's
response generator yields from, so several requests on one stream are in
flight at once and their responses interleave (each carries its request's
id). For a request, response k (0..tokens-1) is a ModelStreamInferResponse
whose infer_response has model_name, model_version "1", id, output
text_output BYTES shape [1] with raw_output_contents one element "tok<k> "
(4-byte little-endian length, then the bytes), and the parameter
`triton_final_response` (bool_param): true only on the last one. When the
request sets `triton_enable_empty_final_response` (tritonclient's
enable_empty_final_response=True), all token responses say false and one
more response follows right after the last token, with no outputs and
triton_final_response true (what real Triton sends for a decoupled model's
flags-only COMPLETE_FINAL). model_name "fail": one response with
error_message set (infer_response carries id and model_name), nothing
else for that request; the stream stays open.

Ground-truth log (--log FILE; JSON Lines, one write + flush per line,
CLOCK_REALTIME ns from time.time_ns()):
  {"ev":"recv","rpc":"stream"|"unary","id":ID,"model":M,"peer":"ipv4:127.0.0.1:PORT","t_ns":T}
      when the request message was taken from the request iterator (stream)
      or the handler was called (unary; grpcio has then read the whole
      request message)
  {"ev":"send","rpc":...,"id":ID,"k":K,"final":B,"output":B,"error":B,"peer":...,"t_ns":T}
      right before the response is handed to grpcio (yield / return); K is
      the response's index within its request (the empty final is K=tokens,
      the error response K=0); for unary K=0, final true
`peer` is grpcio's context.peer() (the client's address and port), so the
log also tells which requests shared a connection.
"""
import argparse
import json
import queue
import signal
import struct
import sys
import threading
import time
from concurrent import futures

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

MODEL_VERSION = "1"


class Log:
    """JSON Lines ground-truth log, one flushed write per line (thread-safe)."""

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


def bytes_tensor(*elems):
    """Triton's raw BYTES encoding: per element a 4-byte little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elems)


def decode_bytes_tensor(raw):
    out, i = [], 0
    while i + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, i)
        out.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    return out


def param_int(req, name, default):
    p = req.parameters.get(name)
    if p is None:
        return default
    kind = p.WhichOneof("parameter_choice")
    return int(getattr(p, kind)) if kind in ("int64_param", "uint64_param", "double_param") else default


def param_bool(req, name):
    p = req.parameters.get(name)
    return p is not None and p.WhichOneof("parameter_choice") == "bool_param" and p.bool_param


def schedule(req):
    """(tokens, ttft_s, gap_s) from the request's parameters."""
    return (max(0, param_int(req, "tokens", 5)), param_int(req, "ttft_ms", 20) / 1000,
            param_int(req, "gap_ms", 10) / 1000)


def infer_response(req, text=None, final=None):
    """A ModelInferResponse for `req`: one text_output element when `text`
    is given, the triton_final_response parameter when `final` is not None."""
    r = service_pb2.ModelInferResponse(model_name=req.model_name, model_version=MODEL_VERSION, id=req.id)
    if text is not None:
        out = r.outputs.add()
        out.name = "text_output"
        out.datatype = "BYTES"
        out.shape.append(1)
        r.raw_output_contents.append(bytes_tensor(text.encode()))
    if final is not None:
        r.parameters["triton_final_response"].bool_param = final
    return r


def sleep_until(deadline, stop):
    """Sleeps until time.monotonic() reaches `deadline`; False when `stop` is set first."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        if stop.wait(min(left, 0.5)):
            return False


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, log, stop):
        self.log = log
        self.stop = stop  # set on shutdown: workers stop sleeping

    # --- health and metadata -------------------------------------------
    def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=True)

    def ModelMetadata(self, request, context):
        r = service_pb2.ModelMetadataResponse(name=request.name, versions=[MODEL_VERSION], platform="python")
        r.inputs.add(name="text_input", datatype="BYTES", shape=[-1])
        r.outputs.add(name="text_output", datatype="BYTES", shape=[-1])
        return r

    # --- unary inference --------------------------------------------------
    def ModelInfer(self, request, context):
        t_recv = time.monotonic()
        peer = context.peer()
        self.log.write(ev="recv", rpc="unary", id=request.id, model=request.model_name, peer=peer,
                       t_ns=time.time_ns())
        if request.model_name == "missing":
            self.log.write(ev="send", rpc="unary", id=request.id, k=0, final=True, output=False, error=True,
                           peer=peer, t_ns=time.time_ns())
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"Request for unknown model: '{request.model_name}' is not found")
        tokens, ttft, gap = schedule(request)
        sleep_until(t_recv + ttft + max(0, tokens - 1) * gap, self.stop)
        resp = infer_response(request, "".join(f"tok{k} " for k in range(tokens)))
        self.log.write(ev="send", rpc="unary", id=request.id, k=0, final=True, output=True, error=False,
                       peer=peer, t_ns=time.time_ns())
        return resp

    # --- streaming inference ---------------------------------------------
    def ModelStreamInfer(self, request_iterator, context):
        """Reader thread: takes requests off the stream, starts one worker
        per request. Workers put (request, k, final, response) items on `q`;
        ("new",) and ("done",) markers count requests in flight, ("eof",)
        says the client half-closed. This generator (grpcio's thread for
        the RPC) yields responses until eof and nothing in flight."""
        q = queue.Queue()
        peer = context.peer()
        stop = threading.Event()  # this RPC ended (cancelled, or server stopping)

        def worker(req, t_recv):
            try:
                if req.model_name == "fail":
                    err = service_pb2.ModelStreamInferResponse(
                        error_message=f"model '{req.model_name}' failed: simulated error",
                        infer_response=service_pb2.ModelInferResponse(model_name=req.model_name, id=req.id))
                    q.put(("resp", req, 0, True, err))
                    return
                tokens, ttft, gap = schedule(req)
                empty_final = param_bool(req, "triton_enable_empty_final_response")
                for k in range(tokens):
                    if not sleep_until(t_recv + ttft + k * gap, stop):
                        return
                    final = (k == tokens - 1) and not empty_final
                    msg = service_pb2.ModelStreamInferResponse(
                        infer_response=infer_response(req, f"tok{k} ", final))
                    q.put(("resp", req, k, final, msg))
                if empty_final or tokens == 0:
                    if tokens == 0 and not sleep_until(t_recv + ttft, stop):
                        return
                    msg = service_pb2.ModelStreamInferResponse(infer_response=infer_response(req, None, True))
                    q.put(("resp", req, tokens, True, msg))
            finally:
                q.put(("done",))

        def reader():
            try:
                for req in request_iterator:
                    t_recv = time.monotonic()
                    self.log.write(ev="recv", rpc="stream", id=req.id, model=req.model_name, peer=peer,
                                   t_ns=time.time_ns())
                    q.put(("new",))
                    threading.Thread(target=worker, args=(req, t_recv), daemon=True).start()
            except Exception:  # cancelled / connection gone: the RPC is over
                stop.set()
            finally:
                q.put(("eof",))

        context.add_callback(stop.set)  # runs when the RPC terminates for any reason
        threading.Thread(target=reader, daemon=True).start()
        in_flight, eof = 0, False
        while not (eof and in_flight == 0):
            try:
                item = q.get(timeout=0.5)
            except queue.Empty:
                if stop.is_set() or self.stop.is_set():
                    return
                continue
            if item[0] == "new":
                in_flight += 1
            elif item[0] == "done":
                in_flight -= 1
            elif item[0] == "eof":
                eof = True
            else:
                _, req, k, final, msg = item
                is_err = bool(msg.error_message)
                self.log.write(ev="send", rpc="stream", id=req.id, k=k, final=final,
                               output=len(msg.infer_response.outputs) > 0, error=is_err, peer=peer,
                               t_ns=time.time_ns())
                yield msg
        stop.set()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="TCP port (0: any free one; printed as READY <port>)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log", help="ground-truth JSON Lines log (appended)")
    ap.add_argument("--max-workers", type=int, default=32,
                    help="grpcio handler threads (default 32); each open stream holds one for its life")
    a = ap.parse_args()

    stop = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=a.max_workers),
                         maximum_concurrent_rpcs=None)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(Log(a.log), stop), server)
    port = server.add_insecure_port(f"{a.host}:{a.port}")
    if port == 0:
        sys.exit(f"triton_server.py: cannot bind {a.host}:{a.port}")
    server.start()
    print(f"READY {port}", flush=True)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    # New RPCs are refused at once; running ones get 1 s, then are
    # cancelled (RST_STREAM: the client sees CANCELLED); then the workers
    # still sleeping are released.
    server.stop(grace=1.0).wait()
    stop.set()


if __name__ == "__main__":
    main()

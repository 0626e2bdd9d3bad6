#!/usr/bin/env python3
"""TLS streaming workload for `cargo xtask bench tls` (same protocol as
benchpeer: prints `ready PID`, waits for `go` on stdin, prints one JSON line).

  tls_bench.py stream N   an HTTPS server thread (Python's ssl: OpenSSL, a
                          socket BIO) answers one request with N SSE chunks,
                          each one SSL_write, as fast as a client thread of
                          the same process reads them; prints
                          {"writes": N, "wall_s": …, "cpu_s": writer thread CPU}
  tls_bench.py idle       maps OpenSSL (imports ssl) and does nothing: a
                          target elsewhere, so the agent attaches its TLS
                          probes to another process using the same libssl

The certificate is made once per run with the `openssl` command (Debian's).
"""
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


def main():
    mode = sys.argv[1]
    if mode == "idle":
        print(f"ready {os.getpid()}", flush=True)
        sys.stdin.readline()
        print(json.dumps({"writes": 0, "wall_s": 0, "cpu_s": 0}), flush=True)
        return
    n = int(sys.argv[2])
    d = tempfile.mkdtemp(prefix="tls-bench-")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(cert, key)
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    result = {}
    go = threading.Event()

    def serve():
        conn, _ = lsock.accept()
        s = sctx.wrap_socket(conn, server_side=True)
        req = b""
        while b"\r\n\r\n" not in req:
            req += s.recv(4096)
        go.wait()
        t0, c0 = time.perf_counter(), time.thread_time()
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for _ in range(n):
            s.sendall(CHUNK)
        s.sendall(b"data: [DONE]\n\n")
        result.update(writes=n, wall_s=time.perf_counter() - t0, cpu_s=time.thread_time() - c0)
        s.close()

    t = threading.Thread(target=serve)
    t.start()
    c = cctx.wrap_socket(socket.create_connection(("127.0.0.1", port)))
    body = json.dumps({"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    go.set()
    while c.recv(65536):
        pass
    t.join()
    c.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

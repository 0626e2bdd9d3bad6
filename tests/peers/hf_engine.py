"""A vLLM-like engine for the tokenizer root test (tests/tests/tokens.rs).

Run as `vllm serve MODEL [--tokenizer T] [--revision R] [--download-dir D]
[--port P] [--host H] [--counts FILE] [--tokens-per-chunk N]` (the test
starts it through a file named `vllm`, so its command line reads as
vLLM's). MODEL is a model directory or a hub id, loaded the way vLLM loads
its tokenizer: `transformers.AutoTokenizer.from_pretrained` (hub ids from
the HF cache: `HF_HUB_CACHE`/`HF_HOME`/`--download-dir`, offline).

It serves the OpenAI API as vLLM counts it:
- chat: the messages (tool-call arguments parsed into objects, as vLLM
  does) rendered by `apply_chat_template(tools=…, add_generation_prompt,
  **chat_template_kwargs)`, encoded without the tokenizer's own specials;
- completions: the prompt encoded with them;
- output: a canned answer's token ids, streamed 2–3 tokens per chunk
  (vLLM's `--stream-interval`), each chunk's text the incremental
  detokenisation, plus the end-of-sequence token (counted, not shown)
  when it stops; a request offering tools whose last message asks for
  the weather gets a tool call (streamed as vLLM's Hermes parser streams
  one: the name, then argument fragments).
No `usage` unless `stream_options.include_usage`. Each request's own
counts are appended to --counts as one JSON line (`model` tag, prompt
and completion tokens) — the test's truth.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer  # noqa: E402

ANSWER = (
    "Sure! Here are three colours of the rainbow: red, orange and yellow. "
    "The others are green, blue, indigo and violet — seven in all, "
    "as Newton counted them in 1672."
)


def args_of(argv):
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("cmd", choices=["serve"])
    p.add_argument("model")
    p.add_argument("--tokenizer")
    p.add_argument("--revision")
    p.add_argument("--tokenizer-revision")
    p.add_argument("--download-dir")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--counts", required=True)
    p.add_argument("--tokens-per-chunk", type=int, default=3)
    return p.parse_args(argv)


class Engine:
    def __init__(self, a):
        self.a = a
        self.tok = AutoTokenizer.from_pretrained(
            a.tokenizer or a.model,
            revision=a.tokenizer_revision or a.revision,
            cache_dir=a.download_dir,
        )
        self.lock = threading.Lock()

    def prompt_tokens(self, path, body):
        if path.endswith("/chat/completions"):
            messages = []
            for m in body["messages"]:
                m = dict(m)
                calls = m.get("tool_calls")
                if calls:
                    m["tool_calls"] = [
                        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                        for c in calls
                    ]
                messages.append(m)
            text = self.tok.apply_chat_template(
                messages,
                tools=body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True),
                tokenize=False,
                **(body.get("chat_template_kwargs") or {}),
            )
            return len(self.tok.encode(text, add_special_tokens=False))
        prompt = body["prompt"]
        prompts = prompt if isinstance(prompt, list) else [prompt]
        return sum(len(self.tok.encode(p, add_special_tokens=True)) for p in prompts)

    def count(self, tag, prompt, completion):
        with self.lock, open(self.a.counts, "a") as f:
            f.write(json.dumps({"model": tag, "prompt_tokens": prompt, "completion_tokens": completion}) + "\n")


def chunks(tok, ids, n):
    """Incremental detokenisation, `n` tokens per chunk: each chunk's text is
    what decoding the ids so far adds."""
    out, shown = [], ""
    for i in range(0, len(ids), n):
        text = tok.decode(ids[: i + n], skip_special_tokens=True)
        out.append(text[len(shown):])
        shown = text
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine = None

    def log_message(self, *a):
        pass

    def send_json(self, obj, status=200):
        b = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def event(self, obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        if self.path in ("/health", "/v1/models"):
            return self.send_json({"ok": True})
        self.send_json({"error": "not found"}, 404)

    def do_POST(self):
        e = self.engine
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        chat = self.path.endswith("/chat/completions")
        if not chat and not self.path.endswith("/completions"):
            return self.send_json({"error": "not found"}, 404)
        prompt = e.prompt_tokens(self.path, body)
        tag = body.get("model", "")
        tok = e.tok
        last = (body.get("messages") or [{}])[-1].get("content") or ""
        tool = chat and body.get("tools") and "weather" in str(last)
        if tool:
            args = json.dumps({"city": "Paris", "days": 3})
            generated = '<tool_call>\n{"name": "get_weather", "arguments": ' + args + "}\n</tool_call>"
            ids = tok.encode(generated, add_special_tokens=False)
        else:
            ids = tok.encode(ANSWER, add_special_tokens=False)[: body.get("max_tokens", 10**6)]
        stop = tool or len(ids) < body.get("max_tokens", 10**6)
        completion = len(ids) + (1 if stop else 0)
        finish = ("tool_calls" if tool else "stop") if stop else "length"
        e.count(tag, prompt, completion)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        rid = "cmpl-%d" % time.monotonic_ns()
        if not body.get("stream"):
            text = tok.decode(ids, skip_special_tokens=True)
            if chat:
                msg = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": msg, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            return self.send_json({"id": rid, "model": tag, "choices": [choice], "usage": usage})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "model": tag}
        if chat:
            self.event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        time.sleep(0.02)
        if tool:
            # The Hermes parser: the name first, then argument fragments.
            self.event({**head, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}}]})
            for frag in (args[:10], args[10:]):
                time.sleep(0.01)
                self.event({**head, "choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": frag}}]}}]})
        else:
            for text in chunks(tok, ids, e.a.tokens_per_chunk):
                if chat:
                    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": text, "finish_reason": None}
                self.event({**head, "choices": [choice]})
                time.sleep(0.005)
        end = {"index": 0, "finish_reason": finish}
        end.update({"delta": {}} if chat else {"text": ""})
        self.event({**head, "choices": [end]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self.event({**head, "choices": [], "usage": usage})
        self.event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main():
    a = args_of(sys.argv[1:])
    Handler.engine = Engine(a)
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    print("listening %d" % a.port, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()

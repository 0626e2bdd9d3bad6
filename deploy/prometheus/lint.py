#!/usr/bin/env python3
"""Offline checks of tokentap's Prometheus rules and Grafana dashboard that
promtool cannot do; `deploy/prometheus/check.sh` runs this, then promtool.

Owns: the table of the instruments the agent exports (checked against the
agent's source: every name, unit and kind), their Prometheus names as the
Collector's `prometheus` exporter writes them, and these checks:

  * every metric an alert, recording rule, dashboard panel, dashboard
    annotation, template variable query or runbook query names is one the
    agent exports (or a recording rule of recording.yaml), and every label
    they name (matchers, grouping, legends, annotation templates) is one
    that metric can carry (its attributes or a resource attribute), with
    values the agent writes where it fixes them (error_type,
    tokentap_request_type, gen_ai_token_type, tokentap_stream, hw_type,
    tokentap_event_kind; error_type per series: the events counter has its
    own error kinds), a regex alternative matching at least one of them;
  * every alert has a severity, a summary, a description and a
    `runbook_url` whose anchor is a heading of docs/runbook.md;
  * every alert has a promtool test case that fires it and one that must
    not (tests.yaml), and the tests' input series pass the name, label and
    value checks above;
  * the dashboard: valid JSON, schemaVersion >= 38, a Prometheus datasource
    variable every panel and annotation uses, the template variables model,
    model_version, request_type and tenant, every `$variable` used defined,
    unique panel ids, every runbook link's anchor a heading of the runbook;
  * it writes every dashboard expression (variables substituted) and every
    expression of the runbook's ```promql blocks into a rules file
    (--query-rules FILE) for `promtool check rules` to parse;
  * it writes a promtool test (--smoke-test-dir DIR) in which every
    dashboard query must return data from series shaped like the agent's;
  * --mutation-test PROMTOOL: each quiet case of tests.yaml passes with its
    alert alone and fails once the alert is loosened (a threshold / 10,
    `> 0` -> `>= 0`, or no `for`), so no quiet case is quiet by accident;
  * --self-test: each check above catches a deliberate breakage.

Must not: need a network, a Prometheus server or anything but Python 3,
PyYAML (check.sh provides a pinned one) and, for --mutation-test, promtool.

Usage: lint.py [--query-rules FILE] [--smoke-test-dir DIR] [--self-test] [--mutation-test PROMTOOL]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
PROM = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "tokentap.json"
RUNBOOK = REPO / "docs" / "runbook.md"
AGENT_SRC = REPO / "agent" / "src"

# Every instrument the agent exports: OTel name -> (kind, unit). Kinds:
# histogram, counter (monotonic sum), updown (non-monotonic sum), gauge.
# check_source() proves this table against agent/src, both ways.
INSTRUMENTS: dict[str, tuple[str, str]] = {
    # agent/src/sinks/otlp/mod.rs: request instruments
    "gen_ai.server.time_to_first_token": ("histogram", "s"),
    "gen_ai.server.time_per_output_token": ("histogram", "s"),
    "gen_ai.server.request.duration": ("histogram", "s"),
    "tokentap.server.time_per_output_chunk": ("histogram", "s"),
    "tokentap.server.queue_time": ("histogram", "s"),
    "tokentap.server.engine_queue_time": ("histogram", "s"),
    "tokentap.server.prefill_time": ("histogram", "s"),
    "tokentap.server.decode_time": ("histogram", "s"),
    "tokentap.server.cached_input_tokens": ("counter", "{token}"),
    "gen_ai.server.token.usage": ("histogram", "{token}"),
    "tokentap.requests": ("counter", "{request}"),
    # agent/src/sinks/otlp/mod.rs: requests that are not LLM requests, by route class
    "tokentap.http.requests": ("counter", "{request}"),
    # agent/src/sinks/otlp/mod.rs: timeline events (agent/src/timeline/), one per
    # event, by kind
    "tokentap.events": ("counter", "{event}"),
    "tokentap.events.folded": ("counter", "{event}"),
    # agent/src/stage/health.rs: the agent's health (INSTRUMENTS)
    "tokentap.capture.events": ("counter", "{event}"),
    "tokentap.capture.dropped": ("counter", "{record}"),
    "tokentap.capture.bodies_left": ("counter", "{call}"),
    "tokentap.capture.pressure": ("counter", "{episode}"),
    "tokentap.decode.errors": ("counter", "{error}"),
    "tokentap.decode.unsupported_protocol": ("counter", "{connection}"),
    "tokentap.decode.joined_mid_stream": ("counter", "{connection}"),
    "tokentap.decode.tls": ("counter", "{connection}"),
    "tokentap.decode.http2": ("counter", "{connection}"),
    "tokentap.decode.unresolved_headers": ("counter", "{field}"),
    "tokentap.decode.http2.dropped": ("counter", "{connection}"),
    "tokentap.decode.grpc.skipped": ("counter", "{message}"),
    "tokentap.decode.shed": ("counter", "{cut}"),
    "tokentap.decode.memory": ("gauge", "By"),
    "tokentap.files.refused": ("counter", "{file}"),
    "tokentap.tokens.tokenized": ("counter", "{count}"),
    "tokentap.tokens.tokenize_failed": ("counter", "{count}"),
    "tokentap.tokens.agreement": ("counter", "{check}"),
    "tokentap.tokens.tokenizer": ("gauge", "{process}"),
    "tokentap.tokens.tokenize_cpu": ("counter", "ns"),
    "tokentap.tls.calls": ("counter", "{call}"),
    "tokentap.tls.unattributed": ("counter", "{call}"),
    "tokentap.tls.bios_linked": ("counter", "{bio}"),
    "tokentap.tls.processes": ("gauge", "{process}"),
    "tokentap.tls.libraries": ("gauge", "{file}"),
    "tokentap.tls.attach_failures": ("counter", "{process}"),
    "tokentap.tls.undecoded": ("counter", "{connection}"),
    "tokentap.metrics.attribute_overflow": ("counter", "{value}"),
    "tokentap.self_requests": ("counter", "{request}"),
    "tokentap.engine.scrape.failures": ("counter", "{scrape}"),
    "tokentap.export.failures": ("counter", "{export}"),
    "tokentap.connections.active": ("updown", "{connection}"),
    "tokentap.requests.in_flight": ("updown", "{request}"),
    # agent/src/sinks/otlp/mod.rs: engines' own /metrics
    "tokentap.engine.kv_cache.usage": ("gauge", "1"),
    "tokentap.engine.requests.waiting": ("gauge", "{request}"),
    "tokentap.engine.requests.running": ("gauge", "{request}"),
    "tokentap.engine.info": ("gauge", ""),
    # agent/src/gpu/instruments.rs: devices
    "hw.gpu.utilization": ("gauge", "1"),
    "hw.gpu.memory.utilization": ("gauge", "1"),
    "hw.power": ("gauge", "W"),
    "hw.temperature": ("gauge", "Cel"),
    "tokentap.gpu.memory_controller.utilization": ("gauge", "1"),
    "tokentap.gpu.throttled": ("gauge", "1"),
    "tokentap.gpu.clock.sm": ("gauge", "MHz"),
    "hw.gpu.memory.usage": ("updown", "By"),
    "hw.gpu.memory.limit": ("updown", "By"),
    "hw.energy": ("counter", "J"),
    # agent/src/gpu/engine_instruments.rs: engine <-> GPU
    "tokentap.engine.gpu": ("gauge", "1"),
    "tokentap.gpu.process.memory.usage": ("updown", "By"),
    "tokentap.gpu.energy_per_output_token": ("gauge", "J/{token}"),
    "tokentap.gpu.idle_energy": ("counter", "J"),
}

# Attribute keys per instrument (OTel names; label = key with every
# character outside [a-zA-Z0-9] made `_`). check_source() proves that each
# key is set somewhere in agent/src (KeyValue::new); which instrument gets
# which key is read from sinks/otlp/mod.rs, gpu/instruments.rs and
# gpu/engine_instruments.rs by hand.
REQUEST_KEYS = {
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
    "gen_ai.response.model", "tokentap.stream", "tokentap.tenant",
    "tokentap.caller", "tokentap.request.type", "server.port",
    "tokentap.model.version", "error.type", "tokentap.role",
    "tokentap.engine.version",
}
DEVICE_KEYS = {"hw.id", "hw.name", "hw.vendor", "hw.parent"}
ENGINE_KEYS = {"gen_ai.provider.name", "tokentap.engine.pid"}
ATTRIBUTES: dict[str, set[str]] = {
    "gen_ai.server.time_to_first_token": REQUEST_KEYS,
    "gen_ai.server.time_per_output_token": REQUEST_KEYS,
    "gen_ai.server.request.duration": REQUEST_KEYS,
    "tokentap.server.time_per_output_chunk": REQUEST_KEYS,
    "tokentap.server.queue_time": REQUEST_KEYS,
    "tokentap.server.engine_queue_time": REQUEST_KEYS,
    "tokentap.server.prefill_time": REQUEST_KEYS,
    "tokentap.server.decode_time": REQUEST_KEYS,
    "tokentap.server.cached_input_tokens": REQUEST_KEYS,
    "gen_ai.server.token.usage": REQUEST_KEYS | {"gen_ai.token.type"},
    "tokentap.requests": REQUEST_KEYS,
    # Metrics::other_request: requests that are not LLM requests.
    "tokentap.http.requests": {"gen_ai.provider.name", "server.port", "tokentap.model.version",
                               "http.request.method", "http.response.status_code",
                               "tokentap.http.route_class"},
    # Metrics::event: the kind always; tenant, caller, model version and
    # error kind when the event names them (each only on some kinds).
    "tokentap.events": {"tokentap.event.kind", "tokentap.tenant", "tokentap.caller",
                        "tokentap.model.version", "error.type"},
    "tokentap.engine.kv_cache.usage": ENGINE_KEYS | {"server.port"},
    "tokentap.engine.requests.waiting": ENGINE_KEYS | {"server.port"},
    "tokentap.engine.requests.running": ENGINE_KEYS | {"server.port"},
    "tokentap.engine.info": ENGINE_KEYS | {"gen_ai.request.model", "tokentap.model.version",
                                           "tokentap.engine.version",
                                           "tokentap.serving_config.version"},
    "hw.gpu.utilization": DEVICE_KEYS | {"hw.gpu.task"},
    "hw.gpu.memory.utilization": DEVICE_KEYS,
    "hw.power": DEVICE_KEYS | {"hw.type"},
    "hw.temperature": DEVICE_KEYS | {"hw.type"},
    "tokentap.gpu.memory_controller.utilization": DEVICE_KEYS,
    "tokentap.gpu.throttled": DEVICE_KEYS | {"tokentap.gpu.throttle_reason"},
    "tokentap.gpu.clock.sm": DEVICE_KEYS,
    "hw.gpu.memory.usage": DEVICE_KEYS,
    "hw.gpu.memory.limit": DEVICE_KEYS,
    "hw.energy": DEVICE_KEYS | {"hw.type"},
    "tokentap.engine.gpu": ENGINE_KEYS | {"hw.id"},
    "tokentap.gpu.process.memory.usage": ENGINE_KEYS | {"hw.id", "process.pid"},
    "tokentap.gpu.energy_per_output_token": ENGINE_KEYS | {"gen_ai.response.model"},
    "tokentap.gpu.idle_energy": {"hw.id"},
    # stage/health.rs: the tokenizer stage's counts (Reading::ByAttrs).
    "tokentap.tokens.tokenized": {"direction"},
    "tokentap.tokens.tokenize_failed": {"reason"},
    "tokentap.tokens.agreement": {"gen_ai.provider.name", "direction", "result"},
    "tokentap.tokens.tokenizer": {"state"},
}
# Resource attributes, labels on every series with the Collector's
# resource_to_telemetry_conversion: the agent's (service.name, host.name,
# k8s.node.name), an engine container's (container.id, k8s.pod.uid,
# k8s.pod.name, k8s.namespace.name), what deploy/collector/config.yaml's
# k8sattributes adds, and the scrape's own job and instance.
RESOURCE_LABELS = {
    "service_name", "host_name", "k8s_node_name", "container_id", "k8s_pod_uid",
    "k8s_pod_name", "k8s_namespace_name", "k8s_deployment_name",
    "k8s_statefulset_name", "k8s_daemonset_name", "k8s_container_name",
    "container_image_name", "container_image_tag", "app", "model", "job",
    "instance",
}


# Label values the rules and queries may match, for the labels whose
# values the agent fixes. check_source() finds each as a string literal in
# agent/src (error types in decode/, request types in identity/; the event
# kinds are read from their declaration).
LABEL_VALUES = {
    "error_type": {"http_429", "http_4xx", "http_5xx", "upstream_reset", "stream_error",
                   "client_disconnect", "truncated_capture", "decode_error",
                   "unsupported_protocol"},
    "tokentap_request_type": {"chat", "completion", "tool_call", "embedding", "batch", "unknown"},
    "gen_ai_token_type": {"input", "output"},
    "tokentap_stream": {"true", "false"},
    "hw_type": {"gpu"},
    # agent/src/stage/events.rs's declaration (kind::ALL), read below
    "tokentap_event_kind": set(),
}


def declared_event_kinds() -> set[str]:
    """The event kinds agent/src/stage/events.rs declares (its `kinds!`
    block: `NAME = "kind", Source, [...]`): the one list of them."""
    text = (AGENT_SRC / "stage" / "events.rs").read_text()
    block = text[text.index("kinds! {"):]
    kinds = set(re.findall(r'^\s*[A-Z0-9_]+ = "([a-z0-9_.]+)", [A-Za-z]+, \[', block, re.M))
    if not kinds:
        sys.exit("lint.py: no event kinds found in agent/src/stage/events.rs")
    return kinds


LABEL_VALUES["tokentap_event_kind"] = declared_event_kinds()

# Where one series' label has values of its own instead: the events
# counter's error_type is a caller.error_burst's kind (timeline/callers.rs
# ERROR_KINDS: 401 and 403 together, no other 4xx), not a request's.
SERIES_LABEL_VALUES = {
    "tokentap_events_total": {
        "error_type": {"http_429", "http_401_403", "http_5xx", "client_disconnect"},
    },
}

# A selector: optional metric name, then {matchers} (quoted values may hold
# braces and commas).
SELECTOR_RE = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}')
MATCHER_RE = re.compile(r'\b(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def allowed_values(metric: str | None, label: str) -> set[str] | None:
    """The values `label` can have on `metric` (None: not fixed). A metric
    that is not one of the agent's (a recording rule, or no name) may have
    any value some series has."""
    own = SERIES_LABEL_VALUES.get(metric or "", {})
    if label in own:
        return own[label]
    if metric and metric in exported_series_names():
        return LABEL_VALUES.get(label)
    values = set(LABEL_VALUES.get(label, set()))
    for per in SERIES_LABEL_VALUES.values():
        values |= per.get(label, set())
    return values or None


def check_values(exprs: list[tuple[str, str]], errors: list[str]) -> int:
    """Every alternative matched against a label whose values the agent
    fixes is one of the values that label has on that metric — a literal
    one of them, or (=~, !~) a regex that matches at least one; `.*`,
    `$var` and empty strings pass."""
    n = 0
    for where, expr in exprs:
        for sel in SELECTOR_RE.finditer(expr):
            metric = sel.group(1)
            for m in MATCHER_RE.finditer(sel.group(2)):
                label, op, value = m.group(1), m.group(2), m.group(3)
                values = allowed_values(metric, label)
                if values is None:
                    continue
                for alt in value.split("|"):
                    n += 1
                    if alt in ("", ".*", ".+") or "$" in alt or alt in values:
                        continue
                    if op in ("=~", "!~"):
                        try:
                            if any(re.fullmatch(alt, v) for v in values):
                                continue
                        except re.error:
                            pass
                    on = f"{metric} " if metric else ""
                    errors.append(f"{where}: {on}{label} never has the value {alt!r} (values: {sorted(values)})")
    return n


def label_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", key)


def series_labels() -> dict[str, set[str]]:
    """Prometheus series name -> the labels it can carry."""
    out = {}
    for series, otel in exported_series_names().items():
        labels = {label_name(k) for k in ATTRIBUTES.get(otel, set())} | RESOURCE_LABELS
        if series.endswith("_bucket"):
            labels.add("le")
        out[series] = labels
    return out


# Builder method word (or the helper closure that wraps it) -> kind.
BUILDER_KINDS = {
    "histogram": "histogram",
    "observable_counter": "counter",
    "counter": "counter",
    "observable_up_down_counter": "updown",
    "up_down_counter": "updown",
    "observable_gauge": "gauge",
    "gauge": "gauge",
}

# Collector-contrib 0.120.0 pkg/translator/prometheus unitMap / perUnitMap.
UNIT_MAP = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds",
    "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes",
    "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes",
    "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules",
    "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz",
    "1": "", "%": "percent",
}
PER_UNIT_MAP = {"s": "second", "m": "minute", "h": "hour", "d": "day",
                "w": "week", "mo": "month", "y": "year"}


def _tokens(s: str) -> list[str]:
    return [t for t in re.split(r"[^A-Za-z0-9]+", s) if t]


def prometheus_name(otel: str, kind: str, unit: str) -> str:
    """The name the Collector's prometheus exporter gives an OTLP metric with
    add_metric_suffixes on and no namespace (normalizeName in
    pkg/translator/prometheus, collector-contrib 0.120.0)."""
    toks = _tokens(otel)
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    if main and not re.search(r"[{}]", main):
        m = "_".join(_tokens(UNIT_MAP.get(main, main)))
        if m and m not in toks:
            toks.append(m)
    if per and not re.search(r"[{}]", per):
        p = "_".join(_tokens(PER_UNIT_MAP.get(per, per)))
        if p and p not in toks:
            toks += ["per", p]
    if kind == "counter":
        toks = [t for t in toks if t != "total"] + ["total"]
    if unit == "1" and kind == "gauge":
        toks = [t for t in toks if t != "ratio"] + ["ratio"]
    return "_".join(toks)


def exported_series_names() -> dict[str, str]:
    """Prometheus series name -> the OTel instrument it comes from
    (histograms give _bucket, _sum and _count)."""
    out = {}
    for otel, (kind, unit) in INSTRUMENTS.items():
        base = prometheus_name(otel, kind, unit)
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[base + suffix] = otel
        else:
            out[base] = otel
    return out


# `#[cfg(test)] mod NAME { ...` (inline: the rest of the file is tests) and
# `#[cfg(test)] mod NAME;` (a file of its own, NAME.rs or NAME/mod.rs).
TEST_MOD_RE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*([{;])")


def _strip_tests(text: str) -> str:
    """The text before its inline test module (test modules come last)."""
    for m in TEST_MOD_RE.finditer(text):
        if m.group(2) == "{":
            return text[:m.start()]
    return text


def _test_files(path: Path, text: str) -> set[Path]:
    """The files of the test modules `path` declares out of line."""
    here = path.parent if path.name in ("mod.rs", "lib.rs", "main.rs") else path.with_suffix("")
    return {f for m in TEST_MOD_RE.finditer(text) if m.group(2) == ";"
            for f in (here / f"{m.group(1)}.rs", here / m.group(1) / "mod.rs")}


def agent_sources() -> dict[Path, str]:
    """agent/src's Rust files without their tests: inline test modules cut
    off, test modules of their own left out."""
    texts = {p: p.read_text() for p in sorted(AGENT_SRC.rglob("*.rs"))}
    tests = set().union(set(), *(_test_files(p, t) for p, t in texts.items()))
    return {p: _strip_tests(t) for p, t in texts.items() if p not in tests}


def check_source(errors: list[str]) -> None:
    """INSTRUMENTS against agent/src (outside test modules): each name is
    built there with its kind and unit, and no other instrument is."""
    sources = agent_sources()
    name_re = re.compile(r'"((?:gen_ai|tokentap|hw)\.[a-z0-9_.]+)"')
    found: dict[str, list[tuple[Path, int]]] = {}
    for path, text in sources.items():
        for m in name_re.finditer(text):
            before = text[max(0, m.start() - 40):m.start()]
            if re.search(r"KeyValue::new\(\s*$", before):
                continue  # an attribute key
            found.setdefault(m.group(1), []).append((path, m.start()))
    for otel, (kind, unit) in INSTRUMENTS.items():
        where = found.get(otel)
        if not where:
            errors.append(f"source: instrument {otel} is not built anywhere in agent/src")
            continue
        path, pos = where[0]
        text = sources[path]
        # The builder: either `.KIND("name")` or a helper whose body builds
        # one; the unit is the next string literal after the name, or a
        # `.with_unit("...")` in the helper (updown helpers fix "By").
        window_before = text[max(0, pos - 300):pos]
        window_after = text[pos:pos + 400]
        direct = re.search(r"\.(?:u64|f64|i64)_(\w+)\(\s*$", window_before)
        # A row of stage/health.rs's INSTRUMENTS: `row(Kind, "name", "unit", ...)`.
        table_row = re.search(r"\brow\(\s*(\w+),\s*$", window_before)
        if table_row:
            got_kind = {"Counter": "counter", "Gauge": "gauge", "UpDown": "updown"}.get(table_row.group(1))
            literals = re.findall(r'"([^"]*)"', window_after)
            got_unit = literals[1] if len(literals) > 1 else None
        elif direct:
            got_kind = BUILDER_KINDS.get(direct.group(1))
            unit_m = re.search(r'\.with_unit\("([^"]*)"\)', window_after)
            got_unit = unit_m.group(1) if unit_m else None
        else:
            helper = re.search(r"(\w+)\(\s*$", window_before)
            helper_name = helper.group(1) if helper else None
            got_kind, got_unit = _helper_kind_unit(text, helper_name, window_after, otel)
        if got_kind != kind:
            errors.append(f"source: {otel} is built as {got_kind!r} in {path.relative_to(REPO)}, the table says {kind!r}")
        if got_unit != unit:
            errors.append(f"source: {otel} has unit {got_unit!r} in {path.relative_to(REPO)}, the table says {unit!r}")
    all_text = "\n".join(sources.values())
    fixed = list(LABEL_VALUES.items()) + [(f"{s} {label}", v) for s, per in SERIES_LABEL_VALUES.items() for label, v in per.items()]
    for label, values in fixed:
        for v in sorted(values - {"true", "false", "unknown"}):
            if f'"{v}"' not in all_text:
                errors.append(f"source: {label} value {v!r} is written nowhere in agent/src (lint.py's LABEL_VALUES)")
    for key in sorted(set().union(*ATTRIBUTES.values())):
        # Set by the OTLP sink, or a health row's attribute pair
        # (`Reading::ByAttrs`: `("key", value)`, made a KeyValue by the sink).
        as_pair = re.search(r'\(\s*"' + re.escape(key) + r'",\s*[\w.]', sources.get(REPO / "agent/src/stage/health.rs", ""))
        if not as_pair and not re.search(r'KeyValue::new\(\s*"' + re.escape(key) + '"', all_text):
            errors.append(f"source: attribute {key} is set nowhere in agent/src (lint.py's ATTRIBUTES)")
    for name, where in found.items():
        if name in INSTRUMENTS:
            continue
        path, pos = where[0]
        text = sources[path]
        before = text[max(0, pos - 80):pos]
        if re.search(r"(?:_histogram|_counter|_gauge)\(\s*$", before) or re.search(r"\b(?:h|gauge|updown|obs_u64)\(\s*$", before) or re.search(r"\brow\(\s*\w+,\s*$", before) or re.search(r"\(\s*\n\s*$", before):
            errors.append(f"source: {path.relative_to(REPO)} builds instrument {name}, which deploy/prometheus/lint.py's table lacks")


def _helper_kind_unit(text: str, helper: str | None, after: str, otel: str):
    """Kind and unit of an instrument built through a helper closure or a
    table of tuples: the helper's definition names the builder."""
    literals = re.findall(r'"([^"]*)"', after)
    next_literal = literals[1] if len(literals) > 1 else None
    if helper is None:
        # A tuple in an array iterated by one builder (engine gauges).
        builder = re.search(r"for \(name, unit, desc, pick\) in gauges.*?\.(?:u64|f64|i64)_(\w+)\(name\)", text, re.S)
        return (BUILDER_KINDS.get(builder.group(1)) if builder else None, next_literal)
    definition = re.search(rf"let {re.escape(helper)}\s*=\s*\|[^|]*\|.*?\.(?:u64|f64|i64)_(\w+)\(name\)(.*?)\.build\(\)", text, re.S)
    if not definition:
        # The tuple form: `(\n "name", "unit", ...)`, helper is None above;
        # here a literal helper we do not know.
        return (None, None)
    kind = BUILDER_KINDS.get(definition.group(1))
    fixed_unit = re.search(r'\.with_unit\("([^"]*)"\)', definition.group(2))
    return (kind, fixed_unit.group(1) if fixed_unit else next_literal)


# --- PromQL: metric names an expression reads -------------------------------

PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
    "group_right", "offset", "bool", "inf", "nan", "atan2",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside strings,
    label matchers, range selectors and grouping clauses that are not
    function calls, keywords or numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"'(?:[^'\\]|\\.)*'", "''", e)
    e = re.sub(r"\{[^{}]*\}", " ", e)
    e = re.sub(r"\[[^\[\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", e)
    e = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if word.lower() in PROMQL_WORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # 1e3, 5m and the like
        names.add(word)
    return names


def label_refs(expr: str) -> list[tuple[str | None, str]]:
    """(metric or None, label) for every label an expression names: in a
    selector's matchers (with the selector's metric) and in by, without,
    on, ignoring, group_left and group_right clauses (None)."""
    refs: list[tuple[str | None, str]] = []
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^{}]*)\}", e):
        for matcher in m.group(2).split(","):
            lm = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)", matcher)
            if lm:
                refs.append((m.group(1), lm.group(1)))
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", e):
        for label in m.group(1).split(","):
            if label.strip():
                refs.append((None, label.strip()))
    return refs


def check_labels(exprs: list[tuple[str, str]], recorded: set[str], errors: list[str]) -> int:
    per_series = series_labels()
    anywhere = set().union(*per_series.values())
    n = 0
    for where, expr in exprs:
        for metric, label in label_refs(expr):
            n += 1
            if metric in per_series:
                if label not in per_series[metric]:
                    errors.append(f"{where}: {metric} has no label {label}")
            elif metric in recorded or metric is None:
                if label not in anywhere:
                    errors.append(f"{where}: no tokentap series has a label {label}")
    return n


def check_names(exprs: list[tuple[str, str]], known: set[str], errors: list[str]) -> int:
    n = 0
    for where, expr in exprs:
        names = metric_names(expr)
        if not names:
            errors.append(f"{where}: reads no metric: {expr!r}")
        for name in names:
            n += 1
            if name not in known:
                errors.append(f"{where}: {name} is not a metric tokentap exports (nor a recording rule)")
    return n


# --- rules and their tests ---------------------------------------------------

def github_slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def runbook_anchors() -> set[str]:
    anchors = set()
    in_code = False
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            anchors.add(github_slug(m.group(1)))
        for a in re.findall(r'<a (?:id|name)="([^"]+)"', line):
            anchors.add(a)
    return anchors


def load_rules(path: Path) -> list[dict]:
    doc = yaml.safe_load(path.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def check_rules(alerts: list[dict], recording: list[dict], tests: dict, errors: list[str]) -> None:
    anchors = runbook_anchors()
    names = [r["alert"] for r in alerts]
    for dup in {n for n in names if names.count(n) > 1}:
        errors.append(f"alerts.yaml: alert {dup} defined twice")
    for r in alerts:
        a, ann = r["alert"], r.get("annotations", {})
        if r.get("labels", {}).get("severity") not in ("info", "warning", "critical"):
            errors.append(f"alerts.yaml: {a}: severity label missing or not info/warning/critical")
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key):
                errors.append(f"alerts.yaml: {a}: annotation {key} missing")
        url = ann.get("runbook_url", "")
        m = re.fullmatch(r"docs/runbook\.md#([\w\-]+)", url)
        if not m:
            errors.append(f"alerts.yaml: {a}: runbook_url {url!r} is not docs/runbook.md#anchor")
        elif m.group(1) not in anchors:
            errors.append(f"alerts.yaml: {a}: runbook_url anchor #{m.group(1)} is no heading of docs/runbook.md")
    fires: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for t in tests.get("tests", []):
        for case in t.get("alert_rule_test", []) or []:
            n = case["alertname"]
            if case.get("exp_alerts"):
                fires[n] = fires.get(n, 0) + 1
            else:
                quiet[n] = quiet.get(n, 0) + 1
    for n in names:
        if not fires.get(n):
            errors.append(f"tests.yaml: no case fires {n}")
        if not quiet.get(n):
            errors.append(f"tests.yaml: no case checks that {n} stays quiet")
    for n in set(fires) | set(quiet):
        if n not in names:
            errors.append(f"tests.yaml: tests alert {n}, which alerts.yaml does not define")
    rec_names = {r["record"] for r in recording}
    tested = {
        m
        for t in tests.get("tests", [])
        for c in t.get("promql_exp_test", []) or []
        for m in metric_names(c["expr"])
    }
    for rn in sorted(rec_names - tested):
        errors.append(f"tests.yaml: recording rule {rn} has no promql_exp_test")


def runbook_exprs() -> list[tuple[str, str]]:
    """Every expression of the runbook's ```promql blocks: a line that
    starts with a space or an operator, or follows a line ending in one,
    continues the expression before it; `#` comments are dropped."""
    exprs: list[tuple[str, str]] = []
    block: list[str] | None = None
    start = 0
    for no, line in enumerate(RUNBOOK.read_text().splitlines(), 1):
        if block is None:
            if line.strip() == "```promql":
                block, start = [], no
            continue
        if line.strip() == "```":
            current: list[str] = []
            for text in block + [""]:
                code = re.sub(r"(^|\s)#.*$", "", text).rstrip()
                continues = bool(current) and (
                    code[:1].isspace()
                    or re.match(r"(/|\*|\+|-|and\b|or\b|unless\b|>|<|==)", code)
                    or re.search(r"(/|\*|\+|-|\band|\bor|\bunless|\bgroup_left|\bgroup_right)$", current[-1])
                )
                if code and continues:
                    current.append(code.strip())
                    continue
                if current:
                    exprs.append((f"docs/runbook.md block at line {start}", " ".join(current)))
                current = [code.strip()] if code else []
            block = None
            continue
        block.append(line)
    return exprs


# --- the dashboard -----------------------------------------------------------

GRAFANA_BUILTINS = {
    "__rate_interval", "__interval", "__interval_ms", "__range", "__range_s",
    "__range_ms", "__from", "__to", "__name", "__dashboard", "__org", "__user",
    "timeFilter", "__timeFilter",
}
REQUIRED_VARIABLES = {"datasource", "model", "model_version", "request_type", "tenant"}


def variables_used(text: str) -> set[str]:
    used = set(re.findall(r"\$\{(\w+)(?::\w+)?\}", text))
    used |= set(re.findall(r"\$(\w+)", text))
    used |= set(re.findall(r"\[\[(\w+)(?::\w+)?\]\]", text))
    return used


def substitute(expr: str) -> str:
    """A dashboard expression as Prometheus would see it with the variables
    at their "All" values."""
    e = expr.replace("$__rate_interval", "5m").replace("${__rate_interval}", "5m")
    e = e.replace("$__interval", "1m").replace("${__interval}", "1m")
    e = e.replace("$__range", "1h").replace("${__range}", "1h")
    e = re.sub(r"\$\{\w+(?::\w+)?\}", ".*", e)
    e = re.sub(r"\$\w+", ".*", e)
    return e


def walk_panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def check_dashboard(dash: dict, errors: list[str]) -> list[tuple[str, str]]:
    """Returns (where, expression) of every query, variables substituted."""
    exprs: list[tuple[str, str]] = []
    if dash.get("schemaVersion", 0) < 38:
        errors.append(f"dashboard: schemaVersion {dash.get('schemaVersion')} < 38")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    for name in sorted(REQUIRED_VARIABLES - set(variables)):
        errors.append(f"dashboard: template variable {name} missing")
    ds = variables.get("datasource")
    if ds and (ds.get("type") != "datasource" or ds.get("query") != "prometheus"):
        errors.append("dashboard: variable datasource is not a Prometheus datasource variable")
    ds_ref = {"type": "prometheus", "uid": "${datasource}"}
    defined = set(variables) | GRAFANA_BUILTINS
    for name, v in variables.items():
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip(), re.S)
            if not m:
                errors.append(f"dashboard: variable {name}: query {q!r} is not label_values(SELECTOR, LABEL)")
            else:
                exprs.append((f"dashboard variable {name}", substitute(m.group(1))))
            if v.get("datasource") != ds_ref:
                errors.append(f"dashboard: variable {name} does not use ${{datasource}}")
            for u in variables_used(q) - defined:
                errors.append(f"dashboard: variable {name} uses undefined ${u}")
    ids = []
    for p in walk_panels(dash.get("panels", [])):
        ids.append(p.get("id"))
        if p.get("type") == "row":
            continue
        title = p.get("title", "?")
        if "gridPos" not in p:
            errors.append(f"dashboard: panel {title!r} has no gridPos")
        if p.get("datasource") != ds_ref:
            errors.append(f"dashboard: panel {title!r} does not use ${{datasource}}")
        targets = p.get("targets", [])
        if not targets:
            errors.append(f"dashboard: panel {title!r} has no query")
        for t in targets:
            expr = t.get("expr", "")
            if not expr:
                errors.append(f"dashboard: panel {title!r} target {t.get('refId')} has no expr")
                continue
            for u in variables_used(expr + t.get("legendFormat", "")) - defined:
                errors.append(f"dashboard: panel {title!r} uses undefined ${u}")
            exprs.append((f"dashboard panel {title!r} {t.get('refId')}", substitute(expr)))
    anchors = runbook_anchors()
    for anchor in sorted(set(re.findall(r"docs/runbook\.md#([\w\-]+)", json.dumps(dash)))):
        if anchor not in anchors:
            errors.append(f"dashboard: links docs/runbook.md#{anchor}, which is no heading of docs/runbook.md")
    for dup in {i for i in ids if ids.count(i) > 1}:
        errors.append(f"dashboard: panel id {dup} used twice")
    if None in ids:
        errors.append("dashboard: a panel has no id")
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("builtIn"):
            continue
        if a.get("datasource") != ds_ref:
            errors.append(f"dashboard: annotation {a.get('name')!r} does not use ${{datasource}}")
        expr = a.get("expr", "")
        if not expr:
            errors.append(f"dashboard: annotation {a.get('name')!r} has no expr")
            continue
        for u in variables_used(expr) - defined:
            errors.append(f"dashboard: annotation {a.get('name')!r} uses undefined ${u}")
        exprs.append((f"dashboard annotation {a.get('name')!r}", substitute(expr)))
    return exprs


def label_templates(alerts: list[dict], dash: dict) -> list[tuple[str, set[str]]]:
    """Labels named by alert annotation templates ($labels.X), dashboard
    legends and annotation titles ({{X}}) and annotation tag keys."""
    out = []
    for r in alerts:
        text = json.dumps(r.get("annotations", {}))
        out.append((f"alert {r['alert']} annotations", set(re.findall(r"\$labels\.(\w+)", text))))
    for p in walk_panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            out.append((f"dashboard panel {p.get('title')!r} legend", set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))))
    for a in dash.get("annotations", {}).get("list", []):
        names = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", a.get("titleFormat", "") + a.get("textFormat", "")))
        names |= {k.strip() for k in a.get("tagKeys", "").split(",") if k.strip()}
        out.append((f"dashboard annotation {a.get('name')!r}", names))
    return out


def write_dashboard_rules(exprs: list[tuple[str, str]], path: Path) -> None:
    """One recording rule per query, so that `promtool check rules` parses
    each (the comment above each says where it came from)."""
    lines = ["groups:", "  - name: dashboard-and-runbook-queries", "    rules:"]
    for i, (where, e) in enumerate(exprs):
        lines.append(f"      # {where}")
        lines.append(f"      - record: query:{i}")
        lines.append(f"        expr: {json.dumps(e)}")
    path.write_text("\n".join(lines) + "\n")


# --- all of it ---------------------------------------------------------------

def run_checks(alerts_doc, recording_doc, tests_doc, dash, dashboard_rules: Path | None) -> tuple[list[str], dict]:
    errors: list[str] = []
    check_source(errors)
    alerts = [r for g in alerts_doc["groups"] for r in g["rules"]]
    recording = [r for g in recording_doc["groups"] for r in g["rules"]] if recording_doc else []
    if any("alert" not in r for r in alerts):
        errors.append("alerts.yaml: holds a rule that is not an alert")
    if any("record" not in r for r in recording):
        errors.append("recording.yaml: holds a rule that is not a recording rule")
    known = set(exported_series_names()) | {r["record"] for r in recording}
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in alerts]
    exprs += [(f"recording rule {r['record']}", r["expr"]) for r in recording]
    check_rules(alerts, recording, tests_doc, errors)
    dash_exprs = check_dashboard(dash, errors)
    book_exprs = runbook_exprs()
    if not book_exprs:
        errors.append("docs/runbook.md: no ```promql block found")
    # The tests' input series must look like what the agent exports, too.
    series = [
        (f"tests.yaml {t['name']!r} series", i["series"])
        for t in tests_doc.get("tests", [])
        for i in t.get("input_series", []) or []
    ]
    every = exprs + dash_exprs + book_exprs + series
    n_refs = check_names(every, known, errors)
    n_labels = check_labels(every, {r["record"] for r in recording}, errors)
    n_labels += check_values(every, errors)
    anywhere = set().union(*series_labels().values())
    for where, text in label_templates(alerts, dash):
        for label in text:
            if label not in anywhere:
                errors.append(f"{where}: template names label {label}, which no tokentap series has")
    if dashboard_rules is not None:
        write_dashboard_rules(dash_exprs + book_exprs, dashboard_rules)
    stats = {
        "alerts": len(alerts),
        "recording rules": len(recording),
        "dashboard queries": len(dash_exprs),
        "runbook queries": len(book_exprs),
        "test input series": len(series),
        "metric references checked": n_refs,
        "label references checked": n_labels,
        "instruments": len(INSTRUMENTS),
    }
    return errors, stats


def load_all():
    alerts = yaml.safe_load((PROM / "alerts.yaml").read_text())
    rec_path = PROM / "recording.yaml"
    recording = yaml.safe_load(rec_path.read_text()) if rec_path.exists() else None
    tests = yaml.safe_load((PROM / "tests.yaml").read_text())
    dash = json.loads(DASHBOARD.read_text())
    return alerts, recording, tests, dash


def self_test() -> int:
    """Breaks copies of the material on purpose; each breakage must be
    reported. Also pins the name translation on known cases."""
    failures = 0
    for otel, kind, unit, want in [
        ("gen_ai.server.time_to_first_token", "histogram", "s", "gen_ai_server_time_to_first_token_seconds"),
        ("tokentap.requests", "counter", "{request}", "tokentap_requests_total"),
        ("tokentap.events", "counter", "{event}", "tokentap_events_total"),
        ("tokentap.requests.in_flight", "updown", "{request}", "tokentap_requests_in_flight"),
        ("hw.gpu.utilization", "gauge", "1", "hw_gpu_utilization_ratio"),
        ("hw.gpu.memory.usage", "updown", "By", "hw_gpu_memory_usage_bytes"),
        ("hw.energy", "counter", "J", "hw_energy_joules_total"),
        ("hw.temperature", "gauge", "Cel", "hw_temperature_celsius"),
        ("tokentap.gpu.clock.sm", "gauge", "MHz", "tokentap_gpu_clock_sm_MHz"),
        ("tokentap.gpu.energy_per_output_token", "gauge", "J/{token}", "tokentap_gpu_energy_per_output_token_joules"),
        ("x.rate", "gauge", "By/s", "x_rate_bytes_per_second"),
        ("x.total.count", "counter", "1", "x_count_total"),
    ]:
        got = prometheus_name(otel, kind, unit)
        if got != want:
            print(f"self-test: prometheus_name({otel}) = {got}, want {want}")
            failures += 1
    base = load_all()
    breakages = []

    def breakage(what, expect, mutate):
        breakages.append((what, expect, mutate))

    breakage("a misspelt metric in an alert", "is not a metric tokentap exports",
             lambda a, r, t, d: a["groups"][0]["rules"][0].update(expr="histogram_quantile(0.95, rate(gen_ai_server_time_to_first_token_bucket[5m])) > 2"))
    breakage("a runbook anchor that does not exist", "is no heading of docs/runbook.md",
             lambda a, r, t, d: a["groups"][0]["rules"][0]["annotations"].update(runbook_url="docs/runbook.md#no-such-section"))
    breakage("an alert without description", "annotation description missing",
             lambda a, r, t, d: a["groups"][0]["rules"][0]["annotations"].pop("description"))
    breakage("an alert without a firing test", "no case fires",
             lambda a, r, t, d: t.update(tests=[{**x, "alert_rule_test": [c for c in x.get("alert_rule_test", []) or [] if c["alertname"] != "TokentapTTFTP95High" or not c.get("exp_alerts")]} for x in t["tests"]]))
    breakage("an alert without a quiet test", "stays quiet",
             lambda a, r, t, d: t.update(tests=[{**x, "alert_rule_test": [c for c in x.get("alert_rule_test", []) or [] if c["alertname"] != "TokentapTTFTP95High" or c.get("exp_alerts")]} for x in t["tests"]]))
    breakage("a dashboard panel with a made-up metric", "is not a metric tokentap exports",
             lambda a, r, t, d: next(p for p in walk_panels(d["panels"]) if p.get("targets"))["targets"][0].update(expr="rate(tokentap_made_up_total[5m])"))
    breakage("a dashboard panel using an undefined variable", "uses undefined $nosuchvar",
             lambda a, r, t, d: next(p for p in walk_panels(d["panels"]) if p.get("targets"))["targets"][0].update(expr='rate(tokentap_requests_total{tokentap_tenant=~"$nosuchvar"}[5m])'))
    breakage("the tenant variable removed", "template variable tenant missing",
             lambda a, r, t, d: d["templating"].update(list=[v for v in d["templating"]["list"] if v["name"] != "tenant"]))
    breakage("an old schemaVersion", "schemaVersion 30 < 38",
             lambda a, r, t, d: d.update(schemaVersion=30))
    breakage("a panel on a fixed datasource", "does not use ${datasource}",
             lambda a, r, t, d: next(p for p in walk_panels(d["panels"]) if p.get("targets")).update(datasource={"type": "prometheus", "uid": "prom1"}))
    breakage("a misspelt label in an alert's selector", "has no label tokentap_request_typ",
             lambda a, r, t, d: a["groups"][0]["rules"][0].update(expr=a["groups"][0]["rules"][0]["expr"].replace('tokentap_request_type!~', 'tokentap_request_typ!~', 1)))
    breakage("a GPU label on a request metric", "has no label hw_id",
             lambda a, r, t, d: a["groups"][0]["rules"][0].update(expr='rate(tokentap_requests_total{hw_id="x"}[5m]) > 0'))
    breakage("a misspelt label in a grouping clause", "no tokentap series has a label tokentap_tennant",
             lambda a, r, t, d: next(p for p in walk_panels(d["panels"]) if p.get("targets"))["targets"][0].update(expr='sum by (tokentap_tennant) (rate(tokentap_requests_total[5m]))'))
    breakage("a misspelt label in a legend", "template names label gen_ai_request_modle",
             lambda a, r, t, d: next(p for p in walk_panels(d["panels"]) if p.get("targets"))["targets"][0].update(legendFormat="{{gen_ai_request_modle}}"))
    breakage("a misspelt label in an alert summary", "template names label tokentap_tennant",
             lambda a, r, t, d: a["groups"][1]["rules"][3]["annotations"].update(summary="{{ $labels.tokentap_tennant }}"))
    breakage("an error kind the agent never writes", "never has the value 'http_500'",
             lambda a, r, t, d: a["groups"][1]["rules"][0].update(expr=a["groups"][1]["rules"][0]["expr"].replace('error_type="http_5xx"', 'error_type="http_500"')))
    breakage("a misspelt request type", "never has the value 'embeding'",
             lambda a, r, t, d: a["groups"][0]["rules"][0].update(expr=a["groups"][0]["rules"][0]["expr"].replace("tool_call|batch|embedding", "tool_call|batch|embeding")))
    breakage("an event kind the agent never writes", "never has the value 'caller.surges'",
             lambda a, r, t, d: a["groups"][0]["rules"][0].update(expr='increase(tokentap_events_total{tokentap_event_kind="caller.surges"}[10m]) > 0'))
    breakage("an event-kind regex that matches no kind", "never has the value 'callers.*'",
             lambda a, r, t, d: d["annotations"]["list"].append({**d["annotations"]["list"][-1], "expr": 'increase(tokentap_events_total{tokentap_event_kind=~"callers.*"}[5m]) > 0'}))
    breakage("a request's error kind on the events counter", "tokentap_events_total error_type never has the value 'http_4xx'",
             lambda a, r, t, d: a["groups"][0]["rules"][0].update(expr='increase(tokentap_events_total{error_type="http_4xx"}[10m]) > 0'))
    breakage("an event's error kind on the request counter", "tokentap_requests_total error_type never has the value 'http_401_403'",
             lambda a, r, t, d: a["groups"][1]["rules"][0].update(expr='rate(tokentap_requests_total{error_type="http_401_403"}[5m]) > 0'))
    breakage("a test series with a label the metric lacks", "has no label hw_id",
             lambda a, r, t, d: t["tests"][0]["input_series"][0].update(series='tokentap_requests_total{hw_id="GPU-1"}'))
    breakage("an attribute the agent never sets", "is set nowhere in agent/src",
             lambda a, r, t, d: ATTRIBUTES.update({"hw.gpu.utilization": DEVICE_KEYS | {"hw.gpu.mig_profile"}}))
    breakage("a table entry with a wrong unit", "has unit 's' in agent/src/sinks/otlp/mod.rs, the table says 'ms'",
             lambda a, r, t, d: INSTRUMENTS.update({"gen_ai.server.time_to_first_token": ("histogram", "ms")}))
    breakage("a table entry with a wrong kind", "is built as 'counter' in agent/src/stage/health.rs, the table says 'updown'",
             lambda a, r, t, d: INSTRUMENTS.update({"tokentap.export.failures": ("updown", "{export}")}))
    breakage("an instrument missing from the table", "lacks",
             lambda a, r, t, d: INSTRUMENTS.pop("tokentap.self_requests"))
    breakage("a table entry the agent does not build", "is not built anywhere",
             lambda a, r, t, d: INSTRUMENTS.update({"tokentap.server.made_up_time": ("histogram", "s")}))
    saved = dict(INSTRUMENTS)
    saved_attrs = dict(ATTRIBUTES)
    for what, expect, mutate in breakages:
        docs = copy.deepcopy(base)
        mutate(*docs)
        errors, _ = run_checks(*docs, None)
        INSTRUMENTS.clear()
        INSTRUMENTS.update(saved)
        ATTRIBUTES.clear()
        ATTRIBUTES.update(saved_attrs)
        if not any(expect in e for e in errors):
            print(f"self-test: NOT caught: {what} (expected an error containing {expect!r}; got {errors})")
            failures += 1
        else:
            print(f"self-test: caught: {what}")
    errors, _ = run_checks(*copy.deepcopy(base), None)
    if errors:
        print("self-test: the unbroken material has errors:\n  " + "\n  ".join(errors))
        failures += 1
    print(f"self-test: {len(breakages)} breakages, {failures} not caught or wrong")
    return 1 if failures else 0


def loosenings(rule: dict) -> list[tuple[str, dict]]:
    """Variants of an alert that fire more easily, one change each: every
    threshold after `>`/`>=` divided by 10 (`> 0` becomes `>= 0`), every
    `== 1` made `>= 0`, and `for` dropped."""
    out = []
    expr = rule["expr"]
    for m in re.finditer(r"(>=|>|==)\s*([0-9.]+)", expr):
        op, num = m.group(1), float(m.group(2))
        if op == "==":
            new = ">= 0"
        elif num == 0:
            new = ">= 0"
        else:
            new = f"{op} {num / 10:g}"
        r = copy.deepcopy(rule)
        r["expr"] = expr[:m.start()] + new + expr[m.end():]
        out.append((f"{m.group(0).strip()} -> {new}", r))
    if rule.get("for"):
        r = copy.deepcopy(rule)
        del r["for"]
        out.append(("no for", r))
    return out


def mutation_test(promtool: str) -> int:
    """Each quiet case of tests.yaml must be quiet *because of* a threshold
    or a `for`: with the alert alone, the case passes, and some loosening
    of the alert (loosenings()) makes it fire, so promtool fails it."""
    import subprocess
    import tempfile as tf

    alerts = {r["alert"]: r for r in load_rules(PROM / "alerts.yaml")}
    tests = yaml.safe_load((PROM / "tests.yaml").read_text())
    cases = []
    for t in tests["tests"]:
        for c in t.get("alert_rule_test", []) or []:
            if not c.get("exp_alerts"):
                cases.append((t, c))
    failures = 0
    with tf.TemporaryDirectory() as d:
        dd = Path(d)

        def run(rule: dict, group: dict, case: dict) -> bool:
            (dd / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "one", "rules": [rule]}]}, sort_keys=False))
            one = {k: v for k, v in group.items() if k != "alert_rule_test" and k != "promql_expr_test"}
            one["alert_rule_test"] = [case]
            (dd / "tests.yaml").write_text(yaml.safe_dump({
                "rule_files": ["rules.yaml"],
                "evaluation_interval": tests.get("evaluation_interval", "1m"),
                "tests": [one]}, sort_keys=False, allow_unicode=True))
            r = subprocess.run([promtool, "test", "rules", str(dd / "tests.yaml")], capture_output=True, text=True)
            return r.returncode == 0

        for group, case in cases:
            name = case["alertname"]
            rule = alerts[name]
            where = f"{group['name']!r} at {case['eval_time']}"
            if not run(rule, group, case):
                print(f"mutation: {name} {where}: fails with the alert as it is")
                failures += 1
                continue
            killers = [what for what, r in loosenings(rule) if not run(r, group, case)]
            if killers:
                print(f"mutation: {name} {where}: quiet; fires when loosened ({'; '.join(killers)})")
            else:
                print(f"mutation: {name} {where}: still quiet with every loosening: the case tests nothing")
                failures += 1
    print(f"mutation: {len(cases)} quiet cases, {failures} without teeth")
    return 1 if failures else 0


# Values of the synthetic series query_smoke_test() feeds the dashboard.
SAMPLE_LABELS = {
    "gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm",
    "gen_ai_request_model": "llama-3-8b", "gen_ai_response_model": "llama-3-8b",
    "tokentap_stream": "true", "tokentap_tenant": "acme", "tokentap_caller": "10.0.0.7",
    "tokentap_request_type": "chat", "server_port": "8000", "hw_id": "GPU-1",
    "hw_name": "NVIDIA H100 80GB HBM3", "hw_vendor": "nvidia", "hw_type": "gpu",
    "hw_gpu_task": "general", "tokentap_gpu_throttle_reason": "sw_power_cap",
    "tokentap_engine_pid": "4242", "process_pid": "4243",
    "http_request_method": "GET", "http_response_status_code": "200",
    "tokentap_http_route_class": "health",
}


def smoke_series() -> list[dict]:
    """Three hours of agent-shaped series, one per exported series (GPU
    labels on GPU metrics, request labels on request metrics, host_name on
    all): counters and histograms grow every minute, gauges hold a value.
    Model version A serves until 2 h, then version B; one series of
    requests fails with http_5xx. The events counter has a series per kind,
    with the labels that kind's events carry."""
    out = []
    for series, otel in exported_series_names().items():
        kind, _ = INSTRUMENTS[otel]
        keys = sorted(label_name(k) for k in ATTRIBUTES.get(otel, set()))
        base = {k: SAMPLE_LABELS[k] for k in keys if k in SAMPLE_LABELS}
        base["host_name"] = "node-a"
        if otel in REQUEST_INSTRUMENT_NAMES:
            variants = [
                (dict(base, tokentap_model_version="aaaaaaaaaaaa"), "0+10x120 1200x60"),
                (dict(base, tokentap_model_version="bbbbbbbbbbbb"), "_x120 0+10x60"),
            ]
            if otel == "tokentap.requests":
                variants.append((dict(base, tokentap_model_version="bbbbbbbbbbbb", error_type="http_5xx"), "_x120 0+1x60"))
            if otel == "gen_ai.server.token.usage":
                variants = [(dict(l, gen_ai_token_type=t), v) for l, v in variants for t in ("input", "output")]
        elif otel == "tokentap.events":
            variants = [(labels, "0+1x180") for labels in event_sample_labels(base)]
        elif kind in ("counter", "histogram"):
            variants = [(base, "0+10x180")]
        else:
            variants = [(base, "1x180")]
        for labels, values in variants:
            if series.endswith("_bucket"):
                for le in ("0.1", "1", "+Inf"):
                    out.append({"series": _series(series, dict(labels, le=le)), "values": values})
            else:
                out.append({"series": _series(series, labels), "values": values})
    return out


def event_sample_labels(base: dict) -> list[dict]:
    """One label set per event kind, as Metrics::event writes them: the
    kind; tenant and model version on caller and drift events; the version
    on engine and model-version events; the error kind on error bursts;
    nothing else on GPU events."""
    out = []
    for k in sorted(LABEL_VALUES["tokentap_event_kind"]):
        labels = {"host_name": base["host_name"], "tokentap_event_kind": k}
        if k.startswith(("caller.", "tokens.")):
            labels["tokentap_tenant"] = SAMPLE_LABELS["tokentap_tenant"]
        if k.startswith(("caller.", "tokens.", "engine.", "model_version.")):
            labels["tokentap_model_version"] = "bbbbbbbbbbbb"
        if k == "caller.error_burst":
            labels["error_type"] = "http_401_403"
        out.append(labels)
    return out


REQUEST_INSTRUMENT_NAMES = {o for o, keys in ATTRIBUTES.items() if keys is REQUEST_KEYS or "gen_ai.token.type" in keys}


def _series(name: str, labels: dict) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def query_smoke_test(dash: dict, out_dir: Path) -> int:
    """Writes a promtool test (out_dir/smoke-test.yaml) in which every
    dashboard query, as `count(QUERY) > 0` in an alert, must return data
    from smoke_series(): panels at 2 h 30 min, the "starts serving"
    annotation just after version B took over, "stops serving" when A has
    been idle 6 minutes. `offset 1d` reads `offset 1h` here (three hours of
    data)."""
    errors: list[str] = []
    exprs = check_dashboard(dash, errors)
    rules, cases = [], []
    for i, (where, e) in enumerate(exprs):
        e = e.replace("offset 1d", "offset 1h")
        name = f"Query{i}"
        rules.append({"alert": name, "expr": f"count({e}) > 0", "annotations": {"where": where}})
        if "starts serving" in where:
            at = "2h2m"
        elif "stops serving" in where:
            at = "2h7m"
        else:
            at = "2h30m"
        cases.append({"eval_time": at, "alertname": name,
                      "exp_alerts": [{"exp_labels": {}, "exp_annotations": {"where": where}}]})
    (out_dir / "smoke-rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard-smoke", "rules": rules}]}, sort_keys=False, allow_unicode=True))
    (out_dir / "smoke-test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["smoke-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"name": "every dashboard query returns data from agent-shaped series",
                   "interval": "1m", "input_series": smoke_series(), "alert_rule_test": cases}],
    }, sort_keys=False, allow_unicode=True))
    print(f"lint: wrote a smoke test of {len(rules)} dashboard queries over {len(smoke_series())} series")
    return len(rules)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--query-rules", type=Path, help="write the dashboard's and runbook's expressions as a rules file for promtool")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--smoke-test-dir", type=Path, metavar="DIR",
                    help="write a promtool test that every dashboard query returns data from agent-shaped series")
    ap.add_argument("--mutation-test", metavar="PROMTOOL",
                    help="check that each quiet test case fires when its alert is loosened")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.mutation_test:
        return mutation_test(args.mutation_test)
    errors, stats = run_checks(*load_all(), args.query_rules)
    if args.smoke_test_dir:
        query_smoke_test(load_all()[3], args.smoke_test_dir)
    for e in errors:
        print(f"lint: {e}")
    print("lint: " + ", ".join(f"{v} {k}" for k, v in stats.items()))
    if errors:
        print(f"lint: {len(errors)} problems")
        return 1
    print("lint: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

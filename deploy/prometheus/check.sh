#!/usr/bin/env bash
# Checks tokentap's Prometheus rules and Grafana dashboard offline:
#   bash deploy/prometheus/check.sh              # everything; exit 1 on any failure
#   bash deploy/prometheus/check.sh --self-test  # also: lint.py catches each deliberate breakage,
#                                                # and each quiet test case fires once its alert is loosened
#
# 1. promtool (from Debian's `prometheus` package, 2.42.x on bookworm;
#    downloaded with `apt-get download` and unpacked into
#    target/prometheus-tools/, never installed system-wide, so no Prometheus
#    service is set up) and PyYAML (pinned, from PyPI, in a venv there).
# 2. lint.py: metric names against the agent's source, runbook anchors,
#    a firing and a quiet test per alert, the dashboard's structure and
#    variables; it writes the dashboard's and runbook's queries into a
#    rules file.
# 3. promtool check rules: alerts.yaml, recording.yaml (if any), and every
#    query of the dashboard and of docs/runbook.md's ```promql blocks.
# 4. promtool test rules tests.yaml, and a generated test in which every
#    dashboard query must return data from series shaped like the agent's.
#
# Idempotent: the tools are fetched once (again only when the pins change).
# Needs: apt-get and dpkg-deb (Debian), python3 with venv, Debian's package
# lists (`apt-get update`; run here when root and the lists lack the package).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TOOLS="$REPO/target/prometheus-tools"
PROMTOOL="$TOOLS/promtool"
PROM_SERIES="2.42."            # Debian bookworm's prometheus
PYYAML="PyYAML==6.0.4"
VENV="$TOOLS/venv"

say() { printf 'check.sh: %s\n' "$*"; }
die() { printf 'check.sh: FAILED: %s\n' "$*" >&2; exit 1; }

install_promtool() {
    if [[ -x "$PROMTOOL" ]] && "$PROMTOOL" --version 2>&1 | grep -q "version $PROM_SERIES"; then
        return
    fi
    command -v apt-get >/dev/null || die "apt-get not found: promtool comes from Debian's prometheus package"
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
    mkdir -p "$TOOLS"
    local tmp
    tmp="$(mktemp -d)"
    if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>"$tmp/err"); then
        if [[ $(id -u) -eq 0 ]]; then
            say "apt-get download prometheus failed; running apt-get update once"
            apt-get update -qq || die "apt-get update failed"
            (cd "$tmp" && apt-get download prometheus >/dev/null 2>"$tmp/err") \
                || die "apt-get download prometheus: $(cat "$tmp/err")"
        else
            die "apt-get download prometheus: $(cat "$tmp/err") (run apt-get update as root)"
        fi
    fi
    local deb version
    deb="$(ls "$tmp"/prometheus_*.deb)"
    version="$(dpkg-deb -f "$deb" Version)"
    [[ "$version" == ${PROM_SERIES}* ]] \
        || die "Debian's prometheus is $version, not ${PROM_SERIES}x: check the rules with it and update PROM_SERIES"
    dpkg-deb -x "$deb" "$tmp/x"
    install -m 0755 "$tmp/x/usr/bin/promtool" "$PROMTOOL"
    {
        echo "package prometheus $version"
        echo "deb sha256 $(sha256sum "$deb" | cut -d' ' -f1)"
        echo "promtool sha256 $(sha256sum "$PROMTOOL" | cut -d' ' -f1)"
    } >"$TOOLS/promtool.version"
    rm -rf "$tmp"
}

install_pyyaml() {
    if [[ -x "$VENV/bin/python" ]] && grep -qx "$PYYAML" "$VENV/.pinned" 2>/dev/null; then
        return
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$PYYAML" || die "pip install $PYYAML failed"
    echo "$PYYAML" >"$VENV/.pinned"
}

install_promtool
install_pyyaml
say "$(head -1 "$TOOLS/promtool.version"); $("$PROMTOOL" --version 2>&1 | head -1)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=0
"$VENV/bin/python" "$HERE/lint.py" --query-rules "$work/queries.yaml" --smoke-test-dir "$work" || failed=1
if [[ "${1:-}" == "--self-test" ]]; then
    "$VENV/bin/python" "$HERE/lint.py" --self-test || failed=1
    # Each quiet test case must fire once its alert is loosened.
    "$VENV/bin/python" "$HERE/lint.py" --mutation-test "$PROMTOOL" || failed=1
fi

rule_files=("$HERE/alerts.yaml")
[[ -f "$HERE/recording.yaml" ]] && rule_files+=("$HERE/recording.yaml")
[[ -f "$work/queries.yaml" ]] && rule_files+=("$work/queries.yaml")
"$PROMTOOL" check rules "${rule_files[@]}" || failed=1

# promtool resolves rule_files relative to the test file's directory.
"$PROMTOOL" test rules "$HERE/tests.yaml" || failed=1
# Every dashboard query returns data from agent-shaped series.
if [[ -f "$work/smoke-test.yaml" ]]; then
    "$PROMTOOL" test rules "$work/smoke-test.yaml" || failed=1
fi

if [[ $failed -ne 0 ]]; then
    die "see above"
fi
say "all checks passed"

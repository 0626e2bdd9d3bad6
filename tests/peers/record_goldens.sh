#!/usr/bin/env bash
# Records the HTTP/2 and gRPC golden transcripts from the real peers with
# `tokentap capture` (root): each scenario's server in this directory's
# virtualenv on 127.0.0.1, the agent capturing its port, then the client.
# Writes tests/golden/captures/<scenario>.jsonl (the capture) and
# <scenario>.server.jsonl (the server's own log: the ground truth the golden
# test checks the decoded records against). Run from anywhere:
#
#   sudo tests/peers/record_goldens.sh [scenario...]
#
# Scenarios: triton_stream triton_unary triton_error triton_health
# triton_goaway h2_openai. Needs `cargo build -p tokentap` and the peers
# (`cargo xtask peers`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/tests/golden/captures"
py="$here/.venv/bin/python"
tt="$root/target/debug/tokentap"
mkdir -p "$out"
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing

port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# record NAME SERVER_SCRIPT CLIENT_COMMAND...
record() {
    local name="$1" server="$2"; shift 2
    local p; p="$(port)"
    local tmp; tmp="$(mktemp -d)"
    rm -f "$out/$name.server.jsonl"
    "$py" "$here/$server" --port "$p" --log "$out/$name.server.jsonl" > "$tmp/server.out" 2>&1 &
    local spid=$!
    until grep -q READY "$tmp/server.out"; do sleep 0.1; done
    "$tt" capture --port "$p" --out "$out/$name.jsonl" 2> "$tmp/capture.err" &
    local cpid=$!
    until grep -q "; ready" "$tmp/capture.err"; do sleep 0.1; done
    URL="127.0.0.1:$p" BASE="http://127.0.0.1:$p/v1" SPID=$spid "$@"
    sleep 1
    kill -INT $cpid; wait $cpid || true
    kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
    chmod 0644 "$out/$name.jsonl"
    echo "recorded $name: $(wc -l < "$out/$name.jsonl") events"
    rm -rf "$tmp"
}

tc() { "$py" "$here/triton_client.py" --url "$URL" "$@" --out /dev/null; }
h2c() { "$py" "$here/h2_client.py" --base-url "$BASE" "$@" --out /dev/null; }
goaway() {
    # A long stream; the server is stopped (grpcio: GOAWAY, then the open
    # stream cancelled) while it is being answered.
    "$py" "$here/triton_client.py" --url "$URL" --plan stream:2 --tokens 30 --gap-ms 20 --out /dev/null &
    local c=$!
    sleep 0.3
    kill -TERM "$SPID"
    wait $c || true
}

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(triton_stream triton_unary triton_error triton_health triton_goaway h2_openai)
for s in "${want[@]}"; do
    case "$s" in
        triton_stream) record "$s" triton_server.py tc --plan stream:4 --empty-final alternate ;;
        triton_unary) record "$s" triton_server.py tc --plan unary:2 ;;
        triton_error) record "$s" triton_server.py tc --plan error ;;
        triton_health) record "$s" triton_server.py tc --plan health ;;
        triton_goaway) record "$s" triton_server.py goaway ;;
        h2_openai) record "$s" h2_app.py h2c --concurrent 3 ;;
        *) echo "unknown scenario $s" >&2; exit 2 ;;
    esac
done

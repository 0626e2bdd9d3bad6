#!/usr/bin/env bash
# Runs the tokentap agent in a container with least privileges (podman +
# runc) against a simulated engine in its own network namespace, sends it
# streamed chat requests, and prints the agent's request log beside the
# engine's own ground truth.
#
# Owns: the demo's network namespace, engine process and containers (all
# removed on exit; the image stays in containers-storage). Must not: pull
# anything, or touch processes and namespaces it did not start.
#
# Usage (root; run install-tools.sh once first):
#   run-agent-demo.sh [--binary PATH] [--engine PATH] [--requests N]
#                     [--caps LIST] [--without CAP] [--engine-user USER]
#                     [--method buildah|oci] [--no-build]
#   --binary      the release agent (eBPF object embedded); default
#                 target/release/tokentap, else /tmp/tokentap-release
#   --engine      the simulated engine; default target/release/simengine,
#                 else target/debug/simengine
#   --caps        capabilities added after --cap-drop=ALL
#                 (default BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH)
#   --without CAP run once more with CAP removed and show that it fails
#   --engine-user run the engine as this user (default root)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
binary=
engine=
requests=5
caps=BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH
without=
engine_user=root
method=buildah
build=1
while (($#)); do
    case $1 in
        --binary) binary=$2; shift 2 ;;
        --engine) engine=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --caps) caps=$2; shift 2 ;;
        --without) without=$2; shift 2 ;;
        --engine-user) engine_user=$2; shift 2 ;;
        --method) method=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "run-agent-demo.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
first_of() { for f in "$@"; do [[ -x $f ]] && { echo "$f"; return; }; done; }
binary=${binary:-$(first_of "$repo/target/release/tokentap" /tmp/tokentap-release)}
engine=${engine:-$(first_of "$repo/target/release/simengine" "$repo/target/debug/simengine")}
[[ $(id -u) -eq 0 ]] || { echo "run-agent-demo.sh: run as root" >&2; exit 1; }
[[ -n $engine ]] || { echo "run-agent-demo.sh: no simengine (cargo build -p tokentap-tests --bins), or give --engine" >&2; exit 1; }
for t in podman buildah runc ip curl python3; do
    command -v "$t" >/dev/null || { echo "run-agent-demo.sh: $t missing (deploy/container/install-tools.sh)" >&2; exit 1; }
done

tag=localhost/tokentap:demo
netns=tokentap-demo-eng
port=8000
work=$(mktemp -d /tmp/tokentap-demo.XXXXXX)
engine_pid=
cleanup() {
    podman rm -f -t 2 tokentap-demo-agent >/dev/null 2>&1 || true
    [[ -n $engine_pid ]] && kill "$engine_pid" 2>/dev/null || true
    ip netns del "$netns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# tracefs: the agent attaches syscall tracepoints through it; in the
# container it is mounted read-only from the host.
if [[ ! -d /sys/kernel/tracing/events ]]; then
    mount -t tracefs tracefs /sys/kernel/tracing
fi

if ((build)); then
    "$here/build-image.sh" --binary "$binary" --tag "$tag" --method "$method"
fi

# The engine, as a pod would run it: its own network namespace, listening on
# its loopback. "vllm-sim" on its command line is what discovery matches
# (simengine ignores extra arguments).
ip netns add "$netns"
ip -n "$netns" link set lo up
cp "$engine" "$work/simengine"
chmod 0755 "$work" "$work/simengine"
touch "$work/truth.jsonl"; chmod 0666 "$work/truth.jsonl"
run_as=()
[[ $engine_user != root ]] && run_as=(setpriv --reuid "$(id -u "$engine_user")" --regid "$(id -g "$engine_user")" --clear-groups)
ip netns exec "$netns" "${run_as[@]}" "$work/simengine" --addr 127.0.0.1 --port "$port" \
    --truth "$work/truth.jsonl" vllm-sim >"$work/engine.log" 2>&1 &
engine_pid=$!
for _ in $(seq 50); do grep -q listening "$work/engine.log" && break; sleep 0.1; done
if ! grep -q listening "$work/engine.log"; then
    echo "run-agent-demo.sh: the engine did not start:" >&2
    cat "$work/engine.log" >&2
    exit 1
fi
echo "engine: pid $engine_pid (user $engine_user) in netns $netns, 127.0.0.1:$port"

mkdir -p "$work/out"
# The privileges: every capability dropped but $1; the host's PID namespace
# (the engine's /proc entries); tracefs read-only; the root filesystem
# read-only with no tmpfs of podman's own (as Kubernetes'
# readOnlyRootFilesystem); seccomp unconfined (podman's default profile
# refuses bpf() without SYS_ADMIN); podman's default network namespace.
run_agent() {
    local caplist=$1
    podman run -d --name tokentap-demo-agent \
        --pid=host --cap-drop=ALL --cap-add="$caplist" \
        --security-opt seccomp=unconfined \
        --read-only --read-only-tmpfs=false \
        -v /sys/kernel/tracing:/sys/kernel/tracing:ro \
        -v /sys/fs/cgroup:/sys/fs/cgroup:ro \
        --mount type=tmpfs,destination=/var/lib/tokentap,tmpfs-mode=0700 \
        -v "$work/out:/out" \
        "$tag" run --no-console --requests-log /out/requests.jsonl >/dev/null
}
wait_ready() {
    for _ in $(seq 100); do
        podman logs tokentap-demo-agent 2>&1 | grep -q "ready" && return 0
        [[ $(podman inspect -f '{{.State.Running}}' tokentap-demo-agent) == true ]] || return 1
        sleep 0.1
    done
    return 1
}

# One session: start the agent with these capabilities, send the requests,
# stop it (SIGTERM), print its log and its request log beside the truth.
session() {
    local caplist=$1
    : >"$work/out/requests.jsonl"
    : >"$work/truth.jsonl"
    local start_ms
    start_ms=$(date +%s%3N)
    run_agent "$caplist"
    if wait_ready; then
        echo "agent: ready $(($(date +%s%3N) - start_ms)) ms after podman run (caps $caplist;" \
            "netns $(podman inspect -f '{{.NetworkSettings.SandboxKey}}' tokentap-demo-agent))"
    else
        echo "agent: not ready (caps $caplist)"
    fi
    for i in $(seq "$requests"); do
        ip netns exec "$netns" curl -sfN "http://127.0.0.1:$port/v1/chat/completions" \
            -H 'content-type: application/json' \
            -d "{\"model\":\"sim-a\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"sim\":{\"id\":$i,\"ttft_ms\":$((20 + 10 * i)),\"gap_ms\":4,\"tokens\":$((4 + i))}}" >/dev/null
    done
    sleep 1
    podman stop -t 10 tokentap-demo-agent >/dev/null
    local rc
    rc=$(podman inspect -f '{{.State.ExitCode}}' tokentap-demo-agent)
    echo "agent log:"
    podman logs tokentap-demo-agent 2>&1 | sed 's/^/  /'
    podman rm tokentap-demo-agent >/dev/null
    echo "agent exit code $rc; request log ($(wc -l <"$work/out/requests.jsonl") lines) vs engine truth:"
    python3 - "$work/out/requests.jsonl" "$work/truth.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
truth = {t["client"]: t for t in map(json.loads, open(sys.argv[2]))}
print(f"  {'client':<18} {'provider':<8} {'ttft_s':>9} {'truth_ttft_s':>13} {'tpot_s':>9} {'out_tok':>7} {'truth_tok':>9}")
for r in recs:
    t = truth.get(r["client"] or "", {})
    # truth: first content write minus first read, bracket midpoints
    tt = (sum(t["first"]) - sum(t["read"])) / 2e9 if t else float("nan")
    print(f"  {str(r['client']):<18} {r['provider']:<8} {r['ttft_s']:>9.6f} {tt:>13.6f} {r['tpot_s'] or 0:>9.6f} {r['output_tokens']:>7} {t.get('tokens', '-'):>9}")
PY
}

session "$caps"
if [[ -n $without ]]; then
    reduced=$(echo "$caps" | tr ',' '\n' | grep -vix "$without" | paste -sd, -)
    echo
    echo "again without $without:"
    session "$reduced"
fi

#!/bin/bash
# A user's run, by hand (not part of CI; needs root, `cargo xtask build`
# and `cargo xtask peers` first): Rotel started first, the agent first in
# its own UTS namespace with NODE_NAME set, llama-server in its own network
# namespace started after the agent and restarted, probes and a /metrics
# scrape beside the openai SDK's streamed and whole chats. Prints the
# records, the events and what Rotel received.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
P=$REPO/tests/peers
BIN=$P/.build/llama.cpp/bin
MODEL=$P/.model/tiny-llama.gguf
PY=$P/.venv/bin/python
R=$P/.venv/lib/python3.11/site-packages/rotel/rotel-agent
TT=${TOKENTAP:-$REPO/target/debug/tokentap}
D=/tmp/user-check; rm -rf $D; mkdir -p $D
ip netns del ttuser 2>/dev/null; ip link del vhu 2>/dev/null
ip netns add ttuser
ip link add vhu type veth peer name vnu
ip link set vnu netns ttuser
ip addr add 10.77.0.1/24 dev vhu; ip link set vhu up
ip netns exec ttuser ip addr add 10.77.0.2/24 dev vnu
ip netns exec ttuser ip link set vnu up; ip netns exec ttuser ip link set lo up
$R start --exporter blackhole --debug-log metrics --debug-log logs --debug-log traces --debug-log-verbosity detailed \
  --otlp-grpc-endpoint 127.0.0.1:14317 --otlp-http-endpoint 127.0.0.1:14318 > $D/rotel.log 2>&1 &
ROTEL=$!
sleep 2
NODE_NAME=node-a unshare --uts sh -c "hostname tokentap-pod-x && exec $TT run --port 8099 --no-console --no-gpu \
  --otlp-endpoint http://127.0.0.1:14317 --export-interval 2 --events-log $D/events.jsonl \
  --requests-log $D/requests.jsonl --traces-sample 1 --log-all-requests" > $D/agent.log 2>&1 &
AGENT=$!
sleep 6
start_engine() {
  ip netns exec ttuser env LD_LIBRARY_PATH=$BIN $BIN/llama-server -m $MODEL --host 10.77.0.2 --port 8099 -t 1 -c 2048 --metrics > $D/engine.$1.log 2>&1 &
  ENGINE=$!
  for i in $(seq 60); do curl -s http://10.77.0.2:8099/health >/dev/null && break; sleep 0.5; done
}
start_engine 1
# A connection opened now stays open over the agent's... (agent already up);
# probes and a scrape beside the LLM calls.
curl -s http://10.77.0.2:8099/health >/dev/null; curl -s http://10.77.0.2:8099/metrics >/dev/null
$PY - <<PYEOF
from openai import OpenAI
c = OpenAI(base_url="http://10.77.0.2:8099/v1", api_key="sk-user-check")
for stream in (True, False):
    for i in range(2):
        msgs=[{"role":"user","content":"Say hello number %d" % i}]
        if stream:
            for _ in c.chat.completions.create(model="m", messages=msgs, max_tokens=8, stream=True): pass
        else:
            c.chat.completions.create(model="m", messages=msgs, max_tokens=8)
print("client ok")
PYEOF
kill $ENGINE; wait $ENGINE 2>/dev/null; sleep 3
start_engine 2
$PY - <<PYEOF
from openai import OpenAI
c = OpenAI(base_url="http://10.77.0.2:8099/v1", api_key="sk-user-check")
for _ in c.chat.completions.create(model="m", messages=[{"role":"user","content":"after restart"}], max_tokens=8, stream=True): pass
print("client after restart ok")
PYEOF
sleep 5
kill -INT $AGENT; wait $AGENT
kill $ENGINE; kill $ROTEL
ip netns del ttuser; ip link del vhu 2>/dev/null
echo "== requests"; wc -l < $D/requests.jsonl
python3 -c "
import json
for l in open('$D/requests.jsonl'):
    r=json.loads(l); print(r['pid'], r['path'], r['status'], r['operation'], r['stream'], r['input_tokens'], r['output_tokens'], r['tokens_source'], r['ttft_s'])"
echo "== events"; python3 -c "
import json
for l in open('$D/events.jsonl'): e=json.loads(l); print(e['kind'], e['message'][:90])"
echo "== agent"; tail -5 $D/agent.log
echo "== rotel"; for k in tokentap.capture.events tokentap.decode.shed tokentap.events gen_ai.server.time_to_first_token host.name node-a tokentap-pod-x engine.start 'chat m' tokentap.http.requests; do echo "$k: $(grep -c "$k" $D/rotel.log)"; done

#!/usr/bin/env bash
# `llumnix serve` on CUDA (DEVICE=cpu to try it here): two instances on one GPU (CUDA graphs recorded at start),
# one plain and one streamed chat completion, the cluster's state, then SIGTERM.
# Usage: benchmarks/gpu/serve_smoke.sh [MODEL]
set -uo pipefail
model=${1:-smollm2}
port=${PORT:-8011}
py=${PYTHON:-python3}
dev=${DEVICE:-cuda}
gpus=(); [ "$dev" = cuda ] && gpus=(--gpus-per-instance 0.5)
$py -m llumnix.cli serve --model "$model" --device "$dev" --instances 2 "${gpus[@]}" \
  --port "$port" > /tmp/serve-smoke.log 2>&1 &
pid=$!
ok=0
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then ok=1; break; fi
  kill -0 $pid 2>/dev/null || break
  sleep 1
done
if [ $ok != 1 ]; then echo "serve did not come up:"; tail -30 /tmp/serve-smoke.log; kill $pid 2>/dev/null; exit 1; fi
name=$(curl -sf "http://127.0.0.1:$port/v1/models" | $py -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
body='{"model": "'$name'", "messages": [{"role": "user", "content": "What is the capital of France?"}],
       "max_tokens": 24, "temperature": 0, "ignore_eos": true}'
rc=0
curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" \
  | $py -c "import json,sys; r=json.load(sys.stdin); u=r['usage']; print('chat:', u); assert u['completion_tokens'] == 24" || rc=1
curl -sfN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "${body%\}}, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" | $py -c "
import json, sys
chunks = [json.loads(l[6:]) for l in sys.stdin if l.startswith('data: {')]
usage = chunks[-1]['usage']
print('stream:', len(chunks), 'chunks, usage', usage)
assert usage['completion_tokens'] == 24" || rc=1
curl -sf "http://127.0.0.1:$port/admin/cluster" | head -c 1500; echo
kill -TERM $pid; wait $pid; echo "serve exit: $?"
tail -5 /tmp/serve-smoke.log
exit $rc

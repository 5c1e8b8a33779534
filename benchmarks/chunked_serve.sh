#!/usr/bin/env bash
# Chunked prefill through the whole serving path: `llumnix serve` (2 SmolLM2 instances on
# this CPU, Ray, LlumSched, the gateway) with and without chunked prefill, driven by
# `llumnix bench serve` with ShareGPT-like lengths (long prompts among short ones),
# alternated over ROUNDS. Results: benchmarks/results/serve-chunked/serve.{json,png}, one run
# per label (TTFT, time per output token, inter-token latency, end-to-end).
#   bash benchmarks/chunked_serve.sh [ROUNDS] [ARMS]     ARMS default "unchunked chunked"; "chunked128" runs
#   chunked prefill at 128 tokens a step (serve's default is 256)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
FIRST=${FIRST:-1}
PORT=${PORT:-8011}
OUT=benchmarks/results/serve-chunked
for round in $(seq "$FIRST" "$((FIRST + ROUNDS - 1))"); do
  for arm in ${2:-unchunked chunked}; do
    case "$arm" in
      unchunked) flags=(--no-chunked-prefill) ;;
      chunked) flags=(--chunked-prefill) ;;
      chunked128) flags=(--chunked-prefill --max-num-batched-tokens 128) ;;
      *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
    .venv/bin/llumnix serve --port "$PORT" "${flags[@]}" > "/tmp/chunked_serve_$arm.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do
      curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
      sleep 1
    done
    if ! curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then
      echo "llumnix serve ($arm) did not come up in 120 s; see /tmp/chunked_serve_$arm.log" >&2
      kill -TERM "$pid" 2>/dev/null || true
      exit 1
    fi
    .venv/bin/llumnix bench serve --url "http://127.0.0.1:$PORT" --label "$arm-r$round" --out "$OUT" \
      --num-requests 24 --rate 0.3 --lengths sharegpt --input-len 300 --output-len 64 \
      --max-input 1500 --max-output 128 --seed "$round"
    kill -TERM "$pid"
    wait "$pid" || true
  done
done

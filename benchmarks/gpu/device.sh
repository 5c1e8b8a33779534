#!/usr/bin/env bash
# One lease of a GPU machine that has CUDA torch but not this project's other packages,
# nor the 93 MB SmolLM2 GGUF (a lease carries at most 64 MiB). Carried in .dev/ (git-ignored):
#   .dev/whl/*.whl        ray (without its Java jars and libraries we do not use), gguf, fastapi...
#   .dev/smollm2-shape/   config.json + tokenizer.json (benchmarks/gpu/random_model.py export)
# The model is SmolLM2-135M's shape with random weights, made there: a step costs the same.
# Runs benchmarks/gpu/run.sh's steps, each under a time limit, and packs the results into
# $OUT/gpu.tgz after each step (a lease returns at most 8 files).
# Usage: benchmarks/gpu/device.sh [STEP...]   (run.sh's steps, or ab: benchmarks/gpu/ab.sh)
set -uo pipefail
OUT=${OUT:-/tmp/out}
res=/tmp/gpu-results
mkdir -p "$res" "$OUT"
site=/tmp/site
t0=$(date +%s)
python3 - "$site" <<'PY'
import glob, os, sys, zipfile
site = sys.argv[1]
for w in sorted(glob.glob(".dev/whl/*.whl")):
    with zipfile.ZipFile(w) as z:
        for info in z.infolist():
            path = z.extract(info, site)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)  # ray's gcs_server and raylet must stay executable
PY
export PYTHONPATH=$site:$PWD/src:$PWD PATH=$site/bin:$PATH
export MODEL=/tmp/smollm2-random LLUMNIX_CACHE=/tmp/llumnix-cache
cp -r .dev/smollm2-shape "$MODEL" && python3 benchmarks/gpu/random_model.py weights "$MODEL" 2>&1 | tail -1
# the real ShareGPT's token counts (bench cluster's trace) travel without the 125 MB data set:
#   cp ~/.cache/llumnix/sharegpt-smollm2.json .dev/   (made here by any run on the data set)
if [ -f .dev/sharegpt-smollm2.json ]; then
  mkdir -p "$LLUMNIX_CACHE" && cp .dev/sharegpt-smollm2.json "$LLUMNIX_CACHE/sharegpt-_tmp_smollm2-random.json"
fi
echo "setup: $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
pack() { tar czf "$OUT/gpu.tgz" -C "$res" . ; }
limit() { case $1 in tests) echo 120;; engine) echo 170;; migration) echo 170;; serve) echo 80;; ab) echo 260;;
  cluster) echo "${CLUSTER_LIMIT:-420}";; gain-micro) echo "${MICRO_LIMIT:-270}";;
  gain-paper) echo "${PAPER_LIMIT:-320}";; *) echo 120;; esac; }
for step in ${*:-tests engine migration serve}; do
  s0=$(date +%s)
  if [ "$step" = ab ]; then cmd=(benchmarks/gpu/ab.sh "$res"); else cmd=(benchmarks/gpu/run.sh "$res" "$step"); fi
  timeout -k 5 "$(limit "$step")" "${cmd[@]}" > "$res/$step.out" 2>&1
  echo "== $step: rc $? in $(( $(date +%s) - s0 )) s"; pack
done
grep -h "passed\|failed\|error" "$res/tests.log" 2>/dev/null | tail -3
for f in "$res"/engine-*/engine.json; do
  [ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); d=r['decode_tokens_per_s']; p=r['prefill_tokens_per_s']; g=r.get('cuda_graphs') or {}; print(sys.argv[1].split('/')[-2], 'decode 1/8/32: %.0f/%.0f/%.0f' % (d['1'], d['8'], d['32']), 'prefill 128/2048: %.0f/%.0f' % (p['128'], p['2048']), 'hf %.0f' % r.get('transformers', {}).get('decode_tokens_per_s_batch1', 0), 'graphs', g.get('graphs'), 'rec %.1fs' % g.get('record_s', 0), 'start %.1fs' % r['engine_start_s'])" "$f"
done
grep -h -A14 "downtime" "$res"/migration-*.log 2>/dev/null | tail -40
tail -6 "$res/serve.log" 2>/dev/null
tail -8 "$res/ab.out" 2>/dev/null
grep -h "capacity\|load \| seed \|wrote" "$res/cluster.log" "$res"/gain-*.log 2>/dev/null | tail -60
echo "total: $(( $(date +%s) - t0 )) s"

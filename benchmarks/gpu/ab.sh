#!/usr/bin/env bash
# Side-by-side runs that followed the first CUDA-graph lease (2026-11-26, one H200).
# Lease 2 (AB_ENGINE=1, AB as below by default):
#  * the engine with graphs off, then on (the reverse of run.sh's order), no transformers
#    reference: prefill read 20-30% slower with graphs in the first lease, graphs first;
#  * migration with graphs at the GIL switch interval of Python (5 ms) and at 0.5 ms, and
#    without graphs at 0.5 ms: with graphs the last stage took 13-21 ms instead of 1-2 ms.
# Lease 3: AB_ENGINE=0 AB="cuda-graphs,0.005,1 cuda-graphs,0.005,0": migration's copies on a
#    stream of their own (1) or on the engine's (0), with graphs. It ran at d118b98; the copy
#    stream changed nothing and was removed after, so COPY_STREAM is inert since.
# A variant is GRAPHS,GIL_SWITCH_S,COPY_STREAM. Usage: benchmarks/gpu/ab.sh OUT_DIR (MODEL as for run.sh)
set -uo pipefail
out=${1:?OUT_DIR}
py=${PYTHON:-python3}
model=${MODEL:-smollm2}
export PYTHONUNBUFFERED=1
if [ "${AB_ENGINE:-1}" = 1 ]; then
  for g in no-cuda-graphs cuda-graphs; do
    $py -m llumnix.cli bench engine --model "$model" --device cuda --dtype bfloat16 --"$g" --no-reference \
      --out "$out/ab-engine-$g" > "$out/ab-engine-$g.log" 2>&1 || echo "engine $g failed"
  done
fi
for spec in ${AB:-cuda-graphs,0.005,1 cuda-graphs,0.0005,1 no-cuda-graphs,0.0005,1}; do
  IFS=, read -r graphs switch stream <<< "$spec"
  name="ab-mig-$graphs-$switch-stream$stream"
  LLUMNIX_GIL_SWITCH_S=$switch LLUMNIX_KV_COPY_STREAM=$stream LLUMNIX_BENCH_LENGTHS=${LLUMNIX_BENCH_LENGTHS:-256,4096} \
    $py -m llumnix.cli bench migration --model "$model" --device cuda --"$graphs" --transport tcp --repeats 2 \
    --out "$out/$name" > "$out/$name.log" 2>&1 || echo "migration $spec failed"
done
for f in "$out"/ab-engine-*/engine.json; do
  [ -f "$f" ] && $py -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2], r['prefill_tokens_per_s'], r['decode_tokens_per_s'])" "$f"
done
for f in "$out"/ab-mig-*/migration.json; do
  $py -c "
import json, sys
r = json.load(open(sys.argv[1]))
live = [x for x in r['rows'] if x['mode'] == 'live']
print(sys.argv[1].split('/')[-2], 'downtime ms', [round(x['downtime_s'] * 1e3, 1) for x in live],
      'last copy ms', [round((x['last_stage_s']['last_copy_done'] - x['last_stage_s']['boundary_done']) * 1e3, 1) for x in live],
      'duration ms', [round(x['duration_s'] * 1e3) for x in live],
      'slowdown src/dst', [(round(x['src_slowdown'], 2), round(x['dst_slowdown'], 2)) for x in live])" "$f"
done

#!/usr/bin/env bash
# The engine and live migration on CUDA: the GPU tests, the engine benchmark (float32
# and bfloat16, CUDA graphs on and off, against transformers on the same GPU), the
# migration benchmark with both instances on one GPU (graphs off, then on), and a smoke
# run of `llumnix serve` on CUDA. Needs a CUDA build of torch and the project installed
# with its serve and bench extras (or on PYTHONPATH).
# Usage: benchmarks/gpu/run.sh [OUT_DIR] [STEP...]; STEP is any of tests engine migration
# serve cluster gain-micro gain-paper (default: the first four). MODEL (default smollm2), TRANSPORTS (default tcp,gloo,ray),
# REPEATS (default 3) and LLUMNIX_BENCH_LENGTHS (e.g. 256,1024,4096) narrow the runs.
set -uo pipefail
out=${1:-benchmarks/results/gpu}
shift || true
steps=${*:-tests engine migration serve}
py=${PYTHON:-python3}
model=${MODEL:-smollm2}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
$py -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
rc=0
for step in $steps; do
  case $step in
    tests)  # every test that needs CUDA, plus the CPU pair of the cross-device migration test
      $py -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/model/test_gpu.py \
        tests/model/test_cuda_graphs.py tests/model/test_live_migration_devices.py 2>&1 | tee "$out/tests.log" || rc=1 ;;
    engine)
      for dtype in bfloat16 float32; do
        for graphs in cuda-graphs no-cuda-graphs; do
          $py -m llumnix.cli bench engine --model "$model" --device cuda --dtype "$dtype" --"$graphs" \
            --out "$out/engine-$dtype-$graphs" 2>&1 | tee "$out/engine-$dtype-$graphs.log" || rc=1
        done
      done ;;
    migration)
      for graphs in no-cuda-graphs cuda-graphs; do
        $py -m llumnix.cli bench migration --model "$model" --device cuda --"$graphs" \
          --transport "${TRANSPORTS:-tcp,gloo,ray}" --repeats "${REPEATS:-3}" \
          --out "$out/migration-$graphs" 2>&1 | tee "$out/migration-$graphs.log" || rc=1
      done ;;
    serve)
      benchmarks/gpu/serve_smoke.sh "$model" 2>&1 | tee "$out/serve.log" || rc=1 ;;
    cluster)  # `llumnix bench cluster` on INSTANCES (default 8) instances sharing GPU 0; CLUSTER_FLAGS replaces
              # the default flags (issue 32's 8-instance check: eager steps, runs of >= 4 s of the probed rate)
      n=${INSTANCES:-8}
      # shellcheck disable=SC2086 # CLUSTER_FLAGS is a list of flags
      $py -m llumnix.cli bench cluster --model "$model" --device cuda --instances "$n" \
        --gpus-per-instance "$($py -c "print(1 / $n)")" ${CLUSTER_FLAGS:---no-cuda-graphs --dtype bfloat16 \
        --systems infaas++,llumnix,round-robin --seeds 0,1,2,3 --run-seconds 4 --requests-per-run 64 \
        --burst-size 64 --probe-requests 192 --probe-concurrency 64} \
        --out "$out/cluster" 2>&1 | tee "$out/cluster.log" || rc=1 ;;
    gain-micro|gain-paper)  # issue 45's two sizings on 8 instances sharing GPU 0, llumnix against INFaaS++,
              # paired seeds; GAIN_FLAGS adds flags to both (e.g. --reschedule-interval 0.1)
      n=${INSTANCES:-8}
      if [ "$step" = gain-micro ]; then  # the benchmark's trace and sizing, session 27's probed capacity
        sizing="--capacity ${MICRO_CAPACITY:-18.88} --run-seconds 4 --requests-per-run 64"
      else  # paper time scale: outputs of 119 tokens on average (~4 s at ~35 ms a token, 28x a 0.15 s
            # reaction), KV for 8 typical requests (155 tokens at their end: 78 blocks) an instance
        sizing="--length-scale 0.5 --prompt-cap 96 --output-cap 192 --num-blocks 80 --run-seconds 3 \
          --requests-per-run 32 --probe-requests 258 --probe-concurrency 128"
      fi
      # shellcheck disable=SC2086 # flag lists
      $py -m llumnix.cli bench cluster --model "$model" --device cuda --instances "$n" \
        --gpus-per-instance "$($py -c "print(1 / $n)")" --no-cuda-graphs --dtype bfloat16 \
        --systems infaas++,llumnix --seeds "${SEEDS:-0,1,2,3}" --loads 0.6,0.85 --burst-size 0 $sizing \
        ${GAIN_FLAGS:-} --out "$out/$step" 2>&1 | tee "$out/$step.log" || rc=1 ;;
    *) echo "unknown step $step (tests, engine, migration, serve, cluster, gain-micro, gain-paper)"; exit 2 ;;
  esac
done
exit $rc

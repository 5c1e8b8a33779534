#!/usr/bin/env bash
# The engine and live migration on CUDA: the GPU tests, the engine benchmark (float32
# and bfloat16, against transformers on the same GPU) and the migration benchmark with
# both instances on one GPU. Needs a CUDA build of torch and the project installed with
# its serve and bench extras (or on PYTHONPATH). Usage: benchmarks/gpu/run.sh [OUT_DIR] [STEP...]
# STEP is any of: tests engine migration (default: all three).
set -uo pipefail
out=${1:-benchmarks/results/gpu}
shift || true
steps=${*:-tests engine migration}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
$py -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
rc=0
for step in $steps; do
  case $step in
    tests)  # every test that needs CUDA, plus the CPU pair of the cross-device migration test
      $py -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/model/test_gpu.py \
        tests/model/test_live_migration_devices.py 2>&1 | tee "$out/tests.log" || rc=1 ;;
    engine)
      for dtype in float32 bfloat16; do
        $py -m llumnix.cli bench engine --device cuda --dtype "$dtype" --out "$out/engine-$dtype" \
          2>&1 | tee "$out/engine-$dtype.log" || rc=1
      done ;;
    migration)
      $py -m llumnix.cli bench migration --device cuda --transport tcp,gloo,ray --repeats ${REPEATS:-3} \
        --out "$out/migration" 2>&1 | tee "$out/migration.log" || rc=1 ;;
    *) echo "unknown step $step (tests, engine, migration)"; exit 2 ;;
  esac
done
exit $rc

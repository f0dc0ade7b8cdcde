#!/usr/bin/env bash
# One device call checking the one-row LM path as the engine's batch-1 default (issue 3, B1), each part under its
# own time limit so a slow part never costs the others their results:
#   1. the GPU tests of the engine and the one-row kernels;
#   2. B1 of the embedded default model, the twenty-third session's kernels (`skinny_pdl`) against the default
#      (`one_row`), in the engine's order and the LM alone;
#   3. the same on the full-size random checkpoint (built on the spot).
#   bash benchmarks/gpu_one_row_default.sh OUT [TEST_S SMALL_S FULL_S]
# Carry .whl_gpu (benchmarks/gpu_setup.sh says what it holds).
set -u
out=${1:?out dir}
source benchmarks/gpu_setup.sh "$out"
timeout "${2:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py tests/test_one_row.py \
  > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" | tee -a "$out/gpu_tests.txt"
tail -3 "$out/gpu_tests.txt"
for part in "small models/default ${3:-60}" "full /tmp/full ${4:-100}"; do
  set -- $part
  PYTHONUNBUFFERED=1 timeout "$3" python3 benchmarks/bench_encoder_overlap.py --model "$2" --counts 1 \
    --modes ahead_encoder_stream,lm_only --variants skinny_pdl,one_row --out "$out/b1_$1.json" > "$out/b1_$1.log" 2>&1
  echo "b1 $1 rc=$?"
  grep -E "bench_encoder_overlap: |Error|error" "$out/b1_$1.log" | tail -3
done

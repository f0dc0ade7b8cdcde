#!/usr/bin/env bash
# One device call for the fused one-row LM kernels (issue 3, B1), each part under its own time limit so a
# slow part never costs the others their results:
#   1. the GPU tests of the kernels and the engine (one-row path exact in fp32, graphs == eager in bf16);
#   2. benchmarks/bench_one_row.py: each fused operation over its configuration grid, and an LM layer's
#      kernels unfused vs fused; its BEST_CONFIGS line becomes STREAMSCRIBE_ONE_ROW_CONFIGS for part 3;
#   3. B1 on the full-size random checkpoint (built on the spot): the twenty-third session's kernels
#      (`skinny_pdl`) against the one-row path (`one_row`), both step orders and each part alone (LM, encoder),
#      alternated in one run.
#   bash benchmarks/gpu_one_row.sh OUT [TEST_S SWEEP_S B1_S]
# Carry .whl_gpu (benchmarks/gpu_setup.sh says what it holds).
set -u
out=${1:?out dir}
source benchmarks/gpu_setup.sh "$out"
timeout "${2:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_one_row.py tests/test_engine.py \
  tests/test_linear.py tests/test_fused_ops.py tests/test_kernels.py > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" | tee -a "$out/gpu_tests.txt"
tail -4 "$out/gpu_tests.txt"
PYTHONUNBUFFERED=1 timeout "${3:-300}" python3 benchmarks/bench_one_row.py --out "$out/one_row.json" > "$out/one_row.log" 2>&1
echo "sweep rc=$?"
grep -E "bench_one_row: " "$out/one_row.log" | tail -8
best=$(grep '^BEST_CONFIGS ' "$out/one_row.log" | tail -1 | cut -d' ' -f2-)
if [ -n "$best" ]; then export STREAMSCRIBE_ONE_ROW_CONFIGS="$best"; fi
echo "configs: ${STREAMSCRIBE_ONE_ROW_CONFIGS:-defaults}"
PYTHONUNBUFFERED=1 timeout "${4:-300}" python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes serial,ahead_encoder_stream,lm_only,encoder_only --variants skinny_pdl,one_row,one_row_fused_gate_up --out "$out/b1.json" > "$out/b1.log" 2>&1
echo "b1 rc=$?"
grep -E "bench_encoder_overlap: |Error|error" "$out/b1.log" | tail -4

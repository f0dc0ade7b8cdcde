#!/usr/bin/env bash
# One device call for the LM's high-priority stream (issue 3, B1/B2; `RunnerOptions.lm_stream_priority`),
# each part under its own time limit so a slow part never costs the others their results:
#   1. the GPU tests of the engine (equality with the LM's stream on and off, graphs on and off) and the
#      one-row kernels;
#   2. B1 on the full-size random checkpoint (built on the spot): the engine's order with the LM's stream at
#      high priority against both streams at one priority, beside serial and each part alone, for the
#      twenty-third session's kernels and the one-row path, whole and with the unfused layer's gate/up kernels
#      (STREAMSCRIBE_ONE_ROW_GATE_UP=0);
#   3. the same A/B at 64 and 256 streams (B2's sizes).
#   [GPU_TESTS_K=expr] [B1_MODES=m1,m2] bash benchmarks/gpu_lm_priority.sh OUT [TEST_S B1_S B2_S]
# The full-size checkpoint's tokenizer is built from mistral-common's bundled vocabulary, which the GPU machine
# lacks: carry its wheel in .whl_gpu (see gpu_one_row.sh).
set -u
out=${1:?out dir}
if ls .whl_gpu/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_gpu/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
timeout "${2:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py tests/test_one_row.py \
  ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" | tee -a "$out/gpu_tests.txt"
tail -3 "$out/gpu_tests.txt"
PYTHONUNBUFFERED=1 timeout "${3:-150}" python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ${B1_MODES:-serial,ahead_encoder_stream,ahead_equal_priority,lm_only,encoder_only} \
  --variants skinny_pdl,one_row,one_row_unfused_gate_up \
  --out "$out/b1.json" > "$out/b1.log" 2>&1
echo "b1 rc=$?"
grep -E "bench_encoder_overlap: |Error|error" "$out/b1.log" | tail -3
PYTHONUNBUFFERED=1 timeout "${4:-150}" python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 64,256 \
  --modes ahead_encoder_stream,ahead_equal_priority --variants skinny_pdl --repeats 2 --steps 100 \
  --out "$out/b2.json" > "$out/b2.log" 2>&1
echo "b2 rc=$?"
grep -E "bench_encoder_overlap: |Error|error" "$out/b2.log" | tail -3

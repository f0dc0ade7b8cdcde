#!/usr/bin/env bash
# One device call for the one-row kernels' tensor-core mode (issue 3, B1; kernels/one_row.py, dot = 1), each part
# under its own time limit so a slow part never costs the others their results, everything packed into OUT/all.tgz
# (a call brings back at most 8 files):
#   1. the GPU tests of the one-row kernels (tensor-core mode bit for bit against `kernels.linear`);
#   2. bench_one_row.py's sweep of both modes, with the layer as the engine runs it;
#   3. B1 on the full-size random checkpoint (built on the spot): the default against the tensor-core mode with
#      the sweep's best configurations, gate/up unfused and fused, and the twenty-third session's kernels;
#   4. the default model's offline speculation in bf16 with the tensor-core mode (outputs identical or not);
#   5. the encoder green-context tests of test_engine.py, stopped at the first failure (its log).
#   bash benchmarks/gpu_one_row_dot.sh OUT
# Carry .whl_gpu (benchmarks/gpu_setup.sh says what it holds).
set -u
out=${1:?out dir}
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_one_row 90 tests/test_one_row.py
PYTHONUNBUFFERED=1 timeout 210 python3 benchmarks/bench_one_row.py --out "$work/one_row.json" > "$work/one_row.log" 2>&1
echo "sweep rc=$?"; grep -E "floor|BEST" "$work/one_row.log" | cut -c25-260
dot=$(grep '^BEST_DOT_CONFIGS ' "$work/one_row.log" | cut -d' ' -f2-)
[ -n "$dot" ] && export BENCH_ONE_ROW_DOT_CONFIGS="$dot"
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only --variants default,one_row_dot,one_row_dot_fused_gate_up,skinny_pdl \
  --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -3
STREAMSCRIBE_ONE_ROW_CONFIGS="${dot:-}" timeout 60 python3 benchmarks/bench_speculative.py --target models/default \
  --drafter models/default_drafter --audio demo/samples/heldout_nyc_f4.wav demo/samples/sample_en.wav --batches 1 \
  --clip-seconds 30 --repeats 1 --skip-flush --device cuda --dtype bf16 --k 6 --out "$work/spec.json" \
  > "$work/spec.log" 2>&1
echo "spec rc=$?"; grep -E "offline batch|Error" "$work/spec.log" | tail -3
gpu_tests tests_encoder_sms 45 -x tests/test_engine.py -k encoder_sms
pack "$out"

#!/usr/bin/env bash
# One device call following up gpu_one_row_dot.sh (issue 3, B1): in that call every tensor-core configuration was bit
# for bit the multi-row path, and the per-operation bests were slower together in a layer than alone. This call,
# everything packed into OUT/all.tgz (a call brings back at most 8 files):
#   1. the one-row GPU tests;
#   2. whole layers with one tensor-core configuration for every operation (bench_one_row.py --layer-sweep);
#   3. B1 on the full-size random checkpoint: the default, the twenty-third session's kernels, the default with the
#      head in tensor-core mode, and the tensor-core mode with the layer sweep's best configuration;
#   4. the default model's offline speculation in bf16 (outputs identical to plain decoding or not): the default
#      kernels and the tensor-core mode.
#   bash benchmarks/gpu_one_row_chain.sh OUT
# Carry .whl_gpu (mistral-common for the full-size tokenizer; soundfile, cffi, pycparser for the audio files).
set -u
out=${1:?out dir}
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_one_row 60 tests/test_one_row.py
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/bench_one_row.py --layer-sweep --out "$work/layers.json" \
  > "$work/layers.log" 2>&1
echo "layer sweep rc=$?"; grep -E "bench_one_row: layer|BEST" "$work/layers.log" | cut -c25-200
dot=$(grep '^BEST_LAYER_DOT_CONFIGS ' "$work/layers.log" | cut -d' ' -f2-)
[ -n "$dot" ] && export BENCH_ONE_ROW_DOT_CONFIGS="$dot"
PYTHONUNBUFFERED=1 timeout 170 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only \
  --variants default,skinny_pdl,one_row_head_dot,one_row_dot,one_row_dot_fused_gate_up --out "$work/b1.json" \
  > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -3
for v in default dot; do
  cfg=""; [ "$v" = dot ] && cfg="${dot:-}"
  STREAMSCRIBE_ONE_ROW_CONFIGS="$cfg" timeout 70 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter models/default_drafter --audio demo/samples/heldout_nyc_f4.wav demo/samples/sample_en.wav \
    --batches 1 --clip-seconds 30 --repeats 1 --skip-flush --device cuda --dtype bf16 --k 6 \
    --out "$work/spec_$v.json" > "$work/spec_$v.log" 2>&1
  echo "spec $v rc=$?"; grep -E "offline batch|Error" "$work/spec_$v.log" | tail -2
done
pack "$out"

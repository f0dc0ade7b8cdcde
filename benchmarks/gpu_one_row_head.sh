#!/usr/bin/env bash
# One device call checking the twenty-sixth session's default (issue 3, B1): the LM head's norm + projection in the
# one-row kernels' tensor-core mode, the rest as before. Everything packed into OUT/all.tgz:
#   1. the one-row GPU tests (tensor-core mode against `kernels.linear` and the fused_ops kernels);
#   2. B1 on the full-size random checkpoint: the default, the FMA head of the session before, the twenty-third
#      session's kernels;
#   3. the default model's offline speculation in bf16 (outputs identical to plain decoding or not);
#   4. the engine's GPU tests, verbose (the encoder green-context cases last aborted the process).
#   bash benchmarks/gpu_one_row_head.sh OUT
# Carry .whl_gpu (mistral-common for the full-size tokenizer; soundfile, cffi, pycparser for the audio files).
set -u
out=${1:?out dir}
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_one_row 60 tests/test_one_row.py
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only --variants default,one_row_fma_head,skinny_pdl --repeats 2 \
  --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -3
demo_spec spec
pack "$out"
gpu_tests tests_engine 150 tests/test_engine.py
pack "$out"

#!/usr/bin/env bash
# One device call for the twenty-seventh session's attention changes (issue 3, B1): the splits merged inside
# the attention kernel (split counters) and RoPE + KV write in one kernel. Everything packed into OUT/all.tgz:
#   1. the GPU tests of the kernels (fold against the reference and race-free over 30 graph replays, rope_write_kv
#      bit for bit), of the engine (graphs on and off) and of the one-row path;
#   2. B1 on the full-size random checkpoint, engine order, LM alone and encoder alone: the default against the
#      code at the session's start (before_s27) and each change alone (no_fold, no_rope_kv);
#   3. 64 streams, engine order, default against before_s27;
#   4. the kernel inventory of a B1 step (serial order, torch.profiler).
#   bash benchmarks/gpu_attention_fold.sh OUT
# Carry .whl_gpu (mistral-common for the full-size tokenizer; soundfile, cffi, pycparser for the audio files).
set -u
out=${1:?out dir}
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_kernels 120 tests/test_kernels.py
PYTHONUNBUFFERED=1 timeout 200 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only,encoder_only --variants default,before_s27,no_fold,no_rope_kv --repeats 3 \
  --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -3
pack "$out"
gpu_tests tests_engine 150 tests/test_engine.py tests/test_one_row.py
pack "$out"
PYTHONUNBUFFERED=1 timeout 100 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 64 \
  --modes ahead_encoder_stream --variants default,before_s27 --repeats 2 --out "$work/b64.json" > "$work/b64.log" 2>&1
echo "b64 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b64.log" | tail -2
PYTHONUNBUFFERED=1 timeout 70 python3 benchmarks/bench_engine.py --model /tmp/full --counts 1 --skip b2,paced,b3,b4 \
  --profile --steps 100 --out "$work/profile.json" > "$work/profile.log" 2>&1
echo "profile rc=$?"
pack "$out"

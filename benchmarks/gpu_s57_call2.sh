#!/usr/bin/env bash
# Fifty-seventh session, issue 3, second call (one GPU; packed into OUT/all.tgz). carry [".whl_gpu"] (docs/ out):
#   bash benchmarks/gpu_s57_call2.sh OUT        (at most 420 s by its timeouts)
# Ran at commit 8f5f2aa (results/session57/call2_*). The empty-split skip was reverted after it (no B1 gain, the
# encoder 1% slower), so its variants are gone: run it from that commit.
# The session's two new defaults, RoPE + KV write in one kernel (STREAMSCRIBE_ROPE_KV) and empty attention splits
# that skip their accumulator (STREAMSCRIBE_ATTN_SKIP_EMPTY):
# 1. B1 (engine order), the LM alone and the encoder alone: the defaults, each off, both off (3 alternating repeats);
# 2. the gpu-marked tests of the paths they touch, on the new defaults (engine, kernels, speculation);
# 3. with the time left, B3 (1 and 32 streams at 1 and 60 minutes) on the defaults.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, b1_ab, pack
t0=$(date +%s)
b1_ab b1 100 3 ahead_encoder_stream,lm_only,encoder_only default,rope_kv_off,attn_skip_empty_off,before_s57
left=$(( 360 - ($(date +%s) - t0) ))
gpu_tests tests_s57 "$left" tests/test_engine.py tests/test_kernels.py tests/test_fused_ops.py tests/test_speculative.py \
  tests/test_spec_round.py tests/test_one_row.py
left=$(( 410 - ($(date +%s) - t0) ))
if [ "$left" -gt 40 ]; then
  PYTHONUNBUFFERED=1 timeout "$left" python3 benchmarks/bench_engine.py --model /tmp/full --steps 100 \
    --skip b1,b2,paced,b4 --out "$GPU_DIR/b3.json" > "$GPU_DIR/b3.log" 2>&1
  echo "b3 rc=$?"; grep -E "B3|Error" "$GPU_DIR/b3.log" | cut -c1-300 | tail -4
fi
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Fifty-seventh session, issue 3 (one GPU; packed into OUT/all.tgz). carry [".whl_gpu"] (docs/ out):
#   bash benchmarks/gpu_s57_calls.sh OUT        (at most 460 s by its timeouts)
# Ran at commit 6bc89d5 (results/session57/call1_*). The fused split combine was reverted after it (B1 +4%), and
# RoPE + KV write in one kernel became the default, so its variants are gone: run it from that commit.
# 1. the GPU tests of the attention's fused split combine (split counters: the last split program of each
#    (run, kv head) combines, no combine kernel), of RoPE + KV write in one kernel, and of the paths they touch;
# 2. B1 (engine order), the LM alone and the encoder alone: default, the split cap at 16, the fused combine with it,
#    RoPE + KV write in one kernel, and all three (3 alternating repeats);
# 3. with the time left, B3 (1 and 32 streams at 1 and 60 minutes): default against all three.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, b1_ab, pack
t0=$(date +%s)
gpu_tests tests_fused 120 tests/test_kernels.py tests/test_engine.py tests/test_fused_ops.py \
  -k "fused or paged_attention or graph_replay or rope or triton_matches"
b1_ab b1 220 3 ahead_encoder_stream,lm_only,encoder_only \
  default,attn_max_splits_16,attn_fused_combine_16,rope_kv,rope_kv_fused_combine_16
for v in default all; do
  left=$(( 450 - ($(date +%s) - t0) ))
  [ "$left" -gt 40 ] || break
  env_v=()
  [ "$v" = default ] || env_v=(STREAMSCRIBE_ROPE_KV=1 STREAMSCRIBE_ATTN_FUSED_COMBINE=1 STREAMSCRIBE_ATTN_MAX_SPLITS=16)
  env "${env_v[@]}" PYTHONUNBUFFERED=1 timeout "$(( left < 80 ? left : 80 ))" python3 benchmarks/bench_engine.py \
    --model /tmp/full --steps 100 --skip b1,b2,paced,b4 --out "$GPU_DIR/b3_$v.json" > "$GPU_DIR/b3_$v.log" 2>&1
  echo "b3_$v rc=$?"; grep -E "B3|Error" "$GPU_DIR/b3_$v.log" | cut -c1-300 | tail -4
done
pack "$out" && rm -rf "$out/r"

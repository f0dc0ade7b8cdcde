#!/usr/bin/env bash
# One device call for the twenty-seventh session's split-K projections (issue 3, B1). Everything in OUT/all.tgz:
#   1. GPU tests: kernels.linear (split-K against F.linear, a PDL chain in a graph), the one-row path, the attention
#      kernels, the engine (graphs on and off);
#   2. B1 on the full-size random checkpoint (engine order, LM alone, encoder alone): the default against the code
#      before (before_s27) and split-K with 128-key attention splits (attn_min_keys_128). As run in the session's
#      call 3 (commit 4123dad, where 128 keys was the default) the variants were named default (= split-K, 128
#      keys), no_split_k (= before_s27) and attn_min_keys_64 (= today's default);
#   3. the kernel inventory of the default (benchmarks/step_inventory.py);
#   4. the embedded default model at batch 1 (engine order), default against before_s27;
#   5. the default model's offline speculation in bf16 (outputs identical to plain decoding or not).
#   OUT=DIR bash benchmarks/gpu_split_k.sh         (carry .whl_gpu)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_linear 120 tests/test_linear.py tests/test_one_row.py
PYTHONUNBUFFERED=1 timeout 170 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only,encoder_only --variants default,before_s27,attn_min_keys_128 --repeats 3 \
  --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -3
pack "$OUT"
PYTHONUNBUFFERED=1 timeout 60 python3 benchmarks/step_inventory.py --model /tmp/full --out "$work/inventory.json" \
  > "$work/inventory.log" 2>&1
echo "inventory rc=$?"; grep -E "step_inventory: [a-z]+:" "$work/inventory.log"
PYTHONUNBUFFERED=1 timeout 60 python3 benchmarks/bench_encoder_overlap.py --model models/default --counts 1 \
  --modes ahead_encoder_stream --variants default,before_s27 --repeats 3 --out "$work/b1_small.json" \
  > "$work/b1_small.log" 2>&1
echo "b1_small rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1_small.log" | tail -2
demo_spec spec
pack "$OUT"
gpu_tests tests_engine 150 tests/test_kernels.py tests/test_engine.py
pack "$OUT"

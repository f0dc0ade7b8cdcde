#!/usr/bin/env bash
# Prepared in the twenty-seventh session (no device time was left to run it): the attention kernel's EARLY mode
# (STREAMSCRIBE_ATTN_EARLY=1: the step's metadata and the first key tile's cache slots read before the PDL wait, each
# tile's keys and values requested together). One device call, everything in OUT/all.tgz:
#   1. the GPU tests of the kernels (both modes) and of the engine with the mode on (graphs on and off);
#   2. B1 on the full-size random checkpoint (engine order, LM alone, encoder alone): default against attn_early;
#   3. the kernel inventory with the mode on (benchmarks/step_inventory.py).
#   OUT=DIR bash benchmarks/gpu_attn_early.sh        (carry .whl_gpu)
# If attn_early is faster in every repeat and the tests pass, make it the default (`early_metadata` in
# kernels/_paged_attention_triton.py).
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_kernels 120 tests/test_kernels.py
STREAMSCRIBE_ATTN_EARLY=1 gpu_tests tests_engine_early 150 tests/test_engine.py
pack "$OUT"
PYTHONUNBUFFERED=1 timeout 130 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only,encoder_only --variants default,attn_early --repeats 3 \
  --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -2
STREAMSCRIBE_ATTN_EARLY=1 PYTHONUNBUFFERED=1 timeout 60 python3 benchmarks/step_inventory.py --model /tmp/full \
  --out "$work/inventory_early.json" > "$work/inventory_early.log" 2>&1
echo "inventory rc=$?"; grep -E "step_inventory: [a-z]+:|paged_attention" "$work/inventory_early.log"
pack "$OUT"

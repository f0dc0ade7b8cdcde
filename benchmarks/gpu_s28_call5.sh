#!/usr/bin/env bash
# Twenty-eighth session, device call 5 (one H200; carry .whl_gpu, .bench_audio): the final code (the attention's
# EARLY mode on by default; verify steps in `lm_rows_invariant_to`, so a tree of 24 drafts (25 rows) takes the
# batch-invariant kernel too).
#   1. GPU tests: linear, engine, speculation;
#   2. bench_speculative on the 5 held-out clips, batch 1, k = 6, 3 repeats: the chain, and a tree of 24.
#   OUT=DIR bash benchmarks/gpu_s28_call5.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_final 240 tests/test_linear.py tests/test_engine.py tests/test_speculative.py
pack "$OUT"
spec_run heldout_chain 110 ".bench_audio/heldout_*" --batches 1 --repeats 3
pack "$OUT"
spec_run heldout_tree24 110 ".bench_audio/heldout_*" --batches 1 --repeats 3 --tree-nodes 24
pack "$OUT"

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
lossless_tests tests_final 240
pack "$OUT"
heldout_spec heldout_chain
pack "$OUT"
heldout_spec heldout_tree24 --tree-nodes 24
pack "$OUT"

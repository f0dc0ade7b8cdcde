#!/usr/bin/env bash
# Twenty-eighth session, device call 4 (one H200; carry .whl_gpu): the attention EARLY mode again (call 1: B1 2.988
# against 3.004 ms, one run of 3 repeats): 5 alternating repeats, and the engine's GPU tests with the mode on.
#   OUT=DIR bash benchmarks/gpu_s28_call4.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
b1_ab b1 200 5 ahead_encoder_stream,lm_only default,attn_early
pack "$OUT"
STREAMSCRIBE_ATTN_EARLY=1 gpu_tests tests_engine_early 150 tests/test_engine.py
pack "$OUT"

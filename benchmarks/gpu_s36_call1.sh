#!/usr/bin/env bash
# Thirty-sixth session, call 1 (carry .whl_gpu), everything in OUT/all.tgz: the encoder two tokens ahead at batch 1
# (`ahead2_encoder_stream`: the encoder of step k+2 beside the LM of steps k and k+1) against the engine's order
# (one ahead), with and without the LM's graphs favoured by the block scheduler, at 1 and 8 streams; and the
# engine's GPU tests on the runner's per-call encoder events.
#   OUT=DIR bash benchmarks/gpu_s36_call1.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests engine 200 tests/test_engine.py
pack "$OUT"
b1_ab ahead2 420 3 ahead_encoder_stream,ahead2_encoder_stream,lm_only,encoder_only_own_stream default,priority_lm 1,8
pack "$OUT"

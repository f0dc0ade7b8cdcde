#!/usr/bin/env bash
# The twenty-seventh session's last device call: the final code's GPU tests, B1 (default against before_s27), and
# issue 5's batch-1 benchmark on the 5 held-out clips (chain and tree of 24) when .bench_audio holds them.
#   OUT=DIR bash benchmarks/gpu_s27_final.sh      (carry .whl_gpu and, for issue 5, .bench_audio)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_gpu 230 tests/test_kernels.py tests/test_engine.py tests/test_linear.py
pack "$OUT"
b1_ab b1 130 3 ahead_encoder_stream,lm_only,encoder_only default,before_s27
pack "$OUT"
if ls .bench_audio/heldout_* > /dev/null 2>&1; then
  TESTS=0 REPEATS=3 bash benchmarks/gpu_tree.sh "$work/spec" .bench_audio .whl_gpu 24
  pack "$OUT"
fi

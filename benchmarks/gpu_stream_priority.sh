#!/usr/bin/env bash
# Twenty-ninth session, one device call (carry .whl_gpu and .bench_audio), everything in OUT/all.tgz:
#   1. the GPU tests of the stream-priority option (`RunnerOptions.stream_priority`) and the engine's other GPU tests;
#   2. B1 (and 64 streams) in engine order, full-size random checkpoint: default against the encoder's graphs or the
#      LM's on the highest stream priority (bench variants priority_encoder, priority_lm), 5 alternating repeats;
#   3. the prepared batch-invariant encoder A/B (gpu_encoder_rows.sh: 1, 8, 16 streams against encoder_rows_16)
#      and its batch-16 speculative identity count.
#   OUT=DIR bash benchmarks/gpu_stream_priority.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests engine_tests 150 tests/test_engine.py
pack "$OUT"
b1_ab priority 170 5 ahead_encoder_stream default,priority_encoder,priority_lm 1,64
pack "$OUT"
ROWS_SECS=170 GPU_WORK="$work" bash benchmarks/gpu_encoder_rows.sh

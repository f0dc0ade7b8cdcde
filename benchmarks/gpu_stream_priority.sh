#!/usr/bin/env bash
# Twenty-ninth session, device call 1 (one H200; carry .whl_gpu and .bench_audio), everything in OUT/all.tgz:
#   1. the engine's GPU tests, with the stream-priority option (`RunnerOptions.stream_priority`);
#   2. B1 (and 64 streams) in engine order, full-size random checkpoint: default against the encoder's graphs or the
#      LM's on the highest stream priority (bench variants priority_encoder, priority_lm), 5 alternating repeats;
#   3. the twenty-eighth session's prepared A/B of its batch-invariant encoder (then every runner's: up to 64 rows on
#      `linear`'s Triton kernel) against encoder_rows_16 (above 16 rows cuBLAS) at 1, 8 and 16 streams, and a
#      batch-16 speculative run. Since this call plain runners take 16 rows by default (`RunnerOptions.encoder_rows`),
#      so on the current code the same A/B is gpu_plain_encoder_rows.sh's default against encoder_rows_64.
#   OUT=DIR bash benchmarks/gpu_stream_priority.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests engine_tests 150 tests/test_engine.py
pack "$OUT"
b1_ab priority 170 5 ahead_encoder_stream default,priority_encoder,priority_lm 1,64
pack "$OUT"
b1_ab rows 170 3 ahead_encoder_stream,encoder_only default,encoder_rows_16 1,8,16
pack "$OUT"
spec_run spec_b16 150 ".bench_audio/heldout_*" --batches 16 --repeats 1
pack "$OUT"

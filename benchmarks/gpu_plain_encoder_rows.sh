#!/usr/bin/env bash
# Twenty-ninth session, one device call (carry .whl_gpu and .bench_audio), everything in OUT/all.tgz: plain runners'
# encoder projections back on cuBLAS above 16 rows (`RunnerOptions.encoder_rows`, speculative runners keep 64):
#   1. the GPU tests of the engine, the speculative engine and `linear` on this code;
#   2. step time at 1, 8 and 16 streams (engine order, full-size random checkpoint): the default against
#      encoder_rows_64 (a plain runner on the batch-invariant kernel up to 64 rows: the code before);
#   3. bench_speculative at batch 1 on the 5 held-out clips (chain, k = 6, 3 alternating repeats): speed-up and
#      outputs against the same engine without a drafter (now with the speculative runner's encoder rows), and
#      at batch 16 (one run).
#   OUT=DIR bash benchmarks/gpu_plain_encoder_rows.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
lossless_tests tests 240
pack "$OUT"
b1_ab rows 150 3 ahead_encoder_stream default,encoder_rows_64 1,8,16
pack "$OUT"
heldout_spec spec_b1
pack "$OUT"
spec_run spec_b16 90 ".bench_audio/heldout_*" --batches 16 --repeats 1
pack "$OUT"

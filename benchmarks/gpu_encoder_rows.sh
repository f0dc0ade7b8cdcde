#!/usr/bin/env bash
# Prepared in the twenty-eighth session (its device time was spent): what the batch-invariant encoder projections
# (up to 64 rows on `linear`'s Triton kernel, not cuBLAS) cost or gain where a step encodes 5-16 streams, and how
# many streams of a batch-16 speculative run now match plain decoding in bf16. One device call (carry .whl_gpu and
# .bench_audio), everything in OUT/all.tgz:
#   1. step time at 1, 8 and 16 streams (engine order, full-size random checkpoint): default against
#      encoder_rows_16 (STREAMSCRIBE_INVARIANT_ROWS=16: above 16 rows cuBLAS, as before);
#   2. bench_speculative at batch 16 on the default model (5 held-out clips cycled), k = 6.
#   OUT=DIR bash benchmarks/gpu_encoder_rows.sh
set -u
work=${GPU_WORK:-$(mktemp -d)}
source benchmarks/gpu_setup.sh "$work"
b1_ab rows ${ROWS_SECS:-240} 3 ahead_encoder_stream,encoder_only default,encoder_rows_16 1,8,16
pack "$OUT"
spec_run spec_b16 150 ".bench_audio/heldout_*" --batches 16 --repeats 1
pack "$OUT"

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
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
PYTHONUNBUFFERED=1 timeout 240 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1,8,16 \
  --modes ahead_encoder_stream,encoder_only --variants default,encoder_rows_16 --repeats 3 \
  --out "$work/rows.json" > "$work/rows.log" 2>&1
echo "rows rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/rows.log" | tail -3
pack "$OUT"
timeout 150 python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
  --audio .bench_audio/heldout_* --clip-seconds 45 --k 6 --dtype bf16 --batches 16 --repeats 1 --skip-flush \
  --out "$work/spec_b16.json" > "$work/spec_b16.log" 2>&1
echo "spec_b16 rc=$?"; grep -E "offline batch|Error" "$work/spec_b16.log" | tail -1
pack "$OUT"

#!/usr/bin/env bash
# Twenty-eighth session, device call 2 (one H200; carry .whl_gpu, .bench_audio): which part of a round breaks bf16
# identity with plain decoding. The look-ahead encoder at 1 token per call encodes exactly as a plain step does, so
# what differs then is the LM's verify step alone (default kernels, and STREAMSCRIBE_ONE_ROW=0).
#   OUT=DIR bash benchmarks/gpu_s28_call2.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
spec() {  # NAME ENV... : batch-1 offline speculation against plain decoding, bf16, k = 6, 5 held-out clips
  local name=$1
  shift
  env "$@" timeout 100 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter models/default_drafter --audio .bench_audio/heldout_* --clip-seconds 45 --k 6 --dtype bf16 \
    --batches 1 --repeats 1 --skip-flush ${SPEC_ARGS:-} --out "$work/$name.json" > "$work/$name.log" 2>&1
  echo "$name rc=$?"; grep -E "offline batch|Error" "$work/$name.log" | tail -1
}
SPEC_ARGS="--lookahead-chunk 1" spec chunk1_default STREAMSCRIBE_SPLIT_K=1
SPEC_ARGS="--lookahead-chunk 1" spec chunk1_one_row_off STREAMSCRIBE_ONE_ROW=0
spec split_k_off STREAMSCRIBE_SPLIT_K=0
pack "$OUT"

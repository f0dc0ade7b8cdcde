#!/usr/bin/env bash
# Twenty-eighth session, device call 2 (one H200; carry .whl_gpu, .bench_audio): which part of a round breaks bf16
# identity with plain decoding. The look-ahead encoder at 1 token per call encodes exactly as a plain step does, so
# what differs then is the LM's verify step alone (default kernels, and STREAMSCRIBE_ONE_ROW=0).
#   OUT=DIR bash benchmarks/gpu_s28_call2.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
clips=".bench_audio/heldout_*"
spec_run chunk1_default 100 "$clips" --batches 1 --repeats 1 --lookahead-chunk 1
STREAMSCRIBE_ONE_ROW=0 spec_run chunk1_one_row_off 100 "$clips" --batches 1 --repeats 1 --lookahead-chunk 1
STREAMSCRIBE_SPLIT_K=0 spec_run split_k_off 100 "$clips" --batches 1 --repeats 1
pack "$OUT"

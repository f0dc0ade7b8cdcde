#!/usr/bin/env bash
# Twenty-eighth session, device call 3 (one H200; carry .whl_gpu, .bench_audio, .bench_audio_seen): lossless bf16
# speculation. The audio encoder takes `linear`'s batch-invariant kernel up to 64 rows (conv stem, layers, adapter)
# and splits its attention by streams; a speculative engine runs without the one-row batch-1 kernels.
#   1. GPU tests: linear (row tiles: every row its bits alone), engine (encoder chunks = one-token calls, and the
#      16-stream equality), speculation;
#   2. bench_speculative, batch 1, k = 6, chain: the 5 held-out clips and the 5 seen-voice clips (identity against
#      the same engine without a drafter, and against the default plain kernels);
#   3. B1 on the full-size random checkpoint (the encoder's conv stem now takes the Triton kernel).
#   OUT=DIR bash benchmarks/gpu_s28_call3.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
lossless_tests tests_lossless 240
pack "$OUT"
heldout_spec heldout
spec_run seen 110 ".bench_audio_seen/train_*" --batches 1 --repeats 3
pack "$OUT"
b1_ab b1 100 3 ahead_encoder_stream,lm_only,encoder_only default
pack "$OUT"

#!/usr/bin/env bash
# Twenty-eighth session, device call 1 (one H200; carry .whl_gpu, .bench_audio, .bench_audio_seen):
#   1. GPU tests: kernels in both attention modes (STREAMSCRIBE_ATTN_EARLY parametrized), linear (split-K batch
#      invariance, never run on a GPU before);
#   2. B1 on the full-size random checkpoint: default against attn_early (engine order, LM alone, encoder alone);
#   3. issue 5's bf16 identity: the 5 held-out clips, default and STREAMSCRIBE_ONE_ROW=0 (batch 1, k = 6, chain);
#   4. issue 5 on seen voices speaking test sentences (.bench_audio_seen: make_speech_clips.py --voices train
#      --sentences test --count 5 --seed 3 --seconds 45), with a kernel profile of a plain step and a round.
#   OUT=DIR bash benchmarks/gpu_s28_call1.sh          (everything in OUT/all.tgz)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests tests_kernels_linear 150 tests/test_kernels.py tests/test_linear.py
pack "$OUT"
b1_ab b1 150 3 ahead_encoder_stream,lm_only,encoder_only default,attn_early
pack "$OUT"
spec_run heldout_default 100 ".bench_audio/heldout_*" --batches 1 --repeats 1
STREAMSCRIBE_ONE_ROW=0 spec_run heldout_one_row_off 100 ".bench_audio/heldout_*" --batches 1 --repeats 1
pack "$OUT"
spec_run seen_default 100 ".bench_audio_seen/train_*" --batches 1 --repeats 1 --profile
pack "$OUT"

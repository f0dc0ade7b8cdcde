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
PYTHONUNBUFFERED=1 timeout 150 python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,lm_only,encoder_only --variants default,attn_early --repeats 3 \
  --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "bench_encoder_overlap: |Error" "$work/b1.log" | tail -2
pack "$OUT"
spec() {  # NAME CLIPS ENV... : batch-1 offline speculation against plain decoding, bf16, k = 6
  local name=$1 clips=$2
  shift 2
  env "$@" timeout 100 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter models/default_drafter --audio $clips --clip-seconds 45 --k 6 --dtype bf16 \
    --batches 1 --repeats 1 --skip-flush ${PROFILE:-} --out "$work/$name.json" > "$work/$name.log" 2>&1
  echo "$name rc=$?"; grep -E "offline batch|Error" "$work/$name.log" | tail -1
}
spec heldout_default ".bench_audio/heldout_*" STREAMSCRIBE_SPLIT_K=1
spec heldout_one_row_off ".bench_audio/heldout_*" STREAMSCRIBE_ONE_ROW=0
pack "$OUT"
PROFILE=--profile spec seen_default ".bench_audio_seen/train_*" STREAMSCRIBE_SPLIT_K=1
pack "$OUT"

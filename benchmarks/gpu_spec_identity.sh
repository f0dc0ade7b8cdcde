#!/usr/bin/env bash
# Which kernel choice makes bf16 speculation differ from plain decoding (issue 5, open since the twenty-seventh
# session: outputs identical on 3 of the 5 held-out clips with the chain, 2 of 5 with a tree of 24). The shipped
# target and drafter, the 5 held-out clips cut to 45 s, k = 6, batch 1, one run per variant (the identity is what
# is read, not the speed): the default; split-K off (STREAMSCRIBE_SPLIT_K=0); the one-row batch-1 LM path off
# (STREAMSCRIBE_ONE_ROW=0: plain steps use `linear` as verify steps do, the twenty-third session's 5 of 5); both.
#   OUT=DIR bash benchmarks/gpu_spec_identity.sh      (carry .whl_gpu and .bench_audio:
#   python benchmarks/make_speech_clips.py --voices heldout --seconds 45 --out .bench_audio)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
for variant in default split_k_off one_row_off both_off; do
  case $variant in
    default) env=() ;;
    split_k_off) env=(STREAMSCRIBE_SPLIT_K=0) ;;
    one_row_off) env=(STREAMSCRIBE_ONE_ROW=0) ;;
    both_off) env=(STREAMSCRIBE_SPLIT_K=0 STREAMSCRIBE_ONE_ROW=0) ;;
  esac
  env "${env[@]}" timeout 100 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter models/default_drafter --audio .bench_audio/heldout_* --clip-seconds 45 --k 6 --dtype bf16 \
    --batches 1 --repeats 1 --skip-flush --out "$work/$variant.json" > "$work/$variant.log" 2>&1
  echo "$variant rc=$?"; grep -E "offline batch|Error" "$work/$variant.log" | tail -1
done
pack "$OUT"

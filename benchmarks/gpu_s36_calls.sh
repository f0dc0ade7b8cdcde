#!/usr/bin/env bash
# Thirty-sixth session, one device call (carry .whl_gpu and .bench_audio: the 5 held-out clips of
# `make_speech_clips.py --voices heldout --seconds 45`), everything in OUT/all.tgz:
#   1. `python -m realtime.transcribe`'s modes on the GPU (bench_transcribe_cli.py: the reference session, the engine
#      without a drafter, with the embedded drafter, with a tree of 24), one clip and the five at once;
#   2. the GPU tests of the engine and of speculation on this code.
#   OUT=DIR bash benchmarks/gpu_s36_calls.sh
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
for set in "1file:.bench_audio/heldout_01_espeak_mb-us3.flac" "5files:.bench_audio/heldout_0*.flac"; do
  name=${set%%:*}
  timeout 120 python3 benchmarks/bench_transcribe_cli.py --files ${set#*:} --device cuda --repeats 3 \
    --out "$GPU_DIR/cli_$name.json" > "$GPU_DIR/cli_$name.log" 2>&1
  echo "cli_$name rc=$?"; tail -4 "$GPU_DIR/cli_$name.log"
  pack "$OUT"
done
gpu_tests gpu_tests_engine_spec 300 tests/test_engine.py tests/test_speculative.py
pack "$OUT"

#!/usr/bin/env bash
# Thirty-sixth session, two device calls on one warm machine (carry .whl_gpu and .bench_audio: the 5 held-out
# clips of `make_speech_clips.py --voices heldout --seconds 45`), everything in OUT/all.tgz:
#   OUT=DIR bash benchmarks/gpu_s36_calls.sh tests   # every gpu-marked test file on this code
#   OUT=DIR bash benchmarks/gpu_s36_calls.sh bench   # `python -m realtime.transcribe`'s modes on the GPU
#                                                    # (bench_transcribe_cli.py), then B1 on the full-size model
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
case "${1:?tests or bench}" in
tests)
  gpu_tests gpu_tests_all 480 tests/test_audio.py tests/test_engine.py tests/test_fused_ops.py tests/test_kernels.py \
    tests/test_linear.py tests/test_one_row.py tests/test_speculative.py tests/test_staging.py
  pack "$OUT" ;;
bench)
  for set in "5files:.bench_audio/heldout_0*.flac" "1file:.bench_audio/heldout_01_espeak_mb-us3.flac"; do
    name=${set%%:*}
    timeout 150 python3 benchmarks/bench_transcribe_cli.py --files ${set#*:} --device cuda --repeats 3 \
      --out "$GPU_DIR/cli_$name.json" > "$GPU_DIR/cli_$name.log" 2>&1
    echo "cli_$name rc=$?"; tail -4 "$GPU_DIR/cli_$name.log"
    pack "$OUT"
  done
  b1_ab b1 240 3 ahead_encoder_stream,lm_only,encoder_only_own_stream default 1
  pack "$OUT" ;;
esac

#!/usr/bin/env bash
# Thirty-sixth session's device calls (carry .whl_gpu and .bench_audio: the 5 held-out clips of
# `make_speech_clips.py --voices heldout --seconds 45`), everything in OUT/all.tgz:
#   OUT=DIR bash benchmarks/gpu_s36_calls.sh        # call 2: `python -m realtime.transcribe`'s modes on the GPU
#       (bench_transcribe_cli.py: the reference session, the engine without a drafter, with the embedded drafter,
#       with a tree of 24), one clip and the five at once; then the GPU tests of the engine and of speculation
#   OUT=DIR bash benchmarks/gpu_s36_calls.sh long   # call 3: the engine modes alone (no slow reference session) on
#       the five at once and on the five joined into one 230 s file (where the speculative engine's setup weighs less)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"

# cli_bench NAME SECONDS FILES [ARGS...]: bench_transcribe_cli.py on the GPU, 3 alternating repeats
cli_bench() {
  local name=$1 secs=$2 files=$3
  shift 3
  timeout "$secs" python3 benchmarks/bench_transcribe_cli.py --files $files --device cuda --repeats 3 "$@" \
    --out "$GPU_DIR/cli_$name.json" > "$GPU_DIR/cli_$name.log" 2>&1
  echo "cli_$name rc=$?"; tail -4 "$GPU_DIR/cli_$name.log"
  pack "$OUT"
}

if [ "${1:-}" = long ]; then
  python3 -c "
import numpy as np, soundfile as sf, glob
sf.write('/tmp/joined.flac', np.concatenate([sf.read(f, dtype='float32')[0]
                                             for f in sorted(glob.glob('.bench_audio/heldout_0*.flac'))]), 16000)"
  cli_bench joined 100 /tmp/joined.flac --modes engine,drafter
  cli_bench 5files 100 ".bench_audio/heldout_0*.flac" --modes engine,drafter
else
  cli_bench 1file 120 .bench_audio/heldout_01_espeak_mb-us3.flac
  cli_bench 5files 120 ".bench_audio/heldout_0*.flac"
  gpu_tests gpu_tests_engine_spec 300 tests/test_engine.py tests/test_speculative.py
  pack "$OUT"
fi

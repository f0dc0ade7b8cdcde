#!/usr/bin/env bash
# Thirty-sixth session, call 3 (carry .whl_gpu and .bench_audio), OUT/all.tgz: `python -m realtime.transcribe`'s
# engine modes on the GPU without the slow reference session: the 5 held-out clips at once, and the five joined
# into one 230 s file (where the speculative engine's setup weighs less).
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
python3 -c "
import numpy as np, soundfile as sf, glob
sf.write('/tmp/joined.flac', np.concatenate([sf.read(f, dtype='float32')[0] for f in sorted(glob.glob('.bench_audio/heldout_0*.flac'))]), 16000)"
for set in "joined:/tmp/joined.flac" "5files:.bench_audio/heldout_0*.flac"; do
  name=${set%%:*}
  timeout 100 python3 benchmarks/bench_transcribe_cli.py --files ${set#*:} --device cuda --repeats 3 \
    --modes engine,drafter --out "$GPU_DIR/cli_$name.json" > "$GPU_DIR/cli_$name.log" 2>&1
  echo "cli_$name rc=$?"; tail -2 "$GPU_DIR/cli_$name.log"
  pack "$OUT"
done

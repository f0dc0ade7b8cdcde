#!/usr/bin/env bash
# Fifty-ninth session: the issue 3 table on the shipped code, for an H200 (one GPU; packed into OUT/all.tgz).
# carry [".whl_gpu"] (docs/ and models/ out of the tree):
#   bash benchmarks/gpu_s59_h200.sh OUT        (at most about 560 s by its timeouts)
# 1. B1 as every session since the fifty-fourth measured it: bench_encoder_overlap.py, engine order, the LM alone and
#    the encoder alone, 3 alternating repeats x 200 steps;
# 2. with the time left, bench_engine.py: B2 (1 to 320 streams of 2-minute sessions; 8 gives B4 its batch-8 ratio),
#    paced runs at 256 and 320 streams, B3 (1 and 32 streams at 1 and 60 minutes), B4 (the device's transformers on
#    the same GPU) and memory per stream. Its JSON is written after each part, so a cut run keeps the parts before.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; b1_ab, pack
t0=$(date +%s)
b1_ab b1 80 3 ahead_encoder_stream,lm_only,encoder_only default
left=$(( 540 - ($(date +%s) - t0) ))
PYTHONUNBUFFERED=1 timeout "$left" python3 benchmarks/bench_engine.py --model /tmp/full --steps 200 \
  --counts 1,8,64,128,256,320 --paced-streams 256,320 --paced-seconds 12 --out "$GPU_DIR/engine.json" \
  > "$GPU_DIR/engine.log" 2>&1
echo "engine rc=$?"; grep -E "B1|B2|B3|B4|paced|memory|Error" "$GPU_DIR/engine.log" | cut -c1-300 | tail -30
pack "$out" && rm -rf "$out/r"

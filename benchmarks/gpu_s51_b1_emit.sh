#!/usr/bin/env bash
# Fifty-first session (issue 5, one GPU): batch-1 offline speculation at the drafter's GPU default (the issue's
# target, >= 3x with mean acceptance length >= 4), then `gpu_s50_emit_ab.sh`: the host phases at 64 and 16 streams
# with a step's token events sent while the device runs the next step (`--tokens-in-flight on`) and at the end of
# their own step (`off`), alternating in separate processes, twice. Every log is packed into OUT/all.tgz.
# carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s51_b1_emit.sh OUT        (at most 120 + 8 x 60 s by its timeouts; about 2.5 minutes on a warm
#                                                 H100)
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"
cat "$GPU_DIR/gpu.txt"
timeout 120 python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
  --audio .bench_audio/* --clip-seconds 45 --dtype bf16 --batches 1 --repeats 3 \
  --out "$GPU_DIR/b1.json" > "$GPU_DIR/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "offline batch|flush batch|Error" "$GPU_DIR/b1.log" | cut -c1-250
bash benchmarks/gpu_s50_emit_ab.sh "$out"  # its logs beside b1's in $out/r, then all of them packed

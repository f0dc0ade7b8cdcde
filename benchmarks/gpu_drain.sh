#!/usr/bin/env bash
# Graceful shutdown under load on one GPU (thirty-fifth session): N live streams of the default model, SIGTERM to
# the server in the middle of them; every stream must still get its final transcript (benchmarks/drain_under_load.py;
# bf16 on the GPU, so its offline fp32 comparison is left to the CPU run).
#   carry [".whl_gpu"] (websockets, soundfile, cffi, pycparser for Python 3.12); OUT=DIR bash benchmarks/gpu_drain.sh N [WORKERS]
set -u
n=${1:-256}; workers=${2:-1}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_gpu/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 benchmarks/drain_under_load.py --streams "$n" --workers "$workers" --device cuda --no-check \
  --signal-after 6 --stagger 1 --drain-timeout 1.0 --out "$OUT/drain_gpu_${n}x${workers}.json"
echo "rc=$?"

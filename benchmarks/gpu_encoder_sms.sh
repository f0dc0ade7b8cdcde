#!/usr/bin/env bash
# One device call for the encoder confined to part of the GPU (issue 3, B1; `RunnerOptions.encoder_sms`), each part
# under its own time limit so a slow part never costs the others their results:
#   1. the engine's GPU tests (equality with the encoder in a green context, graphs on and off);
#   2. B1 on the full-size random checkpoint (built on the spot): the default against the encoder in green
#      contexts of 16 to 96 SMs, in the engine's order and the encoder alone (how long its chain gets).
#   bash benchmarks/gpu_encoder_sms.sh OUT [TEST_S B1_S]
# Carry .whl_gpu (benchmarks/gpu_setup.sh says what it holds).
set -u
out=${1:?out dir}
source benchmarks/gpu_setup.sh "$out"
timeout "${2:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" | tee -a "$out/gpu_tests.txt"
tail -3 "$out/gpu_tests.txt"
PYTHONUNBUFFERED=1 timeout "${3:-200}" python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,encoder_only_own_stream \
  --variants default,encoder_sms_16,encoder_sms_32,encoder_sms_48,encoder_sms_64,encoder_sms_96 \
  --out "$out/b1.json" > "$out/b1.log" 2>&1
echo "b1 rc=$?"
grep -E "bench_encoder_overlap: |Error|error" "$out/b1.log" | tail -3

#!/usr/bin/env bash
# One device call for the encoder confined to part of the GPU (issue 3, B1; `RunnerOptions.encoder_sms`), each part
# under its own time limit so a slow part never costs the others their results, packed into OUT/all.tgz:
#   1. the engine's GPU tests, verbose (equality with the encoder in a green context, graphs on and off);
#   2. B1 on the full-size random checkpoint (built on the spot): the default against the encoder in green
#      contexts of 16 to 64 SMs, in the engine's order and the encoder alone (how long its chain gets).
#   bash benchmarks/gpu_encoder_sms.sh OUT [TEST_S B1_S]
# Carry .whl_gpu (benchmarks/gpu_setup.sh says what it holds).
set -u
out=${1:?out dir}
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
gpu_tests gpu_tests "${2:-120}" tests/test_engine.py
pack "$out"
PYTHONUNBUFFERED=1 timeout "${3:-130}" python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts 1 \
  --modes ahead_encoder_stream,encoder_only_own_stream --variants default,encoder_sms_16,encoder_sms_32,encoder_sms_64 \
  --repeats 2 --out "$work/b1.json" > "$work/b1.log" 2>&1
echo "b1 rc=$?"
grep -E "bench_encoder_overlap: |Error|error" "$work/b1.log" | tail -3
pack "$out"

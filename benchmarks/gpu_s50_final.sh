#!/usr/bin/env bash
# Prepared in the fiftieth session, not run (its one try found no machine): the host phases of plain and speculative
# decoding at 64 and 16 streams with the detokeniser's per-token reuse and the slotted events (the `emit` phase:
# 329 us a step at 64 streams, plain, in that session's call 1, before the change), and the engine's and log-mel's
# GPU tests on that code. Every log is packed into OUT/all.tgz. carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s50_final.sh OUT        (at most 270 s by its timeouts)
set -u
out=$1
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"
phases_ab 64 16
gpu_tests engine_gpu 150 tests/test_engine.py tests/test_audio.py
pack "$out" && rm -rf "$out/r"

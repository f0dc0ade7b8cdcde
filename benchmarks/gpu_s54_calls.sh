#!/usr/bin/env bash
# Fifty-fourth session, issue 3: each layer's o projection weights fetched into L2 while its attention runs
# (`kernels.l2_prefetch`). One call (carry .whl_gpu; docs/ out of the tree):
#   OUT=DIR bash benchmarks/gpu_s54_calls.sh
# 1. the prefetch's GPU tests (the kernel, graphs, the engine's tokens with it on and off);
# 2. B1 and 8 streams, the engine order and each chain alone, with and without the prefetch, alternating repeats.
set -u
w=/tmp/w
mkdir -p "$w"
source benchmarks/gpu_setup.sh "$w"
cat "$w/gpu.txt"
gpu_tests l2_tests 240 tests/test_l2_prefetch.py
b1_ab b1_l2 420 3 ahead_encoder_stream,lm_only,encoder_only default,l2_prefetch,l2_prefetch_mlp8 1,8
pack "${OUT:?}"

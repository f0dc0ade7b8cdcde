#!/usr/bin/env bash
# Fifty-fourth session, issue 3: each layer's o projection weights fetched into L2 while its attention runs
# (`kernels.l2_prefetch`). One call (carry .whl_gpu; docs/ out of the tree):
#   OUT=DIR VARIANTS=default,l2_prefetch,... bash benchmarks/gpu_s54_calls.sh
# (call 1: default,l2_prefetch,l2_prefetch_mlp8,l2_ahead32_enc,l2_ahead8 with 16 KB chunks, the default then;
# call 2: default,default_again,l2_prefetch,l2_prefetch_64x4,l2_prefetch_256x1,l2_ahead32_enc)
# 1. one projection cold against prefetched during a spin (`bench_l2_prefetch.py`: does the fetch arrive in time?);
# 2. B1, the engine order and each chain alone, with and without the prefetch, alternating repeats;
# 3. the prefetch's GPU tests (the kernel, graphs, the engine's tokens with it on and off).
set -u
w=/tmp/w
mkdir -p "$w"
source benchmarks/gpu_setup.sh "$w"
cat "$w/gpu.txt"
PYTHONUNBUFFERED=1 timeout 120 python3 benchmarks/bench_l2_prefetch.py --out "$w/l2_micro.json" > "$w/l2_micro.log" 2>&1
echo "l2_micro rc=$?"; grep -E "bench_l2_prefetch: |Error" "$w/l2_micro.log" | cut -c1-400
b1_ab b1_l2 330 3 ahead_encoder_stream,lm_only,encoder_only ${VARIANTS:?} 1
gpu_tests l2_tests 150 tests/test_l2_prefetch.py
pack "${OUT:?}"

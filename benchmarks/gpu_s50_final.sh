#!/usr/bin/env bash
# Prepared in the fiftieth session for the next (no device time was left to run it): every GPU test on the code that
# sends a step's token events while the device runs the next step (`RunnerOptions.send_tokens_in_flight`, on by
# default on CUDA; the CPU suite runs that path only where a test asks for it). The fiftieth session's calls 8-9 ran
# these files on the code before (83 passed). carry [".whl_gpu"] (docs/ moved out; models/ stays: 6 tests load it):
#   bash benchmarks/gpu_s50_final.sh OUT        (at most 450 s; about 280 s expected on a warm machine)
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"
gpu_tests gpu_all 450 tests/test_audio.py tests/test_engine.py tests/test_fused_ops.py tests/test_kernels.py \
  tests/test_linear.py tests/test_one_row.py tests/test_spec_round.py tests/test_speculative.py tests/test_staging.py
pack "$out" && rm -rf "$out/r"

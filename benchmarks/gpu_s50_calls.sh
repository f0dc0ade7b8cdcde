#!/usr/bin/env bash
# Prepared in the forty-ninth session for the next one (issue 5, one GPU); every log and result is packed into
# OUT/all.tgz. carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s50_calls.sh OUT        (at most 330 s by its timeouts; about 200 s expected on a warm machine)
# What the forty-ninth session's device time did not cover:
# - the GPU test of the whole-step layout (14 streams, graphs equal eager equal the sessions), written after its calls;
# - the encoder calls' numpy sample views (`IncrementalLogMel.window_samples`) on a GPU's host: plain decoding's
#   `encode` phase at 64 streams took 423-448 us a step in the forty-ninth session's calls 1-2 (before the change);
# - the host phases of plain and speculative decoding at 64 and 16 streams again, on the same code as the above.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, pack
gpu_tests spec_gpu 200 tests/test_speculative.py
phases_ab 64 16
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Fifty-eighth session, first call (one GPU; packed into OUT/all.tgz). carry [".stage3", ".whl_gpu"] (docs/ and
# models/ out of the tree: the call carries at most 64 MiB):
#   bash benchmarks/gpu_s58_call1.sh OUT        (at most about 330 s by its timeouts)
# Ran at commit 8dead0b on one H100 in 115 s (docs/benchmarks.md, issue 3, fifty-eighth session;
# results/session58/call1_*).
# 1. Stages .stage3/ (the default model's packed Kokoro training shards; this session's held ps_ke52-55, 8.73 h,
#    without the recipe's ps_ke57) into /tmp/streamscribe_stage for the drafter's distillation, which must follow
#    on the same warm machine (models/README.md, "default_drafter/": the second call is
#    benchmarks/gpu_drafter_more_data.sh).
# 2. B1 on the shipped code (engine order, the LM alone, the encoder alone; 3 alternating repeats × 200 steps).
# 3. The gpu-marked tests that the fifty-seventh session's calls left unrun on the shipped code (its last call cut
#    test_one_row's [dot] case; the audio, linear and staging ones had last run on earlier code).
set -u
out=${1:?out dir}
mkdir -p "$out/r"
S=/tmp/streamscribe_stage
rm -rf "$S" && mkdir -p "$S" && cp -r .stage3/. "$S"/ && touch "$S/DONE"
du -sh "$S"/* | tee "$out/r/staged.txt"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, b1_ab, pack
b1_ab b1 80 3 ahead_encoder_stream,lm_only,encoder_only default
gpu_tests tests_rest 240 "tests/test_one_row.py::test_gpu_kernels_and_a_pdl_chain_in_a_graph" \
  "tests/test_audio.py::test_log_mel_on_the_gpu_matches_the_host" tests/test_linear.py tests/test_staging.py
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# The engine's host path at batch 1 (the small default model, files one after another: bench_engine_files.py) for
# the code in ab_before/ (git archive of the commit before a change: realtime kernels speculative benchmarks) against
# this tree, alternated, then the GPU tests of staging and the engine.
#   OUT=DIR bash benchmarks/gpu_host_ab.sh     # carry .whl_gpu and .bench_audio; ab_before/ travels untracked
set -u
work=$(mktemp -d); source benchmarks/gpu_setup.sh "$work" > /dev/null 2>&1
files=$(ls .bench_audio/heldout_0*.flac)
for rep in 1 2; do for v in before now; do
  root=.; [ $v = before ] && root=ab_before
  timeout 80 python3 $root/benchmarks/bench_engine_files.py --model models/default --files $files --device cuda \
    --max-streams 1 --repeats 3 --out "$GPU_DIR/host_${v}_$rep.json" > "$GPU_DIR/host_${v}_$rep.log" 2>&1
  echo "$v $rep rc=$? $(grep 'repeat [12]' $GPU_DIR/host_${v}_$rep.log | sed 's/.*: //' | tr '\n' ' ')"
done; done
gpu_tests staging_engine 240 tests/test_staging.py tests/test_engine.py
pack "$OUT"

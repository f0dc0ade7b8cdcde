#!/usr/bin/env bash
# Tree verification on the device (issue 5). Optionally the GPU tests of test_speculative and test_kernels
# (TEST_EXTRA: more test files); then batch-1 offline speed of the shipped parallel drafter with a chain of k and
# with trees of several sizes, each against plain decoding in its own alternating repeats
# (bench_speculative.py, bf16, the held-out clips cut to 45 s); optionally batches 16 and 64 and the
# end-of-stream flush for the chain and one tree.
#
#   bash benchmarks/gpu_tree.sh OUT AUDIO_DIR WHEELS_DIR [NODES...]     (default NODES: 8 16 32 64)
#   env: K (6), TESTS (1), REPEATS (3), DRAFTER (models/default_drafter),
#        WIDE (a tree size: also batches 16 and 64 and the flush, chain and that tree; empty: not),
#        TREE_MAX (--tree-max-streams for every tree run: the tree only in steps where that few streams draft;
#        empty: the tree in every step)
# WHEELS_DIR holds soundfile, cffi and pycparser wheels (the device lacks soundfile, needed for FLAC);
# .gpu_shim (mistral-common's vocabulary file) must be in the tree for the tiny test checkpoints.
set -uo pipefail
out=$1; audio=$2; wheels=$3; shift 3
nodes=${*:-8 16 32 64}
k=${K:-6}; drafter=${DRAFTER:-models/default_drafter}; repeats=${REPEATS:-3}; wide=${WIDE:-}; tmax=${TREE_MAX:-}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/*.whl
export PYTHONPATH=/tmp/site:$PWD/.gpu_shim:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
t0=$(date +%s)
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_speculative.py tests/test_kernels.py ${TEST_EXTRA:-} \
    > "$out/gpu_tests.txt" 2>&1
  echo "gpu tests rc=$? $(( $(date +%s) - t0 )) s" >> "$out/times.txt"
fi
bench() {  # name "tree nodes or empty" args...
  local name=$1 m=$2; shift 2
  timeout 150 python3 benchmarks/bench_speculative.py --target models/default --drafter "$drafter" \
    --audio "$audio"/* --clip-seconds 45 --k "$k" --dtype bf16 ${m:+--tree-nodes $m} \
    ${m:+${tmax:+--tree-max-streams $tmax}} "$@" \
    --out "$out/$name.json" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" >> "$out/times.txt"
}
b1=(--batches 1 --repeats "$repeats" --skip-flush)
bench "b1_chain_k$k" "" "${b1[@]}"
for m in $nodes; do bench "b1_tree${m}_k$k" "$m" "${b1[@]}"; done
if [ -n "$wide" ]; then
  bench "b16_64_chain_k$k" "" --batches 16 64 --flush-clip-seconds 10
  bench "b16_64_tree${wide}_k$k" "$wide" --batches 16 64 --flush-clip-seconds 10
fi
grep -h "offline batch\|flush batch" "$out"/*.log

#!/usr/bin/env bash
# Fifty-sixth session, issue 3 (one GPU; every log and result packed into OUT/all.tgz). carry [".whl_gpu"] (docs/ out):
#   bash benchmarks/gpu_s56_calls.sh OUT        (at most 560 s by its timeouts)
# 1. B1 on the current code, the LM and the encoder alone, and the MLP's norm + gate/up + SiLU-mul as one tensor-core
#    kernel (bench_encoder_overlap.py variant fused_gate_up_dot), 3 alternating repeats;
# 2. the persistent-kernel probe: the LM's 26-layer skeleton alone, each product's first weight tile requested
#    before its barrier or not; then both chains side by side as the engine's kernels, either one persistent, and
#    both persistent on disjoint programs (benchmarks/probe_persistent_chain.py);
# 3. where the step's time goes (benchmarks/step_inventory.py), with the time left.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; b1_ab, pack
t0=$(date +%s)
b1_ab b1 200 3 ahead_encoder_stream,lm_only,encoder_only default,fused_gate_up_dot
probe() {
  local name=$1 secs=$2
  shift 2
  PYTHONUNBUFFERED=1 timeout "$secs" python3 benchmarks/probe_persistent_chain.py "$@" --out "$GPU_DIR/$name.json" \
    > "$GPU_DIR/$name.log" 2>&1
  echo "$name rc=$?"; grep -E "probe_persistent_chain: |Error" "$GPU_DIR/$name.log" | cut -c1-200 | tail -24
}
probe lm_alone 120 --layers 26 --programs-per-sm 1 2 --configs 32:512:8:3 16:1024:8:3 --prefetch 0 1 --repeats 10
probe overlap 180 --overlap --encoder-programs 132 --lm-programs 132 264 --both 99:33 198:66 132:132 \
  --prefetch 0 1 --repeats 10
left=$(( 540 - ($(date +%s) - t0) ))
if [ "$left" -gt 60 ]; then
  PYTHONUNBUFFERED=1 timeout "$left" python3 benchmarks/step_inventory.py --model /tmp/full \
    --out "$GPU_DIR/inventory.json" > "$GPU_DIR/inventory.log" 2>&1
  echo "inventory rc=$?"; grep -E "step_inventory: |Error" "$GPU_DIR/inventory.log" | cut -c1-160 | tail -34
fi
pack "$out" && rm -rf "$out/r"

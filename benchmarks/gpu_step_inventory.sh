#!/usr/bin/env bash
# One device call: benchmarks/step_inventory.py on the full-size random checkpoint (batch 1), packed into OUT/all.tgz.
#   OUT=DIR bash benchmarks/gpu_step_inventory.sh     (carry .whl_gpu)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
PYTHONUNBUFFERED=1 timeout 400 python3 benchmarks/step_inventory.py --model /tmp/full --out "$work/inventory.json" > "$work/inventory.log" 2>&1
echo "inventory rc=$?"; grep -E "step_inventory: |Error" "$work/inventory.log" | tail -34
pack "$OUT"

#!/usr/bin/env bash
# Why the fused one-row gate/up runs at 1.6x its bytes where the tensor-core projection runs near 1.1x (issue 3,
# B1): Nsight Compute on both, a few kernels each, with the sections that answer it (achieved DRAM bandwidth,
# occupancy and what limits it, warp stall reasons). About 2 minutes on one H200.
#   bash benchmarks/gpu_ncu_one_row.sh OUT
# Carry .whl_gpu (benchmarks/gpu_setup.sh says what it holds).
set -u
out=${1:?out dir}
source benchmarks/gpu_setup.sh "$out"
sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
for op in gate_up gate_up_unfused o; do
  # skip the first round (compilation, first touches); profile 3 launches of each kernel of the round after
  timeout 150 ncu --clock-control none --kernel-name regex:"one_row_kernel|skinny_linear_kernel|_add_rms_norm_kernel|_silu_mul_kernel" \
    --launch-skip 30 --launch-count 6 $sections --csv --page details \
    python3 benchmarks/bench_one_row.py --profile "$op" --layers 10 --head-copies 1 --rounds 4 > "$out/ncu_$op.csv" 2> "$out/ncu_$op.log"
  echo "ncu $op rc=$?"
  grep -E '"(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Block Limit Registers|Block Limit Shared Mem)"' "$out/ncu_$op.csv" | cut -d, -f5,12- | head -24
done

#!/usr/bin/env bash
# Fiftieth session, prepared for the next (no device time was left to run it): the host phases at 64 and 16 streams
# with a step's token events sent while the device runs the next step (`--tokens-in-flight on`, CUDA's default since
# then) and at the end of their own step (`off`, as before), alternating in separate processes, twice. Every log is
# packed into OUT/all.tgz. carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s50_emit_ab.sh OUT        (at most 8 x 60 s by its timeouts; about 4 minutes expected)
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"
for i in 1 2; do
  for b in 64 16; do
    for v in off on; do
      timeout 60 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
        --audio .bench_audio/* --clip-seconds 20 --batch "$b" --modes plain chain --repeats 1 --tokens-in-flight "$v" \
        --out "$GPU_DIR/b${b}_${v}_$i.json" > "$GPU_DIR/b${b}_${v}_$i.log" 2>&1
      echo "b$b $v $i rc=$?"; grep -E "host_phases: |Error" "$GPU_DIR/b${b}_${v}_$i.log" | cut -c1-330
    done
  done
done
pack "$out" && rm -rf "$out/r"

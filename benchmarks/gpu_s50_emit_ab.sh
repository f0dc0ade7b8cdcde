#!/usr/bin/env bash
# Fiftieth session: the host phases at 64 streams before and after sending a step's token events while the device
# runs the next step (5ed8b64), alternating in one call: "before" is a copy of this tree with the files in BEFORE
# (default .old_engine: realtime/engine/engine.py and stream.py of the commit before) laid over it. Every log is
# packed into OUT/all.tgz. carry [".whl_gpu", ".bench_audio", ".old_engine"] (docs/ moved out):
#   bash benchmarks/gpu_s50_emit_ab.sh OUT        (at most 4 x 60 s by its timeouts)
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"
before=/tmp/streamscribe_before
rm -rf "$before" && mkdir -p "$before"
cp -r realtime speculative kernels benchmarks models .bench_audio "$before/"
cp "${BEFORE:-.old_engine}"/engine.py "${BEFORE:-.old_engine}"/stream.py "$before/realtime/engine/"
for i in 1 2; do
  for v in before after; do
    d=$PWD
    [ "$v" = before ] && d=$before
    (cd "$d" && PYTHONPATH=/tmp/site:$d timeout 60 python3 benchmarks/host_phases.py --target models/default \
      --drafter models/default_drafter --audio .bench_audio/* --clip-seconds 20 --batch 64 --modes plain chain \
      --repeats 1 --out "$GPU_DIR/${v}_$i.json" > "$GPU_DIR/${v}_$i.log" 2>&1)
    echo "$v $i rc=$?"; grep -E "host_phases: |Error" "$GPU_DIR/${v}_$i.log" | cut -c1-330
  done
done
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Prepared in the forty-eighth session for the next one (issue 5, one GPU); every log and result is packed into
# OUT/all.tgz. carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s49_calls.sh OUT        (at most 580 s by its timeouts; about 400 s expected)
# What the forty-eighth session's device time did not cover:
# - the whole-step host layout (`Speculator._rows_at_once`, from AT_ONCE_MIN_STREAMS = 12 streams a step): on the
#   2-core CPU it cut `_layout` at 64 streams from ~850 to ~330 us a step; on the GPU, where a 64-stream step takes
#   ~4 ms, whether that shows in the wall time. host_phases.py runs both layouts in one process, alternating
#   (the forty-eighth session saw the first of three processes run plain decoding at half speed);
# - where a step's time goes at 64 streams when nothing is drafted (host_phases.py with a cap of 128);
# - batches 16 and 64 at k = 12 with 3 alternating repeats (the forty-eighth session's single runs varied 2x in
#   plain decoding), and batch 16 in fp32 (every output must equal plain decoding there).
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; spec_run, pack
# a throwaway first process: Triton's and the CUDA graphs' first compilation on a cold machine
timeout 90 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
  --audio .bench_audio/* --clip-seconds 4 --batch 16 --modes chain --repeats 1 --out "$GPU_DIR/warm.json" \
  > "$GPU_DIR/warm.log" 2>&1
echo "warm rc=$?"
for b in 16 64; do
  timeout 100 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
    --audio .bench_audio/* --clip-seconds 20 --batch "$b" --modes chain@per-stream chain@auto plain --repeats 3 \
    --out "$GPU_DIR/layout_b$b.json" > "$GPU_DIR/layout_b$b.log" 2>&1
  echo "layout_b$b rc=$?"; grep -E "host_phases: |Error" "$GPU_DIR/layout_b$b.log" | cut -c1-300
done
# where a no-draft step's time goes at 64 streams (a cap of 128 drafts nothing: 0.50x plain in the forty-eighth session)
timeout 70 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
  --audio .bench_audio/* --clip-seconds 20 --batch 64 --modes chain plain --repeats 2 --max-verify-rows 128 \
  --out "$GPU_DIR/nodraft_b64.json" > "$GPU_DIR/nodraft_b64.log" 2>&1
echo "nodraft_b64 rc=$?"; grep -E "host_phases: |Error" "$GPU_DIR/nodraft_b64.log" | cut -c1-300
spec_run b16_64_r3 150 ".bench_audio/*" --batches 16 64 --repeats 3 --clip-seconds 20 --k 12
grep -E "offline batch" "$GPU_DIR/b16_64_r3.log" | cut -c1-250
timeout 70 python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
  --audio .bench_audio/* --clip-seconds 20 --k 12 --dtype fp32 --skip-flush --batches 16 --repeats 1 \
  --out "$GPU_DIR/b16_fp32.json" > "$GPU_DIR/b16_fp32.log" 2>&1
echo "b16_fp32 rc=$?"; grep -E "offline batch|Error" "$GPU_DIR/b16_fp32.log" | cut -c1-250
pack "$out" && rm -rf "$out/r"

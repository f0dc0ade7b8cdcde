#!/usr/bin/env bash
# One device call after an engine or drafter change, in order of importance, each part under its own
# time limit so a slow part never costs the others their results:
#   1. the GPU tests (by file: `-m gpu tests` would also collect server tests whose packages the GPU
#      machine lacks);
#   2. the engine on the full-size random checkpoint (built on the spot): B1 with its kernel inventory
#      (`bench_engine.py --profile`), B2 at ENGINE_COUNTS streams, B3 when B3=1;
#   3. the default model's speculative batch-1 speed-up, alternating repeats, for each K in KS (the
#      first also with the kernel inventory and host functions of a step and a round when PROFILE=1);
#   4. batches 16/64 and the end-of-stream flush at the first K (LARGE=1);
#   5. fp32 batches 1/16/64, whose outputs must be identical (FP32=1).
# Summaries go to stdout; raw JSON and logs into OUT/results.tar (OUT returns 8 files at most).
#   benchmarks/gpu_recheck.sh OUT AUDIO_DIR [DRAFTER_DIR]
# Settings (environment): TESTS=1 ENGINE_COUNTS=1,256 B3=0 KS="6 4" PROFILE=1 B1_REPEATS=5 LARGE=1
# LARGE_REPEATS=1 FP32=0. The eighth session's three calls (run then as three scripts; the profile call had
# B1 at 100 steps and no B2):
#   TESTS=0 ENGINE_COUNTS=1 KS=4 B1_REPEATS=3 LARGE=0 benchmarks/gpu_recheck.sh OUT .bench_audio   (profiles)
#   benchmarks/gpu_recheck.sh OUT .bench_audio                                                     (recheck)
#   KS=4 PROFILE=0 B3=1 LARGE_REPEATS=3 FP32=1 benchmarks/gpu_recheck.sh OUT .bench_audio          (final)
set -u
out=${1:?out dir}; audio=${2:?audio dir}; drafter=${3:-models/default_drafter}
ks=${KS:-6 4}; k1=${ks%% *}  # 6: the shipped (parallel) drafter's default; give KS=4 for a chained one
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"
# bench_speculative on the default model and the drafter; each part adds its own arguments
spec=(python3 benchmarks/bench_speculative.py --target models/default --drafter "$drafter" --audio "$audio"/*
      --clip-seconds 45)
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels.py tests/test_fused_ops.py \
    tests/test_engine.py tests/test_speculative.py tests/test_audio.py tests/test_prompt_prefix.py \
    > "$out/gpu_tests.txt" 2>&1
  echo "gpu tests rc=$?"; tail -1 "$out/gpu_tests.txt"
fi
skip=paced,b4; [ "${B3:-0}" = 1 ] || skip=$skip,b3
timeout 170 python3 benchmarks/bench_engine.py --model /tmp/full --counts "${ENGINE_COUNTS:-1,256}" --steps 200 \
  --skip "$skip" --profile --out "$out/engine.json" > "$out/engine.log" 2>&1
echo "engine rc=$?"
python3 - "$out/engine.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b1 = dict(r["B1"]); p = b1.pop("kernel_profile")
print("bw", round(r["copy_bandwidth_GBps"]), "B1", {k: round(v, 3) for k, v in b1.items()})
print("kernels/step", p["kernels_per_step"], "by kind us", {k: round(v, 1) for k, v in p["by_kind_us"].items()})
for t in p["top"]: print("  ", round(t["us_per_step"], 1), t["per_step"], t["kind"], t["name"][:80])
for row in r.get("B2", []): print("B2", row["streams"], round(row["median_ms"], 2), round(row["p99_ms"], 2))
for row in r.get("B3", []): print("B3", row["streams"], round(row["1min"]["median_ms"], 2), round(row["60min"]["median_ms"], 2))
PY
profile=${PROFILE:-1}
for k in $ks; do
  extra=(); [ "$profile" = 1 ] && extra=(--profile)
  timeout 150 "${spec[@]}" --batches 1 --k "$k" --dtype bf16 --repeats "${B1_REPEATS:-5}" --skip-flush "${extra[@]}" \
    --out "$out/spec_b1_k$k.json" > "$out/spec_b1_k$k.log" 2>&1
  echo "spec k=$k rc=$?"; grep "offline batch\|profile" "$out/spec_b1_k$k.log"
  profile=0
done
if [ "${LARGE:-1}" = 1 ]; then
  timeout 120 "${spec[@]}" --flush-clip-seconds 10 --batches 16 64 --k "$k1" --dtype bf16 --repeats "${LARGE_REPEATS:-1}" \
    --out "$out/spec_b16_64.json" > "$out/spec_b16_64.log" 2>&1
  echo "spec 16/64 rc=$?"; grep "offline batch\|flush batch" "$out/spec_b16_64.log"
fi
if [ "${FP32:-0}" = 1 ]; then
  timeout 100 "${spec[@]}" --batches 1 16 64 --k "$k1" --dtype fp32 --skip-flush --out "$out/spec_fp32.json" \
    > "$out/spec_fp32.log" 2>&1
  echo "spec fp32 rc=$?"; grep "offline batch" "$out/spec_fp32.log"
fi
(cd "$out" && tar cf results.tar --exclude results.tar ./* && find . -maxdepth 1 -type f ! -name results.tar -delete)

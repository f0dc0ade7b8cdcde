#!/usr/bin/env bash
# One device call after an engine change: the GPU tests, then B1 with its kernel inventory and B2 at
# 256 streams on the full-size random checkpoint (built on the spot), then the default model's
# speculative batch-1 speed-up with repeats for each K in KS (the first with --profile), then
# batches 16/64 and the flush at the first K. Each part has its own time limit.
#   benchmarks/gpu_recheck.sh OUT AUDIO_DIR [DRAFTER_DIR] [KS]     (KS: space-separated, default "4 3")
set -u
out=${1:?out dir}; audio=${2:?audio dir}; drafter=${3:-models/default_drafter}; ks=${4:-4 3}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels.py tests/test_fused_ops.py \
  tests/test_engine.py tests/test_speculative.py tests/test_audio.py tests/test_prompt_prefix.py > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$out/gpu_tests.txt"
timeout 170 python3 benchmarks/bench_engine.py --model /tmp/full --counts 1,256 --steps 200 --skip paced,b3,b4 \
  --profile --out "$out/engine.json" > "$out/engine.log" 2>&1
echo "engine rc=$?"
python3 - "$out/engine.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b1 = dict(r["B1"]); p = b1.pop("kernel_profile")
print("B1", {k: round(v, 3) for k, v in b1.items()})
print("profile", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in p.items() if k not in ("top", "by_kind_us", "count_by_kind")})
print("by kind us", {k: round(v, 1) for k, v in p["by_kind_us"].items()})
for row in r.get("B2", []): print("B2", row["streams"], round(row["median_ms"], 2), round(row["p99_ms"], 2))
PY
first=1
for k in $ks; do
  extra=""; [ $first = 1 ] && extra="--profile"
  timeout 150 python3 benchmarks/bench_speculative.py --target models/default --drafter "$drafter" --audio "$audio"/* \
    --clip-seconds 45 --batches 1 --k "$k" --dtype bf16 --repeats 5 --skip-flush $extra --out "$out/spec_b1_k$k.json" \
    > "$out/spec_b1_k$k.log" 2>&1
  echo "spec k=$k rc=$?"; grep "offline batch\|profile" "$out/spec_b1_k$k.log"
  first=0
done
k1=${ks%% *}
timeout 120 python3 benchmarks/bench_speculative.py --target models/default --drafter "$drafter" --audio "$audio"/* \
  --clip-seconds 45 --flush-clip-seconds 10 --batches 16 64 --k "$k1" --dtype bf16 --out "$out/spec_b16_64.json" \
  > "$out/spec_b16_64.log" 2>&1
echo "spec 16/64 rc=$?"; grep "offline batch\|flush batch" "$out/spec_b16_64.log"
(cd "$out" && tar cf results.tar --exclude results.tar ./* && find . -maxdepth 1 -type f ! -name results.tar -delete)

#!/usr/bin/env bash
# The eighth session's last device call, in order of importance, each part under its own limit:
# GPU tests; B1 (kernel inventory) + B2 at 256 streams + B3 on the full-size random checkpoint; the
# default model with its drafter: bf16 batch 1 with 5 alternating repeats, batches 16/64 with 3, the
# flush; fp32 batches 1/16/64 (identical outputs).   benchmarks/gpu_final_session8.sh OUT AUDIO_DIR
set -u
out=${1:?out dir}; audio=${2:?audio dir}; d=models/default_drafter
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels.py tests/test_fused_ops.py \
  tests/test_engine.py tests/test_speculative.py tests/test_audio.py tests/test_prompt_prefix.py > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -1 "$out/gpu_tests.txt"
timeout 170 python3 benchmarks/bench_engine.py --model /tmp/full --counts 1,256 --steps 200 --skip paced,b4 \
  --profile --out "$out/engine.json" > "$out/engine.log" 2>&1
echo "engine rc=$?"
python3 - "$out/engine.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b1 = dict(r["B1"]); p = b1.pop("kernel_profile")
print("bw", round(r["copy_bandwidth_GBps"]), "B1", {k: round(v, 3) for k, v in b1.items()})
print("kernels/step", p["kernels_per_step"], "by kind us", {k: round(v, 1) for k, v in p["by_kind_us"].items()})
for row in r.get("B2", []): print("B2", row["streams"], round(row["median_ms"], 2), round(row["p99_ms"], 2))
print("B3", json.dumps(r.get("B3"))[:600])
PY
timeout 100 python3 benchmarks/bench_speculative.py --target models/default --drafter $d --audio "$audio"/* \
  --clip-seconds 45 --batches 1 --k 4 --dtype bf16 --repeats 5 --skip-flush --out "$out/spec_b1.json" > "$out/spec_b1.log" 2>&1
echo "spec b1 rc=$?"; grep "offline batch" "$out/spec_b1.log"
timeout 110 python3 benchmarks/bench_speculative.py --target models/default --drafter $d --audio "$audio"/* \
  --clip-seconds 45 --flush-clip-seconds 10 --batches 16 64 --k 4 --dtype bf16 --repeats 3 --out "$out/spec_b16_64.json" \
  > "$out/spec_b16_64.log" 2>&1
echo "spec 16/64 rc=$?"; grep "offline batch\|flush batch" "$out/spec_b16_64.log"
timeout 100 python3 benchmarks/bench_speculative.py --target models/default --drafter $d --audio "$audio"/* \
  --clip-seconds 45 --batches 1 16 64 --k 4 --dtype fp32 --skip-flush --out "$out/spec_fp32.json" > "$out/spec_fp32.log" 2>&1
echo "spec fp32 rc=$?"; grep "offline batch" "$out/spec_fp32.log"
(cd "$out" && tar cf results.tar --exclude results.tar ./* && find . -maxdepth 1 -type f ! -name results.tar -delete)

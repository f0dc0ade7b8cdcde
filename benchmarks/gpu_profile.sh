#!/usr/bin/env bash
# One device call: where a batch-1 step goes. B1 of the full-size random checkpoint with its kernel
# inventory (bench_engine --profile), then the speculative batch-1 benchmark of the default model and
# its drafter with the kernel inventory and host functions of a plain step and a speculative round
# (bench_speculative --profile). Summaries on stdout, raw JSON and logs in OUT/results.tar.
#   benchmarks/gpu_profile.sh OUT AUDIO_DIR [DRAFTER_DIR]
set -u
out=${1:?out dir}; audio=${2:?audio dir}; drafter=${3:-models/default_drafter}
export OUT=$out
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $out/gpu.txt
timeout 240 python3 benchmarks/bench_engine.py --model /tmp/full --counts 1 --steps 100 --skip b2,paced,b3,b4 --profile --out $out/engine_b1_profile.json > $out/engine_b1_profile.log 2>&1
echo "engine rc=$?"
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/engine_b1_profile.json"))["B1"]
p = r.pop("kernel_profile")
print({k: round(v, 3) for k, v in r.items()})
print({k: v for k, v in p.items() if k != "top"})
for t in p["top"]: print(round(t["us_per_step"], 1), t["per_step"], round(t["mean_us"], 2), t["kind"], t["name"][:90])
PY
timeout 200 python3 benchmarks/bench_speculative.py --target models/default --drafter "$drafter" --audio "$audio"/* --clip-seconds 45 --batches 1 --k 4 --dtype bf16 --repeats 3 --skip-flush --profile --out $out/spec_profile.json > $out/spec_profile.log 2>&1
echo "spec rc=$?"
grep "offline batch\|profile" $out/spec_profile.log
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/spec_profile.json"))["offline"]["1"]["profile"]
for m, o in r.items():
    print(m, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in o.items() if k not in ("top", "host_top")})
    for t in o["top"][:8]: print("  ", round(t["us_per_step"], 1), round(t["per_step"], 2), round(t["mean_us"], 2), t["kind"], t["name"][:80])
    for h in o["host_top"][:18]: print("  H", round(h["own_share"], 3), h["calls"], h["function"][:100])
PY
cd $out && tar cf results.tar *.json *.log gpu.txt && rm -f *.json *.log

#!/usr/bin/env bash
# One device call: distil drafter variants from models/default on the GPU, measure each with
# speculative.train's engine evaluation on the held-out clips and with a batch-1 bench_speculative run
# (bf16, 3 alternating repeats, median), then benchmark the fastest one at batches 1/16/64 and bring its
# files back. Ranked by batch-1 speed-up, not acceptance: a deeper drafter accepts more but costs more
# per round (seventh session: 2 layers accepted 2.46 against 2.30 and ran 2.42x against 2.70x).
#   benchmarks/gpu_drafter_sweep.sh OUT EVAL_DIR VARIANTS_FILE [BENCH_S]
# VARIANTS_FILE: one variant per line, `name|audio folders|extra speculative.train arguments|seconds`, e.g.
#   base|.distill_audio/base|--steps 1100|60
#   all_u4|.distill_audio/base .distill_audio/unseen .distill_audio/warp|--steps 3000 --unroll 4|120
# Variants with the same audio folders reuse the first one's teacher labels (same target, files, delays).
# A variant cut off by its time limit has no report and is left out of the choice.
# Logs and reports go into OUT/results.tar, the chosen drafter's two files into OUT (OUT returns 8 files).
set -u
out=${1:?out dir}; evals=${2:?held-out clips folder}; variants=${3:?variants file}
t_bench=${4:-170}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
declare -A teacher
while IFS='|' read -r name audio extra per; do
  [ -z "$name" ] && continue
  dir="/tmp/drafters/$name"; mkdir -p "$dir"
  if [ -n "${teacher[$audio]:-}" ]; then cp "${teacher[$audio]}" "$dir/teacher.pt"; fi
  # shellcheck disable=SC2086  # audio folders and extra arguments are word lists
  timeout "$per" python3 -m speculative.train --target models/default --audio $audio --eval-audio "$evals" \
    --out "$dir" --delays 480 --log-every 250 $extra > "$out/distill_$name.log" 2>&1
  echo "$name rc=$?" | tee -a "$out/distill_$name.log"
  [ -z "${teacher[$audio]:-}" ] && [ -f "$dir/teacher.pt" ] && teacher[$audio]="$dir/teacher.pt"
  grep -E "engine eval|teacher:|training files" "$out/distill_$name.log" | tail -3
  [ -f "$dir/train_report.json" ] && cp "$dir/train_report.json" "$out/report_$name.json"
  if [ -f "$dir/train_report.json" ]; then
    timeout 150 python3 benchmarks/bench_speculative.py --target models/default --drafter "$dir" --audio "$evals"/* \
      --clip-seconds 45 --batches 1 --k 4 --dtype bf16 --repeats 3 --skip-flush --out "$out/b1_$name.json" \
      > "$out/b1_$name.log" 2>&1
    grep "offline batch" "$out/b1_$name.log"
  fi
done < "$variants"
best=$(python3 - "$out" <<'EOF'
import json, pathlib, sys
rows = []
for p in pathlib.Path(sys.argv[1]).glob("b1_*.json"):
    r = json.loads(p.read_text())["offline"]["1"]
    rows.append((r["speedup"], p.stem.removeprefix("b1_")))
    print(f"{p.stem}: batch-1 speed-up {r['speedup']:.3f}, mean acceptance length "
          f"{r['with']['mean_acceptance_length']:.3f}", file=sys.stderr)
print(max(rows)[1] if rows else "")
EOF
)
echo "best: ${best:-none}" | tee "$out/best.txt"
if [ -n "$best" ]; then
  cp "/tmp/drafters/$best/drafter_config.json" "/tmp/drafters/$best/drafter.safetensors" "$out/"
  timeout "$t_bench" python3 benchmarks/bench_speculative.py --target models/default --drafter "/tmp/drafters/$best" \
    --audio "$evals"/* --clip-seconds 45 --flush-clip-seconds 10 --batches 1 16 64 --k 4 --dtype bf16 \
    --out "$out/spec_bf16.json" > "$out/spec_bf16.log" 2>&1
  echo "bench rc=$?" | tee -a "$out/spec_bf16.log"
  tail -22 "$out/spec_bf16.log"
fi
(cd "$out" && tar cf results.tar --exclude results.tar --exclude 'drafter*' ./* && find . -maxdepth 1 -type f \
  ! -name results.tar ! -name 'drafter*' -delete)

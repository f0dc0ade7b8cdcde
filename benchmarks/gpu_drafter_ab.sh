#!/usr/bin/env bash
# Drafters against each other in one device call (bf16, k = 4 unless NAME=DIR@K, the target models/default):
#   benchmarks/gpu_drafter_ab.sh OUT EVAL_DIR WHEELS_DIR NAME=DRAFTER_DIR[@K]...
# Why: a speed-up is a ratio to plain decoding in the same run, but plain decoding's speed moves by
# ~10% from call to call (another host), so drafters are compared inside one call. Each GPU takes
# every other drafter in turn; batch 1 runs 3 alternating repeats per clip (medians). The first drafter
# is also measured on the last GPU, which shows how much the GPUs differ. Then batches 16 and 64 and the
# end-of-stream flush for every drafter but the first, one per GPU at a time. `@K` drafts K tokens per
# round with that drafter (default 4); the same drafter may come twice with different K.
# WHEELS_DIR: soundfile and its dependencies (the device has none). Back: OUT/results.tar.
set -u
out=${1:?out}; evals=${2:?clips}; wheels=${3:?wheels}; shift 3
[ $# -ge 1 ] || { echo "give NAME=DRAFTER_DIR at least once" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/dsite "$wheels"/*.whl \
  && export PYTHONPATH=/tmp/dsite${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
ngpu=$(nvidia-smi -L | wc -l)
k_of() { case $1 in *@*) echo "${1##*@}";; *) echo 4;; esac; }
b1() {  # gpu name dir[@k]
  CUDA_VISIBLE_DEVICES=$1 timeout 110 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter "${3%@*}" --audio "$evals"/* --clip-seconds 45 --batches 1 --k "$(k_of "$3")" --dtype bf16 \
    --repeats 3 --skip-flush \
    --out "$out/b1_$2_g$1.json" > "$out/b1_$2_g$1.log" 2>&1
}
b16() {  # gpu name dir[@k]
  CUDA_VISIBLE_DEVICES=$1 timeout 90 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter "${3%@*}" --audio "$evals"/* --clip-seconds 45 --flush-clip-seconds 10 --batches 16 64 \
    --k "$(k_of "$3")" --dtype bf16 \
    --out "$out/b16_64_$2_g$1.json" > "$out/b16_64_$2_g$1.log" 2>&1
}
pairs=("$@")
jobs_on() {  # gpu kind: this GPU's share of the drafters, one after another
  local g=$1 kind=$2 i
  for i in "${!pairs[@]}"; do
    [ "$kind" = b16 ] && [ "$i" -eq 0 ] && continue
    [ $(( i % ngpu )) -eq "$g" ] && $kind "$g" "${pairs[i]%%=*}" "${pairs[i]#*=}"
  done
  if [ "$kind" = b1 ] && [ "$ngpu" -ge 2 ] && [ "$g" -eq $(( ngpu - 1 )) ]; then
    b1 "$g" "${pairs[0]%%=*}" "${pairs[0]#*=}"
  fi
  return 0
}
for kind in b1 b16; do
  for g in $(seq 0 $(( ngpu - 1 ))); do jobs_on "$g" "$kind" & done
  wait
done
grep -H "offline batch\|flush batch" "$out"/*.log
(cd "$out" && tar cf results.tar --exclude results.tar ./* && find . -maxdepth 1 -type f ! -name results.tar -delete)

#!/usr/bin/env bash
# One device call on 2 GPUs (nvidia-h200-x2): does more distillation audio make a better drafter?
#   benchmarks/gpu_drafter_more_data.sh OUT EVAL_DIR CARRY [CHUNKS] [STEPS] [CLIP_SECONDS] [MODE] [DROPOUT]
# Why: the recipe's drafter (2.1 h of speech, 3,000 steps) is right on 99.8% of its training positions
# but, on the CPU, 83% on new sentences of training voices and 67% on held-out voices
# (benchmarks/drafter_accuracy.py): it learns its clips by heart.
# 1. Speech is made on the device (benchmarks/device_speech_clips.py from CARRY's engines, corpus and
#    soundfile wheels), in chunks of 5 clips of 60 s for each kind (train, unseen, warp). 8 chunks per kind
#    are the recipe's 2 h (models/README.md); CHUNKS per kind (default 24, 6 h) feed the second drafter.
# 2. Two distillations from models/default at once, one per GPU, with the recipe's arguments (1 layer,
#    unroll 4, 480 ms): `base` on the first 8 chunks per kind, 3,000 steps; `more` on all chunks, STEPS
#    steps (default 4,500). Each ends with speculative.train's engine evaluation on EVAL_DIR; `more` stops
#    training after 3.3 min (its state saved, no evaluation) should its data take longer than planned.
# 3. Both are benchmarked at once (bench_speculative.py, bf16, k = 4): batch 1 with 3 alternating
#    repeats, then batches 16 and 64 with the end-of-stream flush.
# MODE `split` (for many hours) leaves `base` out: each GPU labels half of the chunks at once
# (speculative.train --label-only), then `more` trains from both teacher files (--teacher-from) and is
# benchmarked. With one GPU only `more` runs, labelled in one piece. DROPOUT (split mode, 2 GPUs): the first
# GPU, idle while `more` trains, trains `reg` at the same time from the same teacher files with
# `--dropout DROPOUT` (the drafter memorises its clips), and both are benchmarked at once.
# MODE `parallel` (2 GPUs) labels as `split`, then trains two ParallelEagleDrafters at once (all drafts of
# a round in one drafter pass; speculative.train --parallel): `par` (1 layer) on GPU 0 and `par2` (2 layers:
# a layer costs one pass per round here, not one per draft) on GPU 1, both with unroll PAR_K (env, default 6)
# and `--dropout DROPOUT` (default 0.1), and benchmarks both at once at k = PAR_K. With REF_DRAFTER (env: a
# drafter folder, e.g. the shipped one) that drafter's batch-1 run follows on each GPU, at k = 4: the
# same-call reference, since plain decoding's speed moves between calls. With one GPU only `par` runs
# (labelled in one piece), then the reference.
# PAR_MINUTES (env, default 4): training minutes of each parallel drafter.
# MODE `two_pass` trains TwoPassEagleDrafters instead (speculative.train --two-pass: the first draft in the
# catch-up pass, the others in one more pass), `two` (1 layer) and with 2 GPUs `two2` (2 layers), with the
# same PAR_K, PAR_MINUTES and DROPOUT. REF_DRAFTER may list several drafters, `DIR[@K]` each (K default 4):
# each one's batch-1 run follows in turn (ref_g0, ref2_g0, ...). EXTRA_TRAIN (env): more speculative.train
# arguments for the parallel and two-pass drafters (e.g. "--depth-decay 0.4"). B1_ONLY=1 (env): no batch-16/64 runs.
# EXTRA_AUDIO (env, forty-sixth session): more training audio for the drafters, folders or files as speculative.train's
# --audio takes them, e.g. the default model's packed training shards staged by benchmarks/gpu_stage.sh
# (EXTRA_AUDIO="/tmp/streamscribe_stage/ps_ke52 ..."; Kokoro's 45 natural speakers, which the device cannot
# synthesise): the drafter's first draft is right 66% of the time on held-out voices and ~100% on its training
# positions, so more voices may be what it lacks. DISTIL_LIMIT (env, default 330 s): the one-GPU distillation's limit.
# Back: OUT/results.tar (logs, reports, benchmark JSON) and OUT/{base,more,reg,par,par2,two,two2}/drafter{.safetensors,_config.json}.
set -u
out=${1:?out dir}; evals=${2:?held-out clips folder}; carry=${3:?carry with engines.tar.xz, corpus.tsv.gz, wheels}
chunks=${4:-24}; steps=${5:-4500}; clip_s=${6:-60}; mode=${7:-compare}; dropout=${8:-}
case $mode in compare|split|parallel|two_pass) ;; *) echo "MODE must be compare, split, parallel or two_pass, not $mode" >&2; exit 2;; esac
if [ -n "$dropout" ] && [ "$mode" = compare ]; then echo "DROPOUT needs MODE split or parallel" >&2; exit 2; fi
kind=
case $mode in parallel) kind=--parallel; one=par; two=par2;; two_pass) kind=--two-pass; one=two; two=two2;; esac
[ -n "$kind" ] && dropout=${dropout:-0.1}
t0=$(date +%s)
since() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
ngpu=$(nvidia-smi -L | wc -l)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/dsite "$carry"/wheels/*.whl \
  && export PYTHONPATH=/tmp/dsite${PYTHONPATH:+:$PYTHONPATH}
plan=()
for i in $(seq 1 "$chunks"); do
  plan+=("train:5:$((1000 + i))" "unseen:5:$((2000 + i))" "warp:5:$((3000 + i))")
done
since "synthesising ${#plan[@]} chunks"
jobs=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))  # two cores left for this script and the system
python3 benchmarks/device_speech_clips.py --carry "$carry" --out /tmp/dclips --jobs "$jobs" \
  --plan "${plan[@]}" --seconds "$clip_s" > "$out/clips.log" 2>&1
echo "clips rc=$?" >> "$out/clips.log"
tail -2 "$out/clips.log"
base_audio=(); all_audio=()
for i in $(seq 1 "$chunks"); do
  for pair in train:1000 unseen:2000 warp:3000; do
    d="/tmp/dclips/${pair%%:*}_$(( ${pair##*:} + i ))"
    all_audio+=("$d")
    [ "$i" -le 8 ] && base_audio+=("$d")
  done
done
for d in ${EXTRA_AUDIO:-}; do
  [ -e "$d" ] || { echo "EXTRA_AUDIO: $d is missing (staged on this machine?)" >&2; exit 3; }
  all_audio+=("$d")
done
distil() {  # name gpu steps limit training-minutes source-arguments (--audio DIRS... or --teacher-from DIRS...)
  local name=$1 gpu=$2 n=$3 limit=$4 minutes=$5; shift 5
  # each call trains anew: a second call on the same warm machine (forty-sixth session: PAR_K=14 after PAR_K=10)
  # would otherwise resume the first call's state and be refused for its other config; the teacher file is kept
  # (speculative.train checks that its target, files, audio and delays match)
  rm -f "/tmp/drafters/$name/train_state.pt"
  # the source arguments come last: they may override the recipe's --unroll 4 (argparse keeps the last)
  CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 -m speculative.train --target models/default \
    --eval-audio "$evals" --out "/tmp/drafters/$name" --delays 480 --unroll 4 --steps "$n" \
    --max-minutes "$minutes" --log-every 500 "$@" > "$out/distill_$name.log" 2>&1
  echo "$name rc=$?" >> "$out/distill_$name.log"
  [ -f "/tmp/drafters/$name/train_report.json" ] && cp "/tmp/drafters/$name/train_report.json" "$out/report_$name.json"
}
label() {  # name gpu limit folders...: one part's teacher file, for --teacher-from
  local name=$1 gpu=$2 limit=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 -m speculative.train --target models/default --audio "$@" \
    --out "/tmp/labels/$name" --delays 480 --label-only > "$out/label_$name.log" 2>&1
  echo "$name rc=$?" >> "$out/label_$name.log"
}
bench() {  # name gpu [k] [drafter dir] [b1]: batch 1 (3 repeats), then batches 16 and 64 unless b1
  local name=$1 gpu=$2 k=${3:-4} d=${4:-/tmp/drafters/$1} only=${5:-}
  [ -f "$d/drafter.safetensors" ] || return 0
  CUDA_VISIBLE_DEVICES=$gpu timeout 100 python3 benchmarks/bench_speculative.py --target models/default --drafter "$d" \
    --audio "$evals"/* --clip-seconds 45 --batches 1 --k "$k" --dtype bf16 --repeats 3 --skip-flush \
    --out "$out/b1_$name.json" > "$out/b1_$name.log" 2>&1
  [ "$only" = b1 ] || [ -n "${B1_ONLY:-}" ] && return 0
  CUDA_VISIBLE_DEVICES=$gpu timeout 80 python3 benchmarks/bench_speculative.py --target models/default --drafter "$d" \
    --audio "$evals"/* --clip-seconds 45 --flush-clip-seconds 10 --batches 16 64 --k "$k" --dtype bf16 \
    --out "$out/b16_64_$name.json" > "$out/b16_64_$name.log" 2>&1
}
since "distilling"
if [ "$mode" != compare ] && [ "$ngpu" -ge 2 ]; then
  half=$(( ${#all_audio[@]} / 2 ))
  label part0 0 200 "${all_audio[@]:0:half}" &
  label part1 1 200 "${all_audio[@]:half}"
  wait
  since "labelled"
  grep -h -E "teacher:|rc=" "$out"/label_*.log
  if [ -n "$kind" ]; then
    distil "$one" 0 "$steps" 300 "${PAR_MINUTES:-4}" --teacher-from /tmp/labels/part0 /tmp/labels/part1 \
      --dropout "$dropout" "$kind" --unroll "${PAR_K:-6}" --k "${PAR_K:-6}" ${EXTRA_TRAIN:-} &
    distil "$two" 1 "$steps" 300 "${PAR_MINUTES:-4}" --teacher-from /tmp/labels/part0 /tmp/labels/part1 \
      --dropout "$dropout" "$kind" --layers 2 --unroll "${PAR_K:-6}" --k "${PAR_K:-6}" ${EXTRA_TRAIN:-}
  else
    if [ -n "$dropout" ]; then
      distil reg 0 "$steps" 300 4 --teacher-from /tmp/labels/part0 /tmp/labels/part1 --dropout "$dropout" &
    fi
    distil more 1 "$steps" 300 4 --teacher-from /tmp/labels/part0 /tmp/labels/part1
  fi
  wait
elif [ -n "$kind" ]; then
  distil "$one" 0 "$steps" "${DISTIL_LIMIT:-330}" "${PAR_MINUTES:-4}" --audio "${all_audio[@]}" --dropout "$dropout" \
    "$kind" --unroll "${PAR_K:-6}" --k "${PAR_K:-6}" ${EXTRA_TRAIN:-}
else
  if [ "$ngpu" -ge 2 ]; then
    distil base 0 3000 220 9 --audio "${base_audio[@]}" &
  fi
  distil more $(( ngpu >= 2 ? 1 : 0 )) "$steps" 300 3.3 --audio "${all_audio[@]}"
  wait
fi
since "distilled"
grep -h -E "training files|teacher:|rc=" "$out"/distill_*.log
if [ "$ngpu" -ge 2 ] && [ "$mode" = compare ]; then bench base 0 & fi
refs() {  # gpu: the REF_DRAFTER entries' batch-1 runs on this GPU, one after another
  local n=0 r
  for r in ${REF_DRAFTER:-}; do
    n=$((n + 1))
    bench "ref$([ $n -gt 1 ] && echo $n)_g$1" "$1" "$(case $r in *@*) echo "${r##*@}";; *) echo 4;; esac)" "${r%@*}" b1
  done
}
if [ -n "$kind" ] && [ "$ngpu" -lt 2 ]; then
  bench "$one" 0 "${PAR_K:-6}"
  refs 0
elif [ -n "$kind" ]; then
  bench "$one" 0 "${PAR_K:-6}" &
  bench "$two" 1 "${PAR_K:-6}"
  wait
  refs 0 &
  refs 1
elif [ "$ngpu" -ge 2 ] && [ -n "$dropout" ]; then
  bench reg 0 &
fi
[ -n "$kind" ] || bench more $(( ngpu >= 2 ? 1 : 0 ))
wait
since "benchmarked"
grep -h "offline batch" "$out"/b1_*.log "$out"/b16_64_*.log
for name in base more reg par par2 two two2; do
  if [ -f "/tmp/drafters/$name/drafter.safetensors" ]; then
    mkdir -p "$out/$name"
    cp "/tmp/drafters/$name/drafter_config.json" "/tmp/drafters/$name/drafter.safetensors" "$out/$name/"
  fi
done
cp /tmp/dclips/clips_stats.json "$out/" 2>/dev/null
(cd "$out" && tar cf results.tar --exclude results.tar --exclude base --exclude more --exclude reg \
  --exclude par --exclude par2 --exclude two --exclude two2 ./* \
  && find . -maxdepth 1 -type f ! -name results.tar -delete)

#!/usr/bin/env bash
# Forty-second session: issue 5's speed-ups re-measured for the shipped target and drafter, one device call (~5 min on
# one GPU): batch 1 with the chain of K drafts (3 alternating repeats), batch 1 with a tree of TREE nodes (3 repeats
# since the forty-third session, 1 before), then batches 16 and 64 with the end-of-stream flush; bf16, the 5 held-out
# clips of 45 s.
#   carry [".whl_gpu", ".bench_audio"]; bash benchmarks/gpu_spec_remeasure.sh OUT [WHEELS] [K] [TREE]
# DEVICE=cpu (env) is a dry run here: fp32, clips of 3 s, one repeat. ONLY="b1_chain b16_64" (env) runs those alone.
# DTYPE=fp32 (env; default bf16 on the GPU) checks losslessness where rounding cannot differ between batch shapes:
#   DTYPE=fp32 ONLY=b16_64 bash benchmarks/gpu_spec_remeasure.sh OUT     (every output should be identical)
# AUDIO=DIR (env; default .bench_audio, the 5 held-out voices) measures on other clips, e.g. the forty-third session's
# .bench_audio_seen: training voices speaking test sentences (`make_speech_clips.py --voices train --sentences test`).
# DRAFTER=DIR (env; default models/default_drafter) measures another drafter.
set -u
out=${1:?out dir}; wheels=${2:-.whl_gpu}; k=${3:-6}; tree=${4:-24}
mkdir -p "$out"
dev=${DEVICE:-cuda}; dtype=${DTYPE:-bf16}; clip=45; reps=3
if [ "$dev" = cpu ]; then dtype=fp32; clip=3; reps=1; else
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/dsite "$wheels"/soundfile*.whl \
    "$wheels"/cffi*.whl "$wheels"/pycparser*.whl && export PYTHONPATH=/tmp/dsite${PYTHONPATH:+:$PYTHONPATH}
fi
bench() {  # NAME TIMEOUT ARGS...: one bench_speculative.py run, its table printed
  local name=$1 limit=$2; shift 2
  case " ${ONLY:-b1_chain b1_tree b16_64} " in *" $name "*) ;; *) return 0;; esac
  timeout "$limit" python3 benchmarks/bench_speculative.py --target models/default \
    --drafter "${DRAFTER:-models/default_drafter}" --audio "${AUDIO:-.bench_audio}"/* --device "$dev" --dtype "$dtype" \
    --k "$k" --out "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "bench_speculative:|speedup_batch1\"|mean_acceptance_length\"" "$out/$name.log" | cut -c1-300
}
bench b1_chain 150 --clip-seconds "$clip" --batches 1 --repeats "$reps" --skip-flush
bench b1_tree 150 --clip-seconds "$clip" --batches 1 --repeats "$reps" --skip-flush --tree-nodes "$tree"
bench b16_64 120 --clip-seconds "$clip" --flush-clip-seconds 10 --batches 16 64

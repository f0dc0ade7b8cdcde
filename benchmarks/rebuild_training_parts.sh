#!/usr/bin/env bash
# A fresh machine's training inputs in one command (issue 6). Sessions often start on a machine without any of the
# git-ignored folders the device calls carry; this rebuilds them from the repository, with the model card's
# commands, with the earlier builds' shard counts and hours and sizes within 0.01% (thirty-fourth session):
#   1. Debian packages: the CI set (chromium, espeak-ng, sox, .ci/install_mbrola.sh) and the training engines'
#      (flite, the text corpus, the real recordings, and the mbrola/Festival voices of Debian's contrib/non-free
#      sections through .ci/install_mbrola.sh's private sources list);
#   2. .venv with the test extra (which holds the training packages), via tasks.py;
#   3. the carry (`prepare_carry --mbrola`: corpus, engines, tokenizer, wheels, real recordings) in .train_carry/;
#   4. the pre-synthesised parts of the 35 recorded speakers (models/default_model_card.md): ps_A, ps_B, ps_rh,
#      ps_mb9 and the seed-8 evaluation shards ps_ev;
#   5. the two carries of a continuation from the shipped weights: .stage1/ (the shipped model, for
#      benchmarks/gpu_stage.sh) and .train_full/ (for benchmarks/gpu_train_full.sh), listed in .git/info/exclude.
#   6. with KOKORO_EN=1 (thirty-ninth session, about 75 more minutes): Kokoro's npm speakers
#      (realtime/train/kokoro_js.py, needs Debian's npm), the 24 English and 21 accented training speakers, as the
#      parts the thirty-ninth session made for its (unrun) training call: ps_ke52 (2.94 h) and ps_ke53 (1.43 h) in
#      .stage1/, ps_ke54 (2.95 h) and ps_ke55 (1.41 h) in .stage2/ (a second staging call: STAGE=.stage2 APPEND=1);
#      since the forty-first session (run 53 trained on those four) also ps_ke56 (2.92 h, 14.3 MB) and ps_ke57
#      (1.43 h, 7.0 MB) in .stage2/.
#   7. with MBROLA_DBS=1 (fifty-second session, about 5 more minutes): the mbrola databases that run 58 synthesised
#      on the device (gpu_run --mbrola-dbs), as xz files: us1 us2 fr1 pl1 ro1 sw2 af1 fr4 in .stage2b/mbrola_dbs/ (with
#      hard links of .stage2/'s ps_ke54 and ps_ke55 when step 6 made them), de1 and sw1 in .stage3b/mbrola_dbs/ beside
#      ps_mbx58 (6.56 h of 17 mbrola speakers, seed 58), hu1 in .train_full/mbrola_dbs/. Staged by two more calls
#      (STAGE=.stage2b APPEND=1, STAGE=.stage3b APPEND=1) before the training call (models/default_model_card.md).
# 17 minutes on the 2-core box with .venv and the CI's packages already there (ps_rh's RHVoice alignment is 11 of
# them); a bare machine adds about 5 for the packages and 4 for .venv. A part whose index.json exists is kept.
#   bash benchmarks/rebuild_training_parts.sh [WORK_DIR]     (WORK_DIR: where the parts are built; /tmp/parts)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/parts}
mkdir -p "$work"
log() { echo "$(date +%H:%M:%S) $*"; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

log "1. Debian packages"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium espeak-ng sox \
  flite1-dev flite pocketsphinx-testdata fortunes wordnet-base wamerican gcc >/dev/null
# the voices of ps_A's 17 mbrola speakers, the held-out us3 and en1, and two Festival voices the corpus names
bash .ci/install_mbrola.sh mbrola-us2 mbrola-us3 mbrola-en1 mbrola-ro1 mbrola-pl1 mbrola-fr1 mbrola-sw2 \
  mbrola-fr4 mbrola-af1 mbrola-hu1 mbrola-sw1 mbrola-de1 mbrola-de2 mbrola-de3 mbrola-de4 mbrola-de5 mbrola-de6 \
  mbrola-nl2 festvox-us-slt-hts festvox-kallpc16k

log "2. .venv"
[ -x .venv/bin/python ] || python3 tasks.py test --co -q >/dev/null
PY=.venv/bin/python

log "3. the carry"
[ -f "$work/carry/corpus.tsv.gz" ] || $PY -m realtime.train.prepare_carry --out "$work/carry" --mbrola
C="$work/carry/corpus.tsv.gz"
pack() {  # pack NAME ARGS...: one part, unless it was built before
  local name=$1
  shift
  if [ -f "$work/$name/index.json" ]; then log "   $name: built before"; return; fi
  rm -rf "$work/$name"
  log "   $name"
  $PY -m realtime.train.presynth pack --corpus "$C" --level 0.98 --workers 2 --out "$work/$name" "$@"
}

log "4. the pre-synthesised parts"
pack ps_A --seed 23 --hours 4.3 --voices mb-us1 mb-us2 mb-ro1-en mb-pl1-en mb-fr1-en mb-sw2-en mb-fr4-en \
  mb-af1-en mb-hu1-en mb-sw1-en mb-de2-en mb-de1-en mb-de3-en mb-nl2-en mb-de5-en mb-de4-en mb-de6-en \
  rab_diphone ked_diphone
pack ps_B --seed 24 --hours 0.5 --voices rab_diphone ked_diphone
pack ps_rh --seed 25 --hours 1.3 --voices bdl clb evgeniy-eng lyubov
pack ps_mb9 --seed 26 --hours 1.1 --sentences-per-shard 5 --voices mb-fr2-en mb-fr3-en mb-fr5-en mb-fr6-en \
  mb-fr7-en mb-de7-en mb-es1-en mb-es2-en mb-cr1-en
if [ ! -f "$work/ps_ev/index.json" ]; then
  log "   ps_ev"
  $PY -m realtime.train.presynth pack-eval --corpus "$C" --out "$work/ps_ev" --voices mb-us3 mb-en1 --seed 8
fi

log "5. .train_carry, .stage1, .train_full"
# only what this script makes is replaced: other parts put there (Kokoro's ps_k*, made here with `presynth pack`)
# stay, and gpu_train_full.sh merges every ps_* folder it finds
rm -rf .train_carry .stage1/default
cp -r "$work/carry" .train_carry
mkdir -p .stage1 .train_full
cp -r models/default .stage1/default
for f in corpus.tsv.gz engines.tar.xz tok wheels real ps_A ps_B ps_rh ps_mb9 ps_ev; do
  rm -rf ".train_full/$f"
  if [ -e "$work/carry/$f" ]; then cp -r "$work/carry/$f" .train_full/; else cp -r "$work/$f" .train_full/; fi
done
mkdir -p .git/info
for d in .venv .bench_audio .train_carry .whl_gpu .kokoro_eval .joe_eval .carry_parts .stage1 .train_full \
         .drafter_carry .kokoro_b; do
  grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
for p in ps_A ps_B ps_rh ps_mb9 ps_ev; do  # the Opus bytes each part's index.json counts
  $PY -c "import json, sys; i = json.load(open(sys.argv[1])); print(sys.argv[2], i.get('bytes'), 'bytes,', i.get('shards'), 'shards')" \
    "$work/$p/index.json" "$p"
done
if [ "${KOKORO_EN:-0}" = 1 ]; then
  log "6. Kokoro's npm speakers: ps_ke52, ps_ke53 in .stage1, ps_ke54 to ps_ke57 in .stage2"
  command -v npm > /dev/null || apt-get install -y --no-install-recommends npm
  $PY -m realtime.train.kokoro_js
  voices=$($PY -c "from realtime.train.voices import KOKORO_NPM_TRAIN; print(*KOKORO_NPM_TRAIN)")
  mkdir -p .stage2
  grep -qxF "/.stage2/" .git/info/exclude || echo "/.stage2/" >> .git/info/exclude
  for part in "52 2.5 .stage1" "53 1.2 .stage1" "54 2.5 .stage2" "55 1.2 .stage2" "56 2.5 .stage2" "57 1.2 .stage2"; do
    set -- $part
    [ -f "$work/ps_ke$1/index.json" ] || $PY -m realtime.train.presynth pack --corpus "$C" --out "$work/ps_ke$1" \
      --level 0.98 --seed "$1" --hours "$2" --workers 2 --voices $voices
    rm -rf "$3/ps_ke$1" && cp -r "$work/ps_ke$1" "$3/"
  done
fi
if [ "${MBROLA_DBS:-0}" = 1 ]; then
  log "7. mbrola databases for the device's own synthesis: .stage2b, .stage3b, .train_full/mbrola_dbs"
  for d in .stage2b .stage3b; do
    mkdir -p "$d/mbrola_dbs"
    grep -qxF "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude
  done
  mkdir -p .train_full/mbrola_dbs
  for spec in "us1 us2 fr1 pl1 ro1 sw2 af1 fr4:.stage2b" "de1 sw1:.stage3b" "hu1:.train_full"; do
    for v in ${spec%%:*}; do
      xz -9 -T2 -c "/usr/share/mbrola/$v/$v" > "${spec##*:}/mbrola_dbs/$v.xz"
    done
  done
  for k in 54 55; do
    [ -d ".stage2/ps_ke$k" ] && rm -rf ".stage2b/ps_ke$k" && cp -al ".stage2/ps_ke$k" .stage2b/
  done
  [ -f "$work/ps_mbx58/index.json" ] || $PY -m realtime.train.presynth pack --corpus "$C" --out "$work/ps_mbx58" \
    --level 0.98 --seed 58 --hours 9.5 --workers 2 --voices mb-sw1-en mb-de2-en mb-de1-en mb-de3-en mb-nl2-en \
    mb-de5-en mb-de4-en mb-de6-en mb-fr2-en mb-fr3-en mb-fr5-en mb-fr6-en mb-fr7-en mb-de7-en mb-es1-en mb-es2-en \
    mb-cr1-en
  rm -rf .stage3b/ps_mbx58 && cp -r "$work/ps_mbx58" .stage3b/
  du -sh .stage2b .stage3b
fi
du -sh .stage1 .train_full
log "done: with docs/ and models/ moved out of the tree, carry .stage1 (bash benchmarks/gpu_stage.sh), then" \
    ".train_full (OUT=\$OUT bash benchmarks/gpu_train_full.sh SEED DROPOUT MINUTES [LR]) within 30 s"

#!/usr/bin/env bash
# Thirtieth session, call 2 (and 3) of a warm H200: a continuation of the shipped model from its fp16 weights (no
# 4- or 8-bit rounding of the start) on the whole pre-synthesised speech: the 35 recorded speakers (mbrola,
# Festival, RHVoice; the model card's parts), 2.9 h of Kokoro's four training speakers, plus the device's own
# flite and formant voices. Part of it was staged by benchmarks/gpu_stage.sh (call 1); the rest comes in
# .train_full/ (corpus, engines without the held-out mbrola databases, tokenizer, wheels, real recordings, the
# other parts and the seed-8 evaluation shards of us3 and en1). One run per call, so its fp16 model comes back
# (5 of the 8 files a call returns; with metrics.json, run.log and loss.png, all 8).
#   carry [".train_full"]; OUT=DIR [INIT=DIR] bash benchmarks/gpu_train_full.sh SEED DROPOUT MINUTES [LR]
# MINUTES <= 9.1 (a command's limit is 600 s); LR defaults to gpu_run's 1.5e-3. Run 31: 43 0.3 9.1; run 32: 44 0.3 7.2 5e-4.
# Thirty-first session: more Kokoro parts join the merge (below); run 33: 45 0.3 7.6 5e-4 (ps_k3 staged, ps_k4 carried),
# run 34: 46 0.3 7.6 1e-3 after it on the same machine, carrying ps_kx1 in place of ps_k4.
# Thirty-second session (a fresh machine: every part rebuilt, see the model card): parts found by name, KOKORO_REPEAT.
# Thirty-third session: the Kokoro part is made on the device by benchmarks/gpu_kokoro_synth.sh (call 2, ps_kdSEED in
# the stage); runs 35 and 36 are calls 3 and 4.
set -u
seed=$1 dropout=$2 minutes=$3 lr=${4:-1.5e-3}
S=/tmp/streamscribe_stage
if [ ! -f "$S/DONE" ]; then echo "stage missing: run benchmarks/gpu_stage.sh in the call before"; exit 3; fi
export PYTHONUNBUFFERED=1
C=/tmp/carry_full
rm -rf "$C" && mkdir -p "$C"
for f in corpus.tsv.gz engines.tar.xz tok wheels real; do ln -s "$PWD/.train_full/$f" "$C/$f"; done
# Every pre-synthesised part joins the merge: each `ps_NAME` folder carried in .train_full/ or staged by call 1
# becomes the part `NAME-` (thirty-second session; the parts' names no longer matter to the script). A carried part
# is also copied to the stage, so a later call on the same warm machine trains on it without carrying it again.
# KOKORO_REPEAT=N (default 1) merges each Kokoro part (ps_k*) N times under distinct prefixes: N times its share of
# the uniformly drawn shards, at no carry cost (a fresh machine's Kokoro hours are fewer than the runs before had).
for d in .train_full/ps_*; do [ -d "$d" ] && cp -r "$d" "$S/"; done
parts=()
for d in "$S"/ps_*; do
  [ -d "$d" ] || continue
  name=${d##*/ps_}
  parts+=("$name-=$d")
  case "$name" in k*) for r in $(seq 2 "${KOKORO_REPEAT:-1}"); do parts+=("${name}r$r-=$d"); done;; esac
done
echo "parts: ${parts[*]}"
# Fifty-second session: mbrola databases staged (a stage's mbrola_dbs/) or carried (.train_full/mbrola_dbs/) are
# installed into the carried engines, so those speakers are synthesised here with fresh sentences (gpu_run
# --mbrola-dbs); MBROLA_WEIGHT=W scales the mbrola voices' weights in the synthesis plan (gpu_run --mbrola-weight)
if [ -d .train_full/mbrola_dbs ]; then mkdir -p "$S/mbrola_dbs" && cp -r .train_full/mbrola_dbs/. "$S/mbrola_dbs/"; fi
mb=()
if [ -d "$S/mbrola_dbs" ]; then mb=(--mbrola-dbs "$S/mbrola_dbs"); echo "mbrola databases: $(ls "$S/mbrola_dbs")"; fi
python3 -m realtime.train.presynth merge --out "$C/presynth" "${parts[@]}" || exit 4
timeout 580 python3 -m realtime.train.gpu_run run --carry "$C" --out "$OUT" \
  --minutes "$minutes" --seed "$seed" --init-from "${INIT:-$S/default}" --warmup-steps 100 --lr "$lr" --p-eq 0.25 \
  --unseen-formant-weight 2 --accent-rewrite-weight "${ACCENT_REWRITE_WEIGHT:-0}" --ema-decay 0.999 \
  --dropout "$dropout" --mbrola-weight "${MBROLA_WEIGHT:-1}" "${mb[@]}" > /tmp/train_stdout.log 2>&1
rc=$?; echo "run rc=$rc"; [ $rc = 0 ] || tail -30 /tmp/train_stdout.log
# the exported model stays in the stage as export_SEED, so a next call on the same warm machine can continue it
# (INIT=/tmp/streamscribe_stage/export_SEED) without carrying it back
E=/tmp/streamscribe-train/export
[ -d "$E" ] && rm -rf "$S/export_$seed" && cp -r "$E" "$S/export_$seed"
grep -E "pre-synthesised|voices left out|held-out|WER|done in" "$OUT/run.log" | tail -12
ls -la "$OUT"

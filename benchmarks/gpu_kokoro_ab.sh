#!/usr/bin/env bash
# Twenty-ninth session, one device call on one H200: does Kokoro's speech help a continuation of the shipped model?
# Two 4-minute continuations from the shipped weights' 4-bit pack, the same seed and recipe (the fourteenth session's
# dropout recipe); the control's carry lacks the Kokoro shards, the other's brings them (.train_carry/presynth:
# `presynth pack --voices jf_alpha jf_gongitsune jf_tebukuro jm_kumo`). Each arm's device evaluation (the 5
# held-out voices) plus the evaluation speaker jf_nezumi (.kokoro_eval: `python -m realtime.train.kokoro --speaker
# jf_nezumi`) scored on the device; logs, metrics and scores in OUT/all.tgz, the Kokoro arm's weights as a 4-bit pack.
#   carry .train_carry .warm_pack .kokoro_eval; OUT=DIR bash benchmarks/gpu_kokoro_ab.sh
set -u
export PYTHONUNBUFFERED=1
W=/tmp/ab
mkdir -p "$W"
cp -r .train_carry "$W/ctrl_carry" && rm -rf "$W/ctrl_carry/presynth"
for arm in control kokoro; do
  carry=.train_carry
  [ "$arm" = control ] && carry="$W/ctrl_carry"
  STREAMSCRIBE_WORK="$W/work_$arm" timeout 260 python3 -m realtime.train.gpu_run run --carry "$carry" \
    --out "$W/$arm" --minutes 4.0 --seed 41 --init-from .warm_pack/warm.pt --warmup-steps 100 --p-eq 0.25 \
    --unseen-formant-weight 2 --ema-decay 0.999 --dropout 0.3 > "$W/$arm.log" 2>&1
  echo "$arm rc=$?"; grep -E "held-out|heldout|WER" "$W/$arm.log" | tail -3
  python3 -m realtime.train.gpu_run unpack --files "$W/$arm" --to "$W/${arm}_model" > /dev/null 2>&1
done
export PYTHONPATH="$W/work_control/site:$W/work_kokoro/site:$PWD"
for arm in control kokoro; do
  timeout 60 python3 benchmarks/score_folder.py --folder .kokoro_eval --models "$arm=$W/${arm}_model" \
    --out "$W/${arm}_nezumi.json" 2>&1 | grep WER
done
cd "$W" && tar czf "$OUT/all.tgz" ./*.log ./*_nezumi.json control/metrics.json control/run.log control/loss.png \
  kokoro/metrics.json kokoro/run.log kokoro/loss.png 2>/dev/null; cd - > /dev/null
python3 -m realtime.train.warm pack "$W/kokoro_model" "$OUT/kokoro_warm4.pt" --bits 4 > /dev/null 2>&1
ls -la "$OUT"

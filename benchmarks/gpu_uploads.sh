#!/usr/bin/env bash
# File transcription over HTTP on one GPU (POST /v1/audio/transcriptions; issue 5's offline mode through the service):
# the embedded default model, bf16, CUDA graphs, with and without its drafter; the 5 held-out clips
# (`make_speech_clips.py --voices heldout --seconds 45`, carried in .bench_audio) uploaded CONCURRENCY at a time,
# enough repeats for every level (--max-uploads 64, so that no level is refused); transcripts checked against the
# offline command's (`realtime.transcribe --batch 1`, the same engine kind).
#   OUT=DIR bash benchmarks/gpu_uploads.sh          # carry .whl_gpu (websockets, soundfile) and .bench_audio
#   env: LEVELS (1 16 64), MODES (plain drafter), DEVICE (cuda; cpu for a dry run)
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
port=8124
for mode in ${MODES:-plain drafter}; do
  extra=(); [ "$mode" = drafter ] && extra=(--drafter models/default_drafter)
  # the offline command's transcripts, one file at a time (--batch 1) on the same engine kind: in bf16 the batch's
  # size and the kernels it takes round near-ties differently, so only batch-1 transcripts compare bit for bit
  timeout 120 python3 -m realtime.transcribe --device ${DEVICE:-cuda} --batch 1 "${extra[@]}" \
    .bench_audio/heldout_0*.flac > "$GPU_DIR/expect_$mode.tsv" 2> "$GPU_DIR/expect_$mode.log"
  echo "expect $mode rc=$?"
  serve $port "$GPU_DIR/server_$mode.log" --device ${DEVICE:-cuda} --max-sessions 256 --max-uploads 64 "${extra[@]}" \
    --log-level WARNING
  for c in ${LEVELS:-1 16 64}; do
    repeats=$(( (c + 4) / 5 > 1 ? (c + 4) / 5 : 1 ))
    timeout 200 python3 benchmarks/bench_http_transcribe.py --url http://127.0.0.1:$port \
      --files .bench_audio/heldout_0*.flac --concurrency "$c" --repeats "$repeats" --expect "$GPU_DIR/expect_$mode.tsv" \
      --out "$GPU_DIR/${mode}_c$c.json" > "$GPU_DIR/${mode}_c$c.log" 2>&1
    echo "$mode c$c rc=$?"; tail -1 "$GPU_DIR/${mode}_c$c.log"
  done
  kill $srv; wait $srv 2>/dev/null
  pack "$OUT"
done

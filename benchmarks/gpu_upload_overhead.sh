#!/usr/bin/env bash
# Where a GPU server's time goes for one upload at a time (thirty-eighth session: 0.65 ms a step through the service
# against about 0.3 ms for the engine offline): the engine alone decoding the files one after another, sized for 1,
# 8 and 256 streams (`bench_engine_files.py`), then servers of --max-sessions 256 and 8 with one upload at a time
# (`bench_http_transcribe.py`), and a py-spy profile of the first server's threads during uploads.
#   OUT=DIR bash benchmarks/gpu_upload_overhead.sh     # carry .whl_gpu (with a py-spy wheel) and .bench_audio
set -u
work=$(mktemp -d)
source benchmarks/gpu_setup.sh "$work"
files=$(ls .bench_audio/heldout_0*.flac)
timeout 150 python3 benchmarks/bench_engine_files.py --files $files --device cuda --max-streams 1 8 256 --repeats 2 \
  --out "$GPU_DIR/engine_files.json" > "$GPU_DIR/engine_files.log" 2>&1
echo "engine_files rc=$?"; grep "bench_engine_files:" "$GPU_DIR/engine_files.log"
port=8125
for ms in 256 8; do
  serve $port "$GPU_DIR/server_$ms.log" --device cuda --max-sessions $ms --max-uploads $ms --log-level WARNING
  for rep in 1 2; do
    timeout 100 python3 benchmarks/bench_http_transcribe.py --url http://127.0.0.1:$port --files $files \
      --concurrency 1 --out "$GPU_DIR/uploads_${ms}_$rep.json" > "$GPU_DIR/uploads_${ms}_$rep.log" 2>&1
    echo "uploads max-sessions $ms rep $rep rc=$?"; tail -1 "$GPU_DIR/uploads_${ms}_$rep.log"
  done
  if [ "$ms" = 256 ] && [ -x /tmp/site/bin/py-spy ]; then
    /tmp/site/bin/py-spy record --pid $srv --duration 4 --rate 1000 --threads --format raw \
      --output "$GPU_DIR/pyspy_server.txt" > "$GPU_DIR/pyspy.log" 2>&1 &
    spy=$!
    sleep 0.5
    timeout 60 python3 benchmarks/bench_http_transcribe.py --url http://127.0.0.1:$port --files $files $files \
      --concurrency 1 --out "$GPU_DIR/uploads_spy.json" > "$GPU_DIR/uploads_spy.log" 2>&1
    wait $spy; echo "py-spy rc=$?"; tail -2 "$GPU_DIR/pyspy.log"
  fi
  kill $srv; wait $srv 2>/dev/null
done
pack "$OUT"

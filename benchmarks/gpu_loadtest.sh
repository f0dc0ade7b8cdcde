#!/usr/bin/env bash
# The websocket service under load on one GPU (issue 4): full-size random-weight model, bf16,
# batched engine with CUDA graphs, vLLM dialect, 480 ms delay, paced real-time clients.
#   benchmarks/gpu_loadtest.sh MODEL_DIR OUT_DIR [MAX_STREAMS] [SECONDS_PER_STREAM]
set -u
model=${1:?model dir}; out=${2:?out dir}; max=${3:-256}; dur=${4:-12}
port=8123
python3 -m stream_server --model "$model" --device cuda --port $port --max-sessions "$max" \
  --max-session-seconds 120 --log-level WARNING > "$out/server.log" 2>&1 &
srv=$!
for _ in $(seq 1 180); do
  python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
  sleep 1
done
python3 -m stream_server.loadtest --url ws://127.0.0.1:$port --search "$max" --duration "$dur" --delay-ms 480 \
  --stagger-ms 2000 --max-time 300 --out "$out/loadtest.json" > "$out/loadtest.txt" 2> "$out/loadtest.err"
rc=$?
kill $srv; wait $srv 2>/dev/null
exit $rc

#!/usr/bin/env bash
# Thirty-ninth session: a burst of streams onto a warm CPU server, with and without burst-aware admission.
# One server process (`python -m stream_server --device cpu`, --max-step-ms 64 by default) and the load tester on
# the same cores: a first level of WARM paced streams teaches the engine its step cost, then BURST streams start
# within 0.5 s. Run from a checkout (the code under test); OUT receives the load tester's JSON and log.
#   OUT=/tmp/burst WARM=4 BURST=40 [LOADTEST_ARGS="--retry-busy 1"] bash benchmarks/cpu_burst_admission.sh [SERVER_ARGS...]
# Fortieth session: WARM=0 sends the burst to a cold server (the first level is the burst), which by default
# calibrates its step cost before listening; pass --no-calibrate (a SERVER_ARG) for the server as it was before.
set -u
OUT=${OUT:?OUT=DIR}; WARM=${WARM:-4}; BURST=${BURST:-40}; PORT=${PORT:-8011}
AUDIO=${AUDIO:-.bench_audio/heldout_01_espeak_mb-us3.flac}
mkdir -p "$OUT"
if [ "$WARM" = 0 ]; then RAMP=$BURST; else RAMP=$WARM,$BURST; fi
python -m stream_server --device cpu --port "$PORT" "$@" > "$OUT/server.log" 2>&1 &
srv=$!
tracer=
trap 'kill $srv $tracer 2>/dev/null; wait $srv 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
# Forty-first session: /health every 0.5 s during the run (sessions, recent step, event-loop lag) into health_trace.jsonl
( while curl -s "http://127.0.0.1:$PORT/health" >> "$OUT/health_trace.jsonl" 2>/dev/null; do echo >> "$OUT/health_trace.jsonl"; sleep 0.5; done ) &
tracer=$!
python -m stream_server.loadtest --url "ws://127.0.0.1:$PORT" --files "$AUDIO" --ramp "$RAMP" --duration 20 \
  --stagger-ms 500 --out "$OUT/loadtest.json" --no-plots ${LOADTEST_ARGS:-} 2>&1 | tee "$OUT/loadtest.log" | tail -8
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "rejected_total|recent_step" > "$OUT/metrics.txt"
curl -s "http://127.0.0.1:$PORT/health" > "$OUT/health.json"; cat "$OUT/health.json"; echo

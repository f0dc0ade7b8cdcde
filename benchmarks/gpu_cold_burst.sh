#!/usr/bin/env bash
# Fortieth session: a burst of streams connecting at the same instant to a GPU server that has just started, with
# the start-up step-cost calibration (default) and without it (--no-calibrate). One server process, the embedded
# model, bf16, CUDA graphs, 480 ms delay, 10 s of audio per client; the load tester's clients over PROCS processes.
#   bash benchmarks/gpu_cold_burst.sh OUT [WHEELS_DIR]      env: BURST (512), PROCS (4), MAX_SESSIONS (1100),
#        PROFILE=1 (py-spy of the server threads' stacks and top, during the burst),
#        MODES ("cal nocal"; one of them for a short call; "nocal cal nocal2 cal2" alternates repeats, each in its folder;
#        DEVICE (cuda; cpu for a dry run), w4: four worker processes, calibrated, each its own interpreter lock;
#        dr (forty-second session): one process with the shipped drafter (`--drafter models/default_drafter`), whose
#        flush takes 4-6 steps instead of 17; lag0: one process with `--max-loop-lag-ms 0`, the admission of the
#        sessions before the forty-second, whose command line made 100 ms the default; ne: one process with
#        `--no-empty-deltas`, deltas only for tokens with text, so less host work a stream)
# OUT/{cal,nocal}/: health.json (the calibration and the fitted line), loadtest.json/.txt, server.log,
# health_trace.jsonl (forty-first session: /health every 0.5 s during the burst, with the event loop's lag).
set -u
out=${1:?out dir}; wheels=${2:-}
burst=${BURST:-512}; procs=${PROCS:-4}; port=8124
if [ -n "$wheels" ] && ls "$wheels"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
for mode in ${MODES:-cal nocal}; do
  d=$out/$mode; mkdir -p "$d"
  # nocal, nocal2, ...: repeats in their own folders; wN... (w4, w4b): N worker processes on the port, calibrated
  flag=(); case "$mode" in nocal*) flag=(--no-calibrate);; w[0-9]*) n=${mode#w}; flag=(--workers "${n%%[!0-9]*}");;
    dr*) flag=(--drafter models/default_drafter);; lag0*) flag=(--max-loop-lag-ms 0);; ne*) flag=(--no-empty-deltas);;
  esac
  t0=$(date +%s.%N)
  python3 -m stream_server --device "${DEVICE:-cuda}" --port $port --max-sessions "${MAX_SESSIONS:-1100}" --max-session-seconds 120 \
    "${flag[@]}" > "$d/server.log" 2>&1 &
  srv=$!
  for _ in $(seq 1 300); do
    # with workers, /health answers once the first one listens: wait for the supervisor's line that all of them do
    case "$mode" in w[0-9]*) grep -q "workers, pids" "$d/server.log" && break; sleep 0.5; continue;; esac
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    sleep 0.5
  done
  echo "$mode: listening after $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
  if [ "${PROFILE:-0}" = 1 ] && [ "${mode#w[0-9]}" = "$mode" ]; then  # one server process only
    # Where the server's time goes during the burst: py-spy (from the wheels) samples the server's Python stacks
    # (collapsed, one line per stack) and top shows whether the server or the load tester's processes saturate a core.
    "${PYSPY:-/tmp/site/bin/py-spy}" record --pid $srv --duration 22 --rate 50 --format raw --nonblocking --threads \
      -o "$d/pyspy.txt" > "$d/pyspy.err" 2>&1 &
    top -b -d 1 -n 22 -w 200 | grep -E "^ *PID|python|py-spy" > "$d/top.txt" &
  fi
  # /health every 0.5 s during the burst (sessions, recent step, the event loop's lag) into health_trace.jsonl
  ( while python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=5).read().decode())" \
      >> "$d/health_trace.jsonl" 2>/dev/null; do sleep 0.5; done ) &
  tracer=$!
  python3 -m stream_server.loadtest --processes "$procs" --url ws://127.0.0.1:$port --ramp "$burst" --duration 10 \
    --delay-ms 480 --stagger-ms 0 --max-time 120 --no-plots --out "$d/loadtest.json" > "$d/loadtest.txt" 2> "$d/loadtest.err"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=5).read().decode())" \
    > "$d/health.json" 2>&1
  kill $tracer 2>/dev/null
  kill $srv; wait $srv 2>/dev/null
  grep -E "calibrat" "$d/server.log" | tail -2
  tail -4 "$d/loadtest.txt"; cat "$d/health.json"; echo
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

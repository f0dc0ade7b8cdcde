#!/usr/bin/env bash
# The websocket service under paced load on one GPU (issues 3 and 4): the embedded default model, bf16,
# batched engine with CUDA graphs, vLLM dialect, 480 ms delay, 10 s of audio per client, starts spread
# over 2 s; the load tester's clients spread over PROCS processes (one process falls behind at a few
# hundred clients: watch its lag column). Optionally a py-spy profile of the server process.
#
#   bash benchmarks/gpu_service_load.sh OUT [WHEELS_DIR]
#   env: MODEL (default: the embedded model), RAMP (256,384,448,512), SEARCH (a maximum: double-then-bisect
#        search instead of the ramp), DURATION (10 s per client), PROCS (4), MAX_SESSIONS (1100),
#        PYSPY_SECONDS (0: no profile), PYSPY_ARGS (e.g. --gil: only samples of the thread holding the GIL),
#        DEVICE (cuda; cpu for a dry run), WORKERS (1: server processes, `--workers`; the profile needs 1),
#        SERVER_ARGS (more server flags, e.g. "--max-step-ms 0")
#        SERVER_CPUS / CLIENT_CPUS (e.g. 0-7 / 8-15: `taskset -c` lists that keep the server processes and the
#        load tester on separate cores, so that a failing level says which side ran out; default: shared)
# WHEELS_DIR holds the wheels the device lacks: websockets (and soundfile, cffi, pycparser; py-spy for
# a profile), e.g. `pip download websockets py-spy --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 -d WHEELS_DIR`.
set -u
out=${1:?out dir}; wheels=${2:-}
ramp=${RAMP:-256,384,448,512}; procs=${PROCS:-4}; port=8123
mkdir -p "$out"
if [ -n "$wheels" ] && ls "$wheels"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
server_pin=(); [ -n "${SERVER_CPUS:-}" ] && server_pin=(taskset -c "$SERVER_CPUS")
client_pin=(); [ -n "${CLIENT_CPUS:-}" ] && client_pin=(taskset -c "$CLIENT_CPUS")
"${server_pin[@]}" python3 -m stream_server --model "${MODEL:-default}" --device "${DEVICE:-cuda}" --port $port --max-sessions "${MAX_SESSIONS:-1100}" \
  --max-session-seconds 120 --workers "${WORKERS:-1}" --log-level WARNING ${SERVER_ARGS:-} > "$out/server.log" 2>&1 &
srv=$!
for _ in $(seq 1 600); do  # with --workers, until the supervisor reports all of them listening
  if [ "${WORKERS:-1}" = 1 ]; then
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
      2>/dev/null && break
  else
    grep -q "workers, pids" "$out/server.log" && break
  fi
  sleep 1
done
if [ "${PYSPY_SECONDS:-0}" != 0 ]; then
  /tmp/site/bin/py-spy record --pid $srv --duration "$PYSPY_SECONDS" --rate 100 --nonblocking --threads \
    ${PYSPY_ARGS:-} --format raw -o "$out/pyspy.txt" > "$out/pyspy.log" 2>&1 &
fi
if [ -n "${SEARCH:-}" ]; then levels=(--search "$SEARCH"); else levels=(--ramp "$ramp"); fi
"${client_pin[@]}" python3 -m stream_server.loadtest --processes "$procs" --url ws://127.0.0.1:$port "${levels[@]}" \
  --duration "${DURATION:-10}" --delay-ms 480 --stagger-ms 2000 --max-time 300 --no-plots --out "$out/loadtest.json" > "$out/loadtest.txt" \
  2> "$out/loadtest.err"
rc=$?
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics', timeout=5).read().decode())" \
  > "$out/metrics.txt" 2>&1
kill $srv; wait $srv 2>/dev/null
cat "$out/loadtest.txt"
exit $rc

#!/usr/bin/env bash
# The websocket service under load on one GPU (issue 4), as first measured: a model folder (the full-size
# random-weight model), a capacity search up to MAX_STREAMS, one client process. The steps are
# benchmarks/gpu_service_load.sh's (which the twenty-first session ran on the default model).
#   benchmarks/gpu_loadtest.sh MODEL_DIR OUT_DIR [MAX_STREAMS] [SECONDS_PER_STREAM]
model=${1:?model dir}; out=${2:?out dir}; max=${3:-256}; dur=${4:-12}
MODEL=$model SEARCH=$max MAX_SESSIONS=$max DURATION=$dur PROCS=${PROCS:-1} \
  exec bash "$(dirname "$0")/gpu_service_load.sh" "$out"

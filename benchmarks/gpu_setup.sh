# Sourced by the device-call scripts (gpu_one_row*.sh, gpu_encoder_sms.sh, ...): install the
# wheels carried in .whl_gpu and record the GPU in OUT/gpu.txt.
#   source benchmarks/gpu_setup.sh OUT
# The full-size checkpoint's tokenizer is built from mistral-common's bundled vocabulary, and audio files are read
# with soundfile; the GPU machine has neither. Bring the wheels and carry .whl_gpu:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl_gpu mistral-common==1.13.1
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl_gpu soundfile==0.14.0 cffi==2.1.1 pycparser==3.12          # 8.2 MB in all
if ls .whl_gpu/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_gpu/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "${1:?out dir}/gpu.txt"
GPU_DIR=$1

# serve PORT LOG ARGS...: `python3 -m stream_server --port PORT ARGS...` in the background (its pid in $srv, its output
# in LOG), returning once /health answers (or after 300 s)
serve() {
  local port=$1 log=$2
  shift 2
  python3 -m stream_server --port "$port" "$@" > "$log" 2>&1 &
  srv=$!
  for _ in $(seq 1 300); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
      2>/dev/null && return
    sleep 1
  done
}

# gpu_tests NAME SECONDS FILE...: the gpu-marked tests of the files, verbose, into $GPU_DIR/NAME.txt under a time limit;
# prints the exit status and the summary (or the abort) line
gpu_tests() {
  local name=$1 secs=$2
  shift 2
  timeout "$secs" python3 -m pytest -v -m gpu -p no:cacheprovider "$@" > "$GPU_DIR/$name.txt" 2>&1
  echo "$name rc=$?" | tee -a "$GPU_DIR/$name.txt"
  grep -E "passed|failed|skipped|Aborted|Fatal" "$GPU_DIR/$name.txt" | tail -2
}

# pack OUT: everything in $GPU_DIR as OUT/all.tgz (a call brings back at most 8 files)
pack() { tar czf "$1/all.tgz" -C "$GPU_DIR" .; }

# demo_spec NAME: the default model's offline speculation in bf16 on the two demo samples (30 s each, k = 6, batch 1),
# against plain decoding (outputs identical or not), into $GPU_DIR/NAME.json and .log; prints the summary line
demo_spec() {
  timeout 70 python3 benchmarks/bench_speculative.py --target models/default \
    --drafter models/default_drafter --audio demo/samples/heldout_nyc_f4.wav demo/samples/sample_en.wav \
    --batches 1 --clip-seconds 30 --repeats 1 --skip-flush --device cuda --dtype bf16 --k 6 \
    --out "$GPU_DIR/$1.json" > "$GPU_DIR/$1.log" 2>&1
  echo "$1 rc=$?"; grep -E "offline batch|Error" "$GPU_DIR/$1.log" | tail -2
}

# b1_ab NAME SECONDS REPEATS MODES VARIANTS [COUNTS]: bench_encoder_overlap.py on the full-size random checkpoint
# (/tmp/full, made on first use) under a time limit, into $GPU_DIR/NAME.json and .log; prints the exit status and the
# summary lines
b1_ab() {
  local name=$1 secs=$2 repeats=$3 modes=$4 variants=$5 counts=${6:-1}
  PYTHONUNBUFFERED=1 timeout "$secs" python3 benchmarks/bench_encoder_overlap.py --model /tmp/full --counts "$counts" \
    --modes "$modes" --variants "$variants" --repeats "$repeats" \
    --out "$GPU_DIR/$name.json" > "$GPU_DIR/$name.log" 2>&1
  echo "$name rc=$?"; grep -E "bench_encoder_overlap: |Error" "$GPU_DIR/$name.log" | tail -3
}

# phases_ab BATCH...: host_phases.py on the embedded model and drafter, plain and chained speculation alternating
# (20 s clips of .bench_audio, 3 repeats, 60 s each), into $GPU_DIR/phases_bBATCH.json and .log; prints the medians
phases_ab() {
  local b
  for b in "$@"; do
    timeout 60 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --clip-seconds 20 --batch "$b" --modes plain chain --repeats 3 \
      --out "$GPU_DIR/phases_b$b.json" > "$GPU_DIR/phases_b$b.log" 2>&1
    echo "phases_b$b rc=$?"; grep -E "host_phases: |Error" "$GPU_DIR/phases_b$b.log" | cut -c1-400
  done
}

# spec_run NAME SECONDS CLIPS [ARGS...]: bench_speculative.py offline on the embedded model and drafter (bf16, k = 6,
# clips cut to 45 s, no flush) with ARGS (--batches, --repeats, --tree-nodes ...), into $GPU_DIR/NAME.json and .log;
# environment switches go before the call (STREAMSCRIBE_ONE_ROW=0 spec_run ...); prints the summary line
spec_run() {
  local name=$1 secs=$2 clips=$3
  shift 3
  timeout "$secs" python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
    --audio $clips --clip-seconds 45 --k 6 --dtype bf16 --skip-flush "$@" \
    --out "$GPU_DIR/$name.json" > "$GPU_DIR/$name.log" 2>&1
  echo "$name rc=$?"; grep -E "offline batch|Error" "$GPU_DIR/$name.log" | tail -1
}

# lossless_tests NAME SECONDS: the GPU tests behind lossless speculation (linear's row tiles, the engine's encoder
# chunks and 16-stream equality, speculation), into $GPU_DIR/NAME.txt
lossless_tests() { gpu_tests "$1" "$2" tests/test_linear.py tests/test_engine.py tests/test_speculative.py; }

# heldout_spec NAME [ARGS...]: spec_run at batch 1 on the 5 held-out clips, 3 alternating repeats (speed-up, and
# outputs against the same engine without a drafter)
heldout_spec() {
  local name=$1
  shift
  spec_run "$name" 150 ".bench_audio/heldout_*" --batches 1 --repeats 3 "$@"
}

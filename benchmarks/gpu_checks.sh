#!/usr/bin/env bash
# One device call that re-checks the GPU side after CPU-only changes, in order of importance, each
# part under its own time limit so a slow part never costs the others their results:
#   1. the GPU tests (kernels, fused ops, engine equality and speculation with CUDA graphs on/off, GPU log-mel)
#      by file: `-m gpu tests` would also collect the server tests, whose packages (websockets, openai) the
#      GPU machine lacks;
#   2. the speculative benchmark on the embedded default model with its drafter (issue 5);
#   3. engine B1 + B2 on the full-size random checkpoint (issue 3), built on the spot.
#   benchmarks/gpu_checks.sh OUT_DIR DRAFTER_DIR AUDIO_DIR [TEST_S SPEC_S ENGINE_S]   (ENGINE_S 0: skip part 3)
# The GPU machine lacks soundfile (+cffi, pycparser) and mistral-common (its data file holds the 131k
# vocabulary of the full-size checkpoint; the tests fall back to tokenizer.json without its other
# dependencies). Bring them as wheels, kept small so the 39 MB default model fits beside them in a call:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl_gpu soundfile cffi pycparser mistral-common==1.13.1
# and start the device command with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_gpu/*.whl && export PYTHONPATH=/tmp/site:$PWD
# With DISTILL_AUDIO=<folder of training-voice audio> set, the drafter is first distilled from
# models/default into DRAFTER_DIR on the GPU (fp32 teacher, the shipped recipe; T_DISTILL seconds) and
# its two files come back in OUT; every log and report is packed into OUT/results.tar (OUT returns 8 files at most).
set -u
out=${1:?out dir}; drafter=${2:?drafter dir}; audio=${3:?audio dir}
t_tests=${4:-180}; t_spec=${5:-150}; t_engine=${6:-150}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
if [ -n "${DISTILL_AUDIO:-}" ]; then
  timeout "${T_DISTILL:-200}" python3 -m speculative.train --target models/default --audio "$DISTILL_AUDIO"/* \
    --out "$drafter" --steps 1300 --delays 480 --fresh --dtype fp32 > "$out/distill.log" 2>&1
  echo "distill rc=$?" | tee -a "$out/distill.log"
  tail -4 "$out/distill.log"
  cp "$drafter/drafter_config.json" "$drafter/drafter.safetensors" "$out/"
  cp "$drafter/train_report.json" "$out/distill_report.json"
fi
timeout "$t_tests" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_kernels.py tests/test_fused_ops.py tests/test_engine.py tests/test_speculative.py tests/test_audio.py \
  tests/test_prompt_prefix.py > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" | tee -a "$out/gpu_tests.txt"
timeout "$t_spec" python3 benchmarks/bench_speculative.py --target models/default --drafter "$drafter" \
  --audio "$audio"/* --clip-seconds 45 --flush-clip-seconds 10 --batches 1 16 64 --k 4 \
  --out "$out/spec.json" > "$out/spec.log" 2>&1
echo "spec rc=$?" | tee -a "$out/spec.log"
if [ "$t_engine" -gt 0 ]; then
  timeout "$t_engine" python3 benchmarks/bench_engine.py --model /tmp/full --counts 1,64,128,256 --skip paced,b3,b4 \
    --out "$out/engine.json" > "$out/engine.log" 2>&1
  echo "engine rc=$?" | tee -a "$out/engine.log"
  tail -8 "$out/engine.log"
fi
tail -5 "$out/gpu_tests.txt"; tail -25 "$out/spec.log"
(cd "$out" && tar cf results.tar --exclude results.tar --exclude 'drafter*' ./* && find . -maxdepth 1 -type f \
  ! -name results.tar ! -name 'drafter*' -delete)

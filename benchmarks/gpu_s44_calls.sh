#!/usr/bin/env bash
# Forty-fourth session's device calls for issue 5 (one GPU); every log and result is packed into OUT/all.tgz.
#   carry [".whl_gpu", ".bench_audio"] (docs/ moved out); bash benchmarks/gpu_s44_calls.sh OUT 1
#     the GPU tests of rounds chained on the device (graphs against eager, host rounds and the session) and the
#     speculative graph tests; batch 1 on the 5 held-out 45 s clips, bf16, the shipped drafter (chain of 6 drafts):
#     plain, chained rounds (default 8 a chain) and host rounds (chained_rounds=0) interleaved, 3 repeats; chains of
#     16 rounds; host_phases.py for plain, chain, host-chain
#   bash benchmarks/gpu_s44_calls.sh OUT 2
#     the same after the chained round's layout and acceptance became one Triton kernel each (kernels/spec_round.py):
#     their GPU tests (native against the references), the chained and speculative graph GPU tests, batch 1 with host rounds
#     interleaved (3 repeats), host_phases.py
#   bash benchmarks/gpu_s44_calls.sh OUT 3     (prepared for the next session, not run in this one)
#     where a chained round's device time goes: bench_speculative.py --profile (the device's busy time and kernels a
#     token, plain and speculative; the top kernels) with rounds chained, then through the host
set -u
out=${1:?out dir}; call=${2:?call}
mkdir -p "$out/r"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_gpu/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/r/gpu.txt"
bench() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
    --audio .bench_audio/* --device cuda --dtype bf16 --k 6 --clip-seconds 45 --batches 1 --skip-flush \
    --out "$out/r/$name.json" "$@" > "$out/r/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "bench_speculative:" "$out/r/$name.log" | cut -c1-260
}
case "$call" in
  1)
    timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_speculative.py > "$out/r/gpu_tests.txt" 2>&1
    echo "gpu tests rc=$?"; tail -4 "$out/r/gpu_tests.txt"
    bench b1_compare 200 --repeats 3 --compare-host-rounds
    bench b1_chain16 120 --repeats 3 --chained-rounds 16
    timeout 150 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --clip-seconds 45 --modes plain chain host-chain --out "$out/r/host_phases.json" \
      > "$out/r/host_phases.log" 2>&1
    echo "host_phases rc=$?"; grep "host_phases:" "$out/r/host_phases.log" | cut -c1-300
    ;;
  2)
    timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_spec_round.py tests/test_speculative.py \
      -k "round or chain or graphs_equal_eager" > "$out/r/gpu_tests.txt" 2>&1
    echo "gpu tests rc=$?"; tail -4 "$out/r/gpu_tests.txt"
    bench b1_compare 200 --repeats 3 --compare-host-rounds
    timeout 120 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --clip-seconds 45 --modes plain chain host-chain --out "$out/r/host_phases.json" \
      > "$out/r/host_phases.log" 2>&1
    echo "host_phases rc=$?"; grep "host_phases:" "$out/r/host_phases.log" | cut -c1-300
    ;;
  3)
    bench b1_profile_chained 240 --repeats 1 --profile
    bench b1_profile_host 240 --repeats 1 --profile --chained-rounds 0
    grep -h "profile" "$out/r/b1_profile_chained.log" "$out/r/b1_profile_host.log" | cut -c1-300
    ;;
esac
tar czf "$out/all.tgz" -C "$out" r && rm -rf "$out/r"

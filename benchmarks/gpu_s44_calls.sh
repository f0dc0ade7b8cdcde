#!/usr/bin/env bash
# Forty-fourth session's device calls for issue 5 (one GPU); every log and result is packed into OUT/all.tgz.
#   carry [".whl_gpu", ".bench_audio"] (docs/ moved out); bash benchmarks/gpu_s44_calls.sh OUT 1
#     the GPU tests of rounds chained on the device (graphs against eager, host rounds and the session) and the
#     speculative graph tests; batch 1 on the 5 held-out 45 s clips, bf16, the shipped drafter (chain of 6 drafts):
#     plain, chained rounds (default 8 a chain) and host rounds (chained_rounds=0) interleaved, 3 repeats; chains of
#     16 rounds; host_phases.py for plain, chain, host-chain
#   bash benchmarks/gpu_s44_calls.sh OUT 2
#     the same after the chained round's layout and acceptance became one Triton kernel each (kernels/spec_round.py):
#     their GPU tests (native against the references), the chained and speculative graph GPU tests, batch 1 with
#     host rounds interleaved (3 repeats), host_phases.py
#   bash benchmarks/gpu_s44_calls.sh OUT 3     (prepared for the next session, not run in this one)
#     where a chained round's device time goes: bench_speculative.py --profile (the device's busy time and kernels a
#     token, plain and speculative; the top kernels) with rounds chained, then through the host
set -u
out=${1:?out dir}; call=${2:?call}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, spec_run, pack
# b1 NAME SECONDS ARGS...: spec_run at batch 1 on the 5 held-out clips, with its comparison and profile lines
b1() {
  spec_run "$1" "$2" ".bench_audio/*" --batches 1 "${@:3}"
  grep -E "rounds through the host|profile" "$GPU_DIR/$1.log" | cut -c1-300
}
# phases NAME SECONDS: host_phases.py for plain, chained and host rounds
phases() {
  timeout "$2" python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
    --audio .bench_audio/* --clip-seconds 45 --modes plain chain host-chain --out "$GPU_DIR/$1.json" \
    > "$GPU_DIR/$1.log" 2>&1
  echo "$1 rc=$?"; grep "host_phases:" "$GPU_DIR/$1.log" | cut -c1-300
}
case "$call" in
  1)
    gpu_tests gpu_tests 240 tests/test_speculative.py
    b1 b1_compare 200 --repeats 3 --compare-host-rounds
    b1 b1_chain16 120 --repeats 3 --chained-rounds 16
    phases host_phases 150
    ;;
  2)
    gpu_tests gpu_tests 170 tests/test_spec_round.py tests/test_speculative.py -k "round or chain or graphs_equal_eager"
    b1 b1_compare 200 --repeats 3 --compare-host-rounds
    phases host_phases 120
    ;;
  3)
    b1 b1_profile_chained 240 --repeats 1 --profile
    b1 b1_profile_host 240 --repeats 1 --profile --chained-rounds 0
    ;;
esac
pack "$out" && rm -rf "$out/r"

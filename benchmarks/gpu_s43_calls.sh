#!/usr/bin/env bash
# Forty-third session's device calls, one GPU each; every log and result is packed into OUT/all.tgz.
#   carry [".whl_gpu", ".bench_audio", ".bench_audio_seen"] (docs/ moved out; py-spy's wheel left out of .whl_gpu)
#   bash benchmarks/gpu_s43_calls.sh OUT 1
#     the engine's and speculation's GPU tests (the 16-stream encoder-call test among them); issue 5's batches
#     16 and 64 in fp32 (does speculation equal plain decoding where rounding cannot depend on the batch's shape?);
#     batch 1 with the chain of 6 drafts, bf16, on the seen-voice clips (training voices, test sentences)
#   WINDOWS="256 128" bash benchmarks/gpu_s43_calls.sh OUT 2
#     the other GPU test files (kernels, linear, one-row, staging, fused ops, log-mel, training's GPU checks) and the
#     corrected 8-stream encoder test; then issue 5 with the shipped drafter's weights under each attention window of
#     WINDOWS (its config's sliding_window; the drafter trained on 256-position windows): batch 1 on the held-out
#     clips, the first window also on the seen-voice clips and at batches 16 and 64
#   TREES="24 48" bash benchmarks/gpu_s43_calls.sh OUT 3
#     issue 5 at batch 1 on the held-out clips with the shipped drafter (its window now 256): the chain of 6, then a
#     tree of each size in TREES, 3 alternating repeats each
#   bash benchmarks/gpu_s43_calls.sh OUT 4
#     where a batch-1 step and round go on the host with the shipped drafter's new window (host_phases.py: plain,
#     the chain of 6, a tree of 32), then the cold burst of 512 clients, one server process without and with the
#     drafter (gpu_cold_burst.sh modes cal and dr)
# Since the forty-fourth session's review it sources benchmarks/gpu_setup.sh: its test logs are now NAME.txt (the
# forty-third session's raw results call them gpu_tests_NAME.txt).
set -u
out=${1:?out dir}; call=${2:?call 1 to 4}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, pack
case "$call" in
  1)
    gpu_tests engine_spec 270 tests/test_engine.py tests/test_speculative.py
    DTYPE=fp32 ONLY=b16_64 bash benchmarks/gpu_spec_remeasure.sh "$out/r/fp32_b16_64" .whl_gpu
    AUDIO=.bench_audio_seen ONLY=b1_chain bash benchmarks/gpu_spec_remeasure.sh "$out/r/seen_b1" .whl_gpu
    ;;
  2)
    gpu_tests rest 240 tests/test_kernels.py tests/test_linear.py tests/test_one_row.py tests/test_staging.py \
      tests/test_fused_ops.py tests/test_audio.py tests/test_prompt_prefix.py tests/test_train_augment.py \
      tests/test_train_regularize.py tests/test_train_voice_share.py \
      tests/test_engine.py::test_gpu_eight_streams_per_encoder_call_give_each_stream_its_bits_alone
    first=
    for w in ${WINDOWS:-256 128}; do
      d=/tmp/drafter_w$w; mkdir -p "$d"; cp models/default_drafter/drafter.safetensors "$d/"
      python3 -c "import json, sys; c = json.load(open('models/default_drafter/drafter_config.json'))
c['config']['sliding_window'] = int(sys.argv[1]); json.dump(c, open(sys.argv[2], 'w'), indent=2)" \
        "$w" "$d/drafter_config.json"
      DRAFTER=$d ONLY=b1_chain bash benchmarks/gpu_spec_remeasure.sh "$out/r/heldout_w$w" .whl_gpu 2>/dev/null
      [ -n "$first" ] || first=$d
    done
    AUDIO=.bench_audio_seen DRAFTER=$first ONLY=b1_chain \
      bash benchmarks/gpu_spec_remeasure.sh "$out/r/seen_first" .whl_gpu 2>/dev/null
    DRAFTER=$first ONLY=b16_64 bash benchmarks/gpu_spec_remeasure.sh "$out/r/b16_64_first" .whl_gpu 2>/dev/null
    ;;
  3)
    ONLY=b1_chain bash benchmarks/gpu_spec_remeasure.sh "$out/r/chain" .whl_gpu 2>/dev/null
    for t in ${TREES:-24 48}; do
      ONLY=b1_tree bash benchmarks/gpu_spec_remeasure.sh "$out/r/tree$t" .whl_gpu 6 "$t" 2>/dev/null
    done
    ;;
  4)
    timeout 170 python3 benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --clip-seconds 45 --modes plain chain 32 --out "$out/r/host_phases.json" \
      > "$out/r/host_phases.log" 2>&1
    echo "host_phases rc=$?"; tail -12 "$out/r/host_phases.log"
    MODES="cal dr" timeout 200 bash benchmarks/gpu_cold_burst.sh "$out/r/burst" .whl_gpu
    ;;
esac
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Prepared in the forty-fifth session for the next one (issue 5, one GPU); every log and result is packed into
# OUT/all.tgz. carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s46_calls.sh OUT 1
#     the code landed after the forty-fifth session's last device call: the drafter prepared for inference by
#     load_drafter (fused projections, delay table) and the look-ahead encoder's per-size stream limits. The
#     speculative and encoder-chunk GPU tests; round_anatomy.py (the drafter's catch-up was 92 us of a 222 us
#     round); batch 1 with host rounds, plain decoding with 32-token encoder calls (RunnerOptions.encoder_chunk,
#     no drafter: what most of speculation's batch-1 gain comes from, on the anatomy's figures) and the
#     end-of-stream flush (3 repeats); batches 16 and 64 (with that plain engine too)
# Forty-sixth session: device time went to refused starts and to the drafter trained for 10 drafts (shipped), so call 1
# did not run; it now measures that drafter at its default k (10 on CUDA) at batch 1, and at batches 16 and 64 with
# 10 and with 6 drafts (a stream verifies 11 rows a round instead of 7: unmeasured at those batches). Call 2 (the
# short form: batch 1 and the GPU tests) is what a session that trains first can afford.
set -u
out=${1:?out dir}; call=${2:?call}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, spec_run, pack
case "$call" in
  1)
    timeout 150 python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --clip-seconds 45 --dtype bf16 --batches 1 --repeats 3 --compare-host-rounds \
      --compare-plain-chunk 32 --out "$GPU_DIR/b1.json" > "$GPU_DIR/b1.log" 2>&1
    echo "b1 rc=$?"; grep -E "offline batch|rounds through|plain with|flush batch|Error" "$GPU_DIR/b1.log" | cut -c1-250
    timeout 90 python3 benchmarks/round_anatomy.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --out "$GPU_DIR/anatomy.json" > "$GPU_DIR/anatomy.log" 2>&1
    echo "anatomy rc=$?"; grep -E "round_anatomy mean|Error" "$GPU_DIR/anatomy.log" | cut -c1-900
    for k in 10 6; do
      spec_run "b16_64_k$k" 130 ".bench_audio/*" --batches 16 64 --repeats 1 --clip-seconds 20 \
        --compare-plain-chunk 32 --k "$k"
      grep -E "offline batch|plain with" "$GPU_DIR/b16_64_k$k.log" | cut -c1-250
    done
    ;;
  2)  # the short form for a session whose device time went to training first: batch 1 (with the chunked plain
      # engine and the flush) and the GPU tests, without round_anatomy and batches 16/64
    timeout 150 python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
      --audio .bench_audio/* --clip-seconds 45 --dtype bf16 --batches 1 --repeats 3 \
      --compare-plain-chunk 32 --out "$GPU_DIR/b1.json" > "$GPU_DIR/b1.log" 2>&1
    echo "b1 rc=$?"; grep -E "offline batch|plain with|flush batch|Error" "$GPU_DIR/b1.log" | cut -c1-250
    gpu_tests gpu_tests 170 tests/test_engine.py tests/test_speculative.py \
      -k "encoder_chunks_give or chained_rounds_with or graphs_equal_eager or sixteen_streams_on_gpu"
    ;;
esac
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Prepared in the forty-seventh session for the next one (issue 5, one GPU); every log and result is packed into
# OUT/all.tgz. carry [".whl_gpu", ".bench_audio"] (docs/ moved out):
#   bash benchmarks/gpu_s48_calls.sh OUT        (at most 510 s by its timeouts; about 300 s expected)
# What the forty-seventh session's device time did not cover:
# - the GPU tests of the speculative engine on the code landed after its last device call (a drafter config's
#   gpu_draft_tokens; SpeculativeConfig.max_verify_rows, which is None on CUDA, so the GPU's steps are unchanged);
# - batch 1 at the shipped drafter's GPU default (12 drafts) with plain decoding's 32-token encoder calls beside it;
# - batches 16 and 64 at k = 12 with verify-row caps: none (as measured, 1.41x and 1.12x), 256 (64 streams: 3 drafts
#   each) and 128 (64 streams: none; 16 streams: 7 drafts each). On the CPU the cap made 64 streams 2.43x faster;
#   whether a GPU's rows cost enough at these batches for a cap to pay is what this measures.
set -u
out=${1:?out dir}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, spec_run, pack
gpu_tests gpu_tests 150 tests/test_engine.py tests/test_speculative.py \
  -k "encoder_chunks_give or chained_rounds_with or graphs_equal_eager or sixteen_streams_on_gpu"
timeout 120 python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
  --audio .bench_audio/* --clip-seconds 45 --dtype bf16 --batches 1 --repeats 3 --compare-plain-chunk 32 \
  --out "$GPU_DIR/b1.json" > "$GPU_DIR/b1.log" 2>&1
echo "b1 rc=$?"; grep -E "offline batch|plain with|flush batch|Error" "$GPU_DIR/b1.log" | cut -c1-250
for cap in none 256 128; do
  spec_run "b16_64_cap$cap" 80 ".bench_audio/*" --batches 16 64 --repeats 1 --clip-seconds 20 --k 12 \
    $([ "$cap" = none ] || echo --max-verify-rows "$cap")
  grep -E "offline batch" "$GPU_DIR/b16_64_cap$cap.log" | cut -c1-250
done
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# Forty-fifth session's device calls for issue 5 (one GPU); every log and result is packed into OUT/all.tgz.
#   carry [".whl_gpu", ".bench_audio"] (docs/ moved out); bash benchmarks/gpu_s45_calls.sh OUT 1
#     a chained round as one CUDA graph against six (STREAMSCRIBE_ROUND_GRAPH=0) and the linear kernel without its
#     split-K sums (STREAMSCRIBE_SPLIT_K=0): the chained GPU test (both round graphs against eager, the host path
#     and the session); round_anatomy.py (each graph's device time, the host's time to queue a round); batch 1 on
#     the 5 held-out 45 s clips (bf16, the shipped drafter, chain of 6), plain and chained interleaved, 3 repeats,
#     for each variant
#   bash benchmarks/gpu_s45_calls.sh OUT 2     round_anatomy.py again, with and without the split-K sums
#   bash benchmarks/gpu_s45_calls.sh OUT 3     look-ahead calls of 16 and 32 audio tokens: the GPU tests of their
#     bits (against one-token calls) and of chained rounds; the anatomy at 32; batch 1 at chunks 8, 16, 32
#   bash benchmarks/gpu_s45_calls.sh OUT 4     32-token calls the default on CUDA: the speculative GPU tests; batches
#     16 and 64 at chunks 8 and 32; a tree of 32 at batch 1
#   bash benchmarks/gpu_s45_calls.sh OUT 5     the final code (tokens a call by its streams): GPU tests; batch 1
#     with host rounds and the end-of-stream flush; batches 16 and 64
#   bash benchmarks/gpu_s45_calls.sh OUT 6     the same after one-token look-ahead calls kept the runner's 64 rows
set -u
out=${1:?out dir}; call=${2:?call}
mkdir -p "$out/r"
source benchmarks/gpu_setup.sh "$out/r"  # the wheels, the GPU's name; gpu_tests, spec_run, pack
# anatomy NAME SECONDS [ARGS...]: round_anatomy.py on the 5 held-out clips
anatomy() {
  timeout "$2" python3 benchmarks/round_anatomy.py --target models/default --drafter models/default_drafter \
    --audio .bench_audio/* --out "$GPU_DIR/$1.json" "${@:3}" > "$GPU_DIR/$1.log" 2>&1
  echo "$1 rc=$?"; grep -E "round_anatomy mean|Error" "$GPU_DIR/$1.log" | cut -c1-900
}
# final B1_SECONDS B16_SECONDS: batch 1 with host rounds and the end-of-stream flush (3 repeats), then batches 16 and
# 64 (20 s clips, one repeat), with the engine's defaults
final() {
  timeout "$1" python3 benchmarks/bench_speculative.py --target models/default --drafter models/default_drafter \
    --audio .bench_audio/* --clip-seconds 45 --k 6 --dtype bf16 --batches 1 --repeats 3 --compare-host-rounds \
    --out "$GPU_DIR/b1_final.json" > "$GPU_DIR/b1_final.log" 2>&1
  echo "b1_final rc=$?"; grep -E "offline batch|rounds through|flush batch|Error" "$GPU_DIR/b1_final.log" | cut -c1-250
  spec_run b16_64_final "$2" ".bench_audio/*" --batches 16 64 --repeats 1 --clip-seconds 20
  grep -E "offline batch" "$GPU_DIR/b16_64_final.log" | cut -c1-250
}
case "$call" in
  1)
    anatomy anatomy 100
    spec_run b1_one_graph 110 ".bench_audio/*" --batches 1 --repeats 3
    STREAMSCRIBE_ROUND_GRAPH=0 spec_run b1_six_graphs 110 ".bench_audio/*" --batches 1 --repeats 3
    STREAMSCRIBE_SPLIT_K=0 spec_run b1_nosplit 110 ".bench_audio/*" --batches 1 --repeats 3
    STREAMSCRIBE_SPLIT_K=0 anatomy anatomy_nosplit 60
    gpu_tests gpu_tests 100 tests/test_speculative.py -k "chained_rounds_with_graphs"
    ;;
  2)  # call 1's anatomy runs failed (the engine reports a step's exception on the stream: fixed in the script)
    anatomy anatomy 100
    STREAMSCRIBE_SPLIT_K=0 anatomy anatomy_nosplit 80
    ;;
  3)  # look-ahead encoder calls of 16 and 32 audio tokens (SpeculativeConfig.lookahead_chunk)
    gpu_tests gpu_tests 150 tests/test_engine.py tests/test_speculative.py -k "encoder_chunks_give or chained_rounds_with"
    anatomy anatomy_chunk32 80 --lookahead-chunk 32
    spec_run b1_chunk8 90 ".bench_audio/*" --batches 1 --repeats 3
    spec_run b1_chunk16 90 ".bench_audio/*" --batches 1 --repeats 3 --lookahead-chunk 16
    spec_run b1_chunk32 90 ".bench_audio/*" --batches 1 --repeats 3 --lookahead-chunk 32
    ;;
  4)  # 32-token look-ahead calls by default on CUDA: the speculative GPU tests under it; batches 16 and 64 at
      # chunks 8 and 32 (20 s clips); a tree of 32 at batch 1 (host rounds) with 32-token calls
    gpu_tests gpu_tests 170 tests/test_speculative.py -k "chained_rounds_with or graphs_equal_eager"
    spec_run b16_64_chunk8 130 ".bench_audio/*" --batches 16 64 --repeats 1 --clip-seconds 20 --lookahead-chunk 8
    spec_run b16_64_chunk32 130 ".bench_audio/*" --batches 16 64 --repeats 1 --clip-seconds 20
    spec_run b1_tree32 90 ".bench_audio/*" --batches 1 --repeats 3 --tree-nodes 32
    ;;
  5)  # the final code: a look-ahead call's tokens a stream by its streams (32 alone, 16 for two, 8 for four or
      # more: SpeculativeConfig.tokens_per_call). GPU tests; batch 1 (with host rounds) and the flush; 16 and 64
    gpu_tests gpu_tests 150 tests/test_engine.py tests/test_speculative.py \
      -k "encoder_chunks_give or chained_rounds_with or graphs_equal_eager"
    final 120 130
    ;;
  6)  # call 5 again after one-token calls went back to the runner's 64 rows (only calls of several tokens take up to
      # 256: LookaheadEncoder.chunk_rows): batch 1 with host rounds and the flush, batches 16 and 64, GPU tests
    final 100 100
    gpu_tests gpu_tests 100 tests/test_engine.py tests/test_speculative.py -k "encoder_chunks_give or chained_rounds_with"
    ;;
esac
pack "$out" && rm -rf "$out/r"

#!/usr/bin/env bash
# One device call that checks the host first and then runs the list that host can answer
# (bench/NOTES.md: slow hosts, whose SMs read pinned host memory at ~34 GB/s against the
# copy engine's ~55, came in about half of the sessions, and their offload rows do not
# compare with a healthy host's). Edit the two lists for the session; the results come back
# in $OUT/results.tgz as with scripts/gpu_run.sh (files renamed by tag where one phase runs
# twice). Usage, from the device tool: CALL_S=595 bash scripts/gpu_call_by_host.sh
# (FORCE=healthy|slow skips the check's verdict); CALL_LIST=2 on the same warm machine runs
# the second list of the host the first call found. First used in the twenty-sixth session.
S=$(date +%s); lim(){ echo $((${CALL_S:-595}-($(date +%s)-S))); }
R=/tmp/gpu_run_results; G=scripts/gpu_run.sh
if [ "${CALL_LIST:-1}" = 1 ]; then
  GPU_RUN_LIMIT=$(lim) HOSTCHECK_KINDS=0 bash $G hostcheck 2>&1 | tail -4
  MODE=healthy; grep -q SLOW $R/host_verdict.txt && MODE=slow; MODE=${FORCE:-$MODE}
  echo "MODE=$MODE"; echo "$MODE" > $R/mode.txt
  # the llama.cpp build (242 s) for this call's last rows starts now, on any host
  [ -d bench/.llamacpp_kit ] && bash bench/bench_vs_llamacpp.sh --start-build | tail -1
  # the Q4_K LM head on its word tile since the thirty-third session: its GPU tests
  GPU_RUN_LIMIT=$(lim) PYTEST_TIMEOUT=200 PYTEST_TAG=_gguf \
    PYTEST_FILES="tests/kernels/test_gguf_kernels.py tests/weights/test_gguf_gpu.py" \
    bash $G pytestk 2>&1 | tail -6
  # the Q4_K word tiles, chosen by SASS counts, timed against each other for the first time
  GPU_RUN_LIMIT=$(lim) GGUF_KERNEL_TIMEOUT=170 GGUF_WORDS_SWEEP=1 bash $G ggufkernel 2>&1 \
    | grep -E "^  (linear|moe)" | tail -24
  # issue 16: Q4_K beside llama.cpp on one file, resident (predicted ~400 tok/s) and 12 GB
  GPU_RUN_LIMIT=$(lim) VS_TIMEOUT=$(($(lim) - 15)) VS_ROWS=q4_k bash $G vsllama 2>&1 | tail -8
elif [ "${CALL_LIST}" = 2 ]; then
  MODE=$(cat $R/mode.txt 2>/dev/null || echo slow); echo "MODE=$MODE (from the first call)"
  # the Q6_K head and down experts of real Q4_K_M files (byte path and q8x), then the
  # Q4_K_M mix beside llama.cpp (Q6_K head, half the down experts and attn_v)
  GPU_RUN_LIMIT=$(lim) GGUF_KERNEL_TIMEOUT=150 GGUF_TYPES=Q6_K bash $G ggufkernel 2>&1 \
    | grep -E "^  (linear|moe)" | tail -12
  GPU_RUN_LIMIT=$(lim) VS_TIMEOUT=$(($(lim) - 15)) VS_ROWS=q4_k_m bash $G vsllama 2>&1 | tail -8
elif [ "${CALL_LIST}" = 7 ]; then
  # the thirty-sixth session's next call, any host (run scripts/compile_check_gpu_triton.sh
  # here first): the Q8_0 word path's GPU tests and kernels after its Triton 3.6 compile fix,
  # then Q4_K at 12 GB beside llama.cpp with the seed's 12 GB-card reserve (1.5 GB: `auto`
  # keeps what one 8k sequence needs, ~1.97 GiB, so ~4 more slots a layer than at 2.5)
  [ -d bench/.llamacpp_kit ] && bash bench/bench_vs_llamacpp.sh --start-build | tail -1
  GPU_RUN_LIMIT=$(lim) HOSTCHECK_KINDS=0 bash $G hostcheck 2>&1 | tail -2
  GPU_RUN_LIMIT=$(lim) PYTEST_TIMEOUT=${NEW_TESTS_S:-120} PYTEST_TAG=_q80 \
    PYTEST_FILES="tests/kernels/test_gguf_kernels.py" PYTEST_K="${Q80_K:-q80 or Q8_0}" \
    bash $G pytestk 2>&1 | tail -6
  GPU_RUN_LIMIT=$(lim) GGUF_KERNEL_TIMEOUT=90 GGUF_TYPES=Q8_0 bash $G ggufkernel 2>&1 \
    | grep -E "^  (linear|moe)" | tail -16
  XINFER_BENCH_ARGS="--reserve-gb 1.5" BUDGET_ONLY=1 GPU_RUN_LIMIT=$(lim) \
    VS_TIMEOUT=$(($(lim) - 10)) VS_ROWS=q4_k bash $G vsllama 2>&1 | tail -5
elif [ "${CALL_LIST}" = 8 ]; then
  # on the same warm machine: resident Q8_0 and Q8_0 at 24 GB beside llama.cpp (issue 16's
  # rows), with the word path if list 7's tests passed (Q80=--q80-words), else without
  XINFER_BENCH_ARGS="${Q80:-}" GPU_RUN_LIMIT=$(lim) VS_TIMEOUT=$(($(lim) - 10)) \
    VS_ROWS=q8_0 bash $G vsllama 2>&1 | tail -6
elif [ "${CALL_LIST}" = 9 ]; then
  # Q4_K_M's mixed q|k|v as GGUF segments (one decode launch): its GPU tests, its qkv timed
  # against one launch a segment and the bf16 linear it replaced, then Q4_K_M resident and
  # at 12 GB beside llama.cpp (predicted: +2% resident, ~3 more slots a layer at 12 GB)
  [ -d bench/.llamacpp_kit ] && bash bench/bench_vs_llamacpp.sh --start-build | tail -1
  # (the word linears' GPU tests too: `gguf_linear_rows_kernel` now shares `words_four_rows`)
  GPU_RUN_LIMIT=$(lim) PYTEST_TIMEOUT=150 PYTEST_TAG=_segments PYTEST_K="words or segments" \
    PYTEST_FILES="tests/kernels/test_gguf_segments_gpu.py tests/kernels/test_gguf_kernels.py" \
    bash $G pytestk 2>&1 | tail -6
  GPU_RUN_LIMIT=$(lim) GGUF_KERNEL_TIMEOUT=60 GGUF_Q4KM_QKV=1 bash $G ggufkernel 2>&1 \
    | grep '"linear qkv Q4_K_M"' | tail -6
  GPU_RUN_LIMIT=$(lim) VS_TIMEOUT=$(($(lim) - 10)) VS_ROWS=q4_k_m bash $G vsllama 2>&1 | tail -6
else
  MODE=$(cat $R/mode.txt 2>/dev/null || echo slow); echo "MODE=$MODE (from the first call)"
  # issue 19: GPTQ 20% batch 1, prefetch off and two ahead, on today's kernels (its load and
  # warm-up took 124 s on a fresh machine in the thirty-third session)
  GPU_RUN_LIMIT=$(lim) QUANT_FORMATS=gptq QUANT_OFFLOAD_ARGS="--rates 0.2 --batches 1 \
--steps 64 --warmup-steps 16 --ttft-tokens '' --prefetch 0,2 --prefetch-margin 0" \
    bash $G quantoff 2>&1 | tail -12
fi
tar czf "${OUT:-/tmp/out}/results.tgz" -C $R .; echo "left $(lim)"

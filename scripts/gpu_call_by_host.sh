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
  # a healthy host runs the llama.cpp rows in the second call: its build (242 s) starts now
  [ "$MODE" = healthy ] && [ -d bench/.llamacpp_kit ] && bash bench/bench_vs_llamacpp.sh --start-build | tail -1
  # on any host first: the GPU tests of the switches that are off (fused decode-attention
  # merge, PDL) or new (the router's top-k in its GEMV), then their A/B in one process
  GPU_RUN_LIMIT=$(lim) GPU_TESTS_TIMEOUT=200 \
    GPU_TESTS="tests/kernels/test_decode_reduce_fused_gpu.py tests/kernels/test_pdl_gpu.py tests/kernels/test_router_topk_gpu.py" \
    bash $G gputests 2>&1 | tail -6
  GPU_RUN_LIMIT=$(lim) SWITCH_TIMEOUT=$(($(lim) - 15)) bash $G switches 2>&1 | tail -26
else
  MODE=$(cat $R/mode.txt 2>/dev/null || echo slow); echo "MODE=$MODE (from the first call)"
  q() { # quantoff with offload args $2, its outputs renamed with tag $1
    GPU_RUN_LIMIT=$(lim) QUANT_FORMATS=${QF:-gptq} QUANT_OFFLOAD_ARGS="$2" bash $G quantoff 2>&1 | tail -8
    for f in $R/quant_offload*; do [ -e "$f" ] && mv "$f" "${f/quant_offload/qoff_$1}"; done; }
  Q="--rates 0.2 --batches 1 --steps 64 --warmup-steps 16 --ttft-tokens ''"
  if [ "$MODE" = healthy ]; then
    # issue 16's llama.cpp rows (the kit carried; its build started in the first call)
    GPU_RUN_LIMIT=$(lim) VS_TIMEOUT=$(($(lim) - 15)) BUDGET_ONLY=1 VS_ROWS="q15 q15_isq" \
      bash $G vsllama 2>&1 | tail -14
  else
    q p16 "$Q --prefetch 0,2"
    q p64 "$Q --prefetch 2 --prefetch-programs 64"
    GPU_RUN_LIMIT=$(lim) PREFETCH_PFILL=copy-engine PREFETCH_RATES=0.2 PREFETCH_BATCHES=1 \
      PREFETCH_STEPS=64 PREFETCH_WARMUP=16 PREFETCH_DISTANCES=2 PREFETCH_TAG=_ce bash $G prefetchbench 2>&1 | tail -8
    GPU_RUN_LIMIT=$(lim) bash $G fillvariants 2>&1 | tail -12
  fi
fi
tar czf "${OUT:-/tmp/out}/results.tgz" -C $R .; echo "left $(lim)"

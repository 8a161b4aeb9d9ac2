#!/usr/bin/env bash
# One call on the lent GPU machine: install the wheel kit, then run the named phases,
# logging everything under $OUT (which comes back). Usage: scripts/gpu_run.sh tests bench ...
set -uo pipefail
cd "$(dirname "$0")/.."
# Logs go to a scratch folder packed into one $OUT/results.tgz after each phase (the device
# tool brings back at most 8 files). Set GPU_RUN_LIMIT to the call's timeout_s when it is not
# 600: the phases' timeouts are cut to fit it (below).
FINAL_OUT=${OUT:-/tmp/out}
OUT=/tmp/gpu_run_results
mkdir -p "$OUT" "$FINAL_OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
# The call's own limit (run's timeout_s, 600 by default): every phase's `timeout N` below is
# cut to what is left of it, less 25 s to pack the logs, so a phase that would outlive the
# call stops in time and what it printed comes back (a phase past the deadline is skipped).
START_S=$(date +%s)
CALL_LIMIT_S=${GPU_RUN_LIMIT:-600}
timeout() {
  local opts=()
  while [[ $1 == -* ]]; do
    opts+=("$1"); if [[ $1 == -s || $1 == -k ]]; then shift; opts+=("$1"); fi; shift
  done
  local want=$1 left=$((CALL_LIMIT_S - ($(date +%s) - START_S) - 25)); shift
  if ((left < 10)); then echo "skipped: the call's limit is near ($*)"; return 124; fi
  ((want > left)) && want=$left
  command timeout "${opts[@]}" "$want" "$@"
}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)' | tee -a "$OUT/gpu.txt"
for phase in "$@"; do
  echo "=== phase $phase $(date +%T)"
  case "$phase" in
    tests) timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/server tests 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40 ;;
    gputests) timeout ${GPU_TESTS_TIMEOUT:-540} python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=15 ${GPU_TESTS:-tests} 2>&1 | tee "$OUT/gpu_tests_all.txt" | tail -60 ;;
    # the GPU tests in four concurrent shards (Triton compiles are CPU-bound; 16 cores); a
    # shard past its time gets SIGINT, so pytest still prints the failures it has seen
    gpushards) shard() { local i=$1; shift; XINFER_TEST_CACHE_GB=${XINFER_TEST_CACHE_GB:-6} timeout -s INT -k 30 ${GPU_TESTS_TIMEOUT:-360} \
        python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=8 "$@" > "$OUT/gpu_shard$i.txt" 2>&1; }
      g=tests/kernels/test_gguf_kernels.py
      shard 1 tests/kernels --ignore=$g & shard 2 $g tests/weights &
      shard 3 tests/models tests/e2e tests/structured tests/unit tests/parallel &
      shard 4 tests/offload tests/quant tests/routing tests/bench tests/server &
      wait; for f in "$OUT"/gpu_shard*.txt; do echo "--- $f"; grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|KeyboardInterrupt" "$f" | tail -40; done ;;
    # pytest with a -k expression that may hold spaces (GPU_TESTS above is split on them)
    pytestk) timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rfE --durations=8 ${PYTEST_FILES:-tests} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest${PYTEST_TAG:-}.txt" | tail -30 ;;
    parity) timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/models/test_gpu_parity.py 2>&1 | tail -30 | tee "$OUT/parity.txt" ;;
    offload) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/offload -m gpu 2>&1 | tail -30 | tee "$OUT/offload_tests.txt" ;;
    newtests) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_kernels.py tests/kernels/test_qkv_prep.py tests/kernels/test_gemv.py tests/models/test_gpu_parity.py tests/offload/test_offload_gpu.py 2>&1 | tee "$OUT/new_tests.txt" | tail -30 ;;
    kernels) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tail -30 | tee "$OUT/kernel_tests.txt" ;;
    quant) timeout 580 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_quant_kernels.py tests/quant/test_quant_gpu.py 2>&1 | tee "$OUT/quant_tests.txt" | tail -30 ;;
    quantkernel) timeout ${QUANT_TIMEOUT:-580} python3 bench/bench_quant_kernel.py --formats ${QUANT_FORMATS:-bf16,fp8,nvfp4,gptq} ${QUANT_SWEEP:+--sweep} 2>&1 | tee "$OUT/quant_kernel.txt" | tail -60 ;;
    quantprefill) timeout ${QUANT_TIMEOUT:-400} python3 bench/bench_quant_kernel.py --prefill-sweep --formats ${QUANT_FORMATS:-fp8} 2>&1 | tee "$OUT/quant_prefill_sweep.txt" | tail -40 ;;
    decoderows) timeout ${QUANT_TIMEOUT:-400} python3 bench/bench_quant_kernel.py --decode-rows-sweep --formats ${QUANT_FORMATS:-fp8,gptq,nvfp4} 2>&1 | tee "$OUT/decode_rows_sweep.txt" | tail -80 ;;
    quantres) timeout ${QUANT_TIMEOUT:-580} python3 bench/bench_quant.py --parts resident --formats ${QUANT_FORMATS:-bf16,fp8,nvfp4,gptq} ${QUANT_EXTRA:-} --out "$OUT/quant_resident" 2>&1 | tail -30 | tee "$OUT/quant_resident.txt" ;;
    # the same with a trace of four batch-1 steps per format (gzipped), for trace_summary.py
    quanttrace) timeout ${QUANT_TIMEOUT:-580} python3 bench/bench_quant.py --parts resident --formats ${QUANT_FORMATS:-bf16,fp8,gptq} --trace-dir "$OUT" --out "$OUT/quant_resident_traced" 2>&1 | grep -v Capturing | tail -30 | tee "$OUT/quant_resident_traced.txt"; gzip -f "$OUT"/quant_trace_*.json ;;
    # each kernel switch (router in one launch, PDL, fused merge, qkv GEMV) A/B in one process
    switches) timeout ${SWITCH_TIMEOUT:-400} python3 bench/bench_decode_switches.py --formats ${SWITCH_FORMATS:-bf16,gptq} --variants "${SWITCH_VARIANTS:-router-apart;router;pdl,router-apart;pdl,merge,router-apart;pdl,merge,router;pdl,merge,router,qkv-gemv}" --out "$OUT/switches" 2>&1 | grep -v "it/s]" | tail -40 | tee "$OUT/switches.txt" ;;
    quantoff) timeout 580 python3 bench/bench_quant.py --parts offload --formats ${QUANT_FORMATS:-fp8} --offload-args="${QUANT_OFFLOAD_ARGS:-}" --out "$OUT/quant_offload" 2>&1 | tail -30 | tee "$OUT/quant_offload.txt" ;;
    moebench) timeout 90 python3 bench/bench_moe_kernel.py 2>&1 | tail -30 | tee "$OUT/moe_kernel.txt" ;;
    attnbench) timeout 90 python3 bench/bench_attention_kernel.py 2>&1 | tail -30 | tee "$OUT/attn_kernel.txt" ;;
    # decode attention on bf16 / fp8 / turbo caches, the turbo switches A/B (bench_kv_turbo.py)
    turbobench) timeout ${TURBO_TIMEOUT:-300} python3 bench/bench_kv_turbo.py --kinds ${TURBO_KINDS:-bf16,turbo4,turbo3} --variants "${TURBO_VARIANTS:-base;shuffle;block16;shuffle,block16;stages2}" --out "$OUT/kv_turbo.json" 2>&1 | grep -v "^{" | tail -60 | tee "$OUT/kv_turbo.txt" ;;
    # the host first: fill kernel and copy engine rates (SLOW HOST line), by kind of pinned
    # memory unless HOSTCHECK_KINDS=0
    hostcheck) timeout 60 python3 bench/offload_bench/bandwidth.py 2>&1 | tee "$OUT/host_bandwidth.json" | tail -3
      timeout 90 python3 -c 'import json,sys; sys.path.insert(0,"bench"); from offload_bench.bandwidth import slow_host_note as n; print(n(json.load(open(sys.argv[1]))) or "healthy host")' "$OUT/host_bandwidth.json" | tee "$OUT/host_verdict.txt"
      [ "${HOSTCHECK_KINDS:-1}" = 0 ] || timeout 120 python3 bench/bench_offload_fill.py --host-memory --json "$OUT/host_memory.json" 2>&1 | tee "$OUT/host_memory.txt" | tail -16 ;;
    fillbench) timeout 150 python3 bench/bench_offload_fill.py 2>&1 | tee "$OUT/fill.txt" | tail -80 ;;
    # where the start-up packing (--moe-offload-compress) spends its time: seconds a layer + cProfile
    # (prefault on, then off: xinfer/host_memory.py)
    packprobe) for pf in "" --no-prefault; do timeout ${PACK_TIMEOUT:-150} python3 bench/probe_packing.py $pf --experts ${PACK_EXPERTS:-256} --hidden ${PACK_HIDDEN:-2048} --intermediate ${PACK_INTER:-512} --layers ${PACK_LAYERS:-3} 2>&1 | tee -a "$OUT/pack_probe.txt" | tail -30; done ;;
    # can a prefetch fill hide behind one decode layer's compute, by fill programs (issue 19)
    overlapprobe) timeout ${OVERLAP_TIMEOUT:-150} python3 bench/probe_prefetch_overlap.py ${OVERLAP_ARGS:-} --json "$OUT/prefetch_overlap.json" 2>&1 | tee "$OUT/prefetch_overlap.txt" | tail -30 ;;
    # how fast the host gives fresh pages (zero_ vs MADV_POPULATE_WRITE on N threads, huge and
    # 4 KiB), cudaHostRegister, GPU -> host an expert at a time vs chunks through pinned memory
    touchprobe) timeout ${TOUCH_TIMEOUT:-120} python3 bench/probe_first_touch.py --gb ${TOUCH_GB:-4} --threads ${TOUCH_THREADS:-1,4,8,16} --json "$OUT/first_touch.json" 2>&1 | tee "$OUT/first_touch.txt" | tail -20 ;;
    packedfill) timeout 150 python3 bench/bench_offload_fill.py --packed --json "$OUT/packed_fill.json" 2>&1 | tee "$OUT/packed_fill.txt" | tail -30 ;;
    decode) timeout 300 python3 bench/bench_decode.py ${DECODE_EXTRA:-} --out "$OUT/decode${DECODE_TAG:-}" 2>&1 | grep -v "it/s]" | tail -60 ;;
    offloadbench) timeout ${OFFLOAD_TIMEOUT:-570} python3 bench/bench_offload_decode.py --rates ${OFFLOAD_RATES:-0.1,0.2,0.35,0.5,auto} --batches ${OFFLOAD_BATCHES:-1,8,32} --steps ${OFFLOAD_STEPS:-128,16,6} --warmup-steps ${OFFLOAD_WARMUP:-64,4,2} --ttft-tokens "${OFFLOAD_TTFT-2048,8192}" --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} ${OFFLOAD_EXTRA:-} --out "$OUT/offload" 2>&1 | grep -v "it/s]" | tail -60 ;;
    # the slot policies side by side (LRU, then LFU: --moe-offload-policy), same routing and steps
    # bf16 experts plain, then packed (--moe-offload-compress: 12 bits an element cross the link)
    compressab) for c in plain packed; do f=""; [ $c = packed ] && f=--compress; timeout ${COMPRESS_TIMEOUT:-280} python3 bench/bench_offload_decode.py $f --rates ${COMPRESS_RATES:-0.1,0.2,0.35} --batches ${COMPRESS_BATCHES:-1,8} --steps ${COMPRESS_STEPS:-64,12} --warmup-steps ${COMPRESS_WARMUP:-32,4} --ttft-tokens ${COMPRESS_TTFT:-8192} --ttft-rates ${COMPRESS_TTFT_RATES:-0.1} --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} --out "$OUT/offload_$c" 2>&1 | grep -v "it/s]" | tail -30; done ;;
    policyab) for p in lru lfu; do timeout ${POLICY_TIMEOUT:-280} python3 bench/bench_offload_decode.py --policy $p --rates ${POLICY_RATES:-0.1,0.35} --batches ${POLICY_BATCHES:-1,8} --steps ${POLICY_STEPS:-64,12} --warmup-steps ${POLICY_WARMUP:-32,4} --ttft-tokens "" --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} --out "$OUT/offload_$p" 2>&1 | grep -v "it/s]" | tail -25; done ;;
    # issue 19: cross-layer prefetch on the GPU (tests: ~2-3 min; bench: 5 engines, ~5-6 min)
    prefetchtests) timeout ${PREFETCH_TESTS_TIMEOUT:-240} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=12 tests/offload/test_prefetch_gpu.py tests/offload/test_offload_gpu.py 2>&1 | tee "$OUT/prefetch_tests.txt" | tail -40 ;;
    prefetchbench) timeout ${PREFETCH_TIMEOUT:-570} python3 bench/bench_offload_decode.py --rates ${PREFETCH_RATES:-0.2,0.35} --batches ${PREFETCH_BATCHES:-1,8} --steps ${PREFETCH_STEPS:-64,12} --warmup-steps ${PREFETCH_WARMUP:-16,4} --ttft-tokens "" --prefetch ${PREFETCH_DISTANCES:-0,1} ${PREFETCH_MARGIN:+--prefetch-margin $PREFETCH_MARGIN} ${PREFETCH_FILL:+--fill $PREFETCH_FILL} ${PREFETCH_PFILL:+--prefetch-fill $PREFETCH_PFILL} ${PREFETCH_PROGRAMS:+--prefetch-programs $PREFETCH_PROGRAMS} ${PREFETCH_ISSUE:+--prefetch-issue $PREFETCH_ISSUE} ${PREFETCH_POLICY:+--policy $PREFETCH_POLICY} --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} --out "$OUT/prefetch${PREFETCH_POLICY:+_$PREFETCH_POLICY}${PREFETCH_TAG:-}" 2>&1 | grep -v "it/s]" | tail -60 ;;
    offloadttft) timeout ${TTFT_TIMEOUT:-400} python3 bench/bench_offload_decode.py --batches "" --ttft-tokens ${TTFT_TOKENS:-32768} --ttft-rates ${TTFT_RATES:-0,0.1,0.2,auto} --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} --out "$OUT/offload_ttft" 2>&1 | grep -v "it/s]" | tail -30 ;;
    ttfttrace) timeout ${TTFT_TIMEOUT:-400} python3 bench/bench_offload_decode.py --batches "" --ttft-tokens ${TTFT_TOKENS:-16384} --ttft-rates ${TTFT_RATES:-0,0.1} --trace-ttft ${TRACE_TTFT:-16384} --trace-dir "$OUT" --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} --out "$OUT/traced_ttft_rows" 2>&1 | grep -v "it/s]" | tail -20; gzip -f "$OUT"/ttft_*.json ;;
    routingstate) timeout 120 python3 bench/bench_routing_state.py 2>&1 | tee "$OUT/routing_state.txt" | tail -8 ;;
    routingtests) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/routing tests/unit/test_sampling_no_sync.py tests/offload/test_offload_resident.py 2>&1 | tee "$OUT/routing_tests.txt" | tail -30 ;;
    decode-nohf) timeout 170 python3 bench/bench_decode.py --no-hf ${DECODE_EXTRA:-} --trace "$OUT/trace${DECODE_TAG:-}.json" --out "$OUT/decode${DECODE_TAG:-}" 2>&1 | grep -v "it/s]" | tail -60; gzip -f "$OUT/trace${DECODE_TAG:-}.json" ;;
    moesweep) timeout 200 python3 bench/bench_moe_kernel.py --sweep --decode 1 --prefill "" 2>&1 | tee "$OUT/moe_sweep.txt" | tail -20 ;;
    moeprefill) timeout ${MOE_TIMEOUT:-200} python3 bench/bench_moe_kernel.py --sweep --decode "" --prefill ${MOE_PREFILL:-2048,8192} 2>&1 | tee "$OUT/moe_prefill_sweep.txt" | tail -20 ;;
    gemvbench) timeout ${GEMV_TIMEOUT:-240} python3 bench/bench_gemv.py ${GEMV_SHAPES:+--shapes $GEMV_SHAPES} 2>&1 | tee "$OUT/gemv.txt" | tail -40 ;;
    attnsweep) timeout 240 python3 bench/bench_attention_kernel.py --sweep 2>&1 | tee "$OUT/attn_sweep.txt" | tail -40 ;;
    attnprefill) timeout ${ATTN_TIMEOUT:-200} python3 bench/bench_attention_kernel.py --sweep-prefill 2>&1 | tee "$OUT/attn_prefill_sweep.txt" | tail -25 ;;
    offloadtrace) timeout ${TRACE_TIMEOUT:-200} python3 bench/bench_offload_decode.py --rates ${TRACE_RATES:-0.35} --batches 1 --steps 32 --warmup-steps 16 --ttft-tokens "" --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} ${TRACE_PREFETCH:+--prefetch $TRACE_PREFETCH} ${TRACE_PFILL:+--prefetch-fill $TRACE_PFILL} ${PREFETCH_PROGRAMS:+--prefetch-programs $PREFETCH_PROGRAMS} --trace-dir "$OUT" --out "$OUT/offload_trace" 2>&1 | grep -v "it/s]" | tail -12; gzip -f "$OUT"/offload_*.json ;;
    fillvariants) timeout 200 python3 bench/bench_offload_fill.py --variants --json "$OUT/fill_variants.json" 2>&1 | tee "$OUT/fill_variants.txt" | tail -60 ;;
    # the copy-engine fill (conditional graph nodes): probe (stage by stage), its GPU tests,
    # then decode with it beside the fill kernel at the same rates (issue 14 / 19)
    cefill) timeout 150 python3 bench/probe_copy_engine_fill.py --misses ${CE_MISSES:-2,8,1} --with-kernel 2>&1 | tee "$OUT/ce_probe.txt" | tail -30
      timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/offload/test_copy_engine_gpu.py "tests/offload/test_prefetch_gpu.py::test_prefetch_in_cuda_graph_equals_twin_and_resident" 2>&1 | tee "$OUT/ce_tests.txt" | tail -25 ;;
    cebench) for fill in ${CE_FILLS:-kernel copy-engine}; do timeout ${CE_TIMEOUT:-280} python3 bench/bench_offload_decode.py --rates ${CE_RATES:-0.2,0.35} --batches ${CE_BATCHES:-1,8} --steps ${CE_STEPS:-48,12} --warmup-steps ${CE_WARMUP:-16,4} --ttft-tokens "" --routing ${OFFLOAD_ROUTING:-qwen3-30b-a3b} --fill $fill --out "$OUT/offload_fill_$fill" 2>&1 | grep -v "it/s]" | tail -25; done ;;
    promptpass) timeout ${PASS_TIMEOUT:-540} python3 bench/bench_prompt_pass.py --rates ${PASS_RATES:-0,0.1} --lengths ${PASS_LENGTHS:-2048,8192,32768} --out "$OUT/prompt_pass" 2>&1 | grep -v "it/s]" | tail -40 ;;
    layerbench) timeout 120 python3 bench/bench_offload_layer.py 2>&1 | tail -12 | tee "$OUT/layer.txt" ;;
    hybridtests) timeout 420 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_linear_attn_gpu.py tests/kernels/test_qkv_prep.py "tests/models/test_gpu_parity.py" -k "linear_attn or partial_rotary or qwen3_next or qwen3_5" 2>&1 | tee "$OUT/hybrid_tests.txt" | tail -30 ;;
    hybridbench) timeout ${HYBRID_TIMEOUT:-540} python3 bench/bench_hybrid.py --model bench/configs/qwen3_5_35b_a3b --batches ${HYBRID_BATCHES:-1,8,32} --prefill-lens ${HYBRID_PREFILL:-2048,8192} --out "$OUT/hybrid" 2>&1 | grep -v "it/s]" | tail -50 ;;
    hybridoffload) timeout ${OFFLOAD_TIMEOUT:-570} python3 bench/bench_offload_decode.py --model bench/configs/qwen3_5_35b_a3b --rates ${OFFLOAD_RATES:-0.1,0.2,auto} --batches ${OFFLOAD_BATCHES:-1,8} --steps ${OFFLOAD_STEPS:-128,16} --warmup-steps ${OFFLOAD_WARMUP:-64,4} --ttft-tokens "${OFFLOAD_TTFT-2048,8192}" --ttft-rates ${TTFT_RATES:-0,0.2,auto} --routing ${OFFLOAD_ROUTING:-qwen3.5-35b-a3b} ${OFFLOAD_EXTRA:-} --out "$OUT/hybrid_offload" 2>&1 | grep -v "it/s]" | tail -60 ;;
    structured) timeout 240 python3 -m pytest -q -p no:cacheprovider tests/structured 2>&1 | tail -20 | tee "$OUT/structured_tests.txt"; timeout 180 python3 bench/bench_structured.py --batch 8 --tokens 256 2>&1 | grep -v "it/s]" | tail -12 | tee "$OUT/structured_bench.txt" ;;
    engineux) timeout 240 python3 -m pytest -q -p no:cacheprovider tests/e2e/test_prefix_caching_gpu.py 2>&1 | tail -20 | tee "$OUT/engineux_tests.txt" ;;
    prefixbench) timeout 400 python3 bench/bench_prefix_cache.py --model ${PREFIX_MODEL:-bench/configs/qwen3_30b_a3b} --rates ${PREFIX_RATES:-0,0.2} --out "$OUT/prefix_cache" 2>&1 | grep -v "it/s]" | tail -20 ;;
    tptests) timeout ${TP_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider tests/parallel -m multi_gpu 2>&1 | tee "$OUT/tp_tests.txt" | tail -30 ;;
    tpbench) timeout ${TP_BENCH_TIMEOUT:-590} python3 bench/bench_tp.py --tp ${TP_SIZES:-1,2} --rates ${TP_RATES:-0,0.1,0.2,auto} --batches ${TP_BATCHES:-1,8,32} --gpu-memory-limit-gb 24 ${TP_EXTRA:-} --out "$OUT/tp" 2>&1 | grep -v "it/s]" | tail -40 ;;
    # GGUF (issue 16): carry bench/.llamacpp_kit (bash bench/bench_vs_llamacpp.sh --stage-kit);
    # ggufprep unpacks llama.cpp (its gguf-py serves the tests) and starts its build
    # (to a file, not a pipe: on 2026-12-04 the pipe stayed open for the whole 4-min build)
    ggufprep) bash bench/bench_vs_llamacpp.sh --start-build > "$OUT/ggufprep.txt" 2>&1; tail -3 "$OUT/ggufprep.txt" ;;
    gguftests) PYTHONPATH=$PYTHONPATH:/tmp/lcp/llama.cpp/gguf-py timeout ${GGUF_TESTS_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider -rfE --durations=10 tests/kernels/test_gguf_kernels.py tests/kernels/test_attention_window.py tests/weights/test_gguf_gpu.py 2>&1 | tee "$OUT/gguf_tests.txt" | tail -40 ;;
    # xinfer's resident Q4_K row alone (prompt 2,048) with a trace of four batch-1 steps
    q4ktrace) NO_LLAMACPP=1 NO_BUDGET=1 PP=2048 ONLY=q4_k XINFER_BENCH_ARGS="--trace-dir $OUT" timeout ${VS_TIMEOUT:-300} bash bench/bench_vs_llamacpp.sh 2>&1 | grep -v "it/s]" | tail -6; gzip -f "$OUT"/vs_trace_*.json ;;
    ggufkernel) timeout ${GGUF_KERNEL_TIMEOUT:-500} python3 -u bench/bench_gguf_kernels.py ${GGUF_SWEEP:+--sweep} ${GGUF_WORDS_SWEEP:+--words-sweep} ${GGUF_Q4KM_QKV:+--q4-k-m-qkv} ${GGUF_TYPES:+--types $GGUF_TYPES} --out "$OUT/gguf_kernels.jsonl" 2>&1 | tee "$OUT/gguf_kernels.txt" | tail -50 ;;
    # the llama.cpp build (242 s on 16 cores, nice 19) starts first and runs beside the
    # xinfer rows; each llama.cpp row waits for it up to LCP_WAIT_S (NO_XINFER=1: its rows only)
    vsllama) bash bench/bench_vs_llamacpp.sh --start-build; ONLY="${VS_ROWS:-q4_k}" timeout ${VS_TIMEOUT:-590} bash bench/bench_vs_llamacpp.sh 2>&1 | grep -v "it/s]" | tee "$OUT/vs_llamacpp_${VS_ROWS:-q4_k}.txt" | tail -30; cp bench/results/vs_llamacpp.jsonl "$OUT/" 2>/dev/null ;;
    *) echo "unknown phase $phase" ;;
  esac
  tar czf "$FINAL_OUT/results.tgz" -C "$OUT" .
done
echo "=== done $(date +%T)"
tar czf "$FINAL_OUT/results.tgz" -C "$OUT" .

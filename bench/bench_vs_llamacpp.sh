#!/usr/bin/env bash
# xinfer and llama.cpp on the same random-weight GGUF files, on the GPU machine (issue 16).
#
# The llama.cpp kit (../shared/peers/llamacpp/) does not travel to the GPU machine: stage it
# into the ignored folder bench/.llamacpp_kit/ first, on this machine, and carry that folder:
#     bash bench/bench_vs_llamacpp.sh --stage-kit
# Then on the GPU machine (carry ["bench/.llamacpp_kit"]), each line one command < 10 min:
#     bash bench/bench_vs_llamacpp.sh --start-build   # unpack to /tmp/lcp, build in background
#     ONLY=q4_k bash bench/bench_vs_llamacpp.sh       # ~6 min: Qwen3-30B-A3B Q4_K, resident + 12 GB
#     ONLY=q4_k_m bash bench/bench_vs_llamacpp.sh     # the same in llama.cpp's Q4_K_M mix
#     ONLY=q8_0 bash bench/bench_vs_llamacpp.sh       # ~7 min: Q8_0, resident + 24 GB
#     ONLY=q15 bash bench/bench_vs_llamacpp.sh        # ~6 min: Qwen1.5-MoE bf16, resident + 12 GB
#     ONLY=q15_isq bash bench/bench_vs_llamacpp.sh    # ~5 min: the same file, --isq q8_0 / q4k at 12 GB
#     python3 bench/bench_vs_llamacpp_table.py         # the table (also printed after each row)
# Each row writes its GGUF to /tmp with the kit's writer (the disk holds ~60 GB: q15 keeps its
# file for q15_isq, the others delete theirs), runs xinfer (bench_vs_llamacpp.py; budget runs
# use --moe-offload auto with the routing model --routing-source qwen3-30b-a3b), then
# llama-bench at -ngl 99 with -ncmoe 0 and the kit's -ncmoe for the same budget.
# Results append to bench/results/vs_llamacpp.jsonl (RESET=1 empties it first).
# Env: ONLY (rows), PP=8192 (prompt length), LCP=/tmp/lcp, NO_LLAMACPP=1 (xinfer only),
# NO_XINFER=1 (llama.cpp only), LCP_WAIT_S=120 (how long a row waits for the build),
# BUDGET_ONLY=1 (the budget rows only: neither engine's resident row), NO_BUDGET=1 (xinfer's
# resident row only, e.g. with XINFER_BENCH_ARGS="--trace-dir DIR").
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=bench/.llamacpp_kit
PY=${PYTHON:-python3}
LCP=${LCP:-/tmp/lcp}
if [ "${1:-}" = "--stage-kit" ]; then
  SRC=${KIT_SRC:-../shared/peers/llamacpp}
  [ -d "$SRC" ] || SRC=/work/shared/peers/llamacpp
  mkdir -p "$KIT" && cp "$SRC"/{llama.cpp-src.tar.gz,build.sh,write_random_gguf.py} "$KIT"/
  echo "staged $(du -sh "$KIT" | cut -f1) in $KIT; carry it with the device run"; exit 0
fi
[ -f "$KIT/llama.cpp-src.tar.gz" ] || { echo "run 'bash $0 --stage-kit' here first and carry $KIT" >&2; exit 2; }
if [ ! -d "$LCP/llama.cpp" ]; then
  mkdir -p "$LCP" && tar xzf "$KIT/llama.cpp-src.tar.gz" -C "$LCP"
fi
if [ "${1:-}" = "--start-build" ]; then  # 242 s on 16 cores; survives this command
  # (a build already started in this machine's life has its log: not a second one beside it)
  if [ ! -x "$LCP/llama.cpp/build/bin/llama-bench" ] && [ ! -f "$LCP/build.log" ]; then
    (cd "$LCP/llama.cpp" && nohup setsid nice -n 19 bash peer-kit/build.sh < /dev/null > "$LCP/build.log" 2>&1 &)
  fi
  echo "llama.cpp unpacked in $LCP (gguf-py: $LCP/llama.cpp/gguf-py); build log $LCP/build.log"
  exit 0
fi
PP=${PP:-8192}; ONLY=${ONLY:-"q4_k q8_0 q15 q15_isq"}
OUT=bench/results/vs_llamacpp.jsonl; mkdir -p bench/results
[ "${RESET:-0}" = 1 ] && : > "$OUT"
export PYTHONPATH="$PWD/src:$LCP/llama.cpp/gguf-py:${PYTHONPATH:-}"
WRITER="$KIT/write_random_gguf.py"
# row preset type budget_gb ncmoe xinfer-extra keep-file
rows() {
  echo "q4_k qwen3-30b-a3b q4_k 12 17 - 0"
  echo "q4_k_m qwen3-30b-a3b q4_k_m 12 19 - 0"  # llama.cpp's Q4_K_M mix (bench/write_q4km_gguf.py)
  echo "q8_0 qwen3-30b-a3b q8_0 24 13 - 0"
  echo "q15 qwen1.5-moe-a2.7b bf16 12 17 compress 1"  # bf16 experts cross the link packed
  echo "q15_isq qwen1.5-moe-a2.7b bf16 12 - isq 0"
}
llama_bench() {  # file label ncmoe
  local bin="$LCP/llama.cpp/build/bin/llama-bench"
  local waited=0
  while [ ! -x "$bin" ] && [ "$waited" -lt "${LCP_WAIT_S:-120}" ]; do sleep 5; waited=$((waited + 5)); done
  if [ ! -x "$bin" ]; then
    echo "llama.cpp not built after ${waited} s (was --start-build run? tail $LCP/build.log:" \
      "$(tail -n 2 "$LCP/build.log" 2>/dev/null | tr '\n' ' ')); its rows are skipped" >&2
    return 0
  fi
  local placements="0 $3"
  [ "${BUDGET_ONLY:-0}" = 1 ] && placements="$3"
  for nc in $placements; do
    "$bin" -m "$1" -ngl 99 -fa 1 -t 16 -p "$PP" -n 128 -r 2 -ncmoe "$nc" -o json 2>/dev/null \
      | "$PY" -c '
import json, sys
name, nc = sys.argv[1], sys.argv[2]
for r in json.load(sys.stdin):
    kind = "decode_tok_s" if r["n_gen"] else "pp%d_tok_s" % r["n_prompt"]
    place = "resident" if nc == "0" else "-ncmoe " + nc
    print(json.dumps({"engine": "llama.cpp", "model": name, "placement": place, kind: round(r["avg_ts"], 1)}))
' "$2" "$nc" | tee -a "$OUT"
  done
}
rows | while read -r name preset type budget ncmoe extra keep; do
  case " $ONLY " in *" $name "*) ;; *) continue ;; esac
  f=/tmp/bench-$preset-$type.gguf
  if [ ! -f "$f" ] && [ "$type" = q4_k_m ]; then
    KIT="$KIT" "$PY" bench/write_q4km_gguf.py --preset "$preset" -o "$f"
  fi
  [ -f "$f" ] || "$PY" "$WRITER" --preset "$preset" --type "$type" -o "$f"
  label="$preset $type"
  if [ "$extra" = isq ]; then
    for q in q8_0 q4k; do
      "$PY" bench/bench_vs_llamacpp.py --gguf "$f" --label "$label" --budget-gb "$budget" \
        --skip-resident --isq "$q" --prompt-len "$PP" | tee -a "$OUT"
    done
  elif [ "${NO_XINFER:-0}" = 1 ]; then
    llama_bench "$f" "$label" "$ncmoe"
  else
    # resident and budget rows in two processes: the budget's `auto` sizes its slots from
    # the GPU's free memory, which nothing of the resident engine may still hold
    # XINFER_BENCH_ARGS: more options of bench_vs_llamacpp.py for both (e.g. --q8x)
    [ "${BUDGET_ONLY:-0}" = 1 ] || "$PY" bench/bench_vs_llamacpp.py --gguf "$f" \
      --label "$label" --prompt-len "$PP" ${XINFER_BENCH_ARGS:-} | tee -a "$OUT"
    packed=""; [ "$extra" = compress ] && packed="--compress"
    [ "${NO_BUDGET:-0}" = 1 ] || "$PY" bench/bench_vs_llamacpp.py --gguf "$f" --label "$label" --budget-gb "$budget" \
      --skip-resident --prompt-len "$PP" $packed ${XINFER_BENCH_ARGS:-} | tee -a "$OUT"
    [ "${NO_LLAMACPP:-0}" = 1 ] || llama_bench "$f" "$label" "$ncmoe"
  fi
  [ "$keep" = 1 ] || rm -f "$f"
done
"$PY" bench/bench_vs_llamacpp_table.py "$OUT"

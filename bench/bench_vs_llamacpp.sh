#!/usr/bin/env bash
# xinfer and llama.cpp on the same random-weight GGUF files, one run on the GPU machine.
#
# The llama.cpp kit (../shared/peers/llamacpp/) does not travel to the GPU machine: stage it
# into the ignored folder bench/.llamacpp_kit/ first, on this machine, and carry that folder:
#     bash bench/bench_vs_llamacpp.sh --stage-kit            # copies the 4.8 MB tarball + scripts
#     (device run, carry ["bench/.llamacpp_kit"]):  bash bench/bench_vs_llamacpp.sh
# On the GPU machine it unpacks llama.cpp to /tmp/lcp, starts its build in the background
# (242 s on 16 cores), writes each GGUF to /tmp (one at a time: the disk holds ~60 GB),
# runs xinfer (bench_vs_llamacpp.py) while llama.cpp builds, then llama-bench with the kit's
# -ncmoe for the same budget, and prints one table (also in bench/results/vs_llamacpp.jsonl).
# Rows: Qwen3-30B-A3B q4_k (resident; 12 GB), q8_0 (resident; 24 GB), Qwen1.5-MoE bf16 (12 GB).
# Env: ONLY="q4_k q8_0 q15_bf16" picks rows; PP=8192 prompt length; LCP=/tmp/lcp.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=bench/.llamacpp_kit
if [ "${1:-}" = "--stage-kit" ]; then
  SRC=${KIT_SRC:-../shared/peers/llamacpp}
  [ -d "$SRC" ] || SRC=/work/shared/peers/llamacpp
  mkdir -p "$KIT" && cp "$SRC"/{llama.cpp-src.tar.gz,build.sh,write_random_gguf.py} "$KIT"/
  echo "staged $(du -sh "$KIT" | cut -f1) in $KIT; carry it with the device run"; exit 0
fi
[ -f "$KIT/llama.cpp-src.tar.gz" ] || { echo "run 'bash $0 --stage-kit' here first and carry $KIT" >&2; exit 2; }
PY=${PYTHON:-python3}
LCP=${LCP:-/tmp/lcp}; PP=${PP:-8192}; ONLY=${ONLY:-"q4_k q8_0 q15_bf16"}
OUT=bench/results/vs_llamacpp.jsonl; mkdir -p bench/results; : > "$OUT"
if [ ! -x "$LCP/llama.cpp/build/bin/llama-bench" ]; then
  mkdir -p "$LCP" && tar xzf "$KIT/llama.cpp-src.tar.gz" -C "$LCP"
  (cd "$LCP/llama.cpp" && nohup bash peer-kit/build.sh > "$LCP/build.log" 2>&1 &)
fi
WRITER="$KIT/write_random_gguf.py"
# row: name preset type budget_gb ncmoe (the kit's README table for that budget)
rows() {
  echo "q4_k qwen3-30b-a3b q4_k 12 17"
  echo "q8_0 qwen3-30b-a3b q8_0 24 13"
  echo "q15_bf16 qwen1.5-moe-a2.7b bf16 12 17"
}
wait_build() {
  for _ in $(seq 1 120); do [ -x "$LCP/llama.cpp/build/bin/llama-bench" ] && return 0; sleep 5; done
  echo "llama.cpp build not done: tail $LCP/build.log" >&2; tail -5 "$LCP/build.log" >&2; return 1
}
rows | while read -r name preset type budget ncmoe; do
  case " $ONLY " in *" $name "*) ;; *) continue ;; esac
  f=/tmp/bench-$name.gguf
  [ -f "$f" ] || "$PY" "$WRITER" --preset "$preset" --type "$type" -o "$f"
  skip=""; [ "$type" = bf16 ] && [ "$preset" = qwen3-30b-a3b ] && skip=--skip-resident
  "$PY" bench/bench_vs_llamacpp.py --gguf "$f" --label "$preset $type" --budget-gb "$budget" \
    --prompt-len "$PP" $skip | tee -a "$OUT"
  if wait_build; then
    for nc in 0 "$ncmoe"; do
      "$LCP/llama.cpp/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -t 16 -p "$PP" -n 128 -r 2 \
        -ncmoe "$nc" -o json 2>/dev/null | "$PY" -c '
import json, sys
name, nc = sys.argv[1], sys.argv[2]
for r in json.load(sys.stdin):
    kind = "decode_tok_s" if r["n_gen"] else "pp%d_tok_s" % r["n_prompt"]
    place = "resident" if nc == "0" else "-ncmoe " + nc
    print(json.dumps({"engine": "llama.cpp", "model": name, "placement": place, kind: round(r["avg_ts"], 1)}))
' "$preset $type" "$nc" | tee -a "$OUT"
    done
  fi
  rm -f "$f"
done
"$PY" - "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
table = {}
for r in rows:
    key = (r["model"], r["engine"], r["placement"])
    table.setdefault(key, {}).update({k: v for k, v in r.items() if k.endswith("tok_s") or k == "load_s"})
print(f"{'model':28} {'engine':10} {'placement':14} {'decode tok/s':>12} {'prefill tok/s':>14}")
for (model, engine, place), v in sorted(table.items()):
    pp = next((x for k, x in v.items() if k.startswith("pp")), "")
    print(f"{model:28} {engine:10} {place:14} {v.get('decode_tok_s', ''):>12} {pp:>14}")
print("xinfer runs GGUF blocks dequantized to bf16 (no raw-block kernels yet): its experts move bf16 bytes.")
PYEOF

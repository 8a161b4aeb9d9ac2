"""Whether the Q4_K word GEMVs (`gguf_launch.Q4K_WORDS`) should be the default, from one
device call's logs: their GPU tests passed (no FAILED/ERROR line naming Q4_K or the words) and
`bench_gguf_kernels.py`'s word tile beat the byte tile in the MoE GEMV at one and at eight
tokens. Prints `WORDS ON` or `WORDS OFF` and the figures it went by.

    python3 bench/q4k_words_verdict.py PYTEST_LOG GGUF_KERNELS_JSONL
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def verdict(pytest_log: str, rows: list[dict]) -> tuple[bool, list[str]]:
    why = []
    bad = [
        line
        for line in pytest_log.splitlines()
        if line.startswith(("FAILED", "ERROR")) and ("q4k" in line.lower() or "Q4_K" in line)
    ]
    ran = any(" passed" in line for line in pytest_log.splitlines())
    if bad or not ran:
        why.append(f"tests: {len(bad)} Q4_K failures, ran={ran}")
    ok = not bad and ran
    for tokens in (1, 8):
        moe = [r for r in rows if r.get("kernel") == "moe_gemv" and r.get("tokens") == tokens]
        byte = [r["us"] for r in moe if r.get("tiles") == "None"]
        word = [r["us"] for r in moe if "words=True" in str(r.get("tiles"))]
        if not byte or not word:
            why.append(f"T={tokens}: no timing")
            ok = False
            continue
        why.append(f"T={tokens}: byte {byte[0]} us, words {word[0]} us")
        ok = ok and word[0] < byte[0]
    for r in rows:  # the decode linears, for the record (the MoE GEMV decides)
        if r.get("kernel", "").startswith("linear") and "words=True" in str(r.get("tiles")):
            why.append(f"{r['kernel']} T={r['tokens']}: words {r['us']} us")
    return ok, why


def main() -> None:
    log = Path(sys.argv[1]).read_text() if Path(sys.argv[1]).exists() else ""
    path = Path(sys.argv[2])
    rows = [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
    ok, why = verdict(log, rows)
    print("WORDS ON" if ok else "WORDS OFF")
    for line in why:
        print("  " + line)


if __name__ == "__main__":
    main()

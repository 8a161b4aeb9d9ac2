"""Arithmetic and Markdown of the offload decode benchmark (bench_offload_decode.py): per
(fraction, batch) the hit rate, GB per token, the limit `t_resident(batch) + missed bytes ÷
host→GPU bandwidth` and step / limit; the TTFT table. Pure functions of the workers' rows.

Missed bytes are the slot fills (misses × expert bytes). A whole-layer copy (the staging
path, for a call that needs more experts than the slots hold) moves far more than its
misses and counts no misses, so it shows as step / limit far above 1 and in its own column;
GB/token is every byte moved."""

from __future__ import annotations

NA = "—"


def rate_label(rate: str, slots: list[int] | None = None, num_experts: int | None = None) -> str:
    """'none', '10% (13/128)', 'auto (37/128)'."""
    if rate == "0":
        return "none (resident)"
    label = "auto" if rate == "auto" else f"{100 * float(rate):g}%"
    if slots and num_experts:
        return f"{label} ({min(slots)}/{num_experts})"
    return label


def add_limits(rows: list[dict], bandwidth_gbps: float | None) -> None:
    """Fill each offload decode row (`rate`, `batch`, `step_ms`, `bytes_moved`,
    `bytes_copied`, `hits`, `misses`, `steps`) with hit_rate, gb_per_token, limit_ms,
    limit_tok_s and ratio, against the first resident row (rate "0") of the same batch."""
    resident: dict[int, float] = {}  # the first resident row of each batch
    for r in rows:
        if r["rate"] == "0" and "step_ms" in r:
            resident.setdefault(r["batch"], r["step_ms"])
    for r in rows:
        if "step_ms" not in r:
            continue
        r["tok_s"] = r["batch"] * 1e3 / r["step_ms"]
        if r["rate"] == "0":
            continue
        seen = r["hits"] + r["misses"]
        r["hit_rate"] = r["hits"] / seen if seen else None
        r["gb_per_token"] = r["bytes_moved"] / r["steps"] / r["batch"] / 1e9
        missed = r.get("bytes_copied", r["bytes_moved"]) / r["steps"]  # per step
        t_res = resident.get(r["batch"])
        if t_res is None or not bandwidth_gbps:
            continue
        r["limit_ms"] = t_res + missed / (bandwidth_gbps * 1e9) * 1e3
        r["limit_tok_s"] = r["batch"] * 1e3 / r["limit_ms"]
        r["ratio"] = r["step_ms"] / r["limit_ms"]


def mark_identity(rows: list[dict]) -> None:
    """`identical`: the row's tokens equal those of the first resident row of the same batch
    (the reference itself, and rows without one, get None)."""
    ref: dict[int, dict] = {}
    for r in rows:
        if r["rate"] == "0" and "tokens" in r:
            ref.setdefault(r["batch"], r)
    for r in rows:
        first = ref.get(r["batch"])
        same = first is not None and first is not r and "tokens" in r
        r["identical"] = r["tokens"] == first["tokens"] if same else None


def _f(x: float | None, spec: str, suffix: str = "") -> str:
    return NA if x is None else f"{x:{spec}}{suffix}"


def decode_table(rows: list[dict]) -> str:
    head = (
        "| GPU experts | batch | tok/s | ms/step | bare replay ms | hit rate | GB/token | "
        "whole-layer copies | limit tok/s | step / limit | output |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in sorted(rows, key=_order):
        label = rate_label(r["rate"], r.get("slots"), r.get("num_experts"))
        if "step_ms" not in r:
            lines.append(f"| {label} | {r['batch']} | {r.get('error', 'did not run')} |" + " |" * 8)
            continue
        same = {True: "identical", False: "DIFFERS", None: "ref" if r["rate"] == "0" else NA}
        offload = r["rate"] != "0"
        lines.append(
            f"| {label} | {r['batch']} | {r['batch'] * 1e3 / r['step_ms']:.1f} | "
            f"{r['step_ms']:.2f} | "
            f"{_f(r.get('replay_ms'), '.2f')} | "
            f"{_f(100 * r['hit_rate'] if r.get('hit_rate') is not None else None, '.1f', '%')} | "
            f"{_f(r.get('gb_per_token'), '.3f') if offload else '0'} | "
            f"{r.get('staging_copies', 0) if offload else NA} | "
            f"{_f(r.get('limit_tok_s'), '.1f')} | {_f(r.get('ratio'), '.2f')} | "
            f"{same[r.get('identical')]} |"
        )
    return "\n".join(lines)


def ttft_table(rows: list[dict]) -> str:
    """One row per fraction, one column per prompt length: TTFT (prefill tok/s)."""
    lengths = sorted({t["tokens"] for r in rows for t in r["ttft"]})
    if not lengths:
        return ""
    names = [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in lengths]
    head = "| GPU experts | " + " | ".join(f"{name} tokens" for name in names) + " |"
    lines = [head, "|---|" + "---|" * len(lengths)]
    for r in sorted(rows, key=_order):
        cells = []
        by_len = {t["tokens"]: t for t in r["ttft"]}
        for n in lengths:
            t = by_len.get(n)
            if t is None or t.get("ttft_s") is None:
                cells.append((t or {}).get("error", NA))
                continue
            moved = t.get("bytes_moved")
            gb = f", {moved / 1e9:.3g} GB moved" if moved else ""
            cells.append(f"{t['ttft_s']:.2f} s ({t['tokens'] / t['ttft_s'] / 1e3:.1f}k tok/s{gb})")
        label = rate_label(r["rate"], r.get("slots"), r.get("num_experts"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _order(r: dict) -> tuple:
    rate = r["rate"]
    return (rate == "auto", 0.0 if rate == "auto" else float(rate), r.get("batch", 0))

"""Arithmetic and Markdown of the offload decode benchmark (bench_offload_decode.py): per
(fraction, prefetch, batch) the hit rate, GB per token, two limits and the step's ratio to
each, prefetch statistics; the TTFT table. Pure functions of the workers' rows.

Link bytes are what crossed host → GPU for the lookups and prefetches of the timed steps:
slot fills (misses × expert bytes) plus prefetched experts. With t_resident(batch) the
resident engine's step and B the copy-engine bandwidth:
    serial limit      t_resident + link bytes ÷ B   (compute, then copies: no overlap)
    overlapped limit  max(t_resident, link bytes ÷ B)   (copies hidden under compute)
A whole-layer copy (the staging path, for a call that needs more experts than the slots
hold) moves far more than its misses and counts no misses, so it shows as step / limit far
above 1 and in its own column; GB/token is every byte moved."""

from __future__ import annotations

NA = "—"


def rate_label(
    rate: str,
    slots: list[int] | None = None,
    num_experts: int | None = None,
    stream_buffers: int | None = None,
) -> str:
    """'none', '10% (13/128)', 'auto (37/128)', with the prompt pass's stream buffers the
    engine reports (0 or unknown: not named) 'auto (9/60, 1 stream buffer)'."""
    if rate == "0":
        return "none (resident)"
    label = "auto" if rate == "auto" else f"{100 * float(rate):g}%"
    parts = [f"{min(slots)}/{num_experts}"] if slots and num_experts else []
    if stream_buffers:
        parts.append(f"{stream_buffers} stream buffer" + ("s" if stream_buffers > 1 else ""))
    return f"{label} ({', '.join(parts)})" if parts else label


def row_label(r: dict) -> str:
    """A row's (or TTFT entry's) rate label from what its engine reported."""
    return rate_label(r["rate"], r.get("slots"), r.get("num_experts"), r.get("stream_buffers"))


def prefetch_label(distance: int | None, predictor: str | None = None) -> str:
    """'off', '1 ahead', '2 ahead (router)'."""
    if not distance:
        return "off"
    return f"{distance} ahead" + (f" ({predictor})" if predictor else "")


def add_limits(rows: list[dict], bandwidth_gbps: float | None) -> None:
    """Fill each offload decode row (`rate`, `batch`, `step_ms`, `bytes_moved`,
    `bytes_copied`, `hits`, `misses`, `steps`; with prefetch `prefetch` and the
    `prefetch_*` counters) with hit_rate, gb_per_token, link_bytes_per_step, the serial
    limit (limit_ms, limit_tok_s, ratio = step / limit), the overlapped one (overlap_limit_ms,
    overlap_limit_tok_s, overlap_ratio), vs_serial_off and the prefetch figures
    (`add_prefetch`), against the first resident row (rate "0") of the same batch."""
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
        if "bytes_copied" in r:  # bytes_moved holds the prefetched bytes already
            link = r["bytes_copied"] + r.get("prefetch_prefetched_bytes", 0)
        else:
            link = r["bytes_moved"]
        r["link_bytes_per_step"] = link / r["steps"]
        add_prefetch(r)
        t_res = resident.get(r["batch"])
        if t_res is None or not bandwidth_gbps:
            continue
        copy_ms = r["link_bytes_per_step"] / (bandwidth_gbps * 1e9) * 1e3
        r["limit_ms"] = t_res + copy_ms
        r["limit_tok_s"] = r["batch"] * 1e3 / r["limit_ms"]
        r["ratio"] = r["step_ms"] / r["limit_ms"]
        r["overlap_limit_ms"] = max(t_res, copy_ms)
        r["overlap_limit_tok_s"] = r["batch"] * 1e3 / r["overlap_limit_ms"]
        r["overlap_ratio"] = r["step_ms"] / r["overlap_limit_ms"]
        if r.get("compressed") and r.get("expert_bytes"):  # the limit of the unpacked bytes
            experts = r["misses"] + r.get("prefetch_prefetched", 0)
            unpacked = experts * r["expert_bytes"] / r["steps"]
            r["unpacked_gb_per_token"] = unpacked / r["batch"] / 1e9
            r["unpacked_limit_ms"] = t_res + unpacked / (bandwidth_gbps * 1e9) * 1e3
            r["unpacked_ratio"] = r["step_ms"] / r["unpacked_limit_ms"]
    _compare_with_prefetch_off(rows)


def add_prefetch(r: dict) -> None:
    """A prefetch row's figures per token (GB predicted, prefetched, used, wasted) and
    recall = used ÷ (used + misses): of the experts the lookups needed that were not in a
    slot before any prefetch, the share a prefetch brought in time. Counters of the timed
    window; a prediction settles at the layer's next reservation, so the window's edges
    shift a few experts between used and wasted."""
    if not r.get("prefetch") or "prefetch_predicted" not in r:
        return
    per_token = r["steps"] * r["batch"] * 1e9
    if r.get("expert_bytes"):  # predicted counts experts (present ones too), not bytes
        r["prefetch_predicted_gb_per_token"] = (
            r["prefetch_predicted"] * r["expert_bytes"] / per_token
        )
    for key in ("prefetched", "used", "wasted"):
        r[f"prefetch_{key}_gb_per_token"] = r[f"prefetch_{key}_bytes"] / per_token
    needed = r["prefetch_used"] + r["misses"]
    r["recall"] = r["prefetch_used"] / needed if needed else None


def _compare_with_prefetch_off(rows: list[dict]) -> None:
    """vs_serial_off: tok/s ÷ the serial-limit tok/s of the same fraction and batch without
    prefetch (the row's own limit when that row is absent; > 1: faster than compute and
    the copies prefetch-off needed, one after the other); speedup: tok/s ÷ prefetch-off
    tok/s."""
    off = {}
    for r in rows:
        if not r.get("prefetch") and "step_ms" in r:
            off.setdefault((r["rate"], r["batch"]), r)
    for r in rows:
        if "tok_s" not in r:
            continue
        ref = off.get((r["rate"], r["batch"]))
        if r.get("prefetch") and ref is not None:
            r["speedup"] = r["tok_s"] / ref["tok_s"]
        if "limit_tok_s" in r:
            limit = ref.get("limit_tok_s", r["limit_tok_s"]) if ref else r["limit_tok_s"]
            r["vs_serial_off"] = r["tok_s"] / limit


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


def _pct(x: float | None) -> str:
    return _f(None if x is None else 100 * x, ".1f", "%")


def decode_table(rows: list[dict]) -> str:
    head = (
        "| GPU experts | prefetch | batch | tok/s | ms/step | bare replay ms | hit rate | "
        "GB/token | whole-layer copies | serial limit tok/s | step / serial | "
        "overlapped limit tok/s | step / overlapped | tok/s ÷ serial (off) | output |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in sorted(rows, key=_order):
        label = row_label(r)
        prefetch = NA if r["rate"] == "0" else prefetch_label(r.get("prefetch"))
        if "step_ms" not in r:
            cells = f"| {label} | {prefetch} | {r['batch']} | {r.get('error', 'did not run')} |"
            lines.append(cells + " |" * 11)
            continue
        same = {True: "identical", False: "DIFFERS", None: "ref" if r["rate"] == "0" else NA}
        offload = r["rate"] != "0"
        lines.append(
            f"| {label} | {prefetch} | {r['batch']} | {r['batch'] * 1e3 / r['step_ms']:.1f} | "
            f"{r['step_ms']:.2f} | "
            f"{_f(r.get('replay_ms'), '.2f')} | "
            f"{_pct(r.get('hit_rate'))} | "
            f"{_f(r.get('gb_per_token'), '.3f') if offload else '0'} | "
            f"{r.get('staging_copies', 0) if offload else NA} | "
            f"{_f(r.get('limit_tok_s'), '.1f')} | {_f(r.get('ratio'), '.2f')} | "
            f"{_f(r.get('overlap_limit_tok_s'), '.1f')} | {_f(r.get('overlap_ratio'), '.2f')} | "
            f"{_f(r.get('vs_serial_off'), '.2f')} | "
            f"{same[r.get('identical')]} |"
        )
    return "\n".join(lines)


def packed_table(rows: list[dict]) -> str:
    """The `--moe-offload-compress` rows against the limit of the bytes unpacked ('' when
    no row packed): the decode table's limits count the packed bytes that crossed the link."""
    rows = [r for r in rows if "unpacked_ratio" in r]
    if not rows:
        return ""
    lines = [
        "| GPU experts | batch | link GB/token (packed) | unpacked GB/token | serial limit of "
        "the unpacked bytes, tok/s | step / that limit |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=_order):
        label = row_label(r)
        lines.append(
            f"| {label} | {r['batch']} | {_f(r.get('gb_per_token'), '.3f')} | "
            f"{r['unpacked_gb_per_token']:.3f} | "
            f"{r['batch'] * 1e3 / r['unpacked_limit_ms']:.1f} | {r['unpacked_ratio']:.2f} |"
        )
    return "\n".join(lines)


def prefetch_table(rows: list[dict]) -> str:
    """The prefetch rows' statistics ('' when no row prefetched)."""
    rows = [r for r in rows if r.get("prefetch") and "prefetch_predicted" in r]
    if not rows:
        return ""
    lines = [
        "| GPU experts | prefetch | batch | tok/s ÷ prefetch off | predicted GB/token | "
        "prefetched GB/token | used GB/token | wasted GB/token | dropped / token | recall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=_order):
        label = row_label(r)
        tokens = r["steps"] * r["batch"]
        lines.append(
            f"| {label} | {prefetch_label(r['prefetch'], r.get('predictor'))} | {r['batch']} | "
            f"{_f(r.get('speedup'), '.2f')} | "
            f"{_f(r.get('prefetch_predicted_gb_per_token'), '.3f')} | "
            f"{_f(r.get('prefetch_prefetched_gb_per_token'), '.3f')} | "
            f"{_f(r.get('prefetch_used_gb_per_token'), '.3f')} | "
            f"{_f(r.get('prefetch_wasted_gb_per_token'), '.3f')} | "
            f"{r['prefetch_dropped'] / tokens:.2f} | {_pct(r.get('recall'))} |"
        )
    return "\n".join(lines)


def ttft_table(rows: list[dict]) -> str:
    """One row per fraction, one column per prompt length: TTFT (prefill tok/s) of the
    second prompt of that length, and the first's where it was timed."""
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
            first = f"; first prompt {t['first_ttft_s']:.2f} s" if "first_ttft_s" in t else ""
            cells.append(
                f"{t['ttft_s']:.2f} s ({t['tokens'] / t['ttft_s'] / 1e3:.1f}k tok/s{gb}{first})"
            )
        label = row_label(r)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _order(r: dict) -> tuple:
    rate = r["rate"]
    fraction = 0.0 if rate == "auto" else float(rate)
    return (rate == "auto", fraction, r.get("batch", 0), r.get("prefetch") or 0)

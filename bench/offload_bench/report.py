"""The report: derived numbers per rate (hit rate and bytes as deltas over the measured
request, the PCIe limit `t_resident + missed bytes per token ÷ bandwidth` and the efficiency
limit step ÷ measured step), cell formatting in the seed's style, and the Markdown page."""

from __future__ import annotations

from offload_bench.bandwidth import slow_host_note

NA = "n/a"
COLUMNS = [
    "GPU experts",
    "KV tokens",
    "TTFT",
    "Decode tok/s",
    "Inter-token p50 / p90 / p99 ms",
    "hit rate",
    "GB/token",
    "limit tok/s",
    "efficiency",
]
EXTRA_COLUMNS = ["GPU experts", "load time", "peak GPU memory", "GB moved", "prefill tok/s"]


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """hits / misses / bytes of the expert cache moved between two scrapes."""
    if before is None or after is None:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("hits", "misses", "bytes")}
    seen = d["hits"] + d["misses"]
    d["hit_rate"] = d["hits"] / seen if seen else None
    return d


def limit_tok_s(
    t_resident_s: float | None, bytes_per_token: float | None, bandwidth_gbps: float | None
) -> float | None:
    """1 / (t_resident + bytes_per_token / bandwidth): decode speed if every missed byte
    crossed PCIe at the measured bandwidth with nothing overlapped, and all else took the
    no-offload step time."""
    if t_resident_s is None or bytes_per_token is None or not bandwidth_gbps:
        return None
    return 1 / (t_resident_s + bytes_per_token / (bandwidth_gbps * 1e9))


def add_limits(records: list[dict], t_resident_s: float | None, bandwidth_gbps: float | None):
    """Fills `bytes_per_token`, `limit_tok_s` and `efficiency` (limit step ÷ measured step,
    i.e. measured tok/s ÷ limit tok/s) into each successful record."""
    for r in records:
        m = r.get("measured")
        delta = r.get("expert_delta")
        if not m:
            continue
        tokens = m.get("num_tokens") or 0
        if r["rate"] == "0":
            r["bytes_per_token"] = 0.0
        elif delta and tokens:
            r["bytes_per_token"] = delta["bytes"] / tokens
        else:
            r["bytes_per_token"] = None
        r["limit_tok_s"] = limit_tok_s(t_resident_s, r["bytes_per_token"], bandwidth_gbps)
        rate = m.get("decode_tok_s")
        r["efficiency"] = rate / r["limit_tok_s"] if rate and r["limit_tok_s"] else None


def add_concurrent_limits(records: list[dict], bandwidth_gbps: float | None) -> None:
    """For each concurrent row (N streams): bytes per token over the decode window, the
    limit step `t_resident(N) + bytes per step ÷ bandwidth` (t_resident(N): rate 0's step
    at the same N) and efficiency = limit step ÷ measured step; `identical`: the streams'
    texts equal rate 0's at the same N."""
    resident = {
        c["concurrency"]: c
        for r in records
        if r["rate"] == "0"
        for c in r.get("concurrent") or []
        if "texts" in c
    }
    for r in records:
        for c in r.get("concurrent") or []:
            ref = resident.get(c["concurrency"])
            if "texts" in c:
                same = ref is not None and ref is not c
                c["identical"] = c["texts"] == ref["texts"] if same else None
            if not c.get("step_s"):
                continue
            delta = c.get("expert_delta") or {}
            per_token = delta["bytes"] / c["decode_tokens"] if delta else 0.0
            c["bytes_per_token"] = per_token if r["rate"] != "0" else 0.0
            if ref is None or not ref.get("step_s") or not bandwidth_gbps:
                continue
            limit = ref["step_s"] + c["bytes_per_token"] * c["concurrency"] / (bandwidth_gbps * 1e9)
            c["limit_tok_s"] = c["concurrency"] / limit
            c["efficiency"] = limit / c["step_s"]


CONCURRENT_COLUMNS = ["GPU experts", "streams", "decode tok/s (all)", "ms/step",
                      "inter-token p50 / p90 ms", "hit rate", "GB/token", "limit tok/s",
                      "efficiency", "output"]  # fmt: skip


def concurrent_cells(r: dict, c: dict) -> list[str]:
    if not c.get("step_s"):
        return [experts_label(r), str(c["concurrency"]), c.get("error", "did not run")] + [""] * (
            len(CONCURRENT_COLUMNS) - 3
        )
    hit = (c.get("expert_delta") or {}).get("hit_rate")
    same = {True: "identical", False: "DIFFERS", None: "ref" if r["rate"] == "0" else NA}
    bpt = c.get("bytes_per_token")
    return [
        experts_label(r),
        str(c["concurrency"]),
        fmt(c.get("decode_tok_s"), ".1f"),
        fmt(1e3 * c["step_s"], ".1f"),
        " / ".join(fmt_ms(c.get(k)) for k in ("itl_p50_ms", "itl_p90_ms")),
        "—" if r["rate"] == "0" else fmt(None if hit is None else 100 * hit, ".1f", "%"),
        "—" if r["rate"] == "0" else fmt(None if bpt is None else bpt / 1e9, ".3g"),
        fmt(c.get("limit_tok_s"), ".1f"),
        fmt(None if c.get("efficiency") is None else 100 * c["efficiency"], ".0f", "%"),
        same[c.get("identical")],
    ]


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return NA
    return f"{s:.1f} s" if s >= 1 else f"{1e3 * s:.0f} ms"


def fmt_count(n: float | None) -> str:
    """192000 → '192k', 8400 → '8.4k', 512 → '512'."""
    if n is None:
        return NA
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return f"{n:.0f}"


def fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return NA if x is None else f"{x:{spec}}{suffix}"


def fmt_ms(ms: float | None) -> str:
    """Inter-token milliseconds: '46', '4.2' (one decimal under 10 ms)."""
    return fmt(ms, ".1f" if ms is not None and ms < 10 else ".0f")


def experts_label(r: dict) -> str:
    """'none', '10% (13/128)', 'auto (31%)'."""
    rate, g, e = r["rate"], r.get("gpu_experts"), r.get("num_experts")
    share = f"{100 * g / e:.0f}%" if g is not None and e else None
    if rate == "0":
        return "none" + (" (no limit)" if r.get("is_unlimited_baseline") else "")
    if rate == "auto":
        return f"auto ({share})" if share else "auto"
    label = f"{100 * float(rate):g}%"
    return f"{label} ({g}/{e})" if g is not None and e else label


def row_cells(r: dict) -> list[str]:
    m = r.get("measured")
    if not m:
        return [experts_label(r), "does not run"] + [""] * (len(COLUMNS) - 2)
    delta = r.get("expert_delta") or {}
    itl = " / ".join(fmt_ms(m.get(k)) for k in ("itl_p50_ms", "itl_p90_ms", "itl_p99_ms"))
    hit = delta.get("hit_rate")
    bpt = r.get("bytes_per_token")
    return [
        experts_label(r),
        fmt_count(r.get("kv_tokens")),
        fmt_seconds(m.get("ttft_s")),
        fmt(m.get("decode_tok_s"), ".1f"),
        itl,
        "—" if r["rate"] == "0" else fmt(None if hit is None else 100 * hit, ".1f", "%"),
        "—" if r["rate"] == "0" else fmt(None if bpt is None else bpt / 1e9, ".3g"),
        fmt(r.get("limit_tok_s"), ".1f"),
        fmt(None if r.get("efficiency") is None else 100 * r["efficiency"], ".0f", "%"),
    ]


def extra_cells(r: dict) -> list[str]:
    delta = r.get("expert_delta") or {}
    needle = r.get("needle") or {}
    peak = r.get("peak_gpu_mib")
    prefill = fmt(needle.get("prefill_tok_s"), ".0f")
    if needle:
        prefill += f" ({needle.get('num_tokens')} tok, found: {needle.get('found', NA)})"
    return [
        experts_label(r),
        fmt_seconds(r.get("load_s")),
        NA if peak is None else f"{peak / 1024:.1f} GiB",
        fmt(None if "bytes" not in delta else delta["bytes"] / 1e9, ".2f", " GB"),
        prefill if needle else NA,
    ]


def table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def identity_verdict(records: list[dict]) -> tuple[bool | None, str]:
    """Whether the generated text (and the needle answer) of every rate that ran is
    byte-identical to the first one's; None when fewer than two rates produced output."""
    ran = [r for r in records if "text" in r]
    if len(ran) < 2:
        return None, f"only {len(ran)} rate(s) produced output; nothing to compare"
    ref = ran[0]
    for r in ran[1:]:
        pairs = [("generated text", ref["text"], r["text"])]
        pairs.append(("needle answer", *((x.get("needle") or {}).get("answer") for x in (ref, r))))
        for what, a, b in pairs:
            if a != b:
                at = _first_difference(a or "", b or "")
                return (
                    False,
                    f"{what} DIFFERS between rate {ref['rate']} and {r['rate']} at char {at}",
                )
    return True, "generated text byte-identical across rates " + ", ".join(r["rate"] for r in ran)


def render_markdown(meta: dict, records: list[dict]) -> str:
    """The page: a header (date, GPU, command, model, bandwidth, verdict), the main table
    and a table of load time, peak memory, GB moved and the needle run."""
    bw = meta.get("bandwidth") or {}
    used = meta.get("bandwidth_gbps")
    lines = [
        f"# MoE offload benchmark: {meta['model']}",
        "",
        f"- date: {meta['date']}",
        f"- GPU: {meta['gpu']}",
        f"- command: `{meta['command']}`",
        f"- model: `{meta['model']}` (load format {meta['load_format']}), "
        f"{meta['max_tokens']} decoded tokens, KV dtype {meta['kvcache_dtype']}",
        f"- host→GPU bandwidth: copy engine {fmt(bw.get('copy_engine_expert_gbps'), '.1f')} "
        f"GB/s (experts), {fmt(bw.get('copy_engine_block_gbps'), '.1f')} GB/s (512 MiB); "
        f"fill kernel {fmt(bw.get('fill_kernel_gbps'), '.1f')} GB/s "
        f"({fmt(bw.get('fill_kernel_hostalloc_gbps'), '.1f')} from cudaHostAlloc memory); "
        "limit uses "
        f"{fmt(used, '.1f', ' GB/s')}",
        *([f"- **{note}**"] if (note := slow_host_note(bw)) else []),
        f"- t_resident (no-offload step): {fmt(meta.get('t_resident_ms'), '.2f', ' ms')}",
        f"- routing: {meta.get('routing', 'router')}",
        f"- output: {meta['verdict']}",
        "",
        table(COLUMNS, [row_cells(r) for r in records]),
        "",
        table(EXTRA_COLUMNS, [extra_cells(r) for r in records]),
        "",
        *_concurrent_section(records),
        *[f"- {experts_label(r)} failed: {r['error']}\n" for r in records if "error" in r],
        "Hit rate and GB/token are deltas over the measured request (warm-up excluded); "
        "limit = 1 / (t_resident + GB/token ÷ bandwidth); efficiency = measured ÷ limit.",
        "",
    ]
    return "\n".join(lines)


def _concurrent_section(records: list[dict]) -> list[str]:
    rows = [concurrent_cells(r, c) for r in records for c in r.get("concurrent") or []]
    if not rows:
        return []
    return [
        "Several streams at once (a decode batch; counters over the decode window only):",
        "",
        table(CONCURRENT_COLUMNS, rows),
        "",
    ]

"""Plot of the offload decode benchmark (bench_offload_decode.py's JSON): decode tok/s against
the fraction of experts on the GPU, one panel per batch size, one line per prefetch setting,
with the serial limit `t_resident + link bytes ÷ B` and the overlapped limit
`max(t_resident, link bytes ÷ B)` of the prefetch-off rows, and the resident engine's tok/s.

    python3 bench/plot_offload.py bench/results/offload.json [more.json ...] \
        --out docs/images/offload_prefetch.png

Rows of several files are merged (a later file's row replaces an earlier one of the same
fraction, prefetch and batch). Needs matplotlib (a bench tool: not in the test extras)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESIDENT = "resident"
SERIAL, OVERLAPPED = "serial limit", "overlapped limit"


def load(paths: list[Path]) -> tuple[list[dict], dict]:
    """(decode rows that ran, the first file's meta), merged over `paths` in order."""
    rows: dict[tuple, dict] = {}
    meta: dict = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        meta = meta or data.get("meta", {})
        for r in data.get("decode", []):
            if "step_ms" in r:
                rows[(r["rate"], r.get("prefetch") or 0, r["batch"])] = r
    return list(rows.values()), meta


def fraction(r: dict) -> float | None:
    """The GPU's share of each layer's experts (the smallest layer's; `auto` needs slots)."""
    if r.get("slots") and r.get("num_experts"):
        return min(r["slots"]) / r["num_experts"]
    return None if r["rate"] == "auto" else float(r["rate"])


def prefetch_name(distance: int) -> str:
    return "prefetch off" if not distance else f"prefetch {distance} ahead"


def series(rows: list[dict]) -> dict[int, dict[str, list[tuple[float, float]]]]:
    """Per batch: name → [(fraction, tok/s)] sorted by fraction — one per prefetch setting,
    the two limits (from the prefetch-off rows, else the lowest distance's) and `resident`
    (one point at fraction 1)."""
    out: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        lines = out.setdefault(r["batch"], {})
        tok_s = r.get("tok_s", r["batch"] * 1e3 / r["step_ms"])
        if r["rate"] == "0":
            lines[RESIDENT] = [(1.0, tok_s)]
            continue
        x = fraction(r)
        if x is not None:
            lines.setdefault(prefetch_name(r.get("prefetch") or 0), []).append((x, tok_s))
    for batch, lines in out.items():
        offload = [r for r in rows if r["batch"] == batch and r["rate"] != "0"]
        if offload:
            lowest = min(r.get("prefetch") or 0 for r in offload)
            for r in offload:
                x = fraction(r)
                if (r.get("prefetch") or 0) != lowest or x is None:
                    continue
                for name, key in ((SERIAL, "limit_tok_s"), (OVERLAPPED, "overlap_limit_tok_s")):
                    if r.get(key):
                        lines.setdefault(name, []).append((x, r[key]))
        for name in lines:
            lines[name].sort()
    return dict(sorted(out.items()))


def plot(rows: list[dict], meta: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = series(rows)
    if not panels:
        raise SystemExit("no decode rows to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    styles = {SERIAL: dict(color="0.35", ls="--"), OVERLAPPED: dict(color="0.35", ls=":")}
    for ax, (batch, lines) in zip(axes[0], panels.items()):
        for name, points in lines.items():
            xs, ys = zip(*points)
            if name in styles:
                ax.plot(xs, ys, lw=1.2, label=f"{name} (prefetch off)", **styles[name])
            elif name != RESIDENT:
                ax.plot(xs, ys, marker="o", lw=1.6, label=name)
        # the resident tok/s in the title: as a line it would squash the offload curves
        resident = lines.get(RESIDENT)
        title = f"batch {batch}" + (f", resident {resident[0][1]:.0f} tok/s" if resident else "")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("experts on the GPU (fraction of each layer)")
        ax.set_ylabel("decode tok/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    bw = meta.get("bandwidth_gbps")
    fig.suptitle(
        f"{Path(str(meta.get('model', ''))).name}, {meta.get('gpu', '')}, routing "
        f"`{meta.get('routing', '')}`" + (f", host→GPU {bw:.1f} GB/s" if bw else ""),
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench_offload_decode.py JSON files")
    ap.add_argument("--out", type=Path, default=Path("docs/images/offload_prefetch.png"))
    args = ap.parse_args(argv)
    rows, meta = load(args.results)
    print(plot(rows, meta, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

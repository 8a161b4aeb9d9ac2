"""Reporting for `train_demo.py`: the loss-curve PNG (matplotlib when installed, else a
tiny built-in PNG writer, so training never needs an extra dependency) and the model card."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def plot_loss(log: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in log]
    losses = [r["loss"] for r in log]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_png_plot(steps, losses, path)
        return
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(steps, losses, lw=1.2)
    ax.set(xlabel="step", ylabel="train loss (nats/token)", title="xinfer demo MoE: training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_png_plot(
    xs: list[float], ys: list[float], path: Path, w: int = 640, h: int = 360
) -> None:
    """Dependency-free fallback: a polyline on a white canvas, written as an RGB PNG."""
    pixels = bytearray(b"\xff" * (w * h * 3))
    pad, lo, hi = 20, min(ys), max(ys)

    def put(x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < w and 0 <= y < h:
            pixels[(y * w + x) * 3 : (y * w + x) * 3 + 3] = bytes(rgb)

    for x in range(pad, w - pad):  # axes
        put(x, h - pad, (0, 0, 0))
    for y in range(pad, h - pad):
        put(pad, y, (0, 0, 0))
    to_px = [
        (
            pad + (x - xs[0]) / max(1e-9, xs[-1] - xs[0]) * (w - 2 * pad),
            h - pad - (y - lo) / max(1e-9, hi - lo) * (h - 2 * pad),
        )
        for x, y in zip(xs, ys)
    ]
    for (x0, y0), (x1, y1) in zip(to_px, to_px[1:]):
        num = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(num + 1):
            put(round(x0 + (x1 - x0) * i / num), round(y0 + (y1 - y0) * i / num), (31, 119, 180))
    raw = b"".join(b"\x00" + bytes(pixels[r * w * 3 : (r + 1) * w * 3]) for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
    path.write_bytes(png + chunk(b"IEND", b""))


def write_model_card(out: Path, metrics: dict, samples: list[dict], plot: Path) -> None:
    cfg = metrics["config"]
    sample_md = "\n\n".join(
        f"Prompt:\n\n```python\n{s['prompt']}```\n\nGreedy completion:\n\n```python\n"
        f"{s['prompt']}{s['completion']}\n```"
        for s in samples
    )
    card = f"""# xinfer demo model: tiny Qwen3-MoE trained on the CPython standard library

A deliberately small Mixture-of-Experts causal LM bundled with `xinfer` so that the engine does
something real on any machine, without downloads. It writes Python-looking code; it is not a
useful assistant. This copy was made by `{metrics["command"]}`.

## Data and licence

- CPython {metrics["data"]["python_version"]} standard-library `.py` sources (the
  directory `sysconfig.get_paths()["stdlib"]`, site-packages excluded), sorted, capped at
  {metrics["data"]["max_mb"]:.0f} MB; sources used: {", ".join(metrics["data"]["sources"])}.
  Licence: PSF-2.0 (Python Software Foundation License Version 2); Debian's Python
  documentation, when installed and used, is under the same licence.
- {metrics["data"]["num_train_files"]} training files, {metrics["data"]["num_heldout_files"]}
  held-out files (every {metrics["data"]["heldout_every"]}th file in sorted order),
  {metrics["data"]["num_bytes"] / 1e6:.1f} MB of text,
  {metrics["data"]["train_tokens"]:,} training / {metrics["data"]["heldout_tokens"]:,} held-out
  tokens.
- The weights are a derivative of that PSF-licensed text; they are distributed with xinfer
  under its MIT licence with the PSF notice kept here.

## Shapes

| field | value |
|---|---|
| architecture | `Qwen3MoeForCausalLM` |
| vocab | {cfg["vocab_size"]} (byte-level BPE trained by the script) |
| hidden / layers | {cfg["hidden_size"]} / {cfg["num_hidden_layers"]} |
| attention heads / KV heads / head dim | {cfg["num_attention_heads"]} / \
{cfg["num_key_value_heads"]} / {cfg["head_dim"]} |
| experts / top-k / expert intermediate | {cfg["num_experts"]} / \
{cfg["num_experts_per_tok"]} / {cfg["moe_intermediate_size"]} |
| tied embeddings | {cfg["tie_word_embeddings"]} |
| parameters | {metrics["num_params"]:,} ({metrics["num_active_params"]:,} active per token) |
| weights | bfloat16 safetensors, {metrics["weights_bytes"] / 1e6:.1f} MB |

Chat template: ChatML (`<|im_start|>role\\n...<|im_end|>\\n`); EOS ids are `<|im_end|>` and
`<|endoftext|>`.

## Training

AdamW (betas 0.9/0.95, weight decay 0.1), peak LR {metrics["train"]["lr"]}, warmup then
cosine to 10%, router aux loss coefficient {cfg["router_aux_loss_coef"]}, batch
{metrics["train"]["batch_size"]} x {metrics["train"]["seq_len"]} tokens, device
`{metrics["train"]["device"]}` ({metrics["train"]["dtype"]}).

| | value |
|---|---|
| steps | {metrics["train"]["steps"]} |
| tokens seen | {metrics["train"]["tokens_seen"]:,} |
| training wall time | {metrics["train"]["wall_s"] / 60:.1f} min |
| final train loss (mean of last logs) | {metrics["train"]["final_loss"]:.3f} nats/token |
| held-out perplexity | **{metrics["heldout_ppl"]:.2f}** |
| unigram baseline perplexity (add-one) | {metrics["unigram_ppl"]:.1f} |

Held-out perplexity is over {metrics["eval_tokens"]:,} tokens of held-out files; the unigram
baseline uses training-split token frequencies scored on the same tokens. Loss curve:
`docs/{plot.name}`.

## Greedy samples (transformers `generate`)

{sample_md}
"""
    (out / "model_card.md").write_text(card)

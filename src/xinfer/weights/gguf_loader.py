"""Streams a GGUF checkpoint as (HF name, tensor). Weights the plan keeps in their blocks
(`gguf_plan.py`) are yielded as their raw uint8 rows, memory-mapped views the loader copies
once into the layers' `GGUFFormat` tensors; the rest are dequantized with the twins of
`quant.gguf_blocks` (on the model's device). llama's q/k rows are put back in HF order (raw
rows move whole) and Gemma's norms lose their +1; stacked experts are yielded per expert."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from xinfer.errors import UserError
from xinfer.quant.gguf_blocks import dequantize
from xinfer.weights import gguf_names
from xinfer.weights.gguf_file import GGUFCheckpoint, GGUFTensor, open_gguf
from xinfer.weights.gguf_plan import plan_gguf


@lru_cache(maxsize=2)
def cached_gguf(path: str) -> GGUFCheckpoint:
    """Config, tokenizer and weights all read the same file: parse it once."""
    return open_gguf(Path(path))


def hf_rows(t: GGUFTensor, values: torch.Tensor, ckpt: GGUFCheckpoint, hf: dict) -> torch.Tensor:
    """Undo the converter's q/k row permutation (llama) on values or raw rows."""
    if not gguf_names.needs_unpermute(ckpt.arch):
        return values
    if ".attn_q." in t.name:
        heads = hf["num_attention_heads"]
    elif ".attn_k." in t.name:
        heads = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    else:
        return values
    return values[gguf_names.unpermute_order(values.shape[0], heads).to(values.device)]


def dequantized(
    t: GGUFTensor, ckpt: GGUFCheckpoint, hf: dict, device: torch.device | None = None
) -> torch.Tensor:
    """float32 values in HF layout; the blocks are copied to `device` (a GPU dequantizes a
    30B model in seconds, the CPU twins take minutes) before the twin runs there."""
    raw = t.raw if device is None or device.type == "cpu" else t.raw.to(device)
    values = dequantize(raw, t.btype, t.row_len)
    if gguf_names.is_offset_norm(ckpt.arch, t.name):
        values = values - 1.0
    if t.name.endswith("ffn_gate_inp_shexp.weight"):
        values = values.reshape(1, -1)  # HF's shared_expert_gate is Linear(H, 1)
    return hf_rows(t, values, ckpt, hf)


def iter_gguf(
    path: str | Path,
    hf: dict[str, Any],
    show_progress: bool = True,
    device: torch.device | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    ckpt = cached_gguf(str(path))
    plan = plan_gguf(ckpt)
    for t in tqdm(ckpt.tensors.values(), desc="Loading GGUF", disable=not show_progress):
        if (experts := gguf_names.expert_names(t.name, t.shape[0])) is not None:
            raw = plan.is_raw(experts[0])
            stack = t.raw if raw else dequantized(t, ckpt, hf, device)  # (E, rows, K or bytes)
            for e, name in enumerate(experts):
                yield name, stack[e]
            continue
        name = gguf_names.hf_name(t.name, ckpt.arch)
        if name is None:
            if t.name.startswith("rope_"):  # RoPE factors: gguf_config put them in the config
                continue
            raise UserError(f"GGUF tensor {t.name!r} is not one a {ckpt.arch} model uses")
        if plan.is_raw(name):
            yield name, hf_rows(t, t.raw, ckpt, hf)
            continue
        yield name, dequantized(t, ckpt, hf, device)

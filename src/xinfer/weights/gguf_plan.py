"""Which GGUF tensors the engine keeps in their blocks: the weights of linear and expert layers
whose every part (q|k|v of a merged qkv, gate|up of an expert w13) is stored in the same
quantized block type with kernels (`quant.gguf_formats`). The rest (embeddings, norms,
routers, float tensors, merges of mixed types) are dequantized at load to the engine dtype.
The loader and the layers' formats both follow this one plan."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xinfer.quant.gguf_formats import QUANTIZED_TYPES
from xinfer.weights import gguf_names
from xinfer.weights.gguf_file import GGUFCheckpoint
from xinfer.weights.mapping import map_name

logger = logging.getLogger("xinfer")


@dataclass(frozen=True)
class GGUFPlan:
    # HF checkpoint module name (e.g. `model.layers.0.self_attn.q_proj`, or an expert's
    # `model.layers.0.mlp.experts.3.down_proj`) → the block type its weight stays in
    raw_modules: dict[str, str]

    def is_raw(self, hf_weight_name: str) -> bool:
        return hf_weight_name.removesuffix(".weight") in self.raw_modules


def _weight_modules(ckpt: GGUFCheckpoint, name: str, rows: int) -> list[str]:
    """The HF modules a GGUF linear/expert weight fills (one per expert for stacks)."""
    if (experts := gguf_names.expert_names(name, rows)) is not None:
        return [n.removesuffix(".weight") for n in experts]
    if not gguf_names.is_linear_weight(name):
        return []
    hf = gguf_names.hf_name(name, ckpt.arch)
    return [hf.removesuffix(".weight")] if hf else []


def plan_gguf(ckpt: GGUFCheckpoint) -> GGUFPlan:
    groups: dict[tuple, set[str]] = {}  # engine target (module, expert proj) → block types
    members: dict[str, tuple] = {}
    for t in ckpt.tensors.values():
        for module in _weight_modules(ckpt, t.name, t.shape[0]):
            target = map_name(f"{module}.weight")
            key = (target.module, target.proj)
            groups.setdefault(key, set()).add(t.btype.name)
            members[module] = key
    raw, mixed = {}, []
    for module, key in members.items():
        types = groups[key]
        if len(types) == 1 and (only := next(iter(types))) in QUANTIZED_TYPES:
            raw[module] = only
        elif len(types) > 1:
            mixed.append(f"{key[0]}{'.' + key[1] if key[1] else ''} ({'/'.join(sorted(types))})")
    if mixed:
        shown = ", ".join(sorted(set(mixed))[:3])
        logger.info(
            "GGUF: %d merged weights mix block types and run dequantized (e.g. %s)",
            len(set(mixed)),
            shown,
        )
    return GGUFPlan(raw)

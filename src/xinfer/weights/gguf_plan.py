"""Which GGUF tensors the engine keeps in their blocks: the weights of linear and expert layers
whose every part (q|k|v of a merged qkv, gate|up of an expert w13) is stored in the same
quantized block type with kernels (`quant.gguf_formats`), and merged linears whose parts
form at most `gguf_segments.MAX_SEGMENTS` runs of such types in part order (a Q4_K_M file's
Q4_K q|k and Q6_K v: `quant.gguf_segments`). The rest (embeddings, norms, routers, float
tensors, other merges of mixed types) are dequantized at load to the engine dtype.
The loader and the layers' formats both follow this one plan."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xinfer.quant import gguf_segments
from xinfer.quant.gguf_formats import QUANTIZED_TYPES
from xinfer.weights import gguf_names
from xinfer.weights.gguf_file import GGUFCheckpoint
from xinfer.weights.mapping import map_name, part_rank

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


def _keeps_segments(key: tuple, parts: list[tuple[int, str]]) -> bool:
    """Whether a merge of mixed types stays in its blocks as segments: a linear's (not an
    expert projection's), every part a quantized type, few runs in part order."""
    types = [t for _, t in sorted(parts)]
    return (
        key[1] is None
        and all(t in QUANTIZED_TYPES for t in types)
        and len(gguf_segments.runs(types)) <= gguf_segments.MAX_SEGMENTS
    )


def plan_gguf(ckpt: GGUFCheckpoint) -> GGUFPlan:
    # engine target (module, expert proj) → (part rank, block type) of each checkpoint module
    groups: dict[tuple, list[tuple[int, str]]] = {}
    members: dict[str, tuple[tuple, str]] = {}  # module → (its target, its block type)
    for t in ckpt.tensors.values():
        for module in _weight_modules(ckpt, t.name, t.shape[0]):
            target = map_name(f"{module}.weight")
            key = (target.module, target.proj)
            groups.setdefault(key, []).append((part_rank(target.part), t.btype.name))
            members[module] = (key, t.btype.name)
    raw, mixed, segmented = {}, set(), set()
    for module, (key, own) in members.items():
        types = {t for _, t in groups[key]}
        label = f"{key[0]}{'.' + key[1] if key[1] else ''} ({'/'.join(sorted(types))})"
        if len(types) == 1 and own in QUANTIZED_TYPES:
            raw[module] = own
        elif len(types) > 1 and _keeps_segments(key, groups[key]):
            raw[module] = own
            segmented.add(label)
        elif len(types) > 1:
            mixed.add(label)
    if segmented:
        logger.info(
            "GGUF: %d merged weights mix block types and keep their blocks as segments (e.g. %s)",
            len(segmented),
            ", ".join(sorted(segmented)[:3]),
        )
    if mixed:
        logger.info(
            "GGUF: %d merged weights mix block types and run dequantized (e.g. %s)",
            len(mixed),
            ", ".join(sorted(mixed)[:3]),
        )
    return GGUFPlan(raw)

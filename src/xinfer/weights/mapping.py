"""Checkpoint name → (module, tensor name, where in it). One declarative table covers the
merged projections (q|k|v, gate|up), per-expert tensors stacked into `[E, ...]` sets, and
transformers 5's fused expert tensors; model classes add their renames (`checkpoint_renames`)
and merged projections of their own (`merged_projections`: checkpoint projection → (merged
module, part), the part named after the checkpoint projection).
The tensor name after the module (`weight`, `bias`, `weight_scale_inv`, `qweight`, ...) is
kept as is: which names a module reads is declared by its weight format."""

from __future__ import annotations

import re
from dataclasses import dataclass

# checkpoint projection suffix → (merged module, part name)
_MERGED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_PART_NAME = {(merged, part): proj for proj, (merged, part) in _MERGED.items()}
_PART_RANK = {part: i for i, (_, part) in enumerate(_MERGED.values())}
# expert projection → (expert-set projection, half of w13: 0 gate, 1 up, None for w2)
_EXPERT_PROJ = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None)}
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>\w+)\.(?P<kind>\w+)$")
_FUSED_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")
_PROJ = re.compile(r"^(?P<prefix>.*)\.(?P<proj>[a-z_]+_proj)\.(?P<kind>\w+)$")
_ANY_PROJ = re.compile(r"^(?P<prefix>.*)\.(?P<proj>\w+)\.(?P<kind>\w+)$")


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: tensor `kind` of module `module` (for modules without
    a weight format, the parameter `module.kind`); `part` a merged-projection part; for
    expert layers `proj` (w13/w2), `expert` (None: every expert, a fused tensor) and `half`
    (0/1: the gate/up rows of w13)."""

    module: str
    kind: str
    part: str | None = None
    proj: str | None = None
    expert: int | None = None
    half: int | None = None

    @property
    def name(self) -> str:
        return f"{self.module}.{self.kind}" if self.module else self.kind


def apply_renames(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    for old, new in renames:
        if "{e}" in old:
            pattern = re.escape(old).replace(r"\{e\}", r"(\d+)")
            name = re.sub(pattern, lambda m, new=new: new.replace("{e}", m.group(1)), name)
        else:
            name = name.replace(old, new)
    return name


def part_rank(part: str | None) -> int:
    """A merged part's place among its module's parts (q, k, v; gate, up: the order the
    layers stack them in); 0 for a whole weight."""
    return _PART_RANK.get(part, 0) if part else 0


def map_name(
    name: str,
    renames: tuple[tuple[str, str], ...] = (),
    merged: dict[str, tuple[str, str]] | None = None,
) -> Target:
    """`merged`: a model's own projection → (merged module, part) entries."""
    name = apply_renames(name, renames)
    if m := _PER_EXPERT.match(name):
        if m["proj"] in _EXPERT_PROJ:
            proj, half = _EXPERT_PROJ[m["proj"]]
            return Target(m["prefix"], m["kind"], proj=proj, expert=int(m["e"]), half=half)
    if m := _FUSED_EXPERT.match(name):
        return Target(m["prefix"], "weight", proj="w13" if m["proj"] == "gate_up_proj" else "w2")
    if (m := _PROJ.match(name)) and m["proj"] in _MERGED:
        module, part = _MERGED[m["proj"]]
        return Target(f"{m['prefix']}.{module}", m["kind"], part=part)
    if merged and (m := _ANY_PROJ.match(name)) and m["proj"] in merged:
        module, part = merged[m["proj"]]
        return Target(f"{m['prefix']}.{module}", m["kind"], part=part)
    module, _, kind = name.rpartition(".")
    return Target(module, kind)


def checkpoint_part_name(module: str, part: str) -> str:
    """Our merged module + part → the checkpoint module (`...qkv_proj`, q → `...q_proj`)."""
    prefix, _, merged = module.rpartition(".")
    # a model's own merged projections name their parts after the checkpoint's projections
    return f"{prefix}.{_PART_NAME.get((merged, part), part)}"


def expert_module_names(module: str, num_experts: int) -> list[str]:
    """Checkpoint modules of an expert layer: `<module>.<e>.gate_proj|up_proj|down_proj`."""
    return [f"{module}.{e}.{p}" for e in range(num_experts) for p in _EXPERT_PROJ]

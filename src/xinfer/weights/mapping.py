"""Checkpoint name → (target tensor, where in it). One declarative table covers the merged
projections (q|k|v, gate|up), per-expert tensors stacked into `[E, ...]`, and transformers 5's
fused expert tensors; model classes add their renames (`checkpoint_renames`) and merged
projections of their own (`merged_projections`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# checkpoint projection suffix → (merged parameter, part name)
_MERGED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$")
_FUSED_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")
_PROJ = re.compile(r"^(?P<prefix>.*)\.(?P<proj>\w+)\.(?P<kind>weight|bias)$")


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: `name` is a parameter or expert tensor of the model;
    `part` a merged-projection part; `expert` an index into the first dim of `[E, ...]`;
    `half` 0/1 selects the gate/up rows of w13."""

    name: str
    part: str | None = None
    expert: int | None = None
    half: int | None = None


def apply_renames(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    for old, new in renames:
        if "{e}" in old:
            pattern = re.escape(old).replace(r"\{e\}", r"(\d+)")
            name = re.sub(pattern, lambda m, new=new: new.replace("{e}", m.group(1)), name)
        else:
            name = name.replace(old, new)
    return name


def map_name(
    name: str,
    renames: tuple[tuple[str, str], ...] = (),
    merged: dict[str, tuple[str, str]] | None = None,
) -> Target:
    """`merged`: a model's own projection → (merged parameter, part) entries."""
    name = apply_renames(name, renames)
    if m := _PER_EXPERT.match(name):
        prefix, e, proj = m["prefix"], int(m["e"]), m["proj"]
        if proj == "down_proj":
            return Target(f"{prefix}.w2", expert=e)
        if proj in ("gate_proj", "up_proj"):
            return Target(f"{prefix}.w13", expert=e, half=0 if proj == "gate_proj" else 1)
    if m := _FUSED_EXPERT.match(name):
        return Target(f"{m['prefix']}.{'w13' if m['proj'] == 'gate_up_proj' else 'w2'}")
    table = {**_MERGED, **merged} if merged else _MERGED
    if (m := _PROJ.match(name)) and m["proj"] in table:
        target, part = table[m["proj"]]
        return Target(f"{m['prefix']}.{target}.{m['kind']}", part=part)
    return Target(name)

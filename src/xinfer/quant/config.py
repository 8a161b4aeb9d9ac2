"""Which format each weight of a checkpoint is stored in: parsed once from config.json's
`quantization_config` (or ModelOpt's `hf_quant_config.json` beside it) by the parser that
the declared method registers in `quant/registry.py`. Modules on the producer's ignore list,
and modules a model declares unquantizable (routers), keep the unquantized format."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant.base import WeightFormat


@dataclass(frozen=True)
class ModuleMatcher:
    """The producer's list of modules left unquantized, matched the producer's way:
    `exact` names (compressed-tensors; `re:` entries are regexes matched at the start),
    `glob` patterns (ModelOpt), or `substring` (transformers' modules_to_not_convert)."""

    patterns: tuple[str, ...] = ()
    style: str = "exact"  # exact | glob | substring

    def matches(self, name: str) -> bool:
        for p in self.patterns:
            if p.startswith("re:"):
                if re.match(p[3:], name):
                    return True
            elif self.style == "glob":
                if fnmatch.fnmatchcase(name, p):
                    return True
            elif self.style == "substring":
                # transformers matches whole dotted components, e.g. "gate" ≠ "gate_proj"
                if re.search(rf"(^|\.){re.escape(p)}($|\.)", name):
                    return True
            elif name == p or name.split(".")[-1] == p:
                return True
        return False


@dataclass(frozen=True)
class QuantConfig:
    """`method` as declared, the `fmt` of quantized weights, and the modules it skips."""

    method: str
    fmt: WeightFormat
    ignore: ModuleMatcher = field(default_factory=ModuleMatcher)

    def format_for(
        self,
        checkpoint_modules: Iterable[str],
        default: WeightFormat,
        part_rows: Sequence[int] | None = None,
    ) -> WeightFormat:
        """Format of a module made of these checkpoint modules (q/k/v of a merged qkv, every
        expert's gate/up/down): all ignored → `default`, none → `fmt`, a mix is refused.
        `part_rows`: a linear's rows of each module, in order (for configs whose formats
        lay merged parts out by their sizes; None for expert layers)."""
        names = list(checkpoint_modules)
        ignored = [self.ignore.matches(n) for n in names]
        if all(ignored):
            return default
        if any(ignored):
            skipped = [n for n, i in zip(names, ignored) if i][:3]
            raise UserError(
                f"the {self.method} checkpoint leaves {', '.join(skipped)} unquantized but not "
                "the modules xinfer merges with them; such mixed checkpoints are not supported"
            )
        return self.fmt

    def covers(self, module) -> bool:
        """Whether `module` (a linear or expert layer) takes its format from this config;
        layers a model declares unquantizable (routers, the LM head) keep the plain one."""
        return module.is_quantizable

    def renamed(self, renames: tuple[tuple[str, str], ...]) -> QuantConfig:
        """The ignore list in our module names (a model's `checkpoint_renames` applied)."""
        from xinfer.weights.mapping import apply_renames

        def rename(p: str) -> str:
            body = p[3:] if p.startswith("re:") else p
            body = apply_renames(body + ".", renames)[:-1]
            return "re:" + body if p.startswith("re:") else body

        patterns = tuple(rename(p) for p in self.ignore.patterns)
        return replace(self, ignore=replace(self.ignore, patterns=patterns))


# (quantization_config, the whole config.json, the model's activation dtype) → QuantConfig
ConfigParser = Callable[[dict[str, Any], dict[str, Any], torch.dtype], QuantConfig]


def read_quantization_config(model_dir: str | Path | None, hf: dict[str, Any]) -> dict | None:
    """config.json's `quantization_config`, else ModelOpt's `hf_quant_config.json` (whose
    `quantization` section becomes a config with `quant_method: modelopt`)."""
    qc = hf.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise UserError("config.json's quantization_config must be an object")
        return qc
    if model_dir is None:
        return None
    path = Path(model_dir) / "hf_quant_config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e})") from None
    section = data.get("quantization")
    if not isinstance(section, dict):
        raise UserError(f"{path} has no 'quantization' section")
    return {"quant_method": "modelopt", **section}


def resolve_quant_config(
    model_dir: str | Path | None, hf: dict[str, Any], act_dtype: torch.dtype
) -> QuantConfig | None:
    """The checkpoint's QuantConfig, None for an unquantized one. An unknown method is
    refused before anything is loaded, naming the formats xinfer reads."""
    from xinfer.quant import registry

    qc = read_quantization_config(model_dir, hf)
    if qc is None:
        return None
    method = str(qc.get("quant_method", "")).lower()
    parser = registry.parser_for(method)
    return parser(qc, hf, act_dtype)

"""ModelOpt checkpoints (`hf_quant_config.json`, or config.json `quant_method: modelopt`):
`quant_algo` NVFP4 (`quant/nvfp4.py`) or FP8 (per-tensor e4m3 scales, `quant/fp8.py`);
`exclude_modules` are glob patterns of modules left unquantized."""

from __future__ import annotations

import logging
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant.config import ModuleMatcher, QuantConfig
from xinfer.quant.fp8 import Fp8Scaled
from xinfer.quant.nvfp4 import GROUP, Nvfp4

logger = logging.getLogger("xinfer")


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    algo = str(qc.get("quant_algo", "")).upper()
    if algo == "NVFP4":
        if int(qc.get("group_size", GROUP)) != GROUP:
            raise UserError(f"NVFP4 group_size must be {GROUP}, got {qc.get('group_size')}")
        fmt = Nvfp4()
    elif algo == "FP8":
        fmt = Fp8Scaled(per_tensor=True)
    else:
        raise UserError(
            f"ModelOpt quant_algo {algo or None!r} is not supported; xinfer reads ModelOpt "
            "NVFP4 and FP8"
        )
    if qc.get("kv_cache_quant_algo"):
        logger.info("ModelOpt checkpoint: its KV-cache scales are not used")
    exclude = qc.get("exclude_modules") or qc.get("ignore") or ()
    return QuantConfig("modelopt", fmt, ModuleMatcher(tuple(exclude), "glob"))

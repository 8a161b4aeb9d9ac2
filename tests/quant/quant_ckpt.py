"""Tiny quantized checkpoints in each producer's exact on-disk layout: a transformers model
with random weights, every projection the public checkpoints quantize (attention q/k/v/o,
dense MLPs, shared experts, routed experts per expert) written by the format's quantizer,
the rest (embeddings, norms, routers, LM head) as they are, and the producer's config. The
reference model gets the same weights dequantized by `published_dequant` (code independent
of the engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import published_dequant as pd
import tiny_models as tm
import torch
from safetensors.torch import save_file

from xinfer.quant.config import resolve_quant_config

# shapes whose K dims are multiples of 128 (every group size) and N dims of 8 (packing)
SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=128,
    head_dim=32,
    num_attention_heads=4,
    num_key_value_heads=2,
)
_QUANTIZED = re.compile(r"\.(q|k|v|o|gate|up|down)_proj$")

# name → (quantization_config or None for hf_quant_config.json, ModelOpt side file)
FORMATS: dict[str, dict] = {
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [64, 64]},
    # one weight_scale per module and static input scales (vLLM's serialized fp8)
    "fp8-tensor": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static"},
    "fp8-ct-channel": {"quant_method": "compressed-tensors", "format": "float-quantized",
                       "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                           "num_bits": 8, "type": "float", "symmetric": True,
                           "strategy": "channel"}, "input_activations": {
                           "num_bits": 8, "type": "float", "strategy": "token",
                           "dynamic": True}}},
                       "ignore": ["lm_head", "re:.*mlp\\.gate$"]},
    "fp8-modelopt": {"quant_method": "modelopt", "quant_algo": "FP8",
                     "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
              "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": True, "checkpoint_format": "gptq"},
    "gptq-asym-g32": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False,
                      "sym": False, "checkpoint_format": "gptq"},
    # act-order (desc_act): a random column order per module, shared by q/k/v and by the
    # gate/up of one MLP or expert (GPTQ orders by the inputs, which those share)
    "gptq-actorder": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True,
                      "sym": True, "checkpoint_format": "gptq"},
    "gptq-actorder-asym-g32": {"quant_method": "gptq", "bits": 4, "group_size": 32,
                               "desc_act": True, "sym": False, "checkpoint_format": "gptq"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
            "version": "gemm"},
    "ct": {"quant_method": "compressed-tensors", "format": "pack-quantized",
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
               "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
               "group_size": 128}}},
           "ignore": ["lm_head", "re:.*mlp\\.gate$"]},
    "ct-asym-g64": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                        "num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                        "group_size": 64}}},
                    "ignore": ["lm_head", "re:.*mlp\\.gate$"]},
}  # fmt: skip


def per_module_weights(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's fused expert tensors → per-expert `experts.E.{gate,up,down}_proj`."""
    out = {}
    for name, t in sd.items():
        if name.endswith("experts.gate_up_proj"):
            prefix, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith("experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def fused_weights(sd: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict:
    """Per-expert float weights back into transformers 5's in-memory fused layout."""
    out = {k: v for k, v in sd.items() if ".experts." not in k}
    for name, t in ref.items():
        if name.endswith("experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            out[name] = torch.stack(
                [torch.cat([sd[f"{prefix}{e}.gate_proj.weight"], sd[f"{prefix}{e}.up_proj.weight"]])
                 for e in range(t.shape[0])]
            )  # fmt: skip
        elif name.endswith("experts.down_proj"):
            prefix = name[: -len("down_proj")]
            out[name] = torch.stack(
                [sd[f"{prefix}{e}.down_proj.weight"] for e in range(t.shape[0])]
            )
    return out


def reference_dequant(kind: str, qc: dict, t: dict[str, torch.Tensor], n: int, k: int):
    if kind == "fp8":
        return pd.fp8_block(t, tuple(qc["weight_block_size"]))
    if kind.startswith("fp8-"):
        return pd.fp8_scaled(t)
    if kind == "nvfp4":
        return pd.nvfp4(t)
    if kind.startswith("gptq"):
        return pd.gptq(t, qc["group_size"])
    if kind == "awq":
        return pd.awq(t, qc["group_size"])
    # compressed-tensors: its own package decompresses
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    scheme = QuantizationScheme(targets=["Linear"], **{
        "weights": qc["config_groups"]["group_0"]["weights"]})  # fmt: skip
    # the package returns the scale's dtype: give it fp32 scales so it does not round
    t = {**t, "weight_scale": t["weight_scale"].float()}
    return PackedQuantizationCompressor.decompress(t, scheme)["weight"]


def _input_key(module: str) -> str:
    """Modules of one input (q/k/v; gate/up of an MLP or expert) share a key."""
    return re.sub(r"\.(gate|up)_proj$", ".gate_up", re.sub(r"\.[qkv]_proj$", ".qkv", module))


def write_quantized(
    arch: str,
    kind: str,
    path: Path,
    seed: int = 0,
    skip: re.Pattern | None = None,
    reference: bool = True,
    quantized: re.Pattern = _QUANTIZED,
    qc_extra: dict | None = None,
    **overrides,
):
    """Write the checkpoint; returns (transformers model with the dequantized weights, path).
    Modules matching `quantized` are quantized unless they match `skip` (and the config's
    ignore list must say so; `qc_extra` adds keys to the quantization config).
    `reference=False` skips the dequantized reference (the model keeps its float weights)."""
    qc = {**json.loads(json.dumps(FORMATS[kind])), **(qc_extra or {})}
    extra = {"shared_expert_intermediate_size": 128} if arch == "qwen2_moe" else {}
    hf = tm.make_hf_model(arch, seed=seed, **{**SHAPE, **extra, **overrides})
    path.mkdir(parents=True, exist_ok=True)
    hf.config.architectures = [type(hf).__name__]
    hf.config.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    if qc["quant_method"] == "modelopt":
        side = {k: v for k, v in qc.items() if k != "quant_method"}
        (path / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": side})
        )
    else:
        cfg["quantization_config"] = qc
    (path / "config.json").write_text(json.dumps(cfg))
    fmt = resolve_quant_config(path, cfg, torch.float32).fmt
    full = hf.state_dict()
    if hf.config.tie_word_embeddings:
        full.pop("lm_head.weight", None)
    tensors, floats = {}, {}
    orders: dict[str, torch.Tensor] = {}  # act-order: input key → column order
    gen = torch.Generator().manual_seed(1000 + seed)
    for name, w in per_module_weights(full).items():
        module = name.removesuffix(".weight")
        if (
            name.endswith(".weight")
            and quantized.search(module)
            and not (skip and skip.search(module))
        ):
            options = {}
            if getattr(fmt, "act_order", False):
                key = _input_key(module)
                orders.setdefault(key, torch.randperm(w.shape[1], generator=gen))
                options["perm"] = orders[key]
            q = {f"{module}.{k}": v.contiguous() for k, v in fmt.quantize(w, **options).items()}
            if qc.get("activation_scheme") == "static":  # the producer's activation scale
                q[f"{module}.input_scale"] = torch.tensor(0.05)
            tensors.update(q)
            local = {k.rsplit(".", 1)[1]: v for k, v in q.items()}
            if reference:
                floats[name] = reference_dequant(kind, qc, local, *w.shape)
        else:
            tensors[name] = w.contiguous()
            floats[name] = w
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    if reference:
        hf.load_state_dict(fused_weights(floats, full), strict=False)
    return hf, path

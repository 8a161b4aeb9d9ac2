"""Test helpers that write GGUF files with the `gguf` package's writer: random valid blocks
of every block type, and a tiny HF model converted the way llama.cpp's converter does it
(GGUF names, llama's q/k permutation, Gemma's 1 + w norms, experts stacked per layer)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

try:  # gguf imports yaml at import time; its writer and dequantizers never use it
    import yaml  # noqa: F401
except ImportError:  # (the GPU machine has no PyYAML)
    sys.modules["yaml"] = types.ModuleType("yaml")

import gguf  # noqa: E402
import numpy as np
import torch

from xinfer.quant.gguf_blocks import BLOCK_TYPES
from xinfer.quant.gguf_quantize import quantize

# byte ranges of each block type's float16 scale fields (kept finite in random blocks)
_F16_FIELDS = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(name: str, rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, row_bytes) uint8 of valid blocks: random bits, finite small f16 scales."""
    bt = BLOCK_TYPES[name]
    if bt.is_float:
        vals = rng.standard_normal((rows, row_len)).astype(np.float32)
        if name == "F32":
            return vals.view(np.uint8)
        if name == "F16":
            return vals.astype(np.float16).view(np.uint8)
        return gguf.quants.quantize(vals, gguf.GGMLQuantizationType.BF16)
    raw = rng.integers(0, 256, size=(rows * row_len // bt.block_size, bt.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[name]:
        scale = (rng.random(raw.shape[0]) * 0.02 + 1e-3).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def random_block_rows(
    name: str, rows: int, row_len: int, seed: int, experts: int | None = None, device="cpu"
) -> torch.Tensor:
    """`random_blocks` as a uint8 tensor on `device` (rows, row_bytes), or with `experts`
    one such tensor an expert, stacked (experts, rows, row_bytes), drawn from one generator."""
    rng = np.random.default_rng(seed)
    if experts is None:
        return torch.from_numpy(random_blocks(name, rows, row_len, rng)).to(device)
    stack = [random_blocks(name, rows, row_len, rng) for _ in range(experts)]
    return torch.from_numpy(np.stack(stack)).to(device)


_NAMES = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.(weight|bias)", r"blk.\1.attn_\2.\3"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blk.\1.attn_output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k)_norm\.weight", r"blk.\1.attn_\2_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blk.\1.ffn_\2.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate\.weight", r"blk.\1.ffn_gate_inp.weight"),
]
_NORMS = {
    "llama": [(r"post_attention_layernorm", "ffn_norm")],
    "gemma3": [
        (r"post_attention_layernorm", "post_attention_norm"),
        (r"pre_feedforward_layernorm", "ffn_norm"),
        (r"post_feedforward_layernorm", "post_ffw_norm"),
    ],
}


def gguf_name(hf_name: str, arch: str) -> str:
    for old, new in _NORMS["gemma3" if arch == "gemma3" else "llama"]:
        hf_name = re.sub(rf"model\.layers\.(\d+)\.{old}\.weight", rf"blk.\1.{new}.weight", hf_name)
    for pattern, repl in _NAMES:
        if re.fullmatch(pattern, hf_name):
            return re.sub(pattern, repl, hf_name)
    return hf_name


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: q/k rows reordered for interleaved RoPE."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _stack_experts(sd: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """transformers 5's fused experts (E, 2I, H) / (E, H, I) → GGUF's three stacks."""
    out = {}
    for name, t in sd.items():
        if m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj", name):
            gate, up = t.numpy().reshape(t.shape[0], 2, -1, t.shape[-1]).swapaxes(0, 1)
            out[f"blk.{m[1]}.ffn_gate_exps.weight"] = gate
            out[f"blk.{m[1]}.ffn_up_exps.weight"] = up
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.down_proj", name):
            out[f"blk.{m[1]}.ffn_down_exps.weight"] = t.numpy()
    return out


def _store(writer: gguf.GGUFWriter, name: str, w: np.ndarray, qtype: str, types=None) -> None:
    qtype = next((t for part, t in (types or {}).items() if part in name), qtype)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim == 1 or qtype == "F32":
        writer.add_tensor(name, w)
        return
    qt = gguf.GGMLQuantizationType[qtype]
    if qtype.endswith("_K"):  # the gguf package has no K-quant quantizer: ours writes them
        data = quantize(torch.from_numpy(w), qtype).numpy()
    else:
        data = w.astype(np.float16) if qtype == "F16" else gguf.quants.quantize(w, qt)
    writer.add_tensor(name, data, raw_dtype=qt)


def byte_vocab() -> tuple[list[str], list[str]]:
    """A 256-token byte-level BPE vocabulary (GPT-2's byte → unicode map) and no merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)], []


def write_gguf(
    model,
    path: Path,
    arch: str,
    qtype: str = "Q8_0",
    meta: dict | None = None,
    types: dict[str, str] | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Convert a tiny transformers model to GGUF: 2-D weights in `qtype` (or `types[part]`
    for GGUF names containing `part`, e.g. {"ffn_down_exps": "Q8_0"}), norms F32; `extra`
    tensors are written F32 as they are (e.g. `rope_freqs.weight`)."""
    cfg = model.config
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if arch != "gemma3" else 1e6)
    for key, value in (meta or {}).items():
        getattr(w, f"add_{key}")(value)
    tokens, merges = byte_vocab()
    tokens = tokens + [f"<extra_{i}>" for i in range(cfg.vocab_size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    experts = _stack_experts(sd)
    for name, t in sd.items():
        if ".experts." in name:
            continue
        g, arr = gguf_name(name, arch), t.numpy()
        if arch == "llama" and ".attn_q." in g:
            arr = _permute(arr, cfg.num_attention_heads)
        if arch == "llama" and ".attn_k." in g:
            arr = _permute(arr, cfg.num_key_value_heads)
        if arch == "gemma3" and g.endswith("norm.weight"):
            arr = arr + 1.0
        if g.endswith("ffn_gate_inp.weight"):
            _store(w, g, arr, "F32")  # routers stay F32 as llama.cpp writes them
            continue
        _store(w, g, arr, qtype, types)
    for g, arr in experts.items():
        _store(w, g, arr, qtype, types)
    for g, arr in (extra or {}).items():
        _store(w, g, arr, "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

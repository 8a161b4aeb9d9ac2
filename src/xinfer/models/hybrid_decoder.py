"""The hybrid decoder of Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet (linear attention)
layers interleaved with gated full-attention layers (`layer_types`), partial rotary, q/k
norms per head, and the MoE block with a shared expert. `HybridConfig` adds the fields only
this family needs to `ModelConfig` and tells the engine which layers keep paged KV and how
much recurrent state a request needs. Norm weights are stored zero-centred in these
checkpoints (the norm multiplies by 1 + w); `adapt_checkpoint` adds the 1 while loading."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from xinfer.config import ModelConfig
from xinfer.errors import UserError
from xinfer.kernels import linear_attn
from xinfer.layers.attention import PagedAttention
from xinfer.layers.gated_delta_net import GatedDeltaNet
from xinfer.layers.linear import Linear, MergedLinear
from xinfer.layers.norm import RMSNorm
from xinfer.layers.rotary import RotaryEmbedding
from xinfer.models.layer_stack import LayerStack
from xinfer.models.moe_decoder import MoeForCausalLM, PreNormDecoderLayer

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class HybridConfig(ModelConfig):
    layer_types: tuple[str, ...] = ()  # LINEAR or FULL per layer
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.layer_types) != self.num_layers or set(self.layer_types) - {LINEAR, FULL}:
            raise UserError(
                f"layer_types must name {LINEAR!r} or {FULL!r} for each of the "
                f"{self.num_layers} layers"
            )
        if self.linear_num_value_heads % max(self.linear_num_key_heads, 1):
            raise UserError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.linear_conv_kernel_dim < 2:
            raise UserError("linear_conv_kernel_dim must be at least 2")

    @property
    def kv_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR]

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_conv_dim(self) -> int:
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * key_dim + self.linear_num_value_heads * self.linear_value_head_dim

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        """Per linear layer: the conv's last K-1 inputs (model dtype) and the float32
        (Hv, Dk, Dv) delta-rule state."""
        elem = torch.empty((), dtype=dtype).element_size()
        conv = (self.linear_conv_kernel_dim - 1) * self.linear_conv_dim * elem
        heads = self.linear_num_value_heads
        ssm = heads * self.linear_key_head_dim * self.linear_value_head_dim * 4
        return len(self.linear_layer_ids) * (conv + ssm)


class GatedAttention(nn.Module):
    """Full attention whose q projection also yields a per-head output gate
    ([q_h | gate_h] per head), q/k RMSNorm per head, partial rotary, sigmoid-gated output."""

    # Tensor parallel: heads split (each head's [q | gate] rows stay together), o_proj's
    # output summed over the ranks; the Gated DeltaNet layers stay whole on every rank.
    tp_plan = {"qkv_proj": "column", "o_proj": "row"}
    tp_output = "partial"

    def __init__(self, cfg: HybridConfig, max_pos: int) -> None:
        super().__init__()
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.num_heads, self.head_dim = nh, hd
        self.sizes = [2 * nh * hd, nkv * hd, nkv * hd]
        parts = {"q": self.sizes[0], "k": self.sizes[1], "v": self.sizes[2]}
        self.qkv_proj = MergedLinear(cfg.hidden_size, parts, bias=cfg.qkv_bias)
        self.o_proj = Linear(nh * hd, cfg.hidden_size)
        self.q_norm, self.k_norm = RMSNorm(hd, cfg.rms_norm_eps), RMSNorm(hd, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.rotary_dim, cfg.rope, max_pos)
        self.attn = PagedAttention(nh, nkv, hd, hd**-0.5)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        q_gate, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        q_gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim)
        q, gate = q_gate[..., : self.head_dim], q_gate[..., self.head_dim :]  # (T, Hq, D) views
        k = k.view(num_tokens, -1, self.head_dim)
        v = v.view(num_tokens, -1, self.head_dim)
        cos_sin = self.rotary.cos_sin_cache
        q = self.attn.prepare_qkv(positions, q, k, v, cos_sin, self.q_norm, self.k_norm)
        out = self.attn(q).view(num_tokens, self.num_heads, self.head_dim)
        return self.o_proj(linear_attn.sigmoid_gate_mul(out, gate))


class HybridDecoderLayer(PreNormDecoderLayer):
    def __init__(
        self,
        cfg: HybridConfig,
        layer_idx: int,
        max_pos: int,
        expert_device: torch.device | None,
        split_projections: bool,
    ) -> None:
        super().__init__()
        self.is_linear = cfg.layer_types[layer_idx] == LINEAR
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(
                cfg.hidden_size,
                cfg.linear_num_key_heads,
                cfg.linear_num_value_heads,
                cfg.linear_key_head_dim,
                cfg.linear_value_head_dim,
                cfg.linear_conv_kernel_dim,
                cfg.rms_norm_eps,
                split_projections,
            )
        else:
            self.self_attn = GatedAttention(cfg, max_pos)
        self.add_mlp_and_norms(cfg, layer_idx, expert_device)

    def mix(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.linear_attn(x) if self.is_linear else self.self_attn(positions, x)


class HybridModel(nn.Module):
    def __init__(
        self,
        cfg: HybridConfig,
        max_pos: int,
        expert_device: torch.device | None,
        split_projections: bool,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(cfg, i, max_pos, expert_device, split_projections)
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def layer_stack(self) -> LayerStack:
        """What `forward` chains, for a layer-by-layer driver (models/layer_stack.py): each
        layer runs its chunks in order, so its recurrent state advances as chunk by chunk."""
        return LayerStack(self.embed_tokens, list(self.layers), self.norm)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class HybridForCausalLM(MoeForCausalLM):
    """Subclasses say how their checkpoints store the linear layers' input projections
    (`split_projections`, see `GatedDeltaNet`) and may rewrite the checkpoint stream."""

    split_projections = False
    # the recurrent state of a linear-attention layer cannot be rebuilt from cached KV blocks
    supports_prefix_caching = False

    def build_model(
        self, cfg: ModelConfig, max_pos: int, expert_device: torch.device | None
    ) -> nn.Module:
        if not isinstance(cfg, HybridConfig):
            raise TypeError("a hybrid model needs a HybridConfig")
        return HybridModel(cfg, max_pos, expert_device, self.split_projections)

    def adapt_checkpoint(
        self, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in tensors:
            # every RMSNorm but the gated one (linear_attn.norm) scales by 1 + w
            if name.endswith("norm.weight") and ".linear_attn." not in name:
                tensor = tensor.float() + 1.0  # rounded once, into the parameter's dtype
            yield name, tensor

    def state_layers(self) -> list[nn.Module]:
        return [m for m in self.modules() if isinstance(m, GatedDeltaNet)]

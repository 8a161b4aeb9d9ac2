"""The decoder shared by our MoE architectures (pre-norm attention + MoE/dense MLP). Model
files subclass `MoeForCausalLM`, build their `ModelConfig` (`config_from_hf`) and state how
their checkpoint differs."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from xinfer import kernels
from xinfer.config import ModelConfig
from xinfer.layers.attention import PagedAttention
from xinfer.layers.linear import Linear, MergedLinear
from xinfer.layers.mlp import GatedMLP
from xinfer.layers.moe import FusedMoE
from xinfer.layers.norm import RMSNorm
from xinfer.layers.rotary import RotaryEmbedding
from xinfer.models.layer_stack import LayerStack


class DecoderAttention(nn.Module):
    tp_output = "partial"  # tensor parallel: heads split, o_proj's output summed over ranks

    @property
    def tp_plan(self) -> dict[str, str]:
        plan = {"qkv_proj": "column", "o_proj": "row"}
        if self.qk_norm == "full":  # normalised over all heads: statistics over the ranks
            plan.update(q_norm="norm_over_heads", k_norm="norm_over_kv_heads")
        return plan

    def __init__(self, cfg: ModelConfig, max_pos: int) -> None:
        super().__init__()
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.q_size, self.kv_size, self.head_dim = nh * hd, nkv * hd, hd
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, {"q": nh * hd, "k": nkv * hd, "v": nkv * hd}, bias=cfg.qkv_bias
        )
        self.o_proj = Linear(nh * hd, cfg.hidden_size)
        self.qk_norm, self.clip_qkv = cfg.qk_norm, cfg.clip_qkv
        if cfg.qk_norm == "head":  # Qwen3: per head, after the reshape
            self.q_norm, self.k_norm = RMSNorm(hd, cfg.rms_norm_eps), RMSNorm(hd, cfg.rms_norm_eps)
        elif cfg.qk_norm == "full":  # OLMoE: over the whole projection
            self.q_norm = RMSNorm(nh * hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(nkv * hd, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(hd, cfg.rope, max_pos)
        self.attn = PagedAttention(nh, nkv, hd, hd**-0.5)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.reshape(q.shape[0], -1, self.head_dim)  # (T, Hq, D)
        k = k.reshape(k.shape[0], -1, self.head_dim)  # (T, Hk, D)
        v = v.reshape(v.shape[0], -1, self.head_dim)
        head_norms = (self.q_norm, self.k_norm) if self.qk_norm == "head" else ()
        q = self.attn.prepare_qkv(positions, q, k, v, self.rotary.cos_sin_cache, *head_norms)
        return self.o_proj(self.attn(q))


class SparseMoeBlock(nn.Module):
    """Routed experts, plus Qwen2-MoE's shared expert behind a sigmoid gate when configured."""

    # Tensor parallel: the router and shared-expert gate are replicated; the experts and the
    # shared expert give partial sums, added up once for the whole block.
    tp_output = "partial"

    def __init__(self, cfg: ModelConfig, expert_device: torch.device | str | None) -> None:
        super().__init__()
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, quantizable=False)  # router
        self.experts = FusedMoE(
            cfg.num_experts,
            cfg.num_experts_per_tok,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.norm_topk_prob,
            expert_device,
        )
        self.shared_expert = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(cfg.hidden_size, 1, quantizable=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.experts.run(x, *self.route(x)))

    # A prompt pass runs the block in three parts so that its chunks' routed-expert runs
    # can be one (runner/expert_merge.py): route per chunk, `experts.run`, finish per chunk.
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, H) → the experts' choice (topk_weights, topk_ids) for `experts.run`."""
        return self.experts.route(x, self.gate)

    def finish(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """The block's output from its input x and the routed experts' output."""
        if self.shared_expert is None:
            return routed
        shared = self.shared_expert(x)
        gate_weight = self.shared_expert_gate.plain_weight(x.dtype)
        if gate_weight is not None:  # the gate's dot product inside the add's launch
            return kernels.sigmoid_gated_add(routed, x, shared, gate_weight=gate_weight)
        return kernels.sigmoid_gated_add(routed, self.shared_expert_gate(x), shared)


class PreNormDecoderLayer(nn.Module):
    """A pre-norm layer: its token mixer (`mix`: attention, or linear attention in the hybrid
    decoder) and then the MoE or dense MLP of `layer_idx`, each after an RMSNorm that also
    adds the residual. Subclasses build the mixer, then call `add_mlp_and_norms`."""

    def add_mlp_and_norms(
        self, cfg: ModelConfig, layer_idx: int, expert_device: torch.device | None
    ) -> None:
        if cfg.is_moe_layer(layer_idx):
            self.mlp: nn.Module = SparseMoeBlock(cfg, expert_device)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def mix(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.forward_attention(positions, x, residual)
        return self.mlp(x), residual

    def forward_attention(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer up to its MLP: (the MLP's input, the residual)."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        return self.post_attention_layernorm(self.mix(positions, x), residual)


class DecoderLayer(PreNormDecoderLayer):
    def __init__(
        self, cfg: ModelConfig, layer_idx: int, max_pos: int, expert_device: torch.device | None
    ) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(cfg, max_pos)
        self.add_mlp_and_norms(cfg, layer_idx, expert_device)

    def mix(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.self_attn(positions, x)


class MoeModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_pos: int, expert_device: torch.device | None) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, max_pos, expert_device) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def layer_stack(self) -> LayerStack:
        """What `forward` chains, for a layer-by-layer driver (models/layer_stack.py)."""
        return LayerStack(self.embed_tokens, list(self.layers), self.norm)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class MoeForCausalLM(nn.Module):
    """`forward(input_ids (T,), positions (T,)) → hidden (T, H)`; `compute_logits` → float32.

    Batch metadata (KV slots, block tables) comes from the forward context. Subclasses state
    how their checkpoint differs: `checkpoint_renames`, `merged_projections` and
    `adapt_checkpoint` (tensors to skip or reshape), and may build another decoder stack."""

    # (old, new) substrings applied to checkpoint names before mapping; "{e}" = expert index.
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    # checkpoint projection name → (merged parameter, part), beside the q/k/v and gate/up ones
    merged_projections: dict[str, tuple[str, str]] = {}
    # False for models with per-request state that cached KV blocks cannot restore (linear
    # attention's recurrent state): the engine then turns prefix caching off.
    supports_prefix_caching: bool = True
    tp_plan = {"lm_head": "vocab"}  # tensor parallel: the embedding stays replicated

    def __init__(
        self, cfg: ModelConfig, max_pos: int, expert_device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.config = cfg
        self.model = self.build_model(cfg, max_pos, expert_device)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, quantizable=False)
        )

    def build_model(
        self, cfg: ModelConfig, max_pos: int, expert_device: torch.device | None
    ) -> nn.Module:
        return MoeModel(cfg, max_pos, expert_device)

    def adapt_checkpoint(
        self, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's (name, tensor) stream as this model loads it: unchanged here."""
        return tensors

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return kernels.linear(hidden, self.model.embed_tokens.weight).float()
        return self.lm_head(hidden).float()  # its format's kernels (a GGUF head stays raw)

    def layer_stack(self) -> LayerStack | None:
        """The decoder for a layer-by-layer driver (the long-prompt pass); None where the
        decoder (a subclass's own) does not offer one."""
        make = getattr(self.model, "layer_stack", None)
        return make() if make is not None else None

    def moe_layers(self) -> list[FusedMoE]:
        return [m for m in self.modules() if isinstance(m, FusedMoE)]

    def attention_layers(self) -> list[PagedAttention]:
        return [m for m in self.modules() if isinstance(m, PagedAttention)]

    def state_layers(self) -> list[nn.Module]:
        """Layers with per-request recurrent state (`state_shapes`, `bind_state`): none."""
        return []

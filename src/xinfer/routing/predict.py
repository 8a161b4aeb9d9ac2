"""The prefetch predictor of the routing model (benchmarks with dummy weights, whose routers
route nothing like real ones). It is not a mechanism but a stand-in with the published
accuracy: for a decode token it computes the routing model's own next draw of the target
layer (the drift state c the layer will reach, read only, and the same Gumbel noise), blurs
the scores with `blur`·N(0, 1) from a noise stream of its own, and selects as every
predictor does (`offload.predictor.select`). `blur` is solved once at start-up (bisection on
a fixed sample) so that the top-k recall equals the published figure for the distance:
88.6% one layer ahead for 128 experts (80.7% for 256), 3.75 points less per further layer.
The twin here and `predict_model_kernel` (kernels/triton/prefetch.py) compute the same."""

from __future__ import annotations

import torch

from xinfer.kernels import use_triton
from xinfer.offload.predictor import select_reference
from xinfer.routing import noise
from xinfer.routing.batch import sequence_batch
from xinfer.routing.config import RoutingModelParams
from xinfer.routing.parametric import ParametricRouting
from xinfer.routing.parametric_ops import LayerConstants, RoutingState, SequenceBatch
from xinfer.runner.forward_context import ForwardContext

BLUR = 6  # hash stream of the predictor's blur (routing/noise.py uses 1-3, z uses 4)
RECALL_PER_LAYER = 0.0375  # published: 3.5-4 points less per further layer of lookahead


def published_recall(num_experts: int, distance: int) -> float:
    """Top-k recall of the router-on-an-earlier-hidden-state predictor, as published."""
    one_ahead = 0.886 if num_experts <= 128 else 0.807
    return one_ahead - RECALL_PER_LAYER * (distance - 1)


def recall(predicted: torch.Tensor, actual: torch.Tensor) -> float:
    """Mean fraction of each row's actual ids (T, k) found among its predicted ids."""
    hits = (predicted[:, :, None] == actual[:, None, :]).any(dim=1)
    return hits.float().mean().item()


def calibrate_blur(
    params: RoutingModelParams,
    num_experts: int,
    top_k: int,
    target: float,
    num_tokens: int = 4096,
    seed: int = 0,
) -> float:
    """The blur whose top-k recall (fully scaled layer, stationary drift) is `target`."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_tokens, num_experts)
    z = torch.randn(num_experts, generator=gen)
    c = torch.randn(shape, generator=gen)  # AR(1) drift at its stationary law N(0, 1)
    u = torch.rand(shape, generator=gen).clamp_(1e-7, 1 - 1e-7)
    score = params.sigma * z + params.tau * c - torch.log(-torch.log(u))
    blur_noise = torch.randn(shape, generator=gen)
    actual = score.topk(top_k, dim=-1).indices
    lo, hi = 0.0, 64.0
    for _ in range(40):
        mid = (lo + hi) / 2
        got = recall((score + mid * blur_noise).topk(top_k, dim=-1).indices, actual)
        lo, hi = (mid, hi) if got > target else (lo, mid)
    return (lo + hi) / 2


def peek_drift(state: RoutingState, batch: SequenceBatch, const: LayerConstants) -> torch.Tensor:
    """(B, E) c of each decode token as `advance_state` will compute it, without writing."""
    keys, rows = batch.keys, batch.rows
    pos = batch.seq_lens.long() - 1
    num_experts = state.c.shape[1]
    eps = noise.normal(noise.token_hash(const.step_base, keys, pos), num_experts)
    fresh = noise.normal(noise.token_hash(const.init_base, keys, pos), num_experts)
    prev_c, prev_pos, prev_key = state.c[rows], state.pos[rows], state.key[rows]
    is_same = ((keys >= 0) & (prev_key == keys))[:, None]
    follows = is_same & ((prev_pos == pos - 1) & (pos > 0))[:, None]
    repeats = is_same & (prev_pos == pos)[:, None]
    return torch.where(
        follows, const.phi * prev_c + const.innovation * eps, torch.where(repeats, prev_c, fresh)
    )


def predict_model_reference(
    state: RoutingState,
    batch: SequenceBatch,
    const: LayerConstants,
    blur_base: int,
    blur: float,
    top_k: int,
    margin: float,
) -> torch.Tensor:
    """→ ids (B, k) int32 (-1: not predicted) for a decode call."""
    c = peek_drift(state, batch, const)
    num_experts = c.shape[1]
    pos = batch.seq_lens.long() - 1
    g = noise.gumbel(noise.token_hash(const.gumbel_base, batch.keys, pos), num_experts)
    blur_noise = noise.normal(noise.token_hash(blur_base, batch.keys, pos), num_experts)
    score = const.popularity[None, :] + const.drift_scale * c + g + blur * blur_noise
    return select_reference(score, top_k, margin, batch.keys)


def predict_model(
    state: RoutingState,
    batch: SequenceBatch,
    const: LayerConstants,
    blur_base: int,
    blur: float,
    top_k: int,
    margin: float,
    *,
    force_triton: bool = False,
) -> torch.Tensor:
    if not batch.is_decode:
        raise ValueError("the routing model's predictor runs on decode calls only")
    if not (force_triton or use_triton(state.c)):
        return predict_model_reference(state, batch, const, blur_base, blur, top_k, margin)
    import triton

    from xinfer.kernels.triton.prefetch import predict_model_kernel

    num_seqs, num_experts = batch.seq_lens.shape[0], state.c.shape[1]
    ids = torch.empty(num_seqs, top_k, dtype=torch.int32, device=state.c.device)
    if num_seqs == 0:
        return ids
    block_e = triton.next_power_of_2(num_experts)
    predict_model_kernel[(num_seqs,)](
        batch.seq_lens, batch.rows, batch.keys, state.c, state.pos, state.key,
        const.popularity, ids, num_experts, const.step_base, const.init_base,
        const.gumbel_base, blur_base, const.phi, const.innovation, const.drift_scale,
        float(blur), float(margin),
        TOP_K=top_k, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=4 if block_e >= 512 else 2,
    )  # fmt: skip
    return ids


class ModelPredictor:
    """The routing model's predictor for every target layer (see the module docstring)."""

    name = "routing-model"
    # It runs on the prefetch stream (offload/prefetch.py), as the router's predictor does.
    # It reads its target layer's routing state, which that layer's routing advances on the
    # main stream d layers later: the source waits for the read before it advances the state
    # (`wait_for_read`, the source's `before_advance`).
    on_side_stream = True

    def __init__(
        self,
        source: ParametricRouting,
        top_ks: list[int],
        margin: float,
        distance: int,
        seed: int,
    ) -> None:
        self.source, self.top_ks, self.margin = source, top_ks, margin
        num_experts = [const.popularity.shape[0] for const in source.constants]
        solved: dict[tuple[int, int], float] = {}  # one bisection per (E, k)
        for e, k in zip(num_experts, top_ks):
            if (e, k) not in solved:
                solved[e, k] = calibrate_blur(source.params, e, k, published_recall(e, distance))
        self.blur = [solved[e, k] for e, k in zip(num_experts, top_ks)]
        self.blur_base = [noise.layer_base(seed, BLUR, layer) for layer in range(len(top_ks))]
        self.device = source.constants[0].popularity.device
        is_cuda = self.device.type == "cuda"
        self.read_done = [torch.cuda.Event() if is_cuda else None for _ in top_ks]
        self.is_reading = [False] * len(top_ks)  # host: an event to wait for, per layer
        source.before_advance = self.wait_for_read

    def wait_for_read(self, layer: int) -> None:
        """Before `layer`'s routing advances its state: the current stream waits until this
        step's prediction of `layer`, if any, has read it."""
        if self.is_reading[layer]:
            torch.cuda.current_stream(self.device).wait_event(self.read_done[layer])
            self.is_reading[layer] = False

    def __call__(
        self, target: int, hidden: torch.Tensor, ctx: ForwardContext | None
    ) -> torch.Tensor:
        if ctx is None or not ctx.is_decode:
            raise ValueError("the routing model's predictor runs on decode calls only")
        ids = predict_model(
            self.source.states[target],
            sequence_batch(ctx),
            self.source.constants[target],
            self.blur_base[target],
            self.blur[target],
            self.top_ks[target],
            self.margin,
        )
        if self.read_done[target] is not None:
            self.read_done[target].record(torch.cuda.current_stream(self.device))
            self.is_reading[target] = True
        return ids

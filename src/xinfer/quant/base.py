"""The weight-format interface. A `WeightFormat` describes how one logical (N, K) weight
(N outputs, K inputs) is stored in the engine and in a checkpoint, and how to compute with it:
its tensor set, the conversion of each checkpoint tensor into that set, the pure-torch
dequantize twin and the launchers of its kernels. Unquantized bf16/fp16/fp32 is a format too.

Expert layers hold the same tensor set with a leading E dim (`expert_specs`), as a plain dict
of `[E, ...]` tensors: offload, slots, fill and stats never look inside it."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from xinfer.errors import UserError
from xinfer.kernels import reference

# The two projections of a routed expert: gate|up rows (N = 2I, K = H) and down (N = H, K = I).
EXPERT_PROJS = ("w13", "w2")


@dataclass(frozen=True)
class TensorSpec:
    """One engine tensor of a (N, K) weight. Dim 0 indexes N in units of `n_block` rows (None:
    the tensor has no N dim and is replicated); the last dim indexes K in units of `k_block`
    columns (None: no K dim). Merged projections, expert halves and tensor-parallel shards
    are row (or column) ranges of these tensors, which is why a split must align to them."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    n_block: int | None = 1
    k_block: int | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class KernelWeights:
    """What the shared quantized kernels (`kernels/quant_launch.py`) read of one weight (or
    one `[E, ...]` expert set): `fmt_code` selects the tile decoder of
    `kernels/triton/quant_dequant.py`; `w`, `s`, `z` are the packed weight, its scales and the
    optional third tensor; scales cover `scale_bn` rows x `scale_bk` columns each. `perm`
    (K,), or (E, K) for an expert set: an act-order weight's column order (`quant/act_order.py`):
    column j of `w` multiplies x[perm[j]], so the kernels load x through it; None: x as it lies."""

    fmt_code: int
    w: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor | None = None
    scale_bn: int = 1
    scale_bk: int = 1
    has_zero: bool = False
    perm: torch.Tensor | None = None


def row_slice(dst: torch.Tensor, n_block: int | None, start: int, rows: int, what: str):
    """Rows [start, start + rows) of N in a tensor whose dim 0 counts `n_block` rows each
    (None: no N dim, a per-weight value, the same for every part): where a merged part, an
    expert half or a shard lies in an engine tensor."""
    if n_block is None:
        return dst
    if start % n_block or rows % n_block:
        raise UserError(
            f"{what} covers rows {start}..{start + rows} of a weight whose format stores "
            f"{n_block} rows per block; such checkpoints cannot be merged (not supported)"
        )
    return dst[start // n_block : (start + rows) // n_block]


def expert_key(proj: str, name: str) -> str:
    """Key of an engine tensor in an expert set: `w13`, `w2` for the weight itself (so an
    unquantized set is {w13, w2}), `w13_<name>` / `w2_<name>` for the others."""
    return proj if name == "weight" else f"{proj}_{name}"


def split_expert_set(
    tensors: dict[str, torch.Tensor], names: tuple[str, ...]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An expert set (or slot set) → the (w13, w2) tensor sets keyed by format names."""
    w13 = {n: tensors[expert_key("w13", n)] for n in names}
    w2 = {n: tensors[expert_key("w2", n)] for n in names}
    return w13, w2


class WeightFormat(ABC):
    """How one (N, K) weight is stored and multiplied. Subclasses are immutable values: two
    layers with equal formats share kernels and tile tables."""

    #: short name used in messages, stats and benchmark tables (e.g. "fp8-block-128x128")
    name: str = "?"
    #: whether weights are quantized (False only for the plain float formats)
    is_quantized: bool = True

    # --- layout -------------------------------------------------------------------------
    @abstractmethod
    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        """Engine tensors of one (N, K) weight, by name."""

    @abstractmethod
    def checkpoint_names(self) -> tuple[str, ...]:
        """Checkpoint tensor names (after the module prefix) this format reads, e.g.
        ("weight", "weight_scale_inv"); anything else under a quantized module is refused."""

    def required_checkpoint_names(self) -> tuple[str, ...]:
        """The checkpoint names that must be present (the rest are optional or only checked)."""
        return self.checkpoint_names()

    @abstractmethod
    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        """One checkpoint tensor of a (n, k) weight (or merged part) → the engine tensors it
        fills, shaped as `tensor_specs(n, k)`. Raises UserError when it does not match the
        declared format (dtype, shape). May return {} for tensors that are only checked."""

    def part_views(
        self, tensors: dict[str, torch.Tensor], n: int, k: int, start: int, rows: int, what: str
    ) -> tuple[WeightFormat, dict[str, torch.Tensor]]:
        """Rows [start, start + rows) of this (n, k) weight (a merged part) as the loader fills
        them: the format that part's checkpoint tensors convert in, and the views of
        `tensors` (this weight's engine tensors) they go to, keyed by that format's tensor
        names. Default: this format, each tensor's row range (`row_slice`)."""
        return self, {
            name: row_slice(tensors[name], spec.n_block, start, rows, what)
            for name, spec in self.tensor_specs(n, k).items()
        }

    @property
    def splits_for_tensor_parallel(self) -> bool:
        """Whether a rank may hold a share of this format's weights (`model_loader` refuses
        tensor parallelism before loading where not)."""
        return True

    def finish_loading(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> None:
        """After every checkpoint tensor of one (N, K) weight was converted into `tensors`:
        the work that needs several of them at once, in place (act-order int4 sorts its
        codes by g_idx). Default: nothing."""
        return None

    def finish_experts(
        self, w13: dict[str, torch.Tensor], w2: dict[str, torch.Tensor], hidden: int, inter: int
    ) -> None:
        """`finish_loading` of a routed-expert layer's `[E, ...]` sets (keyed by this format's
        names), which may also move work between the two projections. Default: nothing."""
        return None

    def expert_specs(self, num_experts: int, n: int, k: int) -> dict[str, TensorSpec]:
        return {
            name: TensorSpec((num_experts, *s.shape), s.dtype, s.n_block, s.k_block)
            for name, s in self.tensor_specs(n, k).items()
        }

    def weight_bytes(self, n: int, k: int) -> int:
        """Bytes of one (N, K) weight as stored (and moved by offload)."""
        return sum(s.nbytes for s in self.tensor_specs(n, k).values())

    def split_alignment(self, n: int, k: int) -> tuple[int, int]:
        """(N, K) multiples at which this weight can be cut (merged parts, TP shards)."""
        specs = self.tensor_specs(n, k).values()
        n_align = math.lcm(1, *(s.n_block for s in specs if s.n_block))
        k_align = math.lcm(1, *(s.k_block for s in specs if s.k_block))
        return n_align, k_align

    def dummy(self, n: int, k: int, generator: torch.Generator, std: float) -> dict:
        """Valid random engine tensors for benchmarks: N(0, std) weights, quantized, made on
        the generator's device."""
        w = torch.empty(n, k, dtype=torch.float32, device=generator.device)
        return self.engine_tensors(w.normal_(0, std, generator=generator))

    def kernel_weights(self, tensors: dict[str, torch.Tensor], k: int) -> KernelWeights:
        """This weight's tensors (or `[E, ...]` set, K = `k`) as the shared quantized kernels
        read them; a format with kernels of its own overrides `triton_*` instead."""
        raise NotImplementedError(f"{self.name} has no shared-kernel description")

    # --- numerics -----------------------------------------------------------------------
    @abstractmethod
    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        """The twin: (N, K) float32 weight from the engine tensors of one weight."""

    @abstractmethod
    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Our quantizer: a float (N, K) weight → checkpoint tensors in the producer's exact
        on-disk layout (what `convert` reads). Used by tests, dummy weights and ISQ."""

    def engine_tensors(self, weight: torch.Tensor, **options) -> dict[str, torch.Tensor]:
        """A float (N, K) weight → engine tensors (quantize with `options`, convert, finish)."""
        n, k = weight.shape
        out: dict[str, torch.Tensor] = {}
        for name, t in self.quantize(weight, **options).items():
            out.update(self.convert(name, t, n, k))
        self.finish_loading(out, n, k)
        return out

    def reference_linear(
        self,
        x: torch.Tensor,
        tensors: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
        n: int,
        k: int,
    ) -> torch.Tensor:
        """The twin of `triton_linear`: x (..., K) @ W^T in x's dtype, with W dequantized to
        x's dtype first."""
        return reference.linear(x, self.dequantize(tensors, n, k).to(x.dtype), bias)

    def triton_linear(
        self,
        x: torch.Tensor,
        tensors: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
        n: int,
        k: int,
    ) -> torch.Tensor:
        """The GPU path (x on CUDA); a format without kernels runs its twin."""
        return self.reference_linear(x, tensors, bias, n, k)

    def reference_moe(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        w13: dict[str, torch.Tensor],
        w2: dict[str, torch.Tensor],
        inter: int,
        w2_fmt: WeightFormat | None = None,
    ) -> torch.Tensor:
        """The twin of `triton_moe`: `reference.fused_moe` with the experts this call uses
        dequantized to the hidden dtype (an expert's bits do not depend on the others).
        `w2_fmt`: the format of w2 when it differs from this one (only formats whose
        kernels run such pairs, e.g. GGUF block types, are handed one)."""
        num_ids, hidden_dim = next(iter(w13.values())).shape[0], hidden.shape[-1]
        d13 = hidden.new_zeros(num_ids, 2 * inter, hidden_dim)
        d2 = hidden.new_zeros(num_ids, hidden_dim, inter)
        down = w2_fmt or self
        for e in torch.unique(topk_ids.reshape(-1).long()).tolist():
            d13[e] = self.dequantize({n: t[e] for n, t in w13.items()}, 2 * inter, hidden_dim)
            d2[e] = down.dequantize({n: t[e] for n, t in w2.items()}, hidden_dim, inter)
        return reference.fused_moe(hidden, topk_ids, topk_weights, d13, d2)

    def triton_moe(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        w13: dict[str, torch.Tensor],
        w2: dict[str, torch.Tensor],
        inter: int,
        max_ids: int | None = None,
    ) -> torch.Tensor:
        """The GPU path: routed experts on `[N, ...]` tensor sets (experts or slots).
        `max_ids`: at most this many distinct ids in `topk_ids` (an offloaded layer's E,
        where the set is a slot view of many more rows), for kernels whose work would
        otherwise grow with N; None: up to N."""
        return self.reference_moe(hidden, topk_ids, topk_weights, w13, w2, inter)

    def moe_merge_key(self, num_pairs: int, hidden: torch.Tensor) -> object | None:
        """The GPU path's choice of kernel and tiles for a routed-expert call of `num_pairs`
        (token, k) pairs, where that choice alone fixes each row's bits (calls with equal keys
        may be joined into one); None where a row's bits may depend on the call: never join."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class SharedKernelFormat(WeightFormat):
    """A format run by the shared quantized kernels (`kernels/quant_launch.py`: in-register
    GEMV / GEMM, `quant_prefill` for prefill-sized calls) from its `kernel_weights`: FP8,
    INT4 (GPTQ, AWQ, compressed-tensors) and NVFP4."""

    # Whether expert calls of prefill size (`quant_launch.PREFILL_MIN_PAIRS` pairs and up)
    # dequantize the experts they use and run the bf16 grouped GEMMs (`quant_prefill`), or
    # multiply in registers as decode does: the faster of the two, measured per format.
    dequant_experts_in_prefill = True
    # The MoE GEMV's tiles (`quant_launch.gemv_tiles`), measured per format: columns a step
    # (None: ~2 KB of stored bytes a row tile) and gate and up read in one loop.
    moe_gemv_block_k = None
    moe_gemv_joined = True
    # The in-register grouped GEMMs' tile for expert calls of prefill size (from
    # `quant_launch.PREFILL_MIN_PAIRS` pairs, where they do not dequantize), measured per
    # format: (block_m, block_n, block_k, num_warps, num_stages); None: 64 x 64 x 64, 4 warps.
    moe_prefill_tiles: tuple[int, int, int, int, int] | None = None
    # The decode linears' GEMV-form tile (`quant_launch.linear_tiles`), measured per format:
    # (block_n, block_k, num_warps), one tile for the one-row and four-row kernels so a row's
    # bits do not depend on the batch; None: 8 rows of ~2 KB of stored bytes, 8 warps.
    decode_linear_tiles: tuple[int, int, int] | None = None
    # Whether a decode linear's call of one row runs the one-row GEMV rather than the
    # four-row kernel (faster: no decode shared with absent rows): only where the GPU test
    # (`test_linear_rows_do_not_depend_on_the_batch`) shows the two compiled kernels give a
    # row the same bits, so a row's output never depends on the batch.
    decode_one_row_alone = False
    # Whether the factored GEMVs sum this format's products eight columns at a time within a
    # thread and across threads once after the K loop (`quant_launch.CHUNK_SUMS`), rather
    # than each group's sum across threads every step: measured per format end to end.
    factored_chunks = False

    @abstractmethod
    def kernel_weights(self, tensors: dict[str, torch.Tensor], k: int) -> KernelWeights: ...

    def triton_linear(self, x, tensors, bias, n, k):
        from xinfer.kernels import quant_launch

        return quant_launch.linear(x, self, tensors, bias, n, k)

    def triton_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter, max_ids=None):
        from xinfer.kernels import quant_launch

        return quant_launch.fused_moe(
            hidden, topk_ids, topk_weights, self, w13, w2, inter, max_ids=max_ids
        )

    def moe_merge_key(self, num_pairs, hidden):
        from xinfer.kernels import quant_launch

        return quant_launch.moe_merge_key(num_pairs, hidden, self)

"""Launch census of one decode step on the GPU code path, run on a CPU: how many kernels a
decode step launches and which, per layer kind, for a tiny random checkpoint of an
architecture. Every decode kernel costs ~1-3 µs of launch latency and tail in a CUDA graph
whatever its work (batch-1 decode of Qwen3-30B-A3B: 677 kernels in a 3.3 ms step), so the
count is a lever of its own; the shapes do not change it, which is why a tiny model will do.

How: Triton runs in its CPU interpreter and `kernels.use_triton` answers True for CPU
tensors, so the engine takes its GPU path; a TorchDispatchMode counts the aten ops that
would launch a kernel (views, reshapes and allocations launch none) and a wrapper counts
Triton launches. The step is the difference between generating n + 1 and n tokens.

    python3 bench/launch_census.py --arch qwen3_5_moe [--batch 1] [--moe-offload 0.5]

Not a timing: the counts are what the GPU path launches outside cuBLAS's own internals
(one F.linear = one kernel here and on the GPU, as in the H200 traces). Host-side checks
that run only for CPU tensors show up too (under offload: the lookup's id range check,
torch.min/max a MoE layer); the H200 does not run them."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# ops that allocate or reinterpret memory without a kernel
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "unsqueeze",
    "squeeze", "expand", "slice", "select", "alias", "detach", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "unbind", "split", "split_with_sizes",
    "chunk", "narrow", "_reshape_alias", "lift_fresh", "view_as", "diagonal", "unfold",
    "_local_scalar_dense", "item", "is_nonzero", "resolve_conj", "resolve_neg", "set_",
    "split_tensor", "contiguous", "sym_size", "sym_stride", "dim", "size", "stride",
    "promote_types", "detach_", "to",  # `to` without a copy (a copy shows as _to_copy)
}  # fmt: skip


class Census(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.inside_triton = 0  # the interpreter's own torch ops are not launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if not self.inside_triton and name not in NO_KERNEL:
            self.ops[f"torch.{name}"] += 1
        return out


def _count_triton(census: Census) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        if not census.inside_triton:
            census.ops[f"triton.{self.fn.__name__}"] += 1
        census.inside_triton += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            census.inside_triton -= 1

    InterpretedFunction.run = counted


def _take_gpu_path(kernels) -> None:
    """`use_triton` answers True for CPU tensors (the interpreter runs the kernels), in
    `xinfer.kernels` and in every module that imported the function by name."""
    original = kernels.use_triton

    def always(t) -> bool:
        return True

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("xinfer") and (
            getattr(module, "use_triton", None) is original
        ):
            module.use_triton = always


def census(arch: str, batch: int = 1, tokens: int = 3, **options) -> tuple[Counter[str], int]:
    """(launches of one decode step by name, the model's layers) for `arch`'s tiny model;
    `options`: engine options (e.g. moe_offload="0.5")."""
    from tiny_models import make_hf_model, write_checkpoint

    from xinfer import kernels
    from xinfer.llm import LLM
    from xinfer.sampling import SamplingParams

    _take_gpu_path(kernels)
    counter = Census()
    _count_triton(counter)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(make_hf_model(arch, seed=0), Path(tmp))
        llm = LLM(str(path), device="cpu", **options)
        prompts = [[5 + i, 17, 33, 2] for i in range(batch)]

        def run(n: int) -> Counter[str]:
            counter.ops.clear()
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            with counter:
                llm.generate(prompts, params)
            return Counter(counter.ops)

        base, more = run(tokens), run(tokens + 1)
    return more - base, llm.engine.model_config.num_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen3_moe")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=3, help="decode steps before the counted one")
    ap.add_argument("--moe-offload", default=None, help="an expert fraction, e.g. 0.5")
    args = ap.parse_args()
    options = {"moe_offload": args.moe_offload} if args.moe_offload else {}
    step, layers = census(args.arch, args.batch, args.tokens, **options)
    total = sum(step.values())
    print(f"{args.arch}, batch {args.batch}: {total} launches a decode step, {layers} layers")
    for name, n in sorted(step.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()

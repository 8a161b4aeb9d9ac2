"""One layer of a prompt pass with its chunks' routed-expert calls joined: each chunk runs
the layer up to the MoE block and its router, in order (each chunk's attention sees the KV
of the chunks before it); then consecutive chunks whose calls have the same merge key run
the experts as one call; then each chunk finishes its block (a shared expert, per chunk).

Why: a 2,048-token chunk of a realistically routed prompt touches every expert of a layer,
so per chunk the grouped GEMMs stream the whole layer's weights for little math, and each
call pays its align and launches on the host. One call per layer over a 32k prompt's sixteen
chunks streams them once (bench/NOTES.md, sixth session).

Bits: a layer's routed-expert call gives a token the same bits whatever the other tokens
when its kernel and tiles are the same (`FusedMoE.merge_key`: the grouped GEMMs' rows are
independent, their K order fixed by the tiles). Chunks are joined only while the joined
call keeps the key of each chunk's own call, so the pass stays equal to the chunked path
bit for bit. The router and the dense projections (cuBLAS, whose choice depends on M) stay
per chunk. Layers that do not offer the parts (`forward_attention`, an MLP with `route`,
`experts` and `finish`), blocks whose output is reduced over tensor-parallel ranks (a
forward hook), and formats without a key run chunk by chunk as before."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from xinfer.runner.forward_context import forward_context

# Most bytes of the transient buffers of one joined call (per (token, k) pair: the gate/up
# output, 2I, and the unweighted expert output, H, in the activation dtype): the engine's
# memory plan keeps a fixed 1 GiB workspace (engine/memory.py) that one step's calls fit in;
# a joined call must fit in it too. Qwen3-30B-A3B: 57 KB a token, 9.4k tokens. Formats that
# dequantize their experts (key "dequant") add at most quant_prefill.CHUNK_BYTES (256 MiB)
# of dense experts, and the joined hidden states and output ~80 MB: ~0.85 GiB at most.
MAX_JOINED_BYTES = 512 << 20


def mergeable_block(layer: nn.Module) -> nn.Module | None:
    """The layer's MoE block when the layer can run its chunks' expert calls as one."""
    block = getattr(layer, "mlp", None)
    if not hasattr(layer, "forward_attention") or not all(
        hasattr(block, part) for part in ("route", "experts", "finish")
    ):
        return None
    if block._forward_hooks or block._forward_pre_hooks:  # tensor parallel's all-reduce
        return None
    return block


def join_groups(sizes: Sequence[int], key, max_tokens: int) -> list[list[int]]:
    """Chunk indices in runs to join: consecutive chunks whose own calls (`key(tokens)`) and
    whose joined call (of at most `max_tokens` tokens) have one key that is not None; every
    other chunk alone."""
    groups: list[list[int]] = []
    group_key, total = None, 0
    for c, n in enumerate(sizes):
        k = key(n)
        fits = total + n <= max_tokens
        if groups and k is not None and k == group_key and fits and key(total + n) == k:
            groups[-1].append(c)
            total += n
        else:
            groups.append([c])
            group_key, total = k, n
    return groups


def run_layer(
    layer: nn.Module,
    block: nn.Module,
    chunks: Sequence,
    hidden: list[torch.Tensor],
    residual: list[torch.Tensor | None],
) -> None:
    """Layer `layer` over all `chunks` (their StepInputs, in order), `hidden` and `residual`
    updated in place; per group of chunks to join: each chunk up to its router, the group's
    expert calls as one, each chunk's block finished."""
    experts = block.experts
    sizes = [inp.input_ids.shape[0] for inp in chunks]
    like = hidden[0]  # the dtype and device of the experts' input
    per_token = experts.top_k * (2 * experts.intermediate_size + experts.hidden_size)
    max_tokens = MAX_JOINED_BYTES // (per_token * like.element_size())
    for group in join_groups(sizes, lambda n: experts.merge_key(n, like), max_tokens):
        xs, choices = [], []
        for c in group:
            inp = chunks[c]
            with forward_context(inp.ctx):
                x, residual[c] = layer.forward_attention(inp.positions, hidden[c], residual[c])
                choices.append(block.route(x))
            xs.append(x)
        with forward_context(chunks[group[-1]].ctx):
            if len(group) == 1:
                routed = [experts.run(xs[0], *choices[0])]
            else:
                weights = torch.cat([w for w, _ in choices])
                ids = torch.cat([i for _, i in choices])
                joined = experts.run(torch.cat(xs), weights, ids)
                routed = list(joined.split([sizes[c] for c in group]))
        for c, x, out in zip(group, xs, routed):
            with forward_context(chunks[c].ctx):
                hidden[c] = block.finish(x, out)

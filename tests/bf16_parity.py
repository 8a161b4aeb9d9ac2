"""The bfloat16 logit check shared by the CPU and GPU parity tests: our bf16 logits against
HF float32 run on the same experts. bf16 rounding can move a router logit past a near tie,
so the bf16 run picks another expert and later logits differ for a reason that is no
arithmetic fault; the fp32 reference takes the bf16 run's recorded choices instead (its
routers' top-k replaced), so the logit bound holds as is, and every choice that differs
from fp32's own must be a near tie."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from xinfer import LLM, SamplingParams
from xinfer.routing.trace import read_trace, request_streams

LOGIT_TOL = 3e-2  # relative L2 error of the top-20 logprobs at the last position
# bf16 moves a router logit by up to ~16% of the row's largest |logit| in the hybrid
# models' last MoE layers (~4% elsewhere; measured over 48 prompts on CPU); a choice that
# differs from fp32's own must be that close to fp32's k-th logit
NEAR_TIE = 0.25
MAX_FLIP_SHARE = 0.1  # of all (token, MoE layer) choices (measured: under 3%)


def hf_routers(hf: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' MoE routers in layer order: (T, H) → (logits, weights, ids)."""
    return [m for m in hf.modules() if type(m).__name__.endswith("TopKRouter")]


@contextlib.contextmanager
def forced_routing(hf: torch.nn.Module, ids: torch.Tensor):
    """Inside: HF's router l routes token t to experts `ids[l, t]` (L, T, k), weighted as
    the router weights its own choice (softmax, renormalised over the k where HF does).
    Yields the list that collects each router's float32 logits (T, E)."""
    routers = hf_routers(hf)
    assert len(routers) == ids.shape[0], f"{len(routers)} HF routers, {ids.shape[0]} recorded"
    logits_seen: list[torch.Tensor] = []

    def hook_for(layer: int):
        def hook(router, args, out):
            logits, weights, own_ids = out
            probs = torch.softmax(logits.float(), -1)  # (T, E)
            plain = probs.gather(-1, own_ids)  # (T, k)
            renormed = plain / plain.sum(-1, keepdim=True)
            w = weights.float()
            renormalize = (w - renormed).abs().max() < (w - plain).abs().max()
            assert torch.allclose(w, renormed if renormalize else plain, rtol=1e-2, atol=1e-4), (
                "HF's router weights its choice in a way this hook does not know"
            )
            chosen = ids[layer].to(logits.device, torch.long)  # (T, k)
            new = probs.gather(-1, chosen)
            if renormalize:
                new = new / new.sum(-1, keepdim=True)
            logits_seen.append(logits.detach().float())
            return logits, new.to(weights.dtype), chosen

        return hook

    handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(routers)]
    try:
        yield logits_seen
    finally:
        for h in handles:
            h.remove()


def check_routing_near_ties(hf_logits: list[torch.Tensor], ids: torch.Tensor) -> tuple[int, int]:
    """Each recorded choice is fp32's top-k, or differs from it by a near tie; returns
    (choices that differ, choices)."""
    flips = total = 0
    for layer, logits in enumerate(hf_logits):  # (T, E) fp32 logits on the forced path
        chosen = ids[layer].to(logits.device, torch.long)
        kth = logits.topk(chosen.shape[-1], -1).values[:, -1]
        gap = kth - logits.gather(-1, chosen).min(-1).values  # > 0: a weaker expert taken
        scale = logits.abs().amax(-1)
        worst = int((gap / scale).argmax())
        assert gap[worst] <= NEAR_TIE * scale[worst], (
            f"MoE layer {layer} token {worst}: the bf16 run took an expert {gap[worst]:.3f} "
            f"below fp32's top-{chosen.shape[-1]} (row max |logit| {scale[worst]:.3f}): "
            "no near tie"
        )
        flips += int((gap > 0).sum())
        total += gap.numel()
    return flips, total


def check_bf16_logits(
    hf: torch.nn.Module, path: Path, device: str, prompts: list[list[int]], trace: Path
) -> list[float]:
    """Our bf16 engine on `device` vs `hf` (float32, already on `device`), one prompt at a
    time; `trace` is where the bf16 run records its routing. Returns the relative errors."""
    llm = LLM(str(path), device=device, dtype="bfloat16", record_routing=str(trace))
    assert llm.engine.dtype == torch.bfloat16
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
    results = [llm.generate([prompt], params)[0] for prompt in prompts]
    llm.close()  # flushes the trace
    streams = request_streams(read_trace(trace)[1])  # one per prompt, in order
    assert len(streams) == len(prompts)
    errors, flips, choices = [], 0, 0
    for prompt, r, (_, first, ids) in zip(prompts, results, streams):
        assert (first, ids.shape[1]) == (0, len(prompt))
        ids = torch.from_numpy(ids.astype("int64"))  # (L, T, k)
        with torch.no_grad(), forced_routing(hf, ids) as hf_logits:
            out = hf(torch.tensor([prompt], device=device)).logits[0, -1].float()
        differ, n = check_routing_near_ties(hf_logits, ids)
        flips, choices = flips + differ, choices + n
        ref = torch.log_softmax(out, -1)
        top_ids = torch.tensor(r.logprobs[0].top_ids, device=device)
        ours = torch.tensor(r.logprobs[0].top_logprobs, device=device)
        rel = float((ours - ref[top_ids]).norm() / ref[top_ids].norm())
        assert rel < LOGIT_TOL, f"bf16 relative error {rel:.3e} with the same experts"
        errors.append(rel)
    assert flips <= MAX_FLIP_SHARE * choices, f"{flips} of {choices} routing choices differ"
    return errors

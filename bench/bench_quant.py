"""Decode and prefill speed of each weight format on one model shape (dummy weights of that
format, experts and attention quantized as the public checkpoints are), beside the memory
floor recomputed from the bytes as stored, resident and under offload.

    python3 bench/bench_quant.py --model bench/configs/qwen3_30b_a3b \
        --formats bf16,fp8,nvfp4,gptq,awq,ct --parts resident,offload \
        --gpu-memory-limit-gb 24 --out bench/results/quant

Per format: resident decode at batch 1 and 8 (greedy, CUDA graphs) and a 2k-token prefill;
offload at 0.2 and `auto` under the GPU memory limit, batch 1 with seeded sampling (random
weights under greedy repeat one token, so routing would never change; sampled tokens route
near-uniformly — say so beside the rows), each beside `t_resident + bytes moved / H2D`.
Writes NAME.json and NAME.md (one table per part)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_decode import time_engine_decode, time_engine_prefill  # noqa: E402
from bench_offload_decode import run_rate  # noqa: E402
from cuda_timing import device_copy_bandwidth  # noqa: E402
from offload_bench.bandwidth import copy_engine_gbps  # noqa: E402

from xinfer import LLM  # noqa: E402

# the quantization configs of the public checkpoints of each format (routers, LM head and
# embeddings stay bf16; attention, dense/shared MLPs and routed experts are quantized)
QUANT_CONFIGS = {
    "bf16": None,
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
              "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": True, "checkpoint_format": "gptq"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
            "version": "gemm"},
    "ct": {"quant_method": "compressed-tensors", "format": "pack-quantized",
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
               "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
               "group_size": 128}}}, "ignore": ["lm_head", "re:.*mlp.gate$"]},
}  # fmt: skip


def model_dir(base: Path, fmt: str, tmp: Path) -> Path:
    """A copy of the config directory that declares `fmt`."""
    out = tmp / fmt
    shutil.copytree(base, out)
    qc = QUANT_CONFIGS[fmt]
    if qc is not None:
        cfg = json.loads((out / "config.json").read_text())
        cfg["quantization_config"] = qc
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def stored_bytes(llm: LLM) -> dict:
    """Bytes as stored: per routed expert, dense weights read by a decode step (every
    parameter but the embedding table, of which a step reads one row per token)."""
    model = llm.engine.model
    moe = model.moe_layers()
    expert = moe[0].expert_weights.expert_bytes if moe else 0
    dense = sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if "embed_tokens" not in n or model.lm_head is None
    )
    return {"expert_bytes": expert, "dense_bytes": dense, "num_moe_layers": len(moe)}


def floor_ms(b: dict, cfg, batch: int, hbm: float) -> float:
    """Weight bytes a decode step reads (dense + expected distinct experts of the batch under
    uniform routing) over the device's copy bandwidth (read + write, ANCHORS.md)."""
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    touched = e * (1 - (1 - k / e) ** batch)
    total = b["dense_bytes"] + b["num_moe_layers"] * touched * b["expert_bytes"]
    return total / (hbm / 2) * 1e3  # copy bw counts read + write; a GEMV only reads


def resident(args, fmt: str, path: Path, hbm: float) -> dict:
    kw = dict(device="cuda:0", dtype="bfloat16", load_format="dummy", max_model_len=4096,
              num_kv_blocks=2048, max_num_seqs=8, dummy_weights_seed=0)  # fmt: skip
    t0 = time.perf_counter()
    llm = LLM(str(path), **kw)
    row = {"format": fmt, "load_s": time.perf_counter() - t0, **stored_bytes(llm)}
    cfg = llm.engine.model_config
    for batch in (1, 8):
        step = time_engine_decode(llm, batch, 64, args.steps)
        row[f"b{batch}_tok_s"] = batch / step
        row[f"b{batch}_floor_tok_s"] = batch / (floor_ms(row, cfg, batch, hbm) / 1e3)
    row["prefill_2k_tok_s"] = 2048 / time_engine_prefill(llm, 2048)
    del llm
    torch.cuda.empty_cache()
    return row


def offload(args, fmt: str, path: Path, bw: float) -> list[dict]:
    ns = SimpleNamespace(model=str(path), steps=args.steps, warmup_steps=8,
                         gpu_memory_limit_gb=args.gpu_memory_limit_gb, trace_dir=None)  # fmt: skip
    prompt = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    base = run_rate(ns, "0", prompt)
    for rate in ("0.2", "auto"):
        r = run_rate(ns, rate, prompt)
        limit = base["step_ms"] / 1e3 + r["gb_per_token"] * 1e9 / bw
        r.update(format=fmt, limit_tok_s=1 / limit, ratio=r["step_ms"] / 1e3 / limit,
                 identical=r["tokens"] == base["tokens"], resident_tok_s=base["tok_s"])  # fmt: skip
        r.pop("tokens")
        rows.append(r)
        print({k: v for k, v in r.items() if k != "look_ahead"}, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4,gptq,awq,ct")
    ap.add_argument("--parts", default="resident,offload")
    ap.add_argument("--gpu-memory-limit-gb", type=float, default=24.0)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", default="bench/results/quant")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    hbm = device_copy_bandwidth(dev)
    h2d = copy_engine_gbps(dev, 512 << 20, 1, 5) * 1e9
    print(f"device copy {hbm / 1e12:.2f} TB/s (r+w), host→GPU {h2d / 1e9:.1f} GB/s", flush=True)
    results: dict = {"resident": [], "offload": []}
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            path = model_dir(Path(args.model), fmt, Path(tmp))
            if "resident" in parts:
                results["resident"].append(resident(args, fmt, path, hbm))
                print(results["resident"][-1], flush=True)
            if "offload" in parts:
                results["offload"] += offload(args, fmt, path, h2d)
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(dev),
            "hbm_copy": hbm, "h2d": h2d, "command": " ".join(sys.argv),
            "routing": "seeded sampling on dummy weights (offload rows)"}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, **results}, indent=1))
    out.with_suffix(".md").write_text(render(meta, results))
    print(render(meta, results))


def render(meta: dict, results: dict) -> str:
    lines = [f"Weight formats, {meta['date']}, {meta['gpu']}", ""]
    if results["resident"]:
        lines += [
            "| format | MB/expert | dense GB | b1 tok/s | b1 floor | b8 tok/s | b8 floor | prefill 2k tok/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in results["resident"]:
            lines.append(
                f"| {r['format']} | {r['expert_bytes'] / 1e6:.2f} | {r['dense_bytes'] / 1e9:.2f} "
                f"| {r['b1_tok_s']:.0f} | {r['b1_floor_tok_s']:.0f} | {r['b8_tok_s']:.0f} "
                f"| {r['b8_floor_tok_s']:.0f} | {r['prefill_2k_tok_s']:.0f} |"
            )
        lines.append("")
    if results["offload"]:
        lines += [
            f"Offload, batch 1 ({meta['routing']}), GPU limit for auto",
            "",
            "| format | GPU experts | slots/layer | tok/s | limit tok/s | step / limit | hit rate | GB/token | identical |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["offload"]:
            lines.append(
                f"| {r['format']} | {r['rate']} | {min(r['slots'])} | {r['tok_s']:.1f} "
                f"| {r['limit_tok_s']:.1f} | {r['ratio']:.2f} | {r['hit_rate']:.1%} "
                f"| {r['gb_per_token']:.3f} | {r['identical']} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""Decode and prefill speed of each weight format on one model shape (dummy weights of that
format, experts and attention quantized as the public checkpoints are), beside the memory
floor recomputed from the bytes as stored, resident and under offload.

    python3 bench/bench_quant.py --model bench/configs/qwen3_30b_a3b \
        --formats bf16,fp8,nvfp4,gptq,awq,ct --parts resident,offload \
        --gpu-memory-limit-gb 24 --out bench/results/quant

Per format: resident decode at batch 1 and 8 (greedy, CUDA graphs) and a 2k-token prefill,
beside the floor of the bytes as stored; offload through bench_offload_decode.py (its own
engine processes): 0.2 and `auto` under the GPU memory limit, batch 1 and 8 with the routing
model (`--routing`), each beside `t_resident + bytes moved / H2D`, and the 2k-token TTFT.
Writes NAME.json and NAME.md."""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_decode import export_step_trace, time_engine_decode, time_engine_prefill  # noqa: E402
from cuda_timing import device_copy_bandwidth  # noqa: E402

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
    uniform routing) over the device's copy bandwidth: the bytes read + written per second by
    a device copy, the same rate `bench_decode.py` divides by (a GEMV's reads stream at it)."""
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    touched = e * (1 - (1 - k / e) ** batch)
    total = b["dense_bytes"] + b["num_moe_layers"] * touched * b["expert_bytes"]
    return total / hbm * 1e3


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
    if args.trace_dir:  # four graphed batch-1 steps: bench/trace_summary.py --steps 4
        trace = Path(args.trace_dir) / f"quant_trace_{fmt}.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        row["anatomy"] = export_step_trace(llm, 64, trace)
    del llm
    gc.collect()  # the engine's reference cycles would keep its weights alive
    torch.cuda.empty_cache()
    return row


def offload(args, fmt: str, path: Path) -> str:
    """bench_offload_decode.py on this format's model dir (each engine in its own process):
    batch 1 and 8 at 0.2 and `auto`, 2k-token TTFT, with the routing model, then
    `--offload-args` (which may override any of these: the last occurrence wins); its page."""
    import bench_offload_decode

    out = Path(f"{args.out}_offload_{fmt}")
    bench_offload_decode.main(offload_argv(args, path, out), script="bench/bench_offload_decode.py")
    return f"## {fmt}\n\n" + out.with_suffix(".md").read_text()


def offload_argv(args, path: Path, out: Path) -> list[str]:
    """The arguments of the offload rows' bench_offload_decode.py run for one format."""
    return [
        "--model", str(path), "--rates", "0.2,auto", "--batches", "1,8",
        "--warmup-steps", "32,4", "--steps", "64,16",
        "--ttft-tokens", "2048", "--ttft-rates", "0.2,auto",
        "--gpu-memory-limit-gb", str(args.gpu_memory_limit_gb), "--routing", args.routing,
        "--out", str(out), *shlex.split(args.offload_args),
    ]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4,gptq,awq,ct")
    ap.add_argument("--parts", default="resident,offload")
    ap.add_argument("--gpu-memory-limit-gb", type=float, default=24.0)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--routing", default="qwen3-30b-a3b", help="offload rows: see --routing "
                    "of bench_offload_decode.py")  # fmt: skip
    ap.add_argument(
        "--offload-args", default="",
        help="offload rows: more options of bench_offload_decode.py, one string (e.g. "
        "'--rates 0.2 --prefetch 0,1 --prefetch-programs 16'); later ones override ours",
    )  # fmt: skip
    ap.add_argument("--out", default="bench/results/quant")
    ap.add_argument(
        "--trace-dir", default=None,
        help="resident rows: a Chrome trace of four graphed batch-1 steps per format here "
        "(quant_trace_<format>.json; per kernel: bench/trace_summary.py FILE --steps 4)",
    )  # fmt: skip
    return ap


def main() -> None:
    args = build_parser().parse_args()
    dev = torch.device("cuda:0")
    hbm = device_copy_bandwidth(dev)
    print(f"device copy {hbm / 1e12:.2f} TB/s (read + write)", flush=True)
    results: dict = {"resident": [], "offload": []}
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            path = model_dir(Path(args.model), fmt, Path(tmp))
            if "resident" in parts:
                results["resident"].append(resident(args, fmt, path, hbm))
                print(results["resident"][-1], flush=True)
            if "offload" in parts:
                results["offload"].append(offload(args, fmt, path))
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(dev),
            "hbm_copy": hbm, "command": " ".join(sys.argv), "routing": args.routing}  # fmt: skip
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
        lines += [f"Offload (routing `{meta['routing']}`), per format:", ""]
        lines += results["offload"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

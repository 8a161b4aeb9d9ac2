"""A random-weight GGUF with llama.cpp's Q4_K_M type mix, for the side-by-side runs
(`bench_vs_llamacpp.sh`, row `q4_k_m`): the peer kit's writer (`write_random_gguf.py`, pure
types only) with its tensor plan retyped as `llama-quantize ... Q4_K_M` types a model of
more than 8 experts (llama.cpp's `src/llama-quant.cpp`, `llama_tensor_get_type`): the LM
head (`output.weight`) Q6_K; `attn_v` and every `ffn_down` (routed and shared experts) Q6_K
in the layers where `use_more_bits` holds (the first and last eighth, and every third
between: 24 of Qwen3-30B-A3B's 48); the rest Q4_K. A row length that is not a multiple of
256 falls back as the kit's writer does (Q6_K → Q8_0, Q4_K → Q5_0). The file's `general.file_type` says Q4_K_M.

Real Q4_K_M downloads are this mix, where the kit's `--type q4_k` files are pure Q4_K: the
mix puts Q6_K in half the layers' down projections and `attn_v` (whose q/k/v then are not
one type, so not one merged projection) and in the head.

    python3 bench/write_q4km_gguf.py --preset qwen3-30b-a3b -o /tmp/q3-q4_k_m.gguf
    python3 bench/write_q4km_gguf.py --preset qwen3-30b-a3b --dry-run --budget-gib 12

Every option but `--type` is the kit writer's. KIT: the folder holding
`write_random_gguf.py` (default bench/.llamacpp_kit, then ../shared/peers/llamacpp)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M mixes."""
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def q4km_type(name: str, t: str, n_layers: int) -> str:
    """The Q4_K_M type of tensor `name` whose pure-Q4_K plan gave it type `t`."""
    if t != "q4_k":  # norms, routers, biases (f32), and rows that already fell back
        return t
    if name == "output.weight":
        return "q6_k"
    layer = re.match(r"blk\.(\d+)\.", name)
    more_bits = layer is not None and use_more_bits(int(layer.group(1)), n_layers)
    if more_bits and ("attn_v.weight" in name or "ffn_down" in name):
        return "q6_k"
    return t


def _kit_writer() -> types.ModuleType:
    """The peer kit's `write_random_gguf.py`, imported as a module."""
    candidates = [
        os.environ.get("KIT"),
        ROOT / "bench/.llamacpp_kit",
        ROOT.parent / "shared/peers/llamacpp",
    ]
    for folder in filter(None, candidates):
        path = Path(folder) / "write_random_gguf.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location("write_random_gguf", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SystemExit(
        "write_random_gguf.py not found: run 'bash bench/bench_vs_llamacpp.sh --stage-kit' "
        "or set KIT to the folder that holds it"
    )


def _retyped(kit: types.ModuleType):
    """The kit's `tensor_plan`, retyped to the Q4_K_M mix: a weight the plan gave Q4_K (or
    the kit's fallback of Q4_K for its row length) takes its Q4_K_M type, which falls back
    in turn (Q6_K → Q8_0, as llama.cpp's does, for rows that are not 256k); a type the
    command line chose (`--embd-type`, `--output-type`) stays."""
    plan = kit.tensor_plan

    def tensor_plan(cfg, wtype, embd_type, out_type):
        tensors, arch, hp = plan(cfg, wtype, embd_type, out_type)
        retyped = []
        for name, shape, t, kind in tensors:
            weight = kind not in ("norm", "bias", "router")
            intended = "q4_k" if weight and t == kit.pick_type("q4_k", shape[-1]) else t
            mixed = q4km_type(name, intended, hp["L"])
            retyped.append(
                (name, shape, t if mixed == intended else kit.pick_type(mixed, shape[-1]), kind)
            )
        return retyped, arch, hp

    return tensor_plan


def _labelled_q4km(import_gguf):
    """The kit's `import_gguf`, whose package then names Q4_K_M where the writer asks for
    Q4_K_S (the file type it writes for `--type q4_k`)."""

    def wrapped(extra_path):
        gguf = import_gguf(extra_path)
        file_types = types.SimpleNamespace(
            **{m.name: m for m in gguf.LlamaFileType}
        )  # fmt: skip
        file_types.MOSTLY_Q4_K_S = gguf.LlamaFileType.MOSTLY_Q4_K_M
        proxy = types.ModuleType(gguf.__name__)
        proxy.__dict__.update(vars(gguf))
        proxy.LlamaFileType = file_types
        return proxy

    return wrapped


def main() -> None:
    if any(a == "--type" or a.startswith("--type=") for a in sys.argv[1:]):
        raise SystemExit("write_q4km_gguf.py: the type is the Q4_K_M mix; drop --type")
    kit = _kit_writer()
    kit.tensor_plan = _retyped(kit)
    kit.import_gguf = _labelled_q4km(kit.import_gguf)
    sys.argv[1:] = ["--type", "q4_k", *sys.argv[1:]]
    kit.main()


if __name__ == "__main__":
    main()

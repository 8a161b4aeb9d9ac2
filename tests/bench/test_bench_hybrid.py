"""bench/bench_hybrid.py: the `hybridbench` and `hybridoffload` lines of scripts/gpu_run.sh
name only options their scripts take, and one dry run of the hybrid bench on a tiny CPU
model (two batch sizes, two prefill lengths) writes its result file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_run_phases import gpu_run_args as _gpu_run_args

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


def test_gpu_run_phases_match_the_scripts():
    import bench_hybrid
    import bench_offload_decode

    args = bench_hybrid.build_parser().parse_args(_gpu_run_args("hybridbench", "bench_hybrid.py"))
    assert Path(ROOT / args.model, "config.json").is_file() and args.device == "cuda:0"
    offload = _gpu_run_args("hybridoffload", "bench_offload_decode.py")
    args = bench_offload_decode.build_parser().parse_args(offload)
    assert args.model == bench_hybrid.build_parser().get_default("model")
    assert args.rates == "0.1,0.2,auto" and args.routing == "qwen3.5-35b-a3b"


@pytest.mark.slow
def test_dry_run_on_cpu(tmp_path):
    from tiny_models import make_hf_model, write_checkpoint

    # the bench draws prompt ids below 1000
    model = write_checkpoint(make_hf_model("qwen3_5_moe", seed=3, vocab_size=1024), tmp_path / "m")
    out = tmp_path / "result"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_hybrid.py"), "--model", str(model),
           "--device", "cpu", "--dtype", "float32", "--batches", "1,3", "--prompt-len", "12",
           "--steps", "4", "--prefill-lens", "40,70", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["batch"] for r in data["decode"]] == [1, 3]
    assert all(r["step_ms"] > 0 and "floor_ms" not in r for r in data["decode"])
    assert sorted(data["prefill_tok_s"]) == ["40", "70"]
    assert "decode batch 3:" in proc.stdout and "prefill 70:" in proc.stdout

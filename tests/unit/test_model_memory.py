"""The README's memory table is exactly what `scripts/model_memory.py` computes, and its
figures agree with the published parameter counts of those checkpoints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("model_memory", ROOT / "scripts/model_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_scripts_output():
    script = load_script()
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- model-memory:begin -->\n")[1].split("\n<!-- model-memory:end -->")[0]
    assert block == script.table()


def test_weights_match_published_parameter_counts():
    script = load_script()
    billions = {  # total parameters as their model cards state them
        "Qwen/Qwen3-30B-A3B": 30.5,
        "Qwen/Qwen1.5-MoE-A2.7B": 14.3,
        "mistralai/Mixtral-8x7B-v0.1": 46.7,
        "allenai/OLMoE-1B-7B-0924": 6.9,
    }
    configs = dict(script.CHECKPOINTS)
    for repo_id, params in billions.items():
        gib = script.memory_row(configs[repo_id])["weights"]
        assert abs(gib * (1 << 30) / 2 / 1e9 - params) / params < 0.02, repo_id


def test_readme_names_every_supported_architecture():
    from xinfer.models.registry import supported_architectures

    section = (ROOT / "README.md").read_text().split("## Supported models")[1].split("\n## ")[0]
    for architecture in supported_architectures():
        assert f"`{architecture}`" in section, architecture

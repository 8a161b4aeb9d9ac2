"""Tiny checkpoints for the tensor-parallel tests (a module of its own, not conftest, so that
`from conftest import` never finds another directory's conftest)."""

from __future__ import annotations

import dense_models as dm
import tiny_models as tm


def checkpoint(tmp_path_factory, arch: str, layout: str = "per_expert", **overrides):
    """A tiny checkpoint of a MoE / hybrid (tiny_models) or dense (dense_models) model."""
    if arch in dm.DENSE:
        model = dm.make_dense(arch, seed=5, **overrides)
    else:
        model = tm.make_hf_model(arch, seed=5, **overrides)
    return tm.write_checkpoint(model, tmp_path_factory.mktemp(f"tp-{arch}-{layout}"), layout)

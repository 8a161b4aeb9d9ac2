"""`RoutingConfig`: which routing source the MoE layers use (`router`, a preset of the routing
model, `model:SIGMA,TAU,PHI`, `uniform` or `replay:PATH`), its seed, and where to record the
routed ids. Presets are the parameters fitted to published LRU hit curves (docs/moe_offload.md)."""

from __future__ import annotations

from dataclasses import dataclass

from xinfer.errors import UserError


@dataclass(frozen=True)
class RoutingModelParams:
    """`logit[l,e](t) = s_l·(σ·z[l,e] + τ·c[l,e](t)) + Gumbel`, `c(t+1) = φ·c(t) + √(1−φ²)·N`,
    `s_l = s0 + (1 − s0)·min(1, l / ramp_layers)`."""

    sigma: float  # long-run popularity spread (z fixed per layer)
    tau: float  # weight of the drifting per-request preference c
    phi: float  # AR(1) persistence of c from one token to the next
    s0: float = 0.45  # scale of layer 0 (early layers route flatter)
    ramp_layers: int = 5

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and self.tau >= 0 and 0 <= self.phi < 1):
            raise UserError(
                f"routing model needs sigma >= 0, tau >= 0 and 0 <= phi < 1, got "
                f"sigma={self.sigma}, tau={self.tau}, phi={self.phi}"
            )

    def layer_scale(self, layer: int) -> float:
        return self.s0 + (1 - self.s0) * min(1.0, layer / self.ramp_layers)


PRESETS: dict[str, RoutingModelParams] = {
    "qwen3-30b-a3b": RoutingModelParams(2.0, 2.0, 0.98),
    "qwen3.5-35b-a3b": RoutingModelParams(1.5, 1.75, 0.98),
    "qwen3.6-35b-a3b": RoutingModelParams(1.5, 1.75, 0.98),
    "olmoe": RoutingModelParams(1.15, 1.15, 0.98),
    "uniform": RoutingModelParams(0.0, 0.0, 0.0),  # every k-subset equally likely
}
ROUTER, MODEL, REPLAY = "router", "model", "replay"
_HELP = (
    "use 'router' (the model's own routing), one of "
    + ", ".join(PRESETS)
    + ", 'model:SIGMA,TAU,PHI' or 'replay:PATH' (a file written by --record-routing)"
)


def _parse_model(text: str) -> RoutingModelParams:
    parts = text.split(",")
    try:
        sigma, tau, phi = (float(p) for p in parts)
    except ValueError:
        raise UserError(f"routing source 'model:{text}' is not three numbers; {_HELP}") from None
    return RoutingModelParams(sigma, tau, phi)


@dataclass(frozen=True)
class RoutingConfig:
    """`source`: where each MoE layer's top-k ids come from (see `_HELP`); `seed` fixes the
    routing model's popularity z and every request's noise; `record_path`: write the ids
    every MoE layer routed, step by step, to this file (see xinfer/routing/trace.py)."""

    source: str = ROUTER
    seed: int = 0
    record_path: str | None = None

    def __post_init__(self) -> None:
        if self.kind == MODEL:  # `kind` raises on an unknown source, this on bad numbers
            _ = self.model_params
        if self.record_path is not None and not str(self.record_path).strip():
            raise UserError("--record-routing needs a file path")

    @property
    def kind(self) -> str:
        src = self.source.strip().lower()
        if src == ROUTER:
            return ROUTER
        if src in PRESETS or src.startswith("model:"):
            return MODEL
        if src.startswith("replay:") and src[len("replay:") :].strip():
            return REPLAY
        raise UserError(f"unknown routing source {self.source!r}; {_HELP}")

    @property
    def model_params(self) -> RoutingModelParams:
        src = self.source.strip().lower()
        if src in PRESETS:
            return PRESETS[src]
        return _parse_model(src[len("model:") :])

    @property
    def replay_path(self) -> str:
        return self.source.strip()[len("replay:") :].strip()

    @property
    def is_default(self) -> bool:
        """The router's own choice and no recording: the layers run untouched."""
        return self.kind == ROUTER and self.record_path is None

"""What `--kvcache-dtype` resolves to: a torch dtype (the cache holds K/V as they are) or a
`TurboQuant` format (b-bit codes of rotated K/V plus one float16 scale per token and head),
and the bytes one head of one token takes in either, which every cache-sizing path uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer.errors import UserError

TURBO_BITS = (3, 4)


@dataclass(frozen=True)
class TurboQuant:
    """TurboQuant (MSE) KV cache with `bits`-bit codes: turbo4 ~3.9x, turbo3 ~5.1x fewer
    bytes than bf16 at head_dim 128 (see kv/turbo.py)."""

    bits: int

    def __post_init__(self) -> None:
        if self.bits not in TURBO_BITS:
            raise ValueError(f"TurboQuant bits must be one of {TURBO_BITS}, got {self.bits}")

    def __str__(self) -> str:
        return f"turbo{self.bits}"

    def code_bytes(self, head_dim: int) -> int:
        """Bytes of one (token, head)'s packed codes: `bits` bit-planes of head_dim / 8."""
        check_turbo_head_dim(head_dim, self)
        return self.bits * head_dim // 8


# what a KV cache holds: a dtype, or a quantized format
KVDtype = torch.dtype | TurboQuant


def check_turbo_head_dim(head_dim: int, fmt: TurboQuant) -> None:
    if head_dim % 8:
        raise UserError(
            f"--kvcache-dtype {fmt} packs head_dim into bytes and needs it to be a multiple of "
            f"8, but this model's head_dim is {head_dim}; use --kvcache-dtype auto, bf16 or fp8"
        )


def kv_bytes_per_head(kv_dtype: KVDtype, head_dim: int) -> int:
    """Bytes one token's K (or V) takes for one KV head."""
    if isinstance(kv_dtype, TurboQuant):
        return kv_dtype.code_bytes(head_dim) + 2  # + the float16 scale
    return head_dim * torch.empty((), dtype=kv_dtype).element_size()

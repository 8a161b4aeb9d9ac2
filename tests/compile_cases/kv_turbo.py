"""Compile cases: the TurboQuant KV cache — its store kernel, the rotation kernel, and the
attention kernels reading turbo3/turbo4 codes (decode with the merge apart and in the
launch, prefill, windows, head sizes 64/128/256)."""

from __future__ import annotations

from unittest import mock

import torch

from compile_cases.base import BF16, F16, F32, _gen, _randn, add


def _cache(bits: int, hk: int, head_dim: int, num_blocks: int = 20, dtype=BF16):
    from xinfer.kv import turbo
    from xinfer.kv.format import TurboQuant

    return turbo.allocate(TurboQuant(bits), num_blocks, 16, hk, head_dim, dtype, "cpu")


def _store(dtype, bits: int, hk: int = 4, head_dim: int = 128) -> None:
    from xinfer.kernels import kv_turbo_launch

    k, v = _randn(37, hk, head_dim, dtype=dtype), _randn(37, hk, head_dim, dtype=dtype)
    slots = torch.randperm(320, generator=_gen())[:37]
    kv_turbo_launch.store(k, v, _cache(bits, hk, head_dim, dtype=dtype), slots)


def _rotate(dtype, head_dim: int, transposed: bool) -> None:
    from xinfer.kernels import kv_turbo_launch
    from xinfer.kv.turbo_codebook import rotation

    rot = rotation(head_dim).to(dtype)
    kv_turbo_launch.rotate(_randn(37, 4, head_dim, dtype=dtype), rot.t() if transposed else rot)


def _attention(dtype, decode: bool, bits: int, hq: int, hk: int, head_dim: int,
               window=None, fused: bool = False, shuffle: bool = False) -> None:  # fmt: skip
    from xinfer.kernels import attn_launch

    seq_lens = [300, 17, 1000]
    query_lens = [1, 1, 1] if decode else [300, 5, 64]
    max_blocks = max(seq_lens) // 16 + 1
    cache = _cache(bits, hk, head_dim, len(seq_lens) * max_blocks, dtype)
    tables = torch.randperm(cache.k_codes.shape[0], generator=_gen()).view(len(seq_lens), -1)
    q = _randn(sum(query_lens), hq, head_dim, dtype=dtype)
    qsl = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    with (
        mock.patch.object(attn_launch, "SMALL_INTERPRETER_TILES", False),
        mock.patch.object(attn_launch, "FUSED_DECODE_REDUCE", fused),
        mock.patch.object(attn_launch, "TURBO_LOOKUP_SHUFFLE", shuffle),
    ):
        attn_launch.paged_attention(
            q, cache.k_codes, cache.v_codes, tables.to(torch.int32), lens, qsl, head_dim**-0.5,
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), sliding_window=window,
            turbo=cache,
        )  # fmt: skip


def _cases() -> None:
    store = "turbo_store_kernel"
    for bits in (4, 3):
        add(f"turbo{bits}-store-bf16-hd128", store, _store, BF16, bits)
    add("turbo4-store-fp16-hd80", store, _store, F16, 4, hk=8, head_dim=80)
    add("turbo3-store-fp32-hd256", store, _store, F32, 3, hk=2, head_dim=256)
    rotate = "rotate_rows_kernel"
    add("turbo-rotate-bf16-hd128-rt", rotate, _rotate, BF16, 128, True)
    add("turbo-rotate-fp16-hd80-r", rotate, _rotate, F16, 80, False)
    add("turbo-rotate-fp32-hd256-rt", rotate, _rotate, F32, 256, True)
    decode, prefill = "decode_kernel decode_reduce_kernel", "prefill_kernel"
    for bits in (4, 3):  # (the bits change the loader's plane loop)
        add(f"turbo{bits}-decode-bf16-hd128-g4", decode, _attention, BF16, True, bits, 32, 8, 128)
    add("turbo4-prefill-bf16-hd128-g4", prefill, _attention, BF16, False, 4, 32, 8, 128)
    add("turbo4-decode-bf16-hd128-g4-merged", "decode_kernel", _attention, BF16, True, 4, 32, 8,
        128, fused=True)  # fmt: skip
    add("turbo4-decode-bf16-hd256-g2-window", decode, _attention, BF16, True, 4, 8, 4, 256, 1024)
    add("turbo4-prefill-bf16-hd256-g2-window", prefill, _attention, BF16, False, 4, 8, 4, 256,
        1024)  # fmt: skip
    add("turbo3-decode-fp16-hd64-g8", decode, _attention, F16, True, 3, 16, 2, 64)
    # the centroid lookup by shuffles (`attn_launch.TURBO_LOOKUP_SHUFFLE`)
    add("turbo4-decode-bf16-hd128-g4-shuffle", decode, _attention, BF16, True, 4, 32, 8, 128,
        shuffle=True)  # fmt: skip
    add("turbo3-prefill-bf16-hd128-g4-shuffle", prefill, _attention, BF16, False, 3, 32, 8, 128,
        shuffle=True)  # fmt: skip


_cases()

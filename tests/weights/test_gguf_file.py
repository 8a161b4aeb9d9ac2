"""The GGUF reader: metadata and tensor bytes equal the `gguf` package's reader; tensors
are views of the memory map; split files; bad files refused with one sentence."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from xinfer.errors import UserError
from xinfer.weights.gguf_file import open_gguf


def _write(path, arch="qwen3moe", tensors=None, meta=True):
    w = gguf.GGUFWriter(str(path), arch)
    if meta:
        w.add_block_count(1)
        w.add_token_list(["a", "b", "<s>"])
        w.add_array("test.floats", [0.5, -1.25])
        w.add_string("tokenizer.chat_template", "{{ messages }}")
    for name, arr, qtype in tensors or [
        ("blk.0.attn_q.weight", np.ones((4, 32), np.float32), None)
    ]:
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reader_matches_gguf_package(tmp_path):
    rng = np.random.default_rng(0)
    q8 = gguf.quants.quantize(
        rng.standard_normal((6, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    tensors = [
        ("a.weight", rng.standard_normal((3, 32)).astype(np.float32), None),
        ("b.weight", rng.standard_normal((5, 32)).astype(np.float16), None),
        ("c.weight", q8, gguf.GGMLQuantizationType.Q8_0),
        ("d.weight", rng.standard_normal(7).astype(np.float32), None),
    ]
    path = _write(tmp_path / "m.gguf", tensors=tensors)
    ours, ref = open_gguf(path), gguf.GGUFReader(path)
    for t in ref.tensors:
        got = ours.tensors[t.name]
        assert got.shape == tuple(reversed(t.shape.tolist()))
        assert np.array_equal(
            got.raw.numpy().reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1)
        )
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == field.contents()
    assert ours.tensors["c.weight"].shape == (6, 64) and ours.tensors["c.weight"].raw.shape == (
        6,
        68,
    )
    assert ours.arch == "qwen3moe" and ours.get("block_count") == 1


def test_tensors_are_memory_mapped_not_copied(tmp_path):
    path = _write(tmp_path / "m.gguf")
    t = open_gguf(path).tensors["blk.0.attn_q.weight"]
    addr = t.raw.data_ptr()
    with open("/proc/self/maps") as maps:  # the page holding the tensor maps the file itself
        owners = [
            line.split()[-1]
            for line in maps
            if int(line.split()[0].split("-")[0], 16)
            <= addr
            < int(line.split()[0].split("-")[1], 16)
        ]
    assert owners == [str(path)]


def test_split_files_are_read_as_one(tmp_path):
    _write(
        tmp_path / "m-00001-of-00002.gguf",
        tensors=[("x.weight", np.ones((2, 32), np.float32), None)],
    )
    _write(
        tmp_path / "m-00002-of-00002.gguf",
        tensors=[("y.weight", np.zeros((3, 32), np.float32), None)],
        meta=False,
    )
    ckpt = open_gguf(tmp_path / "m-00001-of-00002.gguf")
    assert set(ckpt.tensors) == {"x.weight", "y.weight"} and len(ckpt.paths) == 2
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(UserError, match="missing its parts m-00002-of-00002.gguf"):
        open_gguf(tmp_path / "m-00001-of-00002.gguf")


def _one_sentence(err: UserError) -> str:
    msg = str(err)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


@pytest.mark.parametrize("cut", [10, 60, -8])
def test_truncated_file_is_refused(tmp_path, cut):
    path = _write(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(UserError) as e:
        open_gguf(path)
    assert "download it again" in _one_sentence(e.value) or "not a GGUF" in str(e.value)


def test_not_gguf_and_unsupported_type_are_refused(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(UserError, match="not a GGUF file"):
        open_gguf(bad)
    raw = np.zeros((2, 66), np.uint8)  # two IQ2_XXS blocks
    path = _write(
        tmp_path / "iq.gguf", tensors=[("w.weight", raw, gguf.GGMLQuantizationType.IQ2_XXS)]
    )
    with pytest.raises(UserError) as e:
        open_gguf(path)
    assert "cannot run" in _one_sentence(e.value)


def test_unknown_architecture_is_refused(tmp_path):
    from xinfer.config import ModelConfig

    path = _write(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(UserError) as e:
        ModelConfig.from_dir(path)
    assert "GGUF architecture 'mamba' is not supported" in _one_sentence(e.value)

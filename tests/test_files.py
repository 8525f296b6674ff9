"""kina.files: every reader takes damaged files with one FileError naming the file and its use.

Each reader gets the same hostile inputs: missing, a directory, empty, truncated at
every length, garbage bytes, and headers that declare far more data than the file
holds. Good files read back exactly (against NumPy and the safetensors package).
"""
from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kina.files import (FileError, gguf_array, read_bytes, read_gguf, read_json, read_npy, read_npz,
                        read_safetensors, read_text, safetensors_header)

SCALE = int(os.environ.get("KINA_FUZZ_EXAMPLES", "0"))  # make fuzz: 5000
FUZZ = settings(max_examples=SCALE or 150, deadline=None, derandomize=not SCALE,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def npy_bytes(tmp_path, a) -> bytes:
    np.save(tmp_path / "good.npy", a)
    return (tmp_path / "good.npy").read_bytes()


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """A .safetensors file written by hand (the format: u64 header length, JSON header, data)."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
             np.dtype(np.int64): "I64"}
    header, data = {}, b""
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


def read_gguf_whole(path, what):
    """A GGUF file's header, then a view of every tensor's bytes."""
    from kina.models.checkpoints.gguf import BLOCK_SIZES
    header = read_gguf(path, what, BLOCK_SIZES)
    for t in header.tensors.values():
        gguf_array(header, t).sum()


def gguf_bytes(tmp_path) -> bytes:
    """A small GGUF file: metadata of every value type, an F32, an F16 and a Q8_0 tensor."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "good.gguf"), arch="llama")
    w.add_block_count(2)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "bc", "<s>"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("b", np.ones(8, np.float16))
    w.add_tensor("q", gguf.quants.quantize(np.ones((2, 32), np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return (tmp_path / "good.gguf").read_bytes()


READERS = {"npy": read_npy, "npz": read_npz, "safetensors": read_safetensors, "json": read_json, "text": read_text,
           "gguf": read_gguf_whole}


def good_file(kind: str, tmp_path) -> bytes:
    if kind == "npy":
        return npy_bytes(tmp_path, np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    if kind == "npz":
        np.savez(tmp_path / "good.npz", a=np.ones((3, 5)), b=np.arange(7, dtype=np.int32))
        return (tmp_path / "good.npz").read_bytes()
    if kind == "safetensors":
        return safetensors_bytes({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float16)})
    if kind == "json":
        return json.dumps({"hidden_size": 64, "layers": [1, 2]}).encode()
    if kind == "gguf":
        return gguf_bytes(tmp_path)
    return "let f = fn() -> () { () }\n".encode()


def assert_clean(reader, path, what="the input"):
    """The reader succeeds, or raises FileError naming the file and what it was for."""
    try:
        reader(path, what)
    except FileError as e:
        assert str(path) in str(e) and what in str(e), e
        assert "\n" not in str(e)


@pytest.mark.parametrize("kind", READERS)
def test_missing_directory_and_empty_files(kind, tmp_path):
    reader = READERS[kind]
    for path, words in ((tmp_path / "nope", "no such file"), (tmp_path, "is a directory")):
        with pytest.raises(FileError, match=words) as e:
            reader(path, "the weights")
        assert str(path) in str(e.value) and "the weights" in str(e.value)
    (tmp_path / "empty").write_bytes(b"")
    if kind == "text":
        assert read_text(tmp_path / "empty", "x") == ""
    else:
        with pytest.raises(FileError, match="empty|too short|is 0 bytes"):
            reader(tmp_path / "empty", "x")


@pytest.mark.parametrize("kind", READERS)
def test_every_truncation_is_a_file_error(kind, tmp_path):
    data = good_file(kind, tmp_path)
    path = tmp_path / f"cut.{kind}"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        assert_clean(READERS[kind], path)


@pytest.mark.parametrize("kind", READERS)
@FUZZ
@given(data=st.data())
def test_damaged_bytes_are_a_file_error(kind, tmp_path, data):
    good = good_file(kind, tmp_path)
    how = data.draw(st.sampled_from(["random", "flip", "splice"]))
    if how == "random":
        damaged = data.draw(st.binary(max_size=300))
    elif how == "flip":
        i = data.draw(st.integers(0, len(good) - 1))
        damaged = good[:i] + bytes([good[i] ^ data.draw(st.integers(1, 255))]) + good[i + 1:]
    else:
        i = data.draw(st.integers(0, len(good)))
        damaged = good[:i] + data.draw(st.binary(min_size=1, max_size=40)) + good[i:]
    path = tmp_path / f"damaged.{kind}"
    path.write_bytes(damaged)
    assert_clean(READERS[kind], path)


def test_good_files_read_back_exactly(tmp_path):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (tmp_path / "a.npy").write_bytes(npy_bytes(tmp_path, a))
    np.testing.assert_array_equal(read_npy(tmp_path / "a.npy"), a)
    f = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    np.save(tmp_path / "f.npy", f)
    np.testing.assert_array_equal(read_npy(tmp_path / "f.npy"), f)
    np.savez(tmp_path / "z.npz", a=a, b=f)
    z = read_npz(tmp_path / "z.npz")
    assert sorted(z) == ["a", "b"] and np.array_equal(z["a"], a) and np.array_equal(z["b"], f)
    assert read_json(_write(tmp_path / "c.json", b'{"a": [1, 2]}')) == {"a": [1, 2]}


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_safetensors_match_the_safetensors_package(tmp_path):
    from safetensors.numpy import save_file
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "h": np.ones((2, 2), np.float16),
               "i": np.arange(5, dtype=np.int64)}
    save_file(tensors, tmp_path / "m.safetensors")
    got = read_safetensors(tmp_path / "m.safetensors", "the weights")
    assert sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v)
    bf = np.arange(8, dtype=np.float32).astype(ml_dtypes.bfloat16)
    _write(tmp_path / "b.safetensors", safetensors_bytes({"x": bf}))
    assert read_safetensors(tmp_path / "b.safetensors")["x"].dtype == ml_dtypes.bfloat16
    assert read_safetensors(tmp_path / "m.safetensors", names=["w"]).keys() == {"w"}
    with pytest.raises(FileError, match="has no tensor 'zz'"):
        read_safetensors(tmp_path / "m.safetensors", names=["zz"])


def test_headers_that_claim_huge_data_allocate_nothing(tmp_path):
    """A .npy header that declares 37 GiB, and a .safetensors one whose offsets pass the
    end, are refused from their sizes alone."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    path = _write(tmp_path / "huge.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"0" * 64)
    with pytest.raises(FileError, match=r"truncated: its header declares \[100000, 100000\] float32"):
        read_npy(path, "--input q")
    head = json.dumps({"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 4 << 40]}}).encode()
    path = _write(tmp_path / "huge.safetensors", struct.pack("<Q", len(head)) + head + b"\0" * 16)
    with pytest.raises(FileError, match="truncated: tensor 'w'"):
        read_safetensors(path)
    path = _write(tmp_path / "claim.safetensors", struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(FileError, match="claims"):
        safetensors_header(path)


def test_object_arrays_and_wrong_json_kinds_are_refused(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FileError, match="pickled"):
        read_npy(tmp_path / "o.npy")
    with pytest.raises(FileError, match="expected a JSON object"):
        read_json(_write(tmp_path / "l.json", b"[1, 2]"), "config.json")
    with pytest.raises(FileError, match=r"not valid JSON: .* line 1 column"):
        read_json(_write(tmp_path / "bad.json", b'{"a": '), "config.json")
    with pytest.raises(FileError, match="not UTF-8 text"):
        read_text(_write(tmp_path / "bin.mlir", b"module {\xff\xfe}"), "the input IR")


def test_size_limit(tmp_path):
    path = _write(tmp_path / "big.kina", b"x" * 2048)
    with pytest.raises(FileError, match="more than"):
        read_bytes(path, "the source", limit=1024)
    assert len(read_bytes(path, "the source", limit=None)) == 2048

"""Every file Kina reads goes through here: checked before it is trusted.

In:  a path and what it is for (`what`, e.g. "--input k_past" or "the weights"), so an
     error can say both.
Out: the file's bytes, text, JSON value, or arrays (`.npy`, `.npz`, `.safetensors`).

Guarantees: a file that is missing, a directory, empty, truncated, garbage or larger
than its reader allows raises one `FileError` (a ValueError) whose message names the
file and `what`, never another library's exception. Sizes that a header declares
(`.npy`, `.npz` members, `.safetensors`) are checked against the file's real size
before anything is allocated, so a header that claims 37 GiB costs nothing. Arrays are
read with NumPy alone (`.safetensors` too: no torch, no safetensors package), with
BF16 as `ml_dtypes.bfloat16`. Pickled (object) arrays are refused. A leaf: imports
nothing from kina.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_TEXT_BYTES = 64 << 20  # a .kina, .mlir or .json file larger than this is not one a person wrote
MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


class FileError(ValueError):
    """A file that cannot be used; the message names the file and what it was for."""

    def __init__(self, path, what: str, problem: str):
        self.path, self.what, self.problem = str(path), what, problem
        super().__init__(f"{what}: {path}: {problem}" if what else f"{path}: {problem}")


def _stat(path, what: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileError(path, what, "no such file") from None
    except OSError as e:
        raise FileError(path, what, f"cannot read it: {e.strerror or e}") from None
    if Path(path).is_dir():
        raise FileError(path, what, "is a directory, not a file")
    return st


def read_bytes(path, what: str = "", limit: int | None = MAX_TEXT_BYTES) -> bytes:
    """The whole file; refused when larger than `limit` bytes (None: no limit)."""
    size = _stat(path, what).st_size
    if limit is not None and size > limit:
        raise FileError(path, what, f"is {size} bytes, more than the {limit >> 20} MiB this reader takes")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise FileError(path, what, f"cannot read it: {e.strerror or e}") from None


def read_text(path, what: str = "", limit: int | None = MAX_TEXT_BYTES) -> str:
    """The file as UTF-8 text; a binary file is refused with the offset of its first bad byte."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(path, what, f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def read_json(path, what: str = "", expect: type = dict):
    """The file's JSON value, which must be an `expect` (a JSON object by default)."""
    text = read_text(path, what)
    if not text.strip():
        raise FileError(path, what, "is empty: expected a JSON object")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise FileError(path, what, f"is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise FileError(path, what, "is not valid JSON: nested too deeply") from None
    if not isinstance(value, expect):
        want = {dict: "a JSON object", list: "a JSON array"}.get(expect, expect.__name__)
        raise FileError(path, what, f"holds {type(value).__name__}, expected {want}")
    return value


# -- arrays -------------------------------------------------------------------------------

def _npy_header(f, path, what: str, size: int) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data bytes) from an .npy header, checked against `size`."""
    fmt = np.lib.format
    try:
        with warnings.catch_warnings():  # NumPy warns about old or odd headers; a bad one is refused below
            warnings.simplefilter("ignore")
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")
    except Exception as e:  # NumPy parses the header as Python literals: any failure means a bad header
        problem = str(e) or type(e).__name__
        raise FileError(path, what, f"is not a .npy array file ({problem.splitlines()[0]})") from None
    if dtype.hasobject:
        raise FileError(path, what, "holds Python objects (a pickled array), which Kina does not load")
    if dtype.itemsize == 0:
        raise FileError(path, what, f"holds elements of dtype {dtype}, which have no size")
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise FileError(path, what, f"declares a bad shape {shape}")
    nbytes, left = math.prod(shape) * dtype.itemsize, size - f.tell()
    if nbytes > left:
        raise FileError(path, what, f"is truncated: its header declares {list(shape)} {dtype} "
                                    f"({nbytes} bytes of data) but only {left} bytes follow the header")
    return shape, fortran, dtype, nbytes


def _read_data(f, path, what: str, shape, fortran: bool, dtype: np.dtype, nbytes: int) -> np.ndarray:
    try:
        data = f.read(nbytes)
    except (OSError, zipfile.BadZipFile, EOFError) as e:  # a damaged archive member
        raise FileError(path, what, f"cannot be read: {e}") from None
    if len(data) != nbytes:
        raise FileError(path, what, f"is truncated: expected {nbytes} bytes of data, found {len(data)}")
    a = np.frombuffer(data, dtype=dtype).copy()
    return a.reshape(shape[::-1]).transpose() if fortran else a.reshape(shape)


def read_npy(path, what: str = "") -> np.ndarray:
    """An array saved by `np.save`; NumPy's raw 2-byte (`V2`) values are left as they are."""
    size = _stat(path, what).st_size
    if size == 0:
        raise FileError(path, what, "is empty: expected a .npy array file")
    try:
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":
                raise FileError(path, what, "is an .npz archive, not a .npy array file (give each array as "
                                            "its own .npy file)")
            f.seek(0)
            shape, fortran, dtype, nbytes = _npy_header(f, path, what, size)
            return _read_data(f, path, what, shape, fortran, dtype, nbytes)
    except OSError as e:
        raise FileError(path, what, f"cannot read it: {e.strerror or e}") from None


def read_npz(path, what: str = "") -> dict[str, np.ndarray]:
    """The arrays of an archive written by `np.savez`, by name (each member's `.npy` dropped)."""
    if _stat(path, what).st_size == 0:
        raise FileError(path, what, "is empty: expected an .npz archive")
    try:
        archive = zipfile.ZipFile(path)
    except Exception as e:  # zipfile parses untrusted bytes: BadZipFile, NotImplementedError, ValueError, ...
        raise FileError(path, what, f"is not an .npz archive ({e})") from None
    out = {}
    with archive:
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            member = f"{path}[{info.filename}]"
            try:
                with archive.open(info) as f:
                    shape, fortran, dtype, nbytes = _npy_header(f, member, what, info.file_size)
                    out[name] = _read_data(f, member, what, shape, fortran, dtype, nbytes)
            except FileError:
                raise
            except Exception as e:  # a damaged member: a bad CRC, compression or local header
                raise FileError(member, what, f"cannot be read: {e}") from None
    return out


# The safetensors dtypes NumPy can hold (BF16 through ml_dtypes, imported when a file has one:
# importing it costs about half a second, which kinac's every start would pay).
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def safetensors_dtype(code: str) -> np.dtype:
    """The NumPy dtype of a safetensors dtype code (a key of SAFETENSORS_DTYPES)."""
    if code == "BF16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(SAFETENSORS_DTYPES[code])


def safetensors_header(path, what: str = "") -> tuple[dict[str, dict], int]:
    """(tensor name -> {dtype, shape, data_offsets}, where the data starts), every entry
    checked: a known dtype, offsets inside the file and matching the shape."""
    size = _stat(path, what).st_size
    if size < 8:
        raise FileError(path, what, f"is {size} bytes: too short for a .safetensors file (an 8-byte header length first)")
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(size - 8, MAX_SAFETENSORS_HEADER):
                raise FileError(path, what, f"is not a .safetensors file, or is truncated: its header claims "
                                            f"{n} bytes and the file has {size - 8} after the length")
            raw = f.read(n)
    except OSError as e:
        raise FileError(path, what, f"cannot read it: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FileError(path, what, f"is not a .safetensors file: its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise FileError(path, what, "is not a .safetensors file: its header is not a JSON object")
    start, data = 8 + n, size - 8 - n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(entry, dict) and isinstance(entry.get("shape"), list)
                and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                        for x in [*entry["shape"], *entry["data_offsets"]])):
            raise FileError(path, what, f"tensor {name!r}: a malformed header entry {entry!r}")
        if entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise FileError(path, what, f"tensor {name!r}: dtype {entry.get('dtype')!r} is not one Kina reads "
                                        f"({', '.join(SAFETENSORS_DTYPES)})")
        begin, end = entry["data_offsets"]
        nbytes = math.prod(entry["shape"]) * safetensors_dtype(entry["dtype"]).itemsize
        if end < begin or end - begin != nbytes:
            raise FileError(path, what, f"tensor {name!r}: offsets {begin}..{end} do not hold "
                                        f"{entry['shape']} {entry['dtype']} ({nbytes} bytes)")
        if end > data:
            raise FileError(path, what, f"is truncated: tensor {name!r} ends at byte {end} of the data, "
                                        f"which has only {data} bytes")
        tensors[name] = entry
    return tensors, start


def read_safetensors(path, what: str = "", names=None, mmap: bool = False) -> dict[str, np.ndarray]:
    """The tensors of a `.safetensors` file (only `names`, if given), read with NumPy; with
    `mmap`, read-only views of a memory map of the file (nothing read until used)."""
    tensors, start = safetensors_header(path, what)
    if names is not None:
        missing = sorted(set(names) - tensors.keys())
        if missing:
            raise FileError(path, what, f"has no tensor {', '.join(map(repr, missing))}")
        tensors = {k: tensors[k] for k in names}
    out = {}
    try:
        if mmap:
            size = os.stat(path).st_size
            data = np.memmap(path, np.uint8, mode="r", offset=start) if size > start else np.zeros(0, np.uint8)
            for name, entry in tensors.items():
                begin, end = entry["data_offsets"]
                dtype = safetensors_dtype(entry["dtype"])
                out[name] = data[begin:end].view(dtype).reshape(entry["shape"])
            return out
        with open(path, "rb") as f:
            for name, entry in tensors.items():
                begin, end = entry["data_offsets"]
                f.seek(start + begin)
                data = f.read(end - begin)
                if len(data) != end - begin:
                    raise FileError(path, what, f"is truncated inside tensor {name!r}")
                dtype = safetensors_dtype(entry["dtype"])
                out[name] = np.frombuffer(data, dtype=dtype).copy().reshape(entry["shape"])
    except OSError as e:
        raise FileError(path, what, f"cannot read it: {e.strerror or e}") from None
    return out


# -- GGUF ---------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
# every ggml type id a GGUF file may name, and its name (Kina reads some of them: the caller says which)
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
                   11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
                   18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8",
                   25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0",
                   39: "MXFP4"}
# value type id -> (struct format, size) for the fixed-size ones; 7 is bool, 8 a string, 9 an array
_GGUF_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
                 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_GGUF_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
               12: "<f8"}
MAX_GGUF_DIMS = 4


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: `shape` in NumPy's order (the file's dims reversed: a
    Linear's [out, in]), its ggml `type` name, where its bytes start in the file and how many."""

    name: str
    shape: tuple[int, ...]
    type: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: str
    version: int
    metadata: dict
    tensors: dict
    alignment: int
    data_start: int


class _Cursor:
    """The header, read in order from a memory map of the file; every length is checked against
    what is left of the file before anything is read or allocated."""

    def __init__(self, buf, path, what: str, size: int):
        self.buf, self.path, self.what, self.size, self.pos = buf, path, what, size, 0

    def fail(self, problem: str):
        raise FileError(self.path, self.what, problem)

    def take(self, n: int, for_what: str) -> bytes:
        if n > self.size - self.pos:
            self.fail(f"is truncated: {for_what} at byte {self.pos} needs {n} bytes, the file has "
                      f"{self.size - self.pos} more")
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def scalar(self, kind: int, for_what: str):
        fmt, n = _GGUF_SCALARS[kind]
        return struct.unpack(fmt, self.take(n, for_what))[0]

    def string(self, for_what: str) -> str:
        n = self.scalar(10, f"the length of {for_what}")
        raw = self.take(n, for_what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{for_what} is not UTF-8 text")

    def strings(self, n: int, for_what: str) -> list[str]:
        """`n` strings in a row (a vocabulary: 50k and more), in one tight loop; at the first
        that is damaged, `string` reads it again to say what is wrong."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        length = _U64.unpack_from
        for i in range(n):
            if size - pos >= 8:
                (m,) = length(buf, pos)
                if m <= size - pos - 8:
                    try:
                        out.append(str(buf[pos + 8:pos + 8 + m], "utf-8"))
                        pos += 8 + m
                        continue
                    except UnicodeDecodeError:
                        pass
            self.pos = pos
            self.string(f"{for_what}[{i}]")  # raises
        self.pos = pos
        return out

    def value(self, kind: int, for_what: str, depth: int = 0):
        if kind in _GGUF_SCALARS:
            return self.scalar(kind, for_what)
        if kind == 8:
            return self.string(for_what)
        if kind != 9:
            self.fail(f"{for_what} has an unknown value type {kind}")
        if depth > 2:
            self.fail(f"{for_what}: arrays nested more than 3 deep")
        elem = self.scalar(4, f"the element type of {for_what}")
        n = self.scalar(10, f"the length of {for_what}")
        least = _GGUF_SCALARS[elem][1] if elem in _GGUF_SCALARS else 8 if elem in (8, 9) else 1
        if n * least > self.size - self.pos:
            self.fail(f"is truncated: {for_what} claims {n} elements, more than the {self.size - self.pos} bytes left")
        if elem in _GGUF_NUMPY:
            return np.frombuffer(self.take(n * least, for_what), _GGUF_NUMPY[elem]).copy()
        if elem == 8:
            return self.strings(n, for_what)
        return [self.value(elem, f"{for_what}[{i}]", depth + 1) for i in range(n)]


_U64 = struct.Struct("<Q")


def read_gguf(path, what: str = "", block_sizes=None) -> GGUFFile:
    """A GGUF file's header: its metadata (key -> value; arrays of numbers as NumPy arrays) and
    tensors (name -> GGUFTensor), each checked: the magic and version (2 or 3), every count,
    length and offset inside the file, a known ggml type, the inner dim a whole number of
    blocks, offsets aligned. `block_sizes` (type name -> (elements, bytes) per block) lists the
    types the caller reads; a tensor of another type is refused, naming the type. Nothing is
    allocated from a size the file merely claims; the data is not read (`gguf_array`)."""
    size = _stat(path, what).st_size
    block_sizes = block_sizes or {}
    try:
        if size < 24:
            raise FileError(path, what, f"is {size} bytes: too short for a GGUF file (a 24-byte header first)")
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(buf, path, what, min(size, len(buf)))
            magic = c.take(4, "the magic")
            if magic != GGUF_MAGIC:
                c.fail(f"is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
            version = c.scalar(4, "the version")
            if version not in (2, 3):
                c.fail(f"is GGUF version {version}: Kina reads versions 2 and 3")
            n_tensors = c.scalar(10, "the tensor count")
            n_kv = c.scalar(10, "the metadata count")
            if n_kv * 13 > size - c.pos or n_tensors * 24 > size - c.pos:
                c.fail(f"is truncated or damaged: it claims {n_kv} metadata entries and {n_tensors} tensors, more "
                       f"than its {size} bytes can hold")
            metadata = {}
            for i in range(n_kv):
                key = c.string(f"metadata key {i}")
                kind = c.scalar(4, f"the type of {key!r}")
                if key in metadata:
                    c.fail(f"metadata key {key!r} appears twice")
                metadata[key] = c.value(kind, f"metadata {key!r}")
            alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
            if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or \
                    alignment & (alignment - 1):
                c.fail(f"metadata 'general.alignment' = {alignment!r}: expected a power of two")
            infos = []
            for i in range(n_tensors):
                name = c.string(f"the name of tensor {i}")
                n_dims = c.scalar(4, f"the rank of tensor {name!r}")
                if not 1 <= n_dims <= MAX_GGUF_DIMS:
                    c.fail(f"tensor {name!r} has {n_dims} dims (1 to {MAX_GGUF_DIMS} are allowed)")
                dims = [c.scalar(10, f"dim {d} of tensor {name!r}") for d in range(n_dims)]
                kind = c.scalar(4, f"the type of tensor {name!r}")
                offset = c.scalar(10, f"the offset of tensor {name!r}")
                infos.append((name, dims, kind, offset))
            data_start = -(-c.pos // alignment) * alignment
    except OSError as e:
        raise FileError(path, what, f"cannot read it: {e.strerror or e}") from None
    tensors = {}
    for name, dims, kind, offset in infos:
        where = f"tensor {name!r}"
        if kind not in GGML_TYPE_NAMES:
            raise FileError(path, what, f"{where} has an unknown ggml type {kind}")
        tname = GGML_TYPE_NAMES[kind]
        if tname not in block_sizes:
            raise FileError(path, what, f"{where} is {tname}, which is not supported; supported: "
                                        f"{', '.join(block_sizes)}")
        elements, nbytes = block_sizes[tname]
        if dims[0] % elements:
            raise FileError(path, what, f"{where} is {tname} [{', '.join(map(str, dims[::-1]))}]: its inner dim "
                                        f"{dims[0]} is not a multiple of the {elements}-element block")
        count = math.prod(dims)
        total = count // elements * nbytes
        if offset % alignment:
            raise FileError(path, what, f"{where} starts at offset {offset}, not a multiple of the alignment "
                                        f"{alignment}")
        if data_start + offset + total > size:
            raise FileError(path, what, f"is truncated: {where} ({tname}, {total} bytes at offset {offset}) ends "
                                        f"past the end of the file")
        if name in tensors:
            raise FileError(path, what, f"{where} appears twice")
        tensors[name] = GGUFTensor(name, tuple(dims[::-1]), tname, data_start + offset, total)
    return GGUFFile(str(path), version, metadata, tensors, alignment, data_start)


def gguf_array(gguf: GGUFFile, tensor: GGUFTensor, numpy_dtype=None) -> np.ndarray:
    """A read-only memory-mapped view of `tensor`'s bytes: as `numpy_dtype` of its shape (a
    float type), or as uint8 [rows, bytes per row] (a block type: None)."""
    data = np.memmap(gguf.path, np.uint8, mode="r", offset=tensor.offset, shape=(tensor.nbytes,)) \
        if tensor.nbytes else np.zeros(0, np.uint8)
    if numpy_dtype is not None:
        return data.view(numpy_dtype).reshape(tensor.shape)
    rows = math.prod(tensor.shape[:-1])
    return data.reshape(rows, tensor.nbytes // max(rows, 1))

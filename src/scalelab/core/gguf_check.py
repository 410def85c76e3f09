"""Read a GGUF file's header before anything dequantizes it: architecture, tensor table, size the table implies.

A GGUF is a header (key/value metadata), a tensor table (name, type, shape, offset) and the tensor data
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). A file cut short still has a readable header, so
its size is checked against the end of the last tensor the table lists.

The header is walked here rather than with gguf.GGUFReader, which turns every value into numpy views: a Qwen2.5
vocabulary (151,936 tokens and as many merges) took it ~20 s on a 2-core machine. Here the two big string
arrays are skipped by their length prefixes, well under a second.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from scalelab.core.wheelparts import ModelError

# value types of the GGUF spec: scalar struct formats by type id, 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_KEEP = ("general.architecture", "general.name", "general.file_type", "general.alignment", "tokenizer.chat_template")


@dataclass(frozen=True)
class GgufInfo:
    architecture: str          # general.architecture, e.g. "qwen2"
    name: str                  # general.name ('' when absent)
    file_type: int             # general.file_type (15 = Q4_K_M); -1 when absent
    n_tensors: int
    data_end_bytes: int        # where the last tensor's data ends: the least size of a whole file
    file_bytes: int
    has_output_weight: bool    # its own output.weight, i.e. the LM head is not tied to the embedding
    chat_template: str         # tokenizer.chat_template ('' when absent)


class _Short(Exception):
    """The header ends before what it announces."""


def _take(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise _Short(f"wanted {n} bytes at offset {f.tell() - len(b)}, the file ends there")
    return b


def _unpack(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _take(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO, keep: bool = True) -> str:
    n = _unpack(f, "<Q")
    if not keep:
        f.seek(n, 1)
        return ""
    return _take(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int, keep: bool) -> Any:
    """One value of type `vtype`; arrays are skipped (no key this reader keeps is an array)."""
    if vtype in _SCALARS:
        return _unpack(f, _SCALARS[vtype])
    if vtype == 8:
        return _string(f, keep)
    if vtype == 9:
        itype, count = _unpack(f, "<I"), _unpack(f, "<Q")
        if itype in _SCALARS:
            f.seek(count * struct.calcsize(_SCALARS[itype]), 1)
        else:
            for _ in range(count):
                _value(f, itype, False)
        return None
    raise ValueError(f"unknown GGUF value type {vtype}")


def _tensor_bytes(ggml_type: int, shape: list[int]) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return math.prod(shape) // block * nbytes


def _walk(f: BinaryIO) -> tuple[dict[str, Any], list[tuple[str, int]], int]:
    """(kept metadata, [(tensor name, end of its data)], data start) of an open GGUF."""
    if _take(f, 4) != b"GGUF":
        raise ValueError("no GGUF magic")
    version = _unpack(f, "<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} (this reader needs 2 or later)")
    n_tensors, n_kv = _unpack(f, "<Q"), _unpack(f, "<Q")
    meta = {}
    for _ in range(n_kv):
        key = _string(f)
        value = _value(f, _unpack(f, "<I"), key in _KEEP)
        if key in _KEEP:
            meta[key] = value
    tensors = []
    for _ in range(n_tensors):
        name = _string(f)
        shape = [_unpack(f, "<Q") for _ in range(_unpack(f, "<I"))]
        ggml_type, offset = _unpack(f, "<I"), _unpack(f, "<Q")
        tensors.append((name, offset + _tensor_bytes(ggml_type, shape)))
    align = int(meta.get("general.alignment", 32))
    return meta, tensors, -(-f.tell() // align) * align


def read_gguf_info(path: str | Path) -> GgufInfo:
    """The header of `path`; a file that is not a GGUF or is shorter than its tensor table is an error."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such GGUF file")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            meta, tensors, data_start = _walk(f)
    except (_Short, ValueError, KeyError, struct.error) as e:
        raise ModelError(f"{path}: truncated or not a GGUF ({size} bytes; {e})") from None
    end = data_start + max((e for _, e in tensors), default=0)
    info = GgufInfo(str(meta.get("general.architecture", "")), str(meta.get("general.name", "")),
                    int(meta.get("general.file_type", -1)), len(tensors), end, size,
                    any(name == "output.weight" for name, _ in tensors),
                    str(meta.get("tokenizer.chat_template", "")))
    if size < end:
        raise ModelError(f"{path}: truncated, {size} bytes but its tensor table ends at byte {end}")
    return info


def check_gguf(path: str | Path, architecture: str, size_bytes: int | None = None) -> GgufInfo:
    """read_gguf_info, then the architecture (and the exact size, when pinned) the registry expects."""
    path = Path(path)
    if size_bytes is not None and path.is_file() and path.stat().st_size != size_bytes:
        raise ModelError(f"{path}: {path.stat().st_size} bytes, expected {size_bytes} (truncated or a different "
                         "file)")
    info = read_gguf_info(path)
    if info.architecture != architecture:
        raise ModelError(f"{path}: general.architecture is {info.architecture!r}, expected {architecture!r}")
    return info

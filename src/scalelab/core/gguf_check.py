"""Read a GGUF file's header before anything dequantizes it: architecture, tensor table, size the table implies.

A GGUF is a header (key/value metadata), a tensor table (name, type, shape, offset) and the tensor data
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). A file cut short still has a readable header, so
its size is checked against the end of the last tensor the table lists.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scalelab.core.wheelparts import ModelError


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


def _field(reader, key: str, default):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf_info(path: str | Path) -> GgufInfo:
    """The header of `path`; a file that is not a GGUF or is shorter than its tensor table is an error."""
    from gguf import GGUFReader
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such GGUF file")
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, OSError) as e:
        # a cut inside the tensor table or data shows up as a short read of the memory map
        raise ModelError(f"{path}: truncated or not a GGUF ({size} bytes; {e})") from None
    end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    info = GgufInfo(str(_field(reader, "general.architecture", "")), str(_field(reader, "general.name", "")),
                    int(_field(reader, "general.file_type", -1)), len(reader.tensors), end, size,
                    any(t.name == "output.weight" for t in reader.tensors),
                    str(_field(reader, "tokenizer.chat_template", "")))
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

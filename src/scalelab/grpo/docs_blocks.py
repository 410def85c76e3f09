"""A docs page made of blocks (docs/grpo.toml's [[page]] entries), in the manifest's order: written prose, a calc
command with what it prints, or a section generated from committed results. This module reads and checks the
manifest and renders the page; the section kinds themselves (a BlockKind each: its heading, the keys it reads,
its renderer) are defined beside their data (grpo.docs for the toy-model studies and benches, grpo.docs_real for
the real-model runs, grpo.docs_bench for the real-model benches) and passed in.

    load_page(manifest, kinds) -> Page   read: the manifest, its prose file; every block checked against its kind
    render(page, kinds) -> str           render: the title, the generated-by line, then each block
    write_page(manifest, kinds, out)     both, saved

A section whose named file or folder is not there renders as its heading and "Not measured yet", naming it,
never as a number; a manifest that is malformed (no kind, an unknown kind, a missing or unknown key, a prose
section placed twice or not at all) is a ManifestError naming the entry.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from scalelab.calc.docs import calc_block
from scalelab.core.jsonio import is_stored
from scalelab.core.sections import (Manifest, ManifestError, check_prose_placed, read_manifest, read_prose,
                                    write_doc)

NOT_MEASURED = "Not measured yet"
FIGURES = "figures"             # beside the Markdown file
COMMON_KEYS = ("section", "heading")


@dataclass(frozen=True)
class Inputs:
    """What one section block reads: its keys' values, the results folder they are relative to, and where its
    figures go."""
    results: Path               # the manifest's `results` folder
    shown: str                  # that folder as the manifest spells it, for the page
    out_dir: Path               # the page's folder: figures are written to its figures/ and linked relative to it
    values: Mapping[str, Any]   # the block's keys
    paths: tuple[str, ...]      # the keys that name a file or folder under `results`

    def path(self, key: str) -> Path:
        return self.results / self.values[key]

    def label(self, key: str) -> str:
        """The path as the page names it: relative to the repository, as a reader would look for it."""
        return f"{self.shown}/{self.values[key]}"

    @property
    def suffix(self) -> str:
        """A figure-name suffix from this block's inputs, so two blocks of one kind never share a figure file: the
        first path as a slug, then a short hash of any others."""
        if not self.paths:
            return ""
        first, *rest = (str(self.values[k]) for k in self.paths)
        slug = re.sub(r"[^A-Za-z0-9._]+", "-", first.removesuffix(".json")).strip("-")
        extra = f"-{hashlib.sha256('|'.join(rest).encode()).hexdigest()[:6]}" if rest else ""
        return f"-{slug}{extra}"

    def figure(self, stem: str) -> Path:
        return self.out_dir / FIGURES / f"{stem}{self.suffix}.png"

    def image(self, path: Path, alt: str) -> str:
        return f"![{alt}]({path.relative_to(self.out_dir).as_posix()})"


@dataclass(frozen=True)
class BlockKind:
    name: str                   # the value of `section =`
    heading: str                # the block's own first line ("### ..."), also when nothing was measured
    paths: tuple[str, ...]      # required keys naming a file or folder under `results`; each must be there
    render: Callable[[Inputs], list[str]]   # the block's lines, its heading first


@dataclass(frozen=True)
class Block:
    number: int                 # 1-based, as errors name the [[page]] entry
    kind: str                   # "prose", "calc" or a section kind
    values: Mapping[str, Any]


@dataclass(frozen=True)
class Page:
    manifest: Manifest
    title: str
    blocks: tuple[Block, ...]
    prose: Mapping[str, str]    # prose section name -> its Markdown
    results: Path
    out: Path                   # the Markdown file; figures go beside it, in figures/
    command: str                # the command that regenerates the page


def _block(m: Manifest, number: int, entry: Mapping, kinds: Mapping[str, BlockKind]) -> Block:
    where = f"{m.path}: [[page]] entry {number}"
    found = [k for k in ("prose", "calc", "section") if k in entry]
    if len(found) != 1:
        raise ManifestError(f"{where} needs exactly one of prose, calc, section: {dict(entry)}")
    if found[0] != "section":
        return Block(number, found[0], dict(entry))
    kind = kinds.get(entry["section"])
    if kind is None:
        raise ManifestError(f"{where}: unknown section {entry['section']!r} (known: {', '.join(sorted(kinds))})")
    missing = [k for k in kind.paths if k not in entry]
    unknown = sorted(set(entry) - {*COMMON_KEYS, *kind.paths})
    if missing or unknown:
        raise ManifestError(f"{where} (section {kind.name}): missing key(s) {missing or 'none'}; unknown key(s) "
                            f"{unknown or 'none'}")
    return Block(number, kind.name, dict(entry))


def load_page(manifest: Manifest | str | Path, kinds: Mapping[str, BlockKind], out: Path | None = None,
              job: str = "grpo") -> Page:
    """out: the file to write instead of the manifest's `out`."""
    m = manifest if isinstance(manifest, Manifest) else read_manifest(manifest, job=job)
    entries = m.require("page")
    blocks = tuple(_block(m, i + 1, e, kinds) for i, e in enumerate(entries))
    prose = read_prose(m.path_of(m.require("prose")))
    check_prose_placed(m.path, [b.values["prose"] for b in blocks if b.kind == "prose"], prose)
    return Page(m, m.require("title"), blocks, prose, m.folder("results"), out or m.out,
                f"scalelab {job} docs {m.path.as_posix()}")


# ---------------------------------------------------------------------------------------------
# rendering


def _intro(p: Page) -> str:
    return (f"# {p.title}\n\n*Generated by `{p.command}`: the tables and figures are read from the committed "
            f"results the manifest names (below `{p.manifest.require('results')}/`; a file that is not there says "
            "so), the calc output is computed when the page is generated; the prose is written "
            f"(`{p.manifest.require('prose')}`) and quotes those outputs.*")


def _there(path: Path) -> bool:
    return path.is_dir() or is_stored(path)   # a folder, or a file plain, compressed or a .same pointer


def _not_measured(kind: BlockKind, inputs: Inputs, absent: list[str]) -> list[str]:
    names = " and ".join(f"`{inputs.label(k)}`" for k in absent)
    return [kind.heading, "", f"{NOT_MEASURED}: {names} {'is' if len(absent) == 1 else 'are'} not there."]


def _section(p: Page, b: Block, kind: BlockKind) -> str:
    inputs = Inputs(p.results, p.manifest.require("results"), p.out.parent, b.values, kind.paths)
    absent = [k for k in kind.paths if not _there(inputs.path(k))]
    lines = _not_measured(kind, inputs, absent) if absent else list(kind.render(inputs))
    if "heading" in b.values:
        lines[0] = b.values["heading"]
    return "\n".join(lines).strip("\n")


def _render_block(p: Page, b: Block, kinds: Mapping[str, BlockKind]) -> str:
    if b.kind == "prose":
        return p.prose[b.values["prose"]]
    if b.kind == "calc":
        try:
            return calc_block(b.values["calc"], p.results, b.values.get("tables"))
        except ManifestError as e:
            raise ManifestError(f"{p.manifest.path}: [[page]] entry {b.number}: {e}") from None
    return _section(p, b, kinds[b.kind])


def render(p: Page, kinds: Mapping[str, BlockKind]) -> str:
    return "\n\n".join([_intro(p), *(_render_block(p, b, kinds) for b in p.blocks)]) + "\n"


def write_page(manifest: str | Path, kinds: Mapping[str, BlockKind], out: Path | None = None) -> Path:
    """The page (the manifest's `out`, or `out`); figures beside it, in figures/."""
    page = load_page(manifest, kinds, out)
    return write_doc(render(page, kinds), page.out)

"""docs/serve.md as a post: written prose (a prose file beside the manifest) placed among the sections serve.docs
generates from the sweep folders. The manifest's `[[page]]` entries say the order; each has one of

    prose = NAME       a written section of the manifest's `prose` file (core.sections.read_prose)
    section = NAME     a generated section (serve.docs.SECTION_NAMES); the title always comes first

Every prose section is placed exactly once; a generated section may be left out (its numbers are then only in
the run folders' REPORT.md) but not placed twice. Without `[[page]]`, the generated sections in their default
order, as before.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from scalelab.core.sections import Manifest, ManifestError, check_prose_placed, read_prose

KINDS = ("prose", "section")


def page_blocks(m: Manifest, names: Sequence[str]) -> list[tuple[str, str]]:
    """The manifest's [[page]] as (kind, name) pairs, checked against the generated section names."""
    blocks = []
    for i, b in enumerate(m.require("page")):
        kinds = [k for k in KINDS if isinstance(b, Mapping) and k in b]
        if len(kinds) != 1:
            raise ManifestError(f"{m.path}: [[page]] entry {i + 1} needs exactly one of {', '.join(KINDS)}: {b}")
        blocks.append((kinds[0], str(b[kinds[0]])))
    placed = [n for k, n in blocks if k == "section"]
    unknown = [n for n in placed if n not in names]
    twice = sorted({n for n in placed if placed.count(n) > 1})
    if unknown or twice or "title" in placed:
        raise ManifestError(f"{m.path}: [[page]] sections unknown: {unknown or 'none'} (known: {', '.join(names)}); "
                            f"placed twice: {twice or 'none'}; the title is placed first by itself")
    return blocks


def join_sections(sections: Mapping[str, list[str]]) -> str:
    """The generated sections in their own order, nothing placed among them."""
    return "\n".join(line for lines in sections.values() for line in lines)


def assemble(m: Manifest | None, sections: Mapping[str, list[str]]) -> str:
    """The title, then each [[page]] block: a prose section as written, a generated section as generated (an
    empty one, e.g. no open-loop folder, leaves nothing). No manifest, or one without [[page]]: join_sections."""
    if m is None or m.get("page") is None:
        return join_sections(sections)
    blocks = page_blocks(m, list(sections))
    prose = read_prose(m.path_of(m.require("prose")))
    check_prose_placed(m.path, [n for k, n in blocks if k == "prose"], prose)
    out = list(sections["title"])
    for kind, name in blocks:
        out += [prose[name], ""] if kind == "prose" else list(sections[name])
    return "\n".join(out)

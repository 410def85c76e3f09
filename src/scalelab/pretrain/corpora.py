"""What the mixed pretraining corpus (ShareGPT plus public-domain text, one manifest) needs beyond the plain
sources: NLTK's corpus zips read as NLTK reads them, and the part syntax of `mix`, which chains other sources and
names every document's group after the part and file it came from, so that routing rules can name files
(DocumentRouter's train_only patterns). The Source classes are in scalelab.pretrain.sources.

    nltk-zip   every *.zip under path: *.txt members one document each (UTF-8, else the codec NLTK's corpus
               loader declares for that corpus), Shakespeare's *.xml plays as plain text; README/DTD/CSS skipped
    mix        parts = ["sharegpt:", "text:<folder>", "nltk-zip:<folder>", ...], read in that order; a document's
               group is "<part label>/<its own group or file>", a part's label being its folder or file name
"""
from __future__ import annotations

import fnmatch
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import Iterator

from scalelab.core.readers import SourceError

# NLTK 3.x's codecs for these corpora (nltk/corpus/__init__.py, the LazyCorpusLoader definitions), first match
# of the member path wins; tried only when a member is not valid UTF-8 (the modern re-encodes of some files are).
NLTK_CODECS: tuple[tuple[str, str], ...] = (
    ("genesis/finnish*", "latin_1"), ("genesis/french*", "latin_1"), ("genesis/german*", "latin_1"),
    ("genesis/swedish*", "cp865"), ("inaugural/*", "latin1"), ("state_union/*", "ISO-8859-2"))
SKIPPED_SUFFIXES = (".dtd", ".css")
# The elements of Jon Bosak's play DTD (play.dtd) that hold text a reader sees, outside speeches.
PLAY_BLOCKS = {"TITLE", "SUBTITLE", "PERSONA", "GRPDESCR", "SCNDESCR", "PLAYSUBT", "STAGEDIR", "SUBHEAD"}


def decode_member(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        pass
    for pattern, codec in NLTK_CODECS:
        if fnmatch.fnmatch(name, pattern):
            return data.decode(codec)
    raise SourceError(f"{name}: not UTF-8, and NLTK declares no codec for it")


def _flat(el: ET.Element) -> str:
    return " ".join("".join(el.itertext()).split())


def play_text(xml: bytes) -> str:
    """A play in the Bosak XML as tiny-shakespeare lays plays out: each speech "SPEAKER:" then its lines,
    blocks separated by a blank line; titles, personae and stage directions as their own lines."""
    root = ET.fromstring(xml)  # noqa: S314 (a local public-domain file listed in the shared data's SHA256SUMS)
    in_speech = {id(d) for sp in root.iter("SPEECH") for d in sp.iter() if d is not sp}
    blocks = []
    for el in root.iter():
        if el.tag == "SPEECH":
            speakers = [f"{_flat(s)}:" for s in el.findall("SPEAKER")]
            lines = [_flat(c) for c in el if c.tag in ("LINE", "STAGEDIR")]
            blocks.append("\n".join(speakers + [ln for ln in lines if ln]))
        elif el.tag in PLAY_BLOCKS and id(el) not in in_speech and _flat(el):
            blocks.append(_flat(el))
    return "\n\n".join(blocks) + "\n"


def zip_documents(path: Path, group_by_file: bool) -> Iterator[tuple[str, str]]:
    """(text, group) per member of one zip, in name order; group "<zip>/<member>" or ""."""
    with zipfile.ZipFile(path) as zf:
        for name in sorted(n for n in zf.namelist() if not n.endswith("/")):
            base = name.rsplit("/", 1)[-1]
            if base.upper().startswith("README") or base.endswith(SKIPPED_SUFFIXES):
                continue
            data = zf.read(name)
            text = play_text(data) if name.endswith(".xml") else decode_member(name, data)
            yield text, (f"{path.name}/{name}" if group_by_file else "")


def parse_part(part: str) -> tuple[str, str]:
    """"text:../shared/data/corpora/tinyshakespeare" -> ("text", that path); "sharegpt:" -> ("sharegpt", "")."""
    name, sep, path = part.partition(":")
    if not sep or not name:
        raise SourceError(f"mix part {part!r}: expected SOURCE:PATH, e.g. text:corpora/books (PATH may be empty)")
    if name == "mix":
        raise SourceError(f"mix part {part!r}: a mix cannot contain a mix")
    return name, path


def part_label(name: str, path: str) -> str:
    return Path(path).name if path else name

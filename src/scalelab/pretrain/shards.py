"""Token shards in the llm.c / modded-nanogpt format, and the stream that feeds the trainer.

File layout (llm.c `dev/data/data_common.py`): a header of 256 little-endian int32 — [0] magic 20240520,
[1] version 1, [2] token count, the rest zero — followed by the tokens as little-endian uint16.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from scalelab.core import errors

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_TOKEN_ID = 2**16 - 1


class ShardError(errors.DataError, ValueError):
    """A shard file is missing, truncated, or has a wrong header."""


def write_shard(path: str | Path, tokens: np.ndarray) -> str:
    """Write tokens atomically (tmp file + rename); return the file's sha256."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > MAX_TOKEN_ID):
        raise ShardError(f"{path}: token ids must lie in [0, {MAX_TOKEN_ID}] for uint16 shards")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, tokens.size
    payload = header.tobytes() + tokens.astype("<u2").tobytes()
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(payload).hexdigest()


def read_header(path: str | Path) -> int:
    """Validate a shard's header against its size; return its token count."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"shard not found: {path}")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ShardError(f"{path}: bad magic {int(header[0])} (expected {MAGIC}); not an llm.c token shard")
    if header[1] != VERSION:
        raise ShardError(f"{path}: unsupported version {int(header[1])} (expected {VERSION})")
    ntok = int(header[2])
    expected = HEADER_BYTES + 2 * ntok
    if ntok < 0 or size != expected:
        raise ShardError(f"{path}: header says {ntok} tokens ({expected} bytes) but the file has {size} bytes; "
                         "truncated or corrupt")
    return ntok


def read_shard(path: str | Path) -> np.ndarray:
    """All tokens of a validated shard as a read-only uint16 memmap."""
    ntok = read_header(path)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(ntok,))


def list_shards(data_dir: str | Path, split: str) -> list[Path]:
    files = sorted(Path(data_dir).glob(f"{split}_*.bin"))
    if not files:
        raise ShardError(f"no {split}_*.bin shards in {data_dir} (run `scalelab pretrain prepare` first)")
    return files


def verify_shards(data_dir: str | Path) -> int:
    """Check every shard the manifest lists against its recorded sha256 (after a copy or an unpack, before a
    run records the manifest's hash as its data's identity); return the number of tokens checked."""
    path = Path(data_dir) / "manifest.json"
    manifest_hash(data_dir)  # the missing-manifest error
    try:
        shards = json.loads(path.read_text())["shards"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ShardError(f"{path}: not a prepare manifest with a 'shards' list ({e})") from e
    tokens = 0
    for s in shards:
        f = Path(data_dir) / s["file"]
        tokens += read_header(f)
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        if digest != s["sha256"]:
            raise ShardError(f"{f}: sha256 {digest[:12]}… differs from the manifest's {s['sha256'][:12]}…; "
                             "the copy is corrupt or comes from another prepare run")
    return tokens


def manifest_hash(data_dir: str | Path) -> str:
    """sha256 of the data folder's manifest.json: what a run records and checks on resume."""
    path = Path(data_dir) / "manifest.json"
    if not path.is_file():
        raise ShardError(f"{data_dir}: no manifest.json (prepare writes one beside the shards)")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class StreamPosition:
    """Where the stream will read next; saved in checkpoints so a resumed run sees the same tokens.
    `offset` counts tokens in sequential order and windows (of the shard's permutation) in shuffled order."""
    shard: int = 0
    offset: int = 0
    epoch: int = 0


class TokenStream:
    """(B, T) windows over the shards for one rank, in one global order shared by all ranks.

    Sequential (llm.c's DistributedDataLoader): each step the ranks read adjacent spans of B*T+1 tokens
    starting at `offset`, which then advances by B*T*world. Shuffled (`shuffle_seed` set; nanoGPT samples
    random windows for the same reason): the shard is cut into T+1-token windows at stride T, served in a
    permutation seeded by (seed, epoch, shard), rank r taking windows [offset + r*B, offset + (r+1)*B).
    Either way the global batch of a step is the same for any split of it into ranks or micro-batches,
    which is what makes DDP == one process and grad-accum == big batch hold exactly. A shard too short for
    the next step's windows rolls over to the next shard, and past the last shard to a new epoch.

    One pass: within an epoch each window is served at most once, to one rank (a permutation, i.e. drawn without
    replacement, read at a cursor that only moves forward, each rank at its own B-wide slice of it), and a resumed
    stream rebuilds the same permutation from the saved (epoch, shard). So the first `one_pass(...).steps` steps
    predict no target token twice, as a one-pass baseline by the speedrun's rules needs; the windows left out are
    the last (windows mod B*world) of each shard's permutation and the micro-batches short of a whole step.
    """

    def __init__(self, files: list[Path], batch: int, seq: int, rank: int = 0, world: int = 1,
                 position: StreamPosition | None = None, shuffle_seed: int | None = None):
        self.files, self.B, self.T, self.rank, self.world = files, batch, seq, rank, world
        self.pos, self.shuffle_seed = position or StreamPosition(), shuffle_seed
        self._loaded, self._tokens = -1, None
        self._perm_key, self._perm = None, None
        need = batch * seq * world + 1
        if max(read_header(f) for f in files) < need:
            raise ShardError(f"every shard holds fewer than {need} tokens (batch*seq*world+1); "
                             "lower train.micro_batch_size or model.block_size, or prepare more data")

    def _shard(self) -> np.ndarray:
        if self._loaded != self.pos.shard:
            self._tokens, self._loaded = read_shard(self.files[self.pos.shard]), self.pos.shard
        return self._tokens

    def _windows(self) -> np.ndarray:
        key = (self.pos.epoch, self.pos.shard)
        if self._perm_key != key:
            n = (len(self._shard()) - 1) // self.T
            self._perm = np.random.default_rng([self.shuffle_seed, *key]).permutation(n)
            self._perm_key = key
        return self._perm

    def _next_shard(self) -> None:
        nxt = self.pos.shard + 1
        self.pos = StreamPosition(nxt % len(self.files), 0, self.pos.epoch + (nxt == len(self.files)))

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) int64 arrays of shape (B, T); y is x shifted by one token."""
        rows = self._shuffled_rows() if self.shuffle_seed is not None else self._sequential_rows()
        return np.array(rows[:, :-1]), np.array(rows[:, 1:])  # owned, writable, C-contiguous copies

    def _sequential_rows(self) -> np.ndarray:
        span = self.B * self.T
        while self.pos.offset + span * self.world + 1 > len(self._shard()):
            self._next_shard()
        start = self.pos.offset + self.rank * span
        buf = np.asarray(self._shard()[start:start + span + 1], dtype=np.int64)
        self.pos = StreamPosition(self.pos.shard, self.pos.offset + span * self.world, self.pos.epoch)
        return np.lib.stride_tricks.sliding_window_view(buf, self.T + 1)[::self.T]  # (B, T+1)

    def _shuffled_rows(self) -> np.ndarray:
        need = self.B * self.world
        while self.pos.offset + need > len(self._windows()):
            self._next_shard()
        first = self.pos.offset + self.rank * self.B
        tokens, T = self._shard(), self.T
        rows = np.stack([np.asarray(tokens[w * T:w * T + T + 1], dtype=np.int64)
                         for w in self._windows()[first:first + self.B]])
        self.pos = StreamPosition(self.pos.shard, self.pos.offset + need, self.pos.epoch)
        return rows

    def state(self) -> dict:
        return asdict(self.pos)


@dataclass(frozen=True)
class PassPlan:
    """One epoch of a TokenStream, in windows of T+1 tokens at stride T (consecutive windows share one token, the
    target of one and the first input of the next, so no token is a target twice)."""
    seq: int               # T
    windows: int           # every window of the shards
    micro_batches: int     # served before the stream starts the next epoch: sum over shards of windows // (B*world)
    steps: int             # whole optimizer steps within those: micro_batches // accum
    windows_per_step: int  # B * world * accum
    dropped_windows: int   # windows - steps * windows_per_step: never trained on in those steps

    @property
    def trained_tokens(self) -> int:
        """Target tokens of the pass's steps, each predicted once."""
        return self.steps * self.windows_per_step * self.seq


def one_pass(shard_tokens: Sequence[int], batch: int, seq: int, world: int = 1, accum: int = 1) -> PassPlan:
    """The longest run of steps that stays inside the first epoch, for shards of these token counts.

    floor(total tokens / tokens per step) can overshoot it: each shard drops its last windows mod B*world (the
    stream rolls over rather than split a micro-batch across shards) and its windows need T+1 tokens each, so a
    step count from the token total alone can start the second epoch and show windows twice. The sequential
    stream rolls over at the same count, floor((n - 1) / (B*T*world)) micro-batches per shard of n tokens."""
    if min(batch, seq, world, accum) < 1:
        raise ValueError(f"batch={batch}, seq={seq}, world={world}, accum={accum}: each must be >= 1")
    per_shard = [max(0, (n - 1) // seq) for n in shard_tokens]
    micro = sum(w // (batch * world) for w in per_shard)
    steps, per_step = micro // accum, batch * world * accum
    return PassPlan(seq, sum(per_shard), micro, steps, per_step, sum(per_shard) - steps * per_step)


def shard_token_counts(files: Sequence[Path]) -> list[int]:
    """Token count of each shard, from its validated header."""
    return [read_header(f) for f in files]


class ValWindows:
    """The val tokens a run scores: the first `count` windows of T+1 tokens at stride T over the val shards in
    order (all of them when the budget is 0 or larger than the split), the same tokens for any micro-batch size
    and any number of ranks.

    Reading them as the train stream does, in strides of B*T*world, would score only the first
    floor(budget / (B*T*world)) strides: on a 1.31M-token split, 1.25M tokens at B=64 but 1.05M at B=256, so two
    runs with different micro-batches would be scored on different text. Here batches of B windows go to the
    ranks in turn and the last one may be short; weighting each batch's mean by its windows gives the mean over
    exactly `count` windows."""

    def __init__(self, files: list[Path], seq: int, budget_tokens: int = 0):
        self.T, self.shards = seq, [read_shard(f) for f in files]
        self._per_shard = np.array([(len(s) - 1) // seq for s in self.shards])
        total = int(self._per_shard.sum())
        self.count = min(total, budget_tokens // seq) if budget_tokens else total
        if self.count < 1:
            raise ShardError(f"the val split ({', '.join(str(f) for f in files)}) holds no window of "
                             f"block_size+1 = {seq + 1} tokens within a budget of {budget_tokens} tokens")
        self._starts = np.concatenate([[0], np.cumsum(self._per_shard)])  # first window index of each shard

    def rows(self, first: int, n: int) -> np.ndarray:
        """Windows first .. first+n-1 as an (n, T+1) int64 array."""
        out = np.empty((n, self.T + 1), dtype=np.int64)
        for i, w in enumerate(range(first, first + n)):
            s = int(np.searchsorted(self._starts, w, side="right")) - 1
            start = (w - int(self._starts[s])) * self.T
            out[i] = self.shards[s][start:start + self.T + 1]
        return out

    def targets(self) -> np.ndarray:
        """The target tokens of every window, in order: the tokens a val loss is scored on."""
        return self.rows(0, self.count)[:, 1:].ravel()

    def batches(self, batch: int, rank: int = 0, world: int = 1):
        """(x, y, windows) for each of this rank's batches. Every rank yields as many batches (a rank past the last
        real one re-reads the first with weight 0), so collectives inside a forward (FSDP2's gathers) stay matched."""
        n_batches = -(-self.count // batch)
        for k in range(-(-n_batches // world)):
            j = k * world + rank
            first, weight = (j * batch, 1) if j < n_batches else (0, 0)
            rows = self.rows(first, min(batch, self.count - first))
            yield rows[:, :-1].copy(), rows[:, 1:].copy(), len(rows) * weight

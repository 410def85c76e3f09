"""The sampled tokens' behaviour log-probabilities out of each engine's reply: a /v1/completions choice of a
vLLM server, and vLLM's own output in the trainer's process (FlatLogprobs, or the older per-position dicts).
A list that does not line up with the sampled tokens is an error: it would train on the wrong log-probs."""
from __future__ import annotations

from typing import Any, Sequence

from scalelab.core import errors
from scalelab.core.http import ServerError


def completion_tokens(choice: dict) -> tuple[list[int], list[float]]:
    """Sampled ids and their logprobs from a /v1/completions choice (token_ids, else 'token_id:N' tokens)."""
    lp = choice.get("logprobs") or {}
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:
        ids = [int(t.split(":", 1)[1]) for t in lp.get("tokens") or []]
    if len(ids) != len(logprobs):
        raise ServerError(f"choice {choice.get('index')}: {len(ids)} token ids but {len(logprobs)} logprobs")
    return list(ids), logprobs


class EngineOutputError(errors.ServerError, RuntimeError):
    """An engine's sampled tokens and their log-probs do not line up."""


def _first_mismatch(got: Sequence[int], want: Sequence[int]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    seen = got[i] if i < len(got) else "nothing"
    return f"position {i}: sampled token {want[i] if i < len(want) else 'none'}, logprob entry for {seen}"


def flat_sampled_logprobs(ids: Sequence[int], flat: Any) -> list[float]:
    """The sampled tokens' log-probs from a vLLM `FlatLogprobs` (SamplingParams(flat_logprobs=True)).

    vLLM's sampler (Sampler.gather_logprobs) writes each position's sampled token first, then its top-k; with
    logprobs=0 every position holds that one entry, so `flat.logprobs` already is the per-token list. The token
    ids are compared anyway: a misaligned list would silently train on the wrong behaviour log-probs."""
    ids = list(ids)
    n = len(ids)
    if len(flat.start_indices) != n:
        raise EngineOutputError(f"{n} sampled tokens but logprobs for {len(flat.start_indices)} positions")
    if len(flat.logprobs) == n:  # logprobs=0: one entry per position
        toks, lps = flat.token_ids, flat.logprobs
    else:  # top-k entries too: the first entry of each position is the sampled token
        toks = [flat.token_ids[i] for i in flat.start_indices]
        lps = [flat.logprobs[i] for i in flat.start_indices]
    if list(toks) != ids:
        raise EngineOutputError(f"vLLM flat logprobs do not match the sampled tokens: {_first_mismatch(toks, ids)}")
    return list(lps)


def dict_sampled_logprobs(ids: Sequence[int], positions: Sequence[dict]) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-position {token id: Logprob} dicts (the older form)."""
    ids = list(ids)
    if len(positions) != len(ids):
        raise EngineOutputError(f"{len(ids)} sampled tokens but logprobs for {len(positions)} positions")
    out = []
    for i, (tok, pos) in enumerate(zip(ids, positions)):
        entry = (pos or {}).get(tok)
        if entry is None:
            raise EngineOutputError(f"position {i}: no logprob for the sampled token {tok} "
                                    f"(entries for {sorted(pos or {})[:5]})")
        out.append(entry.logprob)
    return out


def sampled_logprobs(ids: Sequence[int], logprobs: Any) -> list[float]:
    if logprobs is None:
        raise EngineOutputError("vLLM returned no logprobs (the request asks for logprobs=0)")
    if hasattr(logprobs, "start_indices"):
        return flat_sampled_logprobs(ids, logprobs)
    return dict_sampled_logprobs(ids, logprobs)

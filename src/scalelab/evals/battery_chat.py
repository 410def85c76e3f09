"""The battery's generative half: each item's chat turns sent to an OpenAI-compatible `/v1/chat/completions`
(greedy, the task's max_tokens, many requests in flight), each completion scored by its task's own scorer as it
arrives (code in the sandbox, on a pool of its own so a slow test run never holds a request back), and the task's
summary: score, completion tokens, the share cut off at max_tokens, tokens per second."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable

from scalelab.core import errors
from scalelab.core.http import post_json
from scalelab.evals.battery_plan import GenSpec
from scalelab.evals.battery_records import GenSummary, ItemRecord
from scalelab.evals.mathtasks import strict_correct
from scalelab.evals.tasks import Example, Message, Task

CHAT_PATH = "/v1/chat/completions"


class ReplyError(errors.ServerError, RuntimeError):
    """A chat request that failed or a reply the battery cannot read; the message names the task and item."""


@dataclass(frozen=True)
class Reply:
    text: str
    completion_tokens: int
    finish_reason: str


def _field(body: Any, *path: str | int) -> Any:
    node = body
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
            raise ValueError(f"no {where} in the reply {json.dumps(body)[:200]}") from None
    return node


def parse_reply(body: Any) -> Reply:
    """The completion text, its token count and why it stopped; ValueError naming the field that is wrong."""
    text = _field(body, "choices", 0, "message", "content")
    tokens = _field(body, "usage", "completion_tokens")
    finish = _field(body, "choices", 0, "finish_reason")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"choices[0].message.content is a {type(text).__name__}, not text")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise ValueError(f"usage.completion_tokens is {tokens!r}, not a count")
    if not isinstance(finish, str):
        raise ValueError(f"choices[0].finish_reason is {finish!r}, not a string")
    return Reply(text or "", tokens, finish)  # OpenAI's schema allows a null content: an empty reply


@dataclass(frozen=True)
class ChatClient:
    url: str                                   # the server's base, http://host:port
    model: str                                 # the name the server serves the model under
    timeout_s: float = 900.0
    server_state: Callable[[], str] = lambda: ""  # appended to a failed request's error (a dead server's exit)

    def complete(self, messages: list[Message], max_tokens: int) -> Reply:
        # temperature 0: greedy decoding, the protocol the reference figures use
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "n": 1}
        return parse_reply(post_json(self.url + CHAT_PATH, body, self.timeout_s))


def ask(client: ChatClient, task: str, example: Example, max_tokens: int) -> Reply:
    where = f"{task} item {example.id}"
    try:
        return client.complete(example.prompt, max_tokens)
    except ValueError as e:
        raise ReplyError(f"{where}: malformed reply from {client.url}{CHAT_PATH}: {e}") from None
    except (errors.ServerError, OSError, http.client.HTTPException) as e:  # HTTP status, refused, reset, timeout
        raise ReplyError(f"{where}: request to {client.url}{CHAT_PATH} failed: {e}{client.server_state()}") from None


def prompt_sha256(messages: list[Message]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


def last_user(messages: list[Message]) -> str:
    return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


def score_item(task: Task, spec: GenSpec, example: Example, reply: Reply) -> ItemRecord:
    score = task.score(example, reply.text)
    strict = strict_correct(example, reply.text) if spec.strict else None
    return ItemRecord(example.id, prompt_sha256(example.prompt), last_user(example.prompt), reply.text,
                      reply.completion_tokens, reply.finish_reason, score.correct, score.extracted, score.reason,
                      strict, score.partial)


def score_workers() -> int:
    """Scorers at once: code tests are processes with a wall-clock limit, so no more than the cores can run."""
    return max(1, min(16, os.cpu_count() or 1))


def answer_and_score(client: ChatClient, spec: GenSpec, task: Task, examples: list[Example],
                     concurrency: int) -> list[ItemRecord]:
    """Every example asked (`concurrency` requests in flight) and scored, in the examples' order."""
    out: list[ItemRecord | None] = [None] * len(examples)
    asking, scoring = ThreadPoolExecutor(max(1, concurrency)), ThreadPoolExecutor(score_workers())
    try:
        asked = {asking.submit(ask, client, spec.name, ex, spec.max_tokens): i for i, ex in enumerate(examples)}
        scored: dict[Future, int] = {}
        for fut in as_completed(asked):
            i = asked[fut]
            scored[scoring.submit(score_item, task, spec, examples[i], fut.result())] = i
        for fut in as_completed(scored):
            out[scored[fut]] = fut.result()
    finally:
        # no new request after a failure, and no wait for those in flight: the caller stops the server next,
        # which ends them at once
        asking.shutdown(wait=False, cancel_futures=True)
        scoring.shutdown(wait=False, cancel_futures=True)
    return [r for r in out if r is not None]


def summarize(spec: GenSpec, items: list[ItemRecord], wall_s: float, settings: dict, sha: str,
              sandbox: dict | None = None) -> GenSummary:
    n = len(items)
    tokens = sum(i.completion_tokens for i in items)
    partials = [i.partial for i in items if i.partial is not None]
    return GenSummary(
        task=spec.name, split=spec.split, n=n, correct=sum(i.correct for i in items),
        strict_correct=sum(bool(i.strict) for i in items) if spec.strict else None,
        partial_mean=sum(partials) / len(partials) if partials else None,
        mean_completion_tokens=tokens / n if n else 0.0,
        length_share=sum(i.finish_reason == "length" for i in items) / n if n else 0.0,
        max_tokens=spec.max_tokens, wall_s=wall_s, tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        settings=settings, settings_sha256=sha, sandbox=sandbox)


def run_generate_task(client: ChatClient, spec: GenSpec, task: Task, examples: list[Example], concurrency: int,
                      settings: dict, sha: str, sandbox: dict | None = None) -> tuple[GenSummary, list[ItemRecord]]:
    start = time.perf_counter()
    items = answer_and_score(client, spec, task, examples, concurrency)
    return summarize(spec, items, time.perf_counter() - start, settings, sha, sandbox), items

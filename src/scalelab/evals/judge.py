"""An OpenAI-compatible chat client for LLM-as-a-judge grading (stdlib urllib, threads for concurrency).

`JudgeConfig.url` is the server's base ("http://host:8000"), its "/v1", or the full ".../v1/chat/completions".
The API key is read from the environment variable `api_key_env` at request time and only ever put in the
Authorization header: it is never logged, raised in an error, or returned. It is sent only over https or to a
loopback address (127.0.0.0/8, ::1, localhost): a plain-http judge elsewhere would carry it in clear text, so
with a key set such a url is refused before any connection (without a key it is used, unauthenticated).
Redirects are not followed, since urllib would forward the Authorization header to the new location.

Transient failures (connection refused/reset, timeouts, HTTP 429 and 5xx) are retried with exponential
backoff; anything else (a 4xx, a reply that is not JSON or has no `choices[0].message.content`) raises
`JudgeError` naming the URL, because retrying cannot fix it and a silent empty reply would score as a parse
failure that hides a broken endpoint.
"""
from __future__ import annotations

import ipaddress
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from typing import Iterator, Sequence

from scalelab.core import errors

ATTEMPTS = 4  # one try and three retries
BACKOFF_S = 0.5  # waits 0.5, 1, 2 s between attempts
TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})
BODY_EXCERPT_CHARS = 300


class JudgeError(errors.ServerError, RuntimeError):
    """The judge endpoint failed for good, or answered something that is not a chat completion."""


@dataclass(frozen=True)
class JudgeConfig:
    url: str = ""  # empty (or model empty): no judge, MT-Bench reports "not measured"
    model: str = ""  # the model name the server expects in the request
    api_key_env: str = "OPENAI_API_KEY"  # the variable holding the key; unset = no Authorization header
    temperature: float = 0.0  # greedy, as Zheng et al. 2023 grade (reproducible ratings)
    max_tokens: int = 1024
    timeout_s: float = 120.0
    concurrency: int = 8  # requests in flight at once
    min_capability_gap: float = 2.0  # rating points right answers must beat wrong ones by (mtbench's gate)

    @property
    def configured(self) -> bool:
        return bool(self.url and self.model)


def chat_url(url: str) -> str:
    base = url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


def key_may_go_to(url: str) -> bool:
    """Whether an API key may be sent to `url`: over https, or over http to this machine only."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return True
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme != "http" or not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may resolve anywhere


def _auth_headers(cfg: JudgeConfig) -> dict[str, str]:
    key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
    if not key:
        return {}
    url = chat_url(cfg.url)
    if not key_may_go_to(url):
        raise JudgeError(f"{url}: refusing to send ${cfg.api_key_env} over plain http to a non-loopback host; "
                         f"use https or a loopback address, or unset {cfg.api_key_env}")
    return {"Authorization": f"Bearer {key}"}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx surfaces as an HTTPError (a JudgeError naming the code)


_OPENER = urllib.request.build_opener(_NoRedirect)


def _request(cfg: JudgeConfig, messages: list[dict]) -> urllib.request.Request:
    body = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens}
    headers = {"Content-Type": "application/json", **_auth_headers(cfg)}
    return urllib.request.Request(chat_url(cfg.url), data=json.dumps(body).encode(), headers=headers,
                                  method="POST")


def reply_content(url: str, body: bytes) -> str:
    """`choices[0].message.content` of a chat completion body, or JudgeError naming the URL and the defect."""
    excerpt = body[:BODY_EXCERPT_CHARS].decode("utf-8", errors="replace")
    try:
        reply = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise JudgeError(f"{url}: reply is not JSON: {excerpt!r}") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices:
        raise JudgeError(f"{url}: reply has no 'choices': {excerpt!r}")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise JudgeError(f"{url}: reply has no string 'choices[0].message.content': {excerpt!r}")
    return content


def _attempt(cfg: JudgeConfig, messages: list[dict]) -> tuple[str | None, str]:
    """(content, "") on success, (None, why) on a transient failure; raises JudgeError otherwise."""
    url, request = chat_url(cfg.url), _request(cfg, messages)  # a refused key raises here, before connecting
    try:
        with _OPENER.open(request, timeout=cfg.timeout_s) as resp:
            return reply_content(url, resp.read()), ""
    except urllib.error.HTTPError as e:
        excerpt = e.read()[:BODY_EXCERPT_CHARS].decode("utf-8", errors="replace")
        if e.code in TRANSIENT_HTTP:
            return None, f"HTTP {e.code}"
        raise JudgeError(f"{url}: HTTP {e.code}: {excerpt!r}") from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out (TimeoutError is an OSError)
        return None, f"{type(e).__name__}: {getattr(e, 'reason', e)}"


def chat(cfg: JudgeConfig, messages: list[dict]) -> str:
    """One chat completion's text, retrying transient failures ATTEMPTS times with exponential backoff."""
    why = ""
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        content, why = _attempt(cfg, messages)
        if content is not None:
            return content
    raise JudgeError(f"{chat_url(cfg.url)}: no reply after {ATTEMPTS} attempts; last: {why}")


def chat_many(cfg: JudgeConfig, conversations: Sequence[list[dict]]) -> Iterator[tuple[int, str]]:
    """(index, reply) for each conversation, as they finish, `cfg.concurrency` in flight. A JudgeError stops
    the iteration; replies already yielded stay with the caller (who can persist them)."""
    with ThreadPoolExecutor(max_workers=max(1, cfg.concurrency)) as pool:
        futures = {pool.submit(partial(chat, cfg), m): i for i, m in enumerate(conversations)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


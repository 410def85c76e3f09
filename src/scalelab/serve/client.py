"""Streaming load client for OpenAI-compatible servers (`/v1/completions`, `/v1/chat/completions`).

One `RequestResult` per request: send time, TTFT, every inter-chunk gap, end-to-end latency, output tokens
from the usage chunk. `send_request` never raises: a timeout, an HTTP error, a malformed SSE/JSON chunk, a
stream cut short or a refused connection is a result with success=False and the error text.

Transport: HTTP/1.1 on asyncio streams (stdlib; aiohttp is not installed in this environment and the client
needs only POST + a chunked, sized or read-to-close response), with a keep-alive connection pool per run (a
new TCP connection per request costs ~0.5 ms of TTFT on loopback and leaves a TIME_WAIT socket per request).
https:// works through asyncio's TLS. Timing is time.perf_counter, relative to the run start; TTFT includes
taking a connection from the pool (or opening one), as a user's client would pay.

Durability: each finished request is written and flushed as one JSONL line at once (a killed process keeps
every finished request); fsync runs at most every `fsync_interval_s` in a worker thread, so only a machine
crash can lose the last interval's lines.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Literal, Sequence

from scalelab.core import errors
from scalelab.core.jsonio import json_safe
from scalelab.serve.workload import Request

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class ClientConfigError(errors.ScalelabError, ValueError):
    """The client config cannot work (unknown API, missing API-key variable, unsupported URL)."""


class StreamError(errors.ServerError):
    """The server's response is not a well-formed OpenAI SSE stream."""


@dataclass(frozen=True)
class ClientConfig:
    base_url: str = "http://127.0.0.1:8000"  # with or without a trailing /v1
    api: Literal["completions", "chat"] = "completions"
    model: str = "default"
    api_key_env: str = ""  # NAME of the environment variable holding the key ("" = no key); never the key
    ignore_eos: bool = True  # vLLM/SGLang extension: generate exactly max_tokens so runs are comparable
    temperature: float = 0.0
    timeout_s: float = 600.0  # whole request, connect to [DONE]


@dataclass(frozen=True)
class RequestResult:
    request_id: int
    send_time_s: float  # since the run start
    ttft_s: float  # send -> first non-empty content chunk; 0.0 when none arrived
    itl_s: tuple[float, ...]  # every gap between consecutive content chunks
    e2e_s: float  # send -> data: [DONE] (or the failure)
    output_tokens: int  # from the usage chunk; content chunks counted when usage_reported is False
    prompt_tokens: int  # from the usage chunk, else the workload's count
    success: bool
    error: str = ""
    usage_reported: bool = True
    warmup: bool = False  # excluded by the metrics


def result_from_dict(row: dict) -> RequestResult:
    """Inverse of asdict for a JSONL line (lists back to tuples)."""
    return RequestResult(**{**row, "itl_s": tuple(row["itl_s"])})


# ---------------------------------------------------------------------------------------------
# request construction


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    path: str


def endpoint(cfg: ClientConfig) -> Endpoint:
    if cfg.api not in API_PATHS:
        raise ClientConfigError(f"client.api {cfg.api!r}; allowed: {', '.join(API_PATHS)}")
    url = urllib.parse.urlsplit(cfg.base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ClientConfigError(f"client.base_url {cfg.base_url!r}: need http://host[:port] or https://...")
    prefix = url.path.rstrip("/").removesuffix("/v1")
    port = url.port or (443 if url.scheme == "https" else 80)
    return Endpoint(url.hostname, port, url.scheme == "https", prefix + API_PATHS[cfg.api])


def auth_headers(cfg: ClientConfig) -> dict[str, str]:
    """Bearer header from the environment variable the config names; the key is never stored or logged."""
    if not cfg.api_key_env:
        return {}
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise ClientConfigError(f"client.api_key_env names {cfg.api_key_env!r}, which is not set")
    return {"Authorization": f"Bearer {key}"}


def payload(cfg: ClientConfig, req: Request) -> dict[str, Any]:
    body: dict[str, Any] = {"model": cfg.model, "max_tokens": req.output_tokens, "temperature": cfg.temperature,
                            "stream": True, "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.api == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def http_request(ep: Endpoint, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {ep.path} HTTP/1.1", f"Host: {ep.host}:{ep.port}", "Content-Type: application/json",
             "Accept: text/event-stream", f"Content-Length: {len(body)}", "Connection: keep-alive",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 response reading


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        raise StreamError("connection closed before the response headers") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise StreamError(f"bad HTTP status line {lines[0][:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    return int(parts[1]), headers


async def body_blocks(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives: chunked, Content-Length, or read to close."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line.endswith(b"\n"):
                raise StreamError("connection closed mid-stream (chunked body not terminated)")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()).strip():  # optional trailers, then the blank line that ends
                    pass
                return
            try:
                block = await reader.readexactly(size + 2)
            except asyncio.IncompleteReadError:
                raise StreamError("connection closed mid-stream (inside a chunk)") from None
            yield block[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while block := await reader.read(1 << 16):
            yield block


# ---------------------------------------------------------------------------------------------
# SSE parsing and timing


@dataclass
class StreamState:
    """Mutable timing state of one stream; frozen into a RequestResult at the end."""
    start: float
    first: float = 0.0
    last: float = 0.0
    gaps: list[float] = field(default_factory=list)
    content_chunks: int = 0
    usage_output: int | None = None
    usage_prompt: int | None = None
    done: bool = False
    done_at: float = 0.0  # when [DONE] arrived: the end of e2e (draining the body after it is not timed)

    def on_event(self, data: str, now: float) -> None:
        if data == "[DONE]":
            self.done, self.done_at = True, now
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError as e:
            raise StreamError(f"malformed JSON in SSE data ({e.msg}): {data[:80]!r}") from None
        if not isinstance(event, dict):
            raise StreamError(f"SSE data is not a JSON object: {data[:80]!r}")
        if event.get("error"):
            raise StreamError(f"server error in stream: {str(event['error'])[:200]}")
        usage = event.get("usage")
        if isinstance(usage, dict) and "completion_tokens" in usage:
            self.usage_output, self.usage_prompt = usage["completion_tokens"], usage.get("prompt_tokens")
        if chunk_text(event):
            self.on_token(now)

    def on_token(self, now: float) -> None:
        if self.content_chunks == 0:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last, self.content_chunks = now, self.content_chunks + 1


def chunk_text(event: dict) -> str:
    """Text of a completions (`choices[0].text`) or chat (`choices[0].delta.content`) chunk; "" if none."""
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    return c.get("text") or (c.get("delta") or {}).get("content") or ""


async def consume_sse(blocks: AsyncIterator[bytes], state: StreamState) -> None:
    """Feed SSE `data:` lines to `state` until [DONE]."""
    pending = b""
    async for block in blocks:
        now = time.perf_counter()
        pending += block
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                state.on_event(line[5:].strip().decode("utf-8", "replace"), now)
                if state.done:
                    return
    raise StreamError("stream ended without data: [DONE]")


async def drained(blocks: AsyncIterator[bytes], grace_s: float = 1.0) -> bool:
    """Read what follows [DONE] to the body's end (normally just the chunked terminator, already here);
    False if it does not end within grace_s: the request still succeeded, the connection is not reused."""
    async def rest() -> None:
        async for _ in blocks:
            pass
    try:
        await asyncio.wait_for(rest(), grace_s)
        return True
    except (TimeoutError, StreamError, ConnectionError):
        return False


class ConnectionPool:
    """Idle keep-alive connections to one endpoint; a connection is returned only after a complete response."""

    def __init__(self, ep: Endpoint):
        self.ep = ep
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """(reader, writer, reused)."""
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.ep.host, self.ep.port, ssl=self.ep.tls or None,
                                                       limit=1 << 20)
        return reader, writer, False

    def release(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reusable: bool) -> None:
        if reusable:
            self.idle.append((reader, writer))
        else:
            writer.close()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def response_head(pool: ConnectionPool, raw: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                                    int, dict[str, str]]:
    """Send the request. A reused connection that fails before any response byte (the server closed it while
    idle) is dropped and the request resent on the next one, a fresh one once the idle ones run out."""
    while True:
        reader, writer, reused = await pool.acquire()
        try:
            writer.write(raw)
            status, headers = await read_head(reader)
            return reader, writer, status, headers
        except (StreamError, ConnectionError):
            pool.release(reader, writer, False)
            if not reused:
                raise
        except BaseException:
            pool.release(reader, writer, False)
            raise


async def stream_one(pool: ConnectionPool, raw: bytes, state: StreamState) -> None:
    reader, writer, status, headers = await response_head(pool, raw)
    reusable = False
    try:
        if status != 200:
            body = b"".join([b async for b in body_blocks(reader, headers)])
            raise StreamError(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        blocks = body_blocks(reader, headers)
        await consume_sse(blocks, state)
        keep_alive = headers.get("connection", "").lower() != "close" and (
            "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower())
        reusable = keep_alive and await drained(blocks)
    finally:
        pool.release(reader, writer, reusable)


async def send_request(cfg: ClientConfig, pool: ConnectionPool, req: Request, t0: float,
                       headers: dict[str, str], warmup: bool = False) -> RequestResult:
    """Send one streaming request and time it. Never raises (cancellation aside)."""
    state = StreamState(start=time.perf_counter())
    error = ""
    try:
        raw = http_request(pool.ep, json.dumps(payload(cfg, req)).encode(), headers)
        state.start = time.perf_counter()  # encoding the body is not part of the request's latency
        async with asyncio.timeout(cfg.timeout_s):
            await stream_one(pool, raw, state)
    except TimeoutError:
        error = f"timeout: no complete response within timeout_s={cfg.timeout_s}"
    except Exception as e:  # the contract: every failure becomes a record, never an exception
        error = f"{type(e).__name__}: {e}"
    end = state.done_at if state.done and not error else time.perf_counter()
    return finish(state, req, t0, end, error, warmup)


def finish(s: StreamState, req: Request, t0: float, end: float, error: str, warmup: bool) -> RequestResult:
    usage = s.usage_output is not None
    return RequestResult(
        request_id=req.request_id, send_time_s=s.start - t0, ttft_s=s.first - s.start if s.content_chunks else 0.0,
        itl_s=tuple(s.gaps), e2e_s=end - s.start,
        output_tokens=int(s.usage_output) if usage else s.content_chunks,
        prompt_tokens=int(s.usage_prompt) if s.usage_prompt is not None else req.prompt_tokens,
        success=not error, error=error, usage_reported=usage, warmup=warmup)


# ---------------------------------------------------------------------------------------------
# recording


class JsonlRecorder:
    """Appends each result as one JSON line, written and flushed at once; fsync at most every interval."""

    def __init__(self, path: str | Path, fsync_interval_s: float = 0.1):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a")
        self.fsync_interval_s, self.last_fsync = fsync_interval_s, time.perf_counter()
        self._pending: asyncio.Future | None = None

    def record(self, result: RequestResult) -> None:
        self.file.write(json.dumps(json_safe(asdict(result))) + "\n")
        self.file.flush()
        now = time.perf_counter()
        if now - self.last_fsync >= self.fsync_interval_s and (self._pending is None or self._pending.done()):
            self.last_fsync = now
            self._pending = asyncio.get_running_loop().run_in_executor(None, os.fsync, self.file.fileno())

    async def close(self) -> None:
        if self._pending is not None:
            await self._pending
        os.fsync(self.file.fileno())
        self.file.close()


# ---------------------------------------------------------------------------------------------
# load generation: open loop (schedule) and closed loop (fixed concurrency)


async def _send_and_record(cfg: ClientConfig, pool: ConnectionPool, req: Request, t0: float,
                           headers: dict[str, str], warmup: bool, recorder: JsonlRecorder | None,
                           out: list[RequestResult]) -> None:
    result = await send_request(cfg, pool, req, t0, headers, warmup)
    out.append(result)
    if recorder is not None:
        recorder.record(result)


async def run_open_loop(cfg: ClientConfig, requests: Sequence[Request], times_s: Sequence[float],
                        recorder: JsonlRecorder | None = None, warmup: int = 0) -> list[RequestResult]:
    """Send request i at times_s[i] after the start, without waiting for earlier ones. The first `warmup`
    requests are marked warmup. Results in completion order."""
    pool, headers = ConnectionPool(endpoint(cfg)), auth_headers(cfg)
    out: list[RequestResult] = []
    tasks = []
    t0 = time.perf_counter()
    try:
        for i, (req, at) in enumerate(zip(requests, times_s, strict=True)):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                _send_and_record(cfg, pool, req, t0, headers, i < warmup, recorder, out)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:  # interrupted mid-schedule: in-flight requests end with the run (no-op when done)
            task.cancel()
        pool.close()
    return out


async def run_closed_loop(cfg: ClientConfig, requests: Sequence[Request], concurrency: int,
                          recorder: JsonlRecorder | None = None, warmup: int = 0) -> list[RequestResult]:
    """`concurrency` workers, each sending its next request as soon as its previous one ends."""
    if concurrency < 1:
        raise ClientConfigError(f"concurrency must be >= 1, got {concurrency}")
    pool, headers = ConnectionPool(endpoint(cfg)), auth_headers(cfg)
    out: list[RequestResult] = []
    queue = iter(enumerate(requests))
    t0 = time.perf_counter()

    async def worker() -> None:
        for i, req in queue:  # one shared iterator: each request is taken by exactly one worker
            await _send_and_record(cfg, pool, req, t0, headers, i < warmup, recorder, out)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        pool.close()
    return out

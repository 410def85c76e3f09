"""A local OpenAI-compatible streaming server that emits tokens at known times, for tests and the harness bench.

Written on asyncio streams (stdlib, HTTP/1.1 with keep-alive, chunked SSE): nothing to install,
and its own overhead is small enough that a client's added latency can be measured against it.
Token i (0-based) of a request is written at t_req + ttft_s + i * itl_s on an absolute schedule (no drift),
then a usage chunk and `data: [DONE]`; with max_concurrent, t_req is when the request got a slot. Binds
127.0.0.1 only; port 0 lets the OS pick.

Run alone (for the bench, in its own process): python -m scalelab.serve.mockserver --ttft-s 0.05 --itl-s 0.005
It prints `port <n>` on stdout once listening.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Literal

Fault = Literal["none", "http_500", "close_midway", "malformed_json"]


@dataclass(frozen=True)
class MockConfig:
    ttft_s: float = 0.05  # request parsed -> first token written
    itl_s: float = 0.01  # between tokens
    output_tokens: int = 0  # tokens per request; 0 = the request's max_tokens
    requests_per_connection: int = 0  # close a keep-alive connection after this many (0 = never), still
    # advertising keep-alive: the race a client meets when a server's idle timeout fires
    fault: Fault = "none"  # http_500: status 500; close_midway: drop the connection after half the tokens;
    # malformed_json: the second token's chunk is not JSON
    eos_after: int = 0  # a stand-in for a model's EOS: a request without ignore_eos ends after this many tokens
    # (or its max_tokens, if fewer); 0 = no EOS, every request runs to max_tokens
    max_concurrent: int = 0  # streams served at once (0 = no limit); later requests wait in FIFO order before
    # their TTFT starts, so the server has a known capacity: max_concurrent / (ttft + (n - 1) x itl) requests/s


@dataclass
class MockStats:
    """Server-side truth per streamed request, in the order first tokens were written: the realised delay from
    request parsed to first token written (s), and the prompt (so a client can pair its own records)."""
    first_token_delay_s: list[float] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    requests: int = 0
    connections: int = 0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict | str) -> bytes:
    return _chunk(b"data: " + (obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n\n")


def _token_chunk(chat: bool, i: int) -> dict:
    text = f" t{i}"
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    return {"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}


def _connection(keep_alive: bool) -> bytes:
    return b"keep-alive" if keep_alive else b"close"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], dict]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0].split(" ")[1], headers, json.loads(body or b"{}")


class MockServer:
    def __init__(self, config: MockConfig = MockConfig()):
        self.config, self.stats = config, MockStats()
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(config.max_concurrent) if config.max_concurrent > 0 else None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):  # streams still sleeping towards their next token
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests in turn while the client keeps it alive (HTTP/1.1 keep-alive)."""
        task = asyncio.current_task()
        self._handlers.add(task)
        self.stats.connections += 1
        limit = self.config.requests_per_connection
        try:
            keep_alive, served = True, 0
            while keep_alive and not (limit and served >= limit):
                try:
                    path, headers, body = await _read_request(reader)
                except asyncio.IncompleteReadError:
                    return  # the client closed an idle connection
                keep_alive = headers.get("connection", "").lower() != "close" and self.config.fault == "none"
                await self._respond(writer, path, body, keep_alive)
                await writer.drain()
                served += 1
        except (ConnectionError, ValueError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # client gone, bad request, or server stopping: the handler task ends quietly
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _respond(self, writer: asyncio.StreamWriter, path: str, body: dict, keep_alive: bool) -> None:
        t_req = time.perf_counter()
        self.stats.requests += 1
        if path == "/mock/stats":
            self._reply_stats(writer, keep_alive)
        elif self.config.fault == "http_500":
            msg = b'{"error": "mock server: injected failure"}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(msg), msg))
        elif self._slots is None:
            await self._stream(writer, body, path.endswith("/chat/completions"), t_req, keep_alive)
        else:
            async with self._slots:   # asyncio.Semaphore wakes waiters first come, first served
                await self._stream(writer, body, path.endswith("/chat/completions"), time.perf_counter(),
                                   keep_alive)

    def _reply_stats(self, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        msg = json.dumps({"requests": self.stats.requests, "first_token_delay_s": self.stats.first_token_delay_s,
                          "prompts": self.stats.prompts}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: %s\r\n\r\n%s" % (len(msg), _connection(keep_alive), msg))

    async def _stream(self, writer: asyncio.StreamWriter, body: dict, chat: bool, t_req: float,
                      keep_alive: bool) -> None:
        cfg = self.config
        n = cfg.output_tokens or int(body.get("max_tokens", 16))
        if cfg.eos_after and not body.get("ignore_eos"):
            n = min(n, cfg.eos_after)
        text = body.get("prompt") or " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: %s\r\n\r\n" % _connection(keep_alive))
        for i in range(n):
            await asyncio.sleep(max(0.0, t_req + cfg.ttft_s + i * cfg.itl_s - time.perf_counter()))
            if cfg.fault == "close_midway" and i == n // 2:
                writer.transport.abort()  # no chunk terminator, no [DONE]: the client must notice
                return
            bad = cfg.fault == "malformed_json" and i == 1
            writer.write(_event('{"choices": [{"text": "unterminated' if bad else _token_chunk(chat, i)))
            if i == 0:
                self.stats.first_token_delay_s.append(time.perf_counter() - t_req)
                self.stats.prompts.append(text)
        prompt_tokens = len(str(text).split())  # words, a stand-in for a tokenizer
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        writer.write(_event({"choices": [], "usage": usage}) + _event("[DONE]") + b"0\r\n\r\n")


async def _serve_forever(config: MockConfig) -> None:
    server = MockServer(config)
    await server.start()
    print(f"port {server.port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible streaming mock server on 127.0.0.1")
    ap.add_argument("--ttft-s", type=float, default=0.05)
    ap.add_argument("--itl-s", type=float, default=0.01)
    ap.add_argument("--output-tokens", type=int, default=0, help="0 = the request's max_tokens")
    args = ap.parse_args(argv)
    try:
        asyncio.run(_serve_forever(MockConfig(args.ttft_s, args.itl_s, args.output_tokens)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

"""The streaming client against the local mock server: timing, usage, failure paths, JSONL durability."""
from __future__ import annotations

import asyncio
import json

import pytest

from scalelab.core.jsonio import iter_jsonl
from scalelab.serve.client import (
    ClientConfig, ClientConfigError, ConnectionPool, JsonlRecorder, StreamState, auth_headers, drained, endpoint,
    finish, http_request, payload, result_from_dict, run_closed_loop, run_open_loop, send_request,
)
from scalelab.serve.mockserver import MockConfig, MockServer
from scalelab.serve.workload import Request

TTFT, ITL = 0.05, 0.01


def requests(n: int, out: int = 6) -> list[Request]:
    return [Request(i, f"prompt {i} words here", 4, out) for i in range(n)]


async def with_server(mock: MockConfig, body):
    server = MockServer(mock)
    await server.start()
    try:
        return await body(server)
    finally:
        await server.stop()


def one(mock: MockConfig, api: str = "completions", req: Request | None = None, **cfg):
    async def body(server):
        c = ClientConfig(base_url=server.base_url + "/v1", api=api, **cfg)
        return await send_request(c, ConnectionPool(endpoint(c)), req or requests(1)[0], 0.0, {})
    return asyncio.run(with_server(mock, body))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_timing_and_usage_against_mock(api):
    r = one(MockConfig(ttft_s=TTFT, itl_s=ITL), api)
    assert r.success and r.error == ""
    assert (r.output_tokens, r.usage_reported) == (6, True)  # max_tokens=6, from the usage chunk
    assert len(r.itl_s) == 5
    assert TTFT <= r.ttft_s  # the server waits TTFT after parsing
    # loopback adds ~1 ms (bench); a busy 2-core machine can stall one request by 100+ ms, so the bound on the
    # client's overhead is taken on the best of three requests
    assert min([r.ttft_s] + [one(MockConfig(ttft_s=TTFT, itl_s=ITL), api).ttft_s for _ in range(2)]) < TTFT + 0.03
    assert all(0 < g < ITL + 0.02 for g in r.itl_s)
    assert sum(r.itl_s) == pytest.approx(5 * ITL, abs=0.01)  # absolute server schedule: gaps add up
    assert r.e2e_s == pytest.approx(r.ttft_s + sum(r.itl_s), abs=0.005)  # only usage + [DONE] after last token


def test_fixed_server_output_length_is_reported_from_usage():
    r = one(MockConfig(ttft_s=0.0, itl_s=0.0, output_tokens=3), req=requests(1, out=50)[0])
    assert (r.output_tokens, len(r.itl_s), r.success) == (3, 2, True)


@pytest.mark.parametrize("fault, message", [
    ("http_500", "HTTP 500: "),
    ("close_midway", "closed mid-stream"),
    ("malformed_json", "malformed JSON in SSE data"),
])
def test_server_failures_become_records(fault, message):
    r = one(MockConfig(ttft_s=0.0, itl_s=0.001, fault=fault))
    assert not r.success and message in r.error
    assert r.output_tokens < 6


def test_timeout_and_refused_connection_become_records():
    r = one(MockConfig(ttft_s=1.0), timeout_s=0.05)
    assert not r.success and "timeout" in r.error and r.e2e_s < 0.5
    c = ClientConfig(base_url="http://127.0.0.1:1")  # port 1: nothing listens, the connect is refused
    r = asyncio.run(send_request(c, ConnectionPool(endpoint(c)), requests(1)[0], 0.0, {}))
    assert not r.success and "ConnectionRefusedError" in r.error


def test_scripted_clock_and_missing_usage():
    s = StreamState(start=10.0)
    s.on_event(json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 10.1)  # no text
    for t in (10.2, 10.25, 10.45):
        s.on_event(json.dumps({"choices": [{"text": "x"}]}), t)
    s.on_event("[DONE]", 10.5)
    r = finish(s, Request(3, "p", 9, 3), t0=9.0, end=10.5, error="", warmup=False)
    assert r.send_time_s == pytest.approx(1.0) and r.ttft_s == pytest.approx(0.2)
    assert r.itl_s == pytest.approx((0.05, 0.2)) and r.e2e_s == pytest.approx(0.5)
    assert (r.output_tokens, r.usage_reported, r.prompt_tokens) == (3, False, 9)  # counted chunks, flagged


def test_payload_enforces_output_length():
    req = Request(0, "hello", 1, 123)
    body = payload(ClientConfig(api="chat", model="m"), req)
    assert body["max_tokens"] == 123 and body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hello"}] and "prompt" not in body
    assert "ignore_eos" not in payload(ClientConfig(ignore_eos=False), req)
    assert endpoint(ClientConfig(base_url="https://h.example/api/v1", api="chat")).path == "/api/v1/chat/completions"


def test_api_key_only_from_the_named_environment_variable(monkeypatch):
    monkeypatch.setenv("SCALELAB_TEST_KEY", "sk-secret")
    cfg = ClientConfig(api_key_env="SCALELAB_TEST_KEY")
    headers = auth_headers(cfg)
    assert headers == {"Authorization": "Bearer sk-secret"}
    assert b"Authorization: Bearer sk-secret\r\n" in http_request(endpoint(cfg), b"{}", headers)
    assert "sk-secret" not in repr(cfg)
    monkeypatch.delenv("SCALELAB_TEST_KEY")
    with pytest.raises(ClientConfigError, match="SCALELAB_TEST_KEY"):
        auth_headers(cfg)


def test_open_loop_records_every_request_to_jsonl(tmp_path):
    path = tmp_path / "requests.jsonl"

    async def body(server):
        rec = JsonlRecorder(path)
        out = await run_open_loop(ClientConfig(base_url=server.base_url), requests(20, out=3),
                                  [i * 0.005 for i in range(20)], rec, warmup=3)
        await rec.close()
        return out

    out = asyncio.run(with_server(MockConfig(ttft_s=0.01, itl_s=0.002), body))
    back = sorted((result_from_dict(row) for row in iter_jsonl(path)), key=lambda r: r.request_id)
    assert back == sorted(out, key=lambda r: r.request_id) and len(back) == 20
    assert [r.warmup for r in back] == [True] * 3 + [False] * 17
    assert all(r.success and r.output_tokens == 3 for r in back)
    # dispatched on the schedule, not after completions (serial sending would put the last at > 0.28 s)
    sends = [r.send_time_s for r in back]
    assert all(abs(s - i * 0.005) < 0.05 for i, s in enumerate(sends)), sends


def test_interrupted_run_keeps_finished_requests(tmp_path):
    path = tmp_path / "requests.jsonl"

    async def body(server):
        rec = JsonlRecorder(path)
        run = asyncio.create_task(run_open_loop(ClientConfig(base_url=server.base_url), requests(40, out=2),
                                                [i * 0.02 for i in range(40)], rec))
        await asyncio.sleep(0.3)
        run.cancel()  # as a Ctrl-C would
        with pytest.raises(asyncio.CancelledError):
            await run
        lines_at_cancel = len(list(iter_jsonl(path)))
        await asyncio.sleep(0.1)  # in-flight requests were cancelled with the run: nothing more is written
        assert len(list(iter_jsonl(path))) == lines_at_cancel
        rec.file.close()

    asyncio.run(with_server(MockConfig(ttft_s=0.01, itl_s=0.01), body))
    rows = list(iter_jsonl(path))
    assert 5 <= len(rows) < 40 and all(row["success"] for row in rows)  # ~13 finished before the cut


def test_closed_loop_keeps_concurrency_requests_in_flight():
    async def body(server):
        return await run_closed_loop(ClientConfig(base_url=server.base_url), requests(8, out=3), concurrency=2)

    out = asyncio.run(with_server(MockConfig(ttft_s=0.03, itl_s=0.01), body))
    assert len(out) == 8 and all(r.success for r in out)
    spans = [(r.send_time_s, r.send_time_s + r.e2e_s) for r in out]
    in_flight = [sum(a <= t < b for a, b in spans) for t, _ in spans]  # at each send instant
    assert max(in_flight) == 2
    with pytest.raises(ClientConfigError):
        asyncio.run(run_closed_loop(ClientConfig(), [], concurrency=0))


@pytest.mark.parametrize("per_connection, connections", [(0, 1), (1, 5)])
def test_keep_alive_reuses_connections_and_survives_servers_closing_them(per_connection, connections):
    async def body(server):
        return await run_closed_loop(ClientConfig(base_url=server.base_url), requests(5, out=2), concurrency=1)

    server_cfg = MockConfig(ttft_s=0.0, itl_s=0.0, requests_per_connection=per_connection)
    server = MockServer(server_cfg)

    async def main():
        await server.start()
        try:
            return await body(server)
        finally:
            await server.stop()

    out = asyncio.run(main())
    assert all(r.success for r in out) and len(out) == 5
    # one connection for all five; or, when the server drops each after one request, a fresh one per request
    # (the client retries a dropped idle connection instead of failing the request)
    assert server.stats.connections == connections


def test_stale_pooled_connection_is_retried_once_on_a_fresh_one():
    server = MockServer(MockConfig(ttft_s=0.0, itl_s=0.0, requests_per_connection=1))

    async def main():
        await server.start()
        try:
            cfg = ClientConfig(base_url=server.base_url)
            pool = ConnectionPool(endpoint(cfg))
            first = await send_request(cfg, pool, requests(1, out=2)[0], 0.0, {})
            await asyncio.sleep(0.05)  # the server has closed the connection the client keeps as idle
            reader, _ = pool.idle[0]
            reader.at_eof = lambda: False  # hide the EOF, as when the close races with the next request
            second = await send_request(cfg, pool, requests(2, out=2)[1], 0.0, {})
            pool.close()
            return first, second
        finally:
            await server.stop()

    first, second = asyncio.run(main())
    assert first.success and second.success and second.output_tokens == 2
    assert server.stats.connections == 2


def test_body_that_never_ends_after_done_is_not_reused():
    async def never_ends():
        yield b""
        await asyncio.sleep(10)
        yield b""

    async def finished():
        yield b"0"

    assert asyncio.run(drained(finished(), grace_s=0.05)) is True
    assert asyncio.run(drained(never_ends(), grace_s=0.05)) is False


def test_unencodable_request_is_a_failed_record_not_an_exception():
    c = ClientConfig()
    r = asyncio.run(send_request(c, ConnectionPool(endpoint(c)), Request(5, "x", 1, 2), 0.0, {"X-Bad": "\u2603"}))
    assert not r.success and "UnicodeEncodeError" in r.error and r.request_id == 5

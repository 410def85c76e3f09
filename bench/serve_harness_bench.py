#!/usr/bin/env python
"""Harness quality: can the load client issue 200 req/s open loop on 2 cores, and how much does it add to TTFT?

    python bench/serve_harness_bench.py --out results/cpu/serve_harness.json

The mock server (scalelab.serve.mockserver) runs in its own process and answers every request with
`--output-tokens` (<= 8) tokens, the first `--ttft-s` after it parsed the request, then one every `--itl-s`.
The client runs here, open loop, recording every result to a JSONL file as a real run does. Per row:
- issue rate: (n - 1) / (last send - first send); shortfall % = 1 - issue rate / scheduled rate, where the
  scheduled rate is the schedule's own (n - 1) / last scheduled time (for "uniform" that is exactly --rate).
- send lag: actual send time - scheduled time, p50/p99/max (ms).
- added TTFT: client-measured TTFT - configured TTFT, p50/p99 (ms): everything between the two, including the
  mock server's own costs. It splits, per request (paired by prompt), into
  - server overshoot = the server's realised request-parsed -> first-token-written delay - configured TTFT
    (asyncio's timer wakes late: epoll rounds its timeout up to whole ms), and
  - client + transport = client TTFT - that realised delay: pool/connect, request write, the server's read
    and parse of the request, loopback delivery, the client's SSE parsing.
Goals: shortfall < 2 %, added TTFT < 1 ms.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from scalelab.core.jsonio import write_json
from scalelab.core.provenance import collect
from scalelab.serve.client import ClientConfig, JsonlRecorder, RequestResult, run_open_loop
from scalelab.serve.metrics import spread
from scalelab.serve.workload import Request, arrival_times

GOAL_SHORTFALL_PCT, GOAL_ADDED_TTFT_MS = 2.0, 1.0


@dataclass(frozen=True)
class HarnessRow:
    schedule: str
    repeat: int
    requests: int
    failed: int
    scheduled_rate_rps: float
    issue_rate_rps: float
    shortfall_pct: float
    send_lag_p50_ms: float
    send_lag_p99_ms: float
    send_lag_max_ms: float
    added_ttft_p50_ms: float
    added_ttft_p99_ms: float
    server_overshoot_p50_ms: float
    server_overshoot_p99_ms: float
    client_transport_p50_ms: float
    client_transport_p99_ms: float


# ---------------------------------------------------------------------------------------------
# measure


def start_server(ttft_s: float, itl_s: float, tokens: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "scalelab.serve.mockserver", "--ttft-s", str(ttft_s),
                             "--itl-s", str(itl_s), "--output-tokens", str(tokens)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "port":
        proc.kill()
        raise RuntimeError(f"mock server did not start (said {line!r})")
    return proc, f"http://127.0.0.1:{line[1]}"


def server_delays(base_url: str) -> dict[str, float]:
    """{prompt: realised first-token delay (s)} for every request the server has streamed."""
    with urllib.request.urlopen(base_url + "/mock/stats", timeout=10) as r:
        stats = json.loads(r.read())
    return dict(zip(stats["prompts"], stats["first_token_delay_s"]))


def prompt(run: int, i: int) -> str:
    return f"run {run} request {i}: say something short."


def schedule(kind: str, n: int, rate: float, seed: int) -> np.ndarray:
    return np.arange(n) / rate if kind == "uniform" else arrival_times(n, rate, seed)


async def load(base_url: str, run: int, times: np.ndarray, tokens: int, jsonl: Path) -> list[RequestResult]:
    requests = [Request(i, prompt(run, i), 7, tokens) for i in range(len(times))]
    recorder = JsonlRecorder(jsonl)
    try:
        return await run_open_loop(ClientConfig(base_url=base_url), requests, times.tolist(), recorder)
    finally:
        await recorder.close()


# ---------------------------------------------------------------------------------------------
# compute


def ms(x: float) -> float:
    return round(1e3 * float(x), 3)


def row(kind: str, repeat: int, times: np.ndarray, results: list[RequestResult], ttft_s: float,
        server_s: dict[str, float]) -> HarnessRow:
    by_id = sorted(results, key=lambda r: r.request_id)
    sends = np.array([r.send_time_s for r in by_id])
    lag = sends - times
    scheduled = (len(times) - 1) / times[-1]
    issued = (len(sends) - 1) / (sends.max() - sends.min())
    ok = [r for r in by_id if r.success]
    added = np.array([r.ttft_s for r in ok]) - ttft_s
    realised = np.array([server_s[prompt(repeat, r.request_id)] for r in ok])
    over, client = realised - ttft_s, np.array([r.ttft_s for r in ok]) - realised
    return HarnessRow(kind, repeat, len(by_id), len(by_id) - len(ok), round(scheduled, 2), round(issued, 2),
                      round(100 * (1 - issued / scheduled), 3), ms(np.percentile(lag, 50)),
                      ms(np.percentile(lag, 99)), ms(lag.max()), ms(np.percentile(added, 50)),
                      ms(np.percentile(added, 99)), ms(np.percentile(over, 50)), ms(np.percentile(over, 99)),
                      ms(np.percentile(client, 50)), ms(np.percentile(client, 99)))


def summary(rows: list[HarnessRow]) -> dict:
    uniform = [r for r in rows if r.schedule == "uniform"]
    return {name: asdict(spread([getattr(r, name) for r in uniform]))
            for name in ("issue_rate_rps", "shortfall_pct", "added_ttft_p50_ms", "added_ttft_p99_ms",
                         "client_transport_p50_ms", "client_transport_p99_ms")}


# ---------------------------------------------------------------------------------------------
# report


def print_table(rows: list[HarnessRow]) -> None:
    cols = ("schedule", "repeat", "requests", "failed", "scheduled_rate_rps", "issue_rate_rps", "shortfall_pct",
            "send_lag_p99_ms", "added_ttft_p50_ms", "added_ttft_p99_ms", "server_overshoot_p50_ms",
            "client_transport_p50_ms", "client_transport_p99_ms")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(getattr(r, c)) for c in cols))


# ---------------------------------------------------------------------------------------------
# main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3, help="uniform-schedule repeats (>= 3); plus one Poisson")
    ap.add_argument("--ttft-s", type=float, default=0.05)
    ap.add_argument("--itl-s", type=float, default=0.005)
    ap.add_argument("--output-tokens", type=int, default=8)
    ap.add_argument("--out", default="results/cpu/serve_harness.json")
    args = ap.parse_args()
    n = int(args.rate * args.seconds)
    proc, url = start_server(args.ttft_s, args.itl_s, args.output_tokens)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            warm = schedule("uniform", 200, args.rate, 0)
            asyncio.run(load(url, -1, warm, args.output_tokens, Path(tmp, "warm.jsonl")))
            for i, kind in enumerate(["uniform"] * args.repeats + ["poisson"]):
                times = schedule(kind, n, args.rate, seed=i)
                results = asyncio.run(load(url, i, times, args.output_tokens, Path(tmp, f"run{i}.jsonl")))
                rows.append(row(kind, i, times, results, args.ttft_s, server_delays(url)))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print_table(rows)
    provenance = collect({"python": platform.python_version(), "cpu_count": os.cpu_count(),
                          "load_average_1_5_15_at_end": os.getloadavg(),
                          "aiohttp": _version("aiohttp"), "transport": "stdlib asyncio streams (HTTP/1.1)"})
    write_json(args.out, {"provenance": provenance, "config": vars(args),
                          "goals": {"shortfall_pct_lt": GOAL_SHORTFALL_PCT, "added_ttft_ms_lt": GOAL_ADDED_TTFT_MS},
                          "rows": [asdict(r) for r in rows], "uniform_spread": summary(rows)})
    print(f"wrote {args.out}")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()

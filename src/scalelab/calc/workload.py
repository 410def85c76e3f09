"""Serving workloads: prompt and output length distributions, arrival rate, latency SLOs.

A distribution is summarised by a deterministic grid of mid-quantiles (q = (i + 0.5)/n), so every
expectation (E[S], E[S²] of a nonlinear service time) is a plain average, reproducible without a seed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

GRID = 200


def _fixed(d: "LengthDist", q: float) -> float:
    return d.mean


def _lognormal(d: "LengthDist", q: float) -> float:
    # arithmetic mean m and log-sd s: mu = ln m - s²/2, so that E[X] = exp(mu + s²/2) = m
    mu = math.log(d.mean) - d.sigma ** 2 / 2
    return math.exp(mu + d.sigma * NormalDist().inv_cdf(q))


def _uniform(d: "LengthDist", q: float) -> float:
    # sigma is the half-width as a share of the mean: U[m(1-s), m(1+s)]
    return d.mean * (1 - d.sigma + 2 * d.sigma * q)


DISTRIBUTIONS: dict[str, Callable[["LengthDist", float], float]] = {
    "fixed": _fixed, "lognormal": _lognormal, "uniform": _uniform}


@dataclass(frozen=True)
class LengthDist:
    kind: str                   # key of DISTRIBUTIONS
    mean: float                 # tokens, before clipping
    sigma: float = 0.0          # lognormal: sd of ln(x); uniform: half-width / mean
    lo: float = 1.0             # clip, tokens
    hi: float = 1e9

    def points(self, n: int = GRID) -> list[float]:
        if self.kind not in DISTRIBUTIONS:
            raise KeyError(f"unknown length distribution {self.kind!r}; known: {', '.join(DISTRIBUTIONS)}")
        f = DISTRIBUTIONS[self.kind]
        return [min(self.hi, max(self.lo, f(self, (i + 0.5) / n))) for i in range(n)]

    def moment(self, k: int = 1) -> float:
        pts = self.points()
        return sum(x ** k for x in pts) / len(pts)

    def quantile(self, q: float) -> float:
        pts = sorted(self.points())
        return pts[min(len(pts) - 1, int(q * len(pts)))]

    def scaled(self, factor: float) -> "LengthDist":
        return dataclasses.replace(self, mean=self.mean * factor, lo=self.lo * factor, hi=self.hi * factor)

    def describe(self) -> str:
        body = {"fixed": f"fixed {self.mean:g}",
                "lognormal": f"lognormal(mean {self.mean:g}, sigma_ln {self.sigma:g})",
                "uniform": f"uniform[{self.mean * (1 - self.sigma):g}, {self.mean * (1 + self.sigma):g}]"}[self.kind]
        clip = f" clipped to [{self.lo:g}, {self.hi:g}]" if self.kind != "fixed" else ""
        return f"{body}{clip}: mean {self.moment():.0f}, p50 {self.quantile(0.5):.0f}, p90 {self.quantile(0.9):.0f}"


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: LengthDist
    output: LengthDist
    ttft_slo_s: float           # p90 time to first token
    tpot_slo_s: float           # mean time per output token after the first
    rate_rps: float             # Poisson arrival rate, requests/s (for "GPUs needed")
    note: str = ""


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    # ShareGPT-like chat: heavy-tailed lengths with the means the ShareGPT traces show after the usual
    # filtering (prompts ~250, replies ~200 tokens); lognormal spreads as an explicit assumption.
    Workload("sharegpt", LengthDist("lognormal", 250, 1.0, 4, 4096), LengthDist("lognormal", 200, 0.8, 4, 2048),
             ttft_slo_s=1.0, tpot_slo_s=0.05, rate_rps=20.0,
             note="chat; SLOs: TTFT p90 1 s, TPOT 50 ms (interactive reading speed)"),
    Workload("long-prompt", LengthDist("fixed", 8192), LengthDist("fixed", 256),
             ttft_slo_s=4.0, tpot_slo_s=0.05, rate_rps=5.0,
             note="RAG/summarisation: 8k-token prompt, 256-token answer; SLOs: TTFT p90 4 s, TPOT 50 ms"),
]}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]

"""When disaggregation pays: goodput per GPU of the best P:D over colocation, as one knob moves.

The comparison uses the ideal real-valued P:D (goodput.fluid_per_gpu), i.e. a deployment large enough
that instance granularity does not matter; small deployments pay the granularity, which the P:D table
and `gpus_at_rate` show. Within +-5% the two are called a wash: the model is not more accurate than that.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scalelab.calc.goodput import capacities, fluid_per_gpu, workload_stats
from scalelab.calc.servemodel import ServeSetup
from scalelab.calc.workload import Workload

BAND = 0.05
EDGE = 0.5          # p90 prefill alone above this share of the TTFT SLO: both layouts live at the SLO's edge
SCAN_MEANS = [32 * 2 ** (k / 2) for k in range(21)]     # mean prompt 32 .. 32768 tokens, sqrt(2) apart
SCAN_TPOT_S = [0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1]


@dataclass(frozen=True)
class ScanPoint:
    knob: float                 # mean prompt tokens, or TPOT SLO seconds
    colocated_per_gpu: float    # requests/s per GPU
    disagg_per_gpu: float       # at the ideal P:D
    ideal_ratio: float          # P/D = lambda_d / lambda_p
    prefill_p90_share: float = 0.0  # p90 prefill service time / TTFT SLO

    @property
    def advantage(self) -> float:
        if self.colocated_per_gpu <= 0:
            return math.inf if self.disagg_per_gpu > 0 else math.nan
        return self.disagg_per_gpu / self.colocated_per_gpu


def verdict(adv: float) -> str:
    if math.isnan(adv):
        return "SLO infeasible"
    return "pays" if adv >= 1 + BAND else "loses" if adv <= 1 - BAND else "wash"


def labels(points: list[ScanPoint]) -> list[str]:
    """Verdict per point; where the p90 prefill alone takes over half the TTFT SLO both layouts run at the
    SLO's edge with little room to queue, and their ratio says more about the SLO than about the layout."""
    return [verdict(p.advantage) if p.prefill_p90_share <= EDGE or math.isnan(p.advantage) else "SLO-limited"
            for p in points]


def _point(ss: ServeSetup, w: Workload, link: str, knob: float) -> ScanPoint:
    st = workload_stats(ss, w, link)
    cap = capacities(ss, w, st)
    ratio = cap.decode_rps / cap.prefill_rps if cap.prefill_rps > 0 else math.inf
    return ScanPoint(knob, cap.colocated_rps / ss.tp, fluid_per_gpu(cap, ss.tp), ratio, st.prefill_p90_s / w.ttft_slo_s)


def prompt_scan(ss: ServeSetup, w: Workload, link: str, means: list[float] = SCAN_MEANS) -> list[ScanPoint]:
    """Scale the prompt distribution (shape kept) to each mean; everything else fixed."""
    base = w.prompt.moment(1)
    out = []
    for mean in means:
        wk = dataclasses.replace(w, prompt=w.prompt.scaled(mean / base))
        out.append(_point(ss, wk, link, wk.prompt.moment(1)))
    return out


def tpot_scan(ss: ServeSetup, w: Workload, link: str, slos: list[float] = SCAN_TPOT_S) -> list[ScanPoint]:
    return [_point(ss, dataclasses.replace(w, tpot_slo_s=t), link, t) for t in slos]


@dataclass(frozen=True)
class Region:
    lo: float                   # knob range, inclusive
    hi: float
    verdict: str
    advantage_min: float
    advantage_max: float


def regions(points: list[ScanPoint]) -> list[Region]:
    """Runs of consecutive scan points with the same verdict."""
    out: list[Region] = []
    for p, v in zip(points, labels(points)):
        a = p.advantage
        if out and out[-1].verdict == v:
            r = out[-1]
            out[-1] = Region(r.lo, p.knob, v, min(r.advantage_min, a), max(r.advantage_max, a))
        else:
            out.append(Region(p.knob, p.knob, v, a, a))
    return out


@dataclass(frozen=True)
class Boundary:
    knob: float                 # where the advantage crosses the band edge, log-interpolated
    before: str                 # verdict below the knob
    after: str


def boundaries(points: list[ScanPoint]) -> list[Boundary]:
    """Knob values where the verdict changes: the crossovers."""
    out = []
    marks = labels(points)
    for (a, va), (b, vb) in zip(zip(points, marks), zip(points[1:], marks[1:])):
        if va == vb:
            continue
        edge = 1 + BAND if "pays" in (va, vb) else 1 - BAND
        comparable = {va, vb} <= {"pays", "wash", "loses"}
        if comparable and math.isfinite(a.advantage) and math.isfinite(b.advantage) and a.advantage != b.advantage:
            f = min(1.0, max(0.0, (edge - a.advantage) / (b.advantage - a.advantage)))
            knob = math.exp(math.log(a.knob) + f * (math.log(b.knob) - math.log(a.knob)))
        else:
            knob = b.knob
        out.append(Boundary(knob, va, vb))
    return out

"""Open-loop rows scored against the predictions written before them: rate by rate, and the knee.

The knee is the lowest rate of a ladder whose goodput share falls below the SLO's attainment (DistServe's
"SLO attainment", Zhong et al. 2024); a ladder only brackets it, so each ladder also gets the rate at which the
share crosses the attainment, interpolated linearly between the two rungs around the crossing. The predicted
knee and crossing come from predictions.json (the calc queueing model with the calibrated step model), the
measured ones from rows.jsonl, matched by (engine, TP, rate, arrival CV): a gamma or EOS-swapped row is scored
against the prediction made for that same load, never against the Poisson ladder's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from scalelab.core.jsonio import find_stored, is_stored, iter_jsonl, read_json
from scalelab.serve.compare import WITHIN
from scalelab.serve.metrics import Probe, RateSearch, judged_gap_s
from scalelab.serve.rows import Row, RowFigures
from scalelab.serve.table import arrival_cv, offered, rate_rps

FIGURES = (("goodput_share", "goodput", "{:.0%}"), ("ttft_p99_ms", "p99 TTFT (ms)", "{:,.0f}"),
           ("itl_p99_ms", "p99 ITL (ms)", "{:,.1f}"), ("throughput_tok_s", "tok/s", "{:,.0f}"))


@dataclass(frozen=True)
class RatePoint:
    """One open-loop load, its prediction beside its measurement."""
    engine: str
    tp: int
    rate_rps: float
    cv: float
    load: str                   # the table's load cell without the achieved rate
    predicted: RowFigures
    measured: RowFigures


@dataclass(frozen=True)
class Knee:
    """Where a ladder stops meeting the SLO."""
    knee_rps: float | None          # lowest rung below attainment; None when every rung meets it
    crossing_rps: float | None      # interpolated rate where the share falls through attainment
    top_rps: float                  # the ladder's highest rung
    meets_rps: float | None = None  # the rung below the knee (the last that meets the SLO): the crossing lies between


@dataclass(frozen=True)
class KneeScore:
    engine: str
    tp: int
    predicted: Knee
    measured: Knee

    @property
    def ratio(self) -> float | None:
        """Predicted / measured knee (the rung), None when either ladder has none."""
        p, m = self.predicted.knee_rps, self.measured.knee_rps
        return None if p is None or m is None else p / m

    @property
    def within(self) -> bool | None:
        return None if self.ratio is None else abs(self.ratio - 1) <= WITHIN


def _cv(row: Row) -> float:
    cv = arrival_cv(row)
    return 1.0 if cv is None else round(cv, 6)


def _point_id(row: Row) -> tuple[str, int, float, float]:
    return row.key.engine, row.key.tp, round(rate_rps(row), 6), _cv(row)


def rate_points(measured: Sequence[Row], predicted: Sequence[Row]) -> list[RatePoint]:
    """Every measured ok open-loop row with a prediction for the same engine, TP, rate and arrival CV."""
    pred = {_point_id(r): r for r in predicted if r.status == "predicted" and rate_rps(r) is not None}
    out = []
    for m in measured:
        if m.status != "ok" or rate_rps(m) is None or _point_id(m) not in pred:
            continue
        p = pred[_point_id(m)]
        out.append(RatePoint(m.key.engine, m.key.tp, rate_rps(m), _cv(m), offered(m), p.figures, m.figures))
    return sorted(out, key=lambda x: (x.engine, x.tp, x.cv, x.rate_rps))


def knee_of(ladder: Sequence[tuple[float, float]], attainment: float) -> Knee:
    """The knee of [(rate, goodput share)]: the lowest rung below attainment and the interpolated crossing
    (between the last rung that meets it and the knee; the knee itself when the first rung already misses)."""
    ladder = sorted(ladder)
    if not ladder:
        return Knee(None, None, math.nan)
    i = next((k for k, (_, share) in enumerate(ladder) if share < attainment), None)
    if i is None:
        return Knee(None, None, ladder[-1][0])
    x1, s1 = ladder[i]
    if i == 0:
        return Knee(x1, x1, ladder[-1][0])
    x0, s0 = ladder[i - 1]
    cross = x0 + (x1 - x0) * (s0 - attainment) / (s0 - s1) if s0 > s1 else x1
    return Knee(x1, cross, ladder[-1][0], x0)


def poisson_ladders(points: Sequence[RatePoint]) -> dict[tuple[str, int], list[RatePoint]]:
    """(engine, TP) -> its Poisson (CV 1) points with >= 2 rates, in rate order."""
    groups: dict[tuple[str, int], list[RatePoint]] = {}
    for p in points:
        if abs(p.cv - 1) < 1e-6:
            groups.setdefault((p.engine, p.tp), []).append(p)
    return {k: v for k, v in sorted(groups.items()) if len(v) >= 2}


def knee_scores(points: Sequence[RatePoint], attainment: float) -> list[KneeScore]:
    """Per Poisson ladder (engine, TP, CV 1) with >= 2 rates: the predicted knee against the measured one."""
    out = []
    for (engine, tp), ps in poisson_ladders(points).items():
        pred = knee_of([(p.rate_rps, p.predicted.goodput_share) for p in ps], attainment)
        meas = knee_of([(p.rate_rps, p.measured.goodput_share) for p in ps], attainment)
        out.append(KneeScore(engine, tp, pred, meas))
    return out


# ---------------------------------------------------------------------------------------------
# Markdown


def _fmt(form: str, v: float) -> str:
    return form.format(v) if math.isfinite(v) else "N/A"


def _rate(x: float | None) -> str:
    return "none" if x is None else f"{x:.3g} req/s"


def _between(k: Knee) -> str:
    """How far to trust an interpolated crossing: the rungs it lies between (a wide gap is a guess)."""
    if k.meets_rps is None:
        return "the first rung already misses"
    return f"interpolated between the rungs at {k.meets_rps:g} and {k.knee_rps:g} req/s"


def knee_sentence(k: KneeScore, attainment: float) -> str:
    head = f"{k.engine} TP={k.tp}, Poisson ladder up to {k.measured.top_rps:g} req/s"
    if k.measured.knee_rps is None:
        pred = ("the prediction agrees (no predicted knee either)" if k.predicted.knee_rps is None
                else f"predicted knee {_rate(k.predicted.knee_rps)}: not reached, so not scored")
        return f"{head}: every measured rate meets the SLO (share >= {attainment:.0%}); {pred}."
    if k.predicted.knee_rps is None:
        return (f"{head}: measured knee {_rate(k.measured.knee_rps)} (crossing at {_rate(k.measured.crossing_rps)}); "
                "the prediction had none on this ladder: a miss.")
    verdict = "within" if k.within else "outside"
    cross = (f"; the share crosses {attainment:.0%} at {_rate(k.predicted.crossing_rps)} predicted, "
             f"{_rate(k.measured.crossing_rps)} measured ({_between(k.measured)})")
    return (f"{head}: knee predicted {_rate(k.predicted.knee_rps)}, measured {_rate(k.measured.knee_rps)} "
            f"(ratio {k.ratio:.2f}, {verdict} ±{WITHIN:.0%}){cross}.")


def open_loop_md(points: Sequence[RatePoint], attainment: float) -> list[str]:
    """The section of a sweep's REPORT.md for its open-loop rows; empty without any."""
    if not points:
        return []
    lines = ["### Open loop, predicted before the sweep", "",
             "Each rate's prediction was on file (predictions.json, sha256 logged) before its first request; "
             "predicted / measured per column.", ""]
    knees = [f"- {knee_sentence(k, attainment)}" for k in knee_scores(points, attainment)]
    lines += knees + ([""] if knees else [])
    cols = " | ".join(title for _, title, _ in FIGURES)
    lines += [f"| Config | Load | {cols} |", "|---|---|" + "---|" * len(FIGURES)]
    for p in points:
        cells = [f"{_fmt(form, getattr(p.predicted, f))} / {_fmt(form, getattr(p.measured, f))}"
                 for f, _, form in FIGURES]
        lines.append(f"| {p.engine} TP={p.tp} | {p.load} | " + " | ".join(cells) + " |")
    return lines + [""]


# ---------------------------------------------------------------------------------------------
# which SLO breaks first: each missing request's reason, from its stored record


@dataclass(frozen=True)
class Misses:
    """A row's measured requests (warm-up excluded) by the part of the SLO they miss."""
    load: str
    rate_rps: float
    requests: int
    ttft_only: int
    gap_only: int
    both: int
    failed: int


def record_gap_s(d: dict, quantile: float) -> float:
    """The request's judged gap from a full record (its gap list) or a slim one (serve.slim)."""
    return judged_gap_s(d["itl_s"], quantile) if "itl_s" in d else d.get("gap_judged_s", 0.0)


def row_misses(run_dir: Path, row: Row, ttft_s: float, itl_s: float, quantile: float = 0.99) -> Misses | None:
    """Count a row's requests by reason from requests/ or requests-slim/; None when neither holds them."""
    pattern = Path(row.provenance.get("request_files", "")).name
    files = [f for d in ("requests", "requests-slim") for f in find_stored(run_dir / d, pattern)] if pattern else []
    if not files:
        return None
    n = t_only = g_only = both = failed = 0
    for f in files:
        for d in iter_jsonl(f):
            if d.get("warmup"):
                continue
            n += 1
            if not d.get("success", True):
                failed += 1
                continue
            late, gap = d["ttft_s"] > ttft_s, record_gap_s(d, quantile) > itl_s
            t_only, g_only, both = t_only + (late and not gap), g_only + (gap and not late), both + (late and gap)
    return Misses(offered(row), rate_rps(row), n, t_only, g_only, both, failed)


def misses_md(misses: Sequence[Misses], ttft_s: float, itl_s: float, runs: Sequence[str] = ()) -> list[str]:
    """The table of misses by reason; with `runs` (one name per entry) a first column names each row's run."""
    if not misses:
        return []
    run_col = ("| Run ", "|---") if runs else ("", "")
    lines = ["### Which part of the SLO the missing requests miss", "",
             f"Per measured request (warm-up excluded): TTFT over {ttft_s:g} s, the judged inter-token gap over "
             f"{itl_s * 1e3:g} ms (a request's p99 gap; its longest when it has <= 100 gaps), both, or failed.", "",
             f"{run_col[0]}| Load | Requests | TTFT only | gap only | both | failed |",
             f"{run_col[1]}|---|---|---|---|---|---|"]
    for i, m in enumerate(misses):
        cells = [f"{k} ({k / m.requests:.0%})" if m.requests else "0" for k in (m.ttft_only, m.gap_only, m.both,
                                                                               m.failed)]
        lead = f"| `{runs[i]}` " if runs else ""
        lines.append(f"{lead}| {m.load} | {m.requests} | " + " | ".join(cells) + " |")
    return lines + [""]


# ---------------------------------------------------------------------------------------------
# the rate search


def read_search(run_dir: Path) -> RateSearch | None:
    """A search folder's search.json as a RateSearch; None when the folder has none."""
    if not is_stored(run_dir / "search.json"):
        return None
    d = read_json(run_dir / "search.json")
    probes = tuple(Probe(float(p["rate_rps"]), tuple(float(x) for x in p["shares"]), bool(p["meets"]))
                   for p in d["probes"])
    return RateSearch(float(d["rate_rps"]), float(d["share_at_rate"]), probes, d.get("rule", "median"))


def search_sentence(s: RateSearch) -> str:
    """The search's answer and every probe, as `scalelab serve search` prints them."""
    probes = ", ".join(f"{p.rate_rps:.3g}/s -> {'/'.join(f'{x:.0%}' for x in p.shares)}"
                       f" ({'meets' if p.meets else 'misses'})" for p in s.probes)
    if s.lower_bound:  # the top probe met: nothing above it was tried
        answer = (f"highest rate meeting the SLO: at least {s.rate_rps:.3g} req/s, the highest probed ({s.rule} "
                  f"share {s.share_at_rate:.0%}); no rate above it was tried (search.ceiling_rps)")
    elif s.rate_rps > 0:
        answer = f"highest rate meeting the SLO: {s.rate_rps:.3g} req/s ({s.rule} share {s.share_at_rate:.0%})"
    else:  # even the lowest probe missed: the search found no rate, it does not say the capacity is zero
        low = min(s.probes, key=lambda p: p.rate_rps)
        answer = (f"no probed rate met the SLO (the lowest, {low.rate_rps:.3g} req/s: {s.rule} share "
                  f"{s.share_at_rate:.0%}); the highest rate meeting it lies below that")
    return f"{answer}\nprobes (each repeat's goodput share): {probes}"

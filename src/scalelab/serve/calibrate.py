"""Fit the serving model's constants (serve.stepmodel.ServeCalibration) to some measured rows; the other rows are
the test. Constants fitted on a row are never scored on it (serve.report keeps the roles apart).

The fit is maximum a posteriori with log-normal priors: least squares (scipy.optimize.least_squares, trust-region
reflective within bounds) over log(predicted / measured) of every FIT_FIGURES figure of every fitted row, plus a
weak pull of each fitted constant toward its prior (PRIOR_WEIGHT per unit of log(value / prior)) that decides the
directions the rows hardly see (hbm_eff against the step overhead at batch 1; the all-reduce latency, a small
share of a step). The loss is soft-L1 at LOSS_SCALE: a figure the model cannot reproduce (its mechanism is
missing, or it is one noisy request) counts linearly beyond that log error, so it cannot bend every constant to
shrink its square. Each row is predicted as it was measured: on its own requests, in runs of its requests per
repeat (serve.simulate), so the start burst of the measurement is in the model too.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import least_squares

from scalelab.calc.models import ModelSpec
from scalelab.serve.fit import engine_limits
from scalelab.serve.metrics import SLO
from scalelab.serve.model import SCORED_FIGURES, row_figures
from scalelab.serve.rows import Row, RowFigures, RowKey
from scalelab.serve.steady import lengths
from scalelab.serve.stepmodel import ServeCalibration, resolved

FIT_FIGURES = ("throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
# A fitted figure weighs 1 per unit of log(pred / meas), a constant PRIOR_WEIGHT per unit of log(value / prior):
# sigma_figure / sigma_prior with figures good to ~5% (repeat spread and model error) and priors to a factor e.
PRIOR_WEIGHT = 0.05
LOSS_SCALE = 0.1        # soft-L1 turns linear beyond ~10% log error
BOUNDS = {              # physical ranges of the fitted constants
    "hbm_eff": (0.2, 1.0), "prefill_eff": (0.05, 1.0), "overhead_tp1_s": (1e-5, 0.05),
    "allreduce_latency_s": (1e-7, 5e-4), "request_overhead_s": (1e-5, 0.5),
}


@dataclass(frozen=True)
class RowWorkload:
    """The requests one row was measured with (the sweep gives every row its own slice of the pool)."""
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    requests_per_run: int | None = None     # the sweep's requests per repeat; None = steady state


def default_fit_labels(rows: Sequence[Row]) -> tuple[str, ...]:
    """The rows the constants are fitted on: the smallest batch of every TP (it pins that TP's fixed per-step
    cost: overhead and all-reduce latency) and the largest batch of the smallest TP (the batch slope pins the
    efficiencies). Every other measured row is held out for scoring: the middle batches test the batch curve
    between fitted ends, the large batches of the larger TPs test the TP=1 slope carried to another TP."""
    keys = [r.key for r in rows if r.status == "ok"]
    chosen: set[RowKey] = set()
    for engine in {k.engine for k in keys}:
        mine = [k for k in keys if k.engine == engine]
        smallest = {min((k for k in mine if k.tp == tp), key=lambda k: k.batch) for tp in {k.tp for k in mine}}
        low = min(k.tp for k in mine)
        slope = max((k for k in mine if k.tp == low), key=lambda k: k.batch)
        # keep at least one row of the engine out of the fit when there are two or more
        chosen |= smallest | ({slope} if len(smallest | {slope}) < len(mine) else set())
    return tuple(k.label for k in sorted(chosen, key=lambda k: (k.engine, k.tp, k.batch)))


def free_params(rows: Sequence[Row]) -> list[str]:
    """The all-reduce latency is told apart from the step overhead only by rows at TP=1 and at TP>1 together;
    the per-rank sync stays at its prior: within one model it cannot be told apart from the all-reduce latency."""
    tps = {r.key.tp for r in rows}
    both = 1 in tps and len(tps) > 1
    return ["hbm_eff", "prefill_eff", "overhead_tp1_s", "request_overhead_s"] + (["allreduce_latency_s"] if both
                                                                                 else [])


def _log_errors(pred: RowFigures, meas: RowFigures, figures: Sequence[str]) -> list[float]:
    """log(pred / meas) per figure; a figure either side cannot state (0, NaN) counts as 0."""
    out = []
    for f in figures:
        p, m = getattr(pred, f), getattr(meas, f)
        ok = math.isfinite(p) and math.isfinite(m) and p > 0 and m > 0
        out.append(math.log(p / m) if ok else 0.0)
    return out


def _fit_rows(measured: Sequence[Row], fit_on: Sequence[str] | None) -> list[Row]:
    ok = [r for r in measured if r.status == "ok"]
    labels = tuple(fit_on) if fit_on is not None else default_fit_labels(ok)
    rows = [r for r in ok if r.key.label in labels]
    missing = set(labels) - {r.key.label for r in rows}
    if missing or not rows:
        raise ValueError(f"fit_calibration: no measured 'ok' row for {sorted(missing) or 'any label'}; "
                         f"measured ok rows: {[r.key.label for r in ok]}")
    if len({r.key.engine for r in rows}) > 1:
        raise ValueError(f"fit_calibration: rows of several engines {sorted({r.key.engine for r in rows})}; "
                         "fit one calibration per engine")
    return rows


def _solve(residual: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, names: list[str]) -> np.ndarray:
    """Trust-region reflective least squares in log space, bounded by BOUNDS; the start is clipped inside."""
    lo, hi = np.log([BOUNDS[n][0] for n in names]), np.log([BOUNDS[n][1] for n in names])
    start = np.clip(x0, lo + 1e-6, hi - 1e-6)
    # finite differences with a relative step of 1e-2 on the log constants (0.2-6% on the constants themselves)
    # step over the simulation's small jumps, where a request moves to another step as step lengths change
    res = least_squares(residual, start, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE, diff_step=1e-2,
                        x_scale=1.0, xtol=1e-6, ftol=1e-8, max_nfev=400)
    return res.x


def fit_calibration(measured: Sequence[Row], model: ModelSpec, hardware: str, prompt_tokens: Sequence[int],
                    output_tokens: Sequence[int], slo: SLO = SLO(), mem_util: float = 0.9,
                    fit_on: Sequence[str] | None = None, prior: ServeCalibration | None = None,
                    workloads: dict[str, RowWorkload] | None = None) -> ServeCalibration:
    """Fit free_params to the FIT_FIGURES of the `fit_on` rows (default: default_fit_labels). Each row is
    predicted on `workloads[label]` when given, else on prompt_tokens/output_tokens in steady state."""
    rows = _fit_rows(measured, fit_on)
    base = resolved(prior or ServeCalibration(), model, hardware, max(r.key.tp for r in rows))
    names, limits = free_params(rows), engine_limits(rows[0].key.engine)
    x0 = np.log([min(max(getattr(base, n), BOUNDS[n][0]), BOUNDS[n][1]) for n in names])
    default = RowWorkload(tuple(prompt_tokens), tuple(output_tokens))
    work = {r.key: (workloads or {}).get(r.key.label, default) for r in rows}
    lens = {k: lengths(w.prompt_tokens, w.output_tokens) for k, w in work.items()}

    def predict(cal: ServeCalibration, key: RowKey) -> RowFigures:
        return row_figures(model, hardware, key, lens[key], slo, mem_util, cal, limits, work[key].requests_per_run)

    def apply(x: np.ndarray) -> ServeCalibration:
        return dataclasses.replace(base, **{n: float(math.exp(v)) for n, v in zip(names, x)})

    def residual(x: np.ndarray) -> np.ndarray:
        cal = apply(x)
        errs = [e for r in rows for e in _log_errors(predict(cal, r.key), r.figures, FIT_FIGURES)]
        return np.array(errs + list(PRIOR_WEIGHT * (x - x0)))

    fitted = apply(_solve(residual, x0, names))
    worst = {f: max(abs(getattr(predict(fitted, r.key), f) / getattr(r.figures, f) - 1) for r in rows)
             for f in SCORED_FIGURES if all(getattr(r.figures, f) > 0 for r in rows)}
    return dataclasses.replace(
        fitted, fitted_on=tuple(r.key.label for r in rows), fitted_params=tuple(names),
        fit_rel_err=tuple(worst.items()),
        source=f"fitted ({', '.join(names)}) on {len(rows)} measured rows to {', '.join(FIT_FIGURES)} (soft-L1 "
               f"least squares on log ratios, weak pull to the priors); the other constants are the priors "
               f"(serve.stepmodel.PRIOR_SOURCE)")

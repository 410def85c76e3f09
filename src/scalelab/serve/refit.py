"""The report's re-runs of the model from a sweep folder's own files: the current model
with its stated priors, and the model calibrated on some measured rows (serve.calibrate). Each predicts every
row again on the requests that row was measured with, in the protocol it was measured with (its requests per
repeat, from the measured row's provenance), so the comparison is figure for figure."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from scalelab.calc.models import ModelSpec
from scalelab.serve.calibrate import RowWorkload, default_fit_labels, fit_calibration
from scalelab.serve.metrics import SLO
from scalelab.serve.model import predict_row
from scalelab.serve.rows import Row
from scalelab.serve.stepmodel import ServeCalibration, calibration_from_dict


def closed_loop(r: Row) -> bool:
    return r.key.batch >= 1 and r.provenance.get("load", {}).get("mode") != "rate"


def row_workload(pred: Row, meas: Row | None) -> RowWorkload | None:
    """The row's requests in send order from its prediction's record; runs of the measured row's requests per
    repeat when the record holds every request (a sample of a long workload loses the order: steady state)."""
    w = pred.provenance.get("workload", {})
    pairs = w.get("lengths") or w.get("lengths_sample")
    if not pairs:
        return None
    whole = len(pairs) == w.get("requests", len(pairs))
    per_run = (meas.provenance.get("requests_per_repeat") if meas is not None else None) or w.get("requests_per_run")
    return RowWorkload(tuple(int(a) for a, _ in pairs), tuple(int(b) for _, b in pairs),
                       int(per_run) if per_run and whole else None)


@dataclass(frozen=True)
class ModelInputs:
    """What re-running the model needs, from the predictions' own record (serve.model._provenance)."""
    model: ModelSpec
    hardware: str
    mem_util: float
    usd_per_gpu_hour: float
    slo: SLO
    calibration: ServeCalibration           # as recorded with the predictions
    workloads: dict[str, RowWorkload]


def model_inputs(predicted: Sequence[Row], measured: Sequence[Row] = ()) -> ModelInputs | None:
    meas = {r.key.label: r for r in measured if closed_loop(r)}
    work = {r.key.label: w for r in predicted if r.provenance.get("model_spec")
            and (w := row_workload(r, meas.get(r.key.label))) is not None}
    if not work:
        return None
    p = next(r for r in predicted if r.key.label in work).provenance
    slo_names = {f.name for f in dataclasses.fields(SLO)}
    return ModelInputs(ModelSpec(**p["model_spec"]), p["hardware"], float(p.get("mem_util", 0.9)),
                       float(p.get("usd_per_gpu_hour", math.nan)),
                       SLO(**{k: v for k, v in p.get("slo", {}).items() if k in slo_names}),
                       calibration_from_dict(p["calibration"]) if "calibration" in p else ServeCalibration(),
                       work)


def explain_kwargs(mi: ModelInputs | None, calibration: ServeCalibration | None) -> dict[str, Any]:
    if mi is None:
        return {}
    w = next(iter(mi.workloads.values()))
    return {"model": mi.model, "hardware": mi.hardware, "prompt_tokens": w.prompt_tokens,
            "output_tokens": w.output_tokens, "mem_util": mi.mem_util, "calibration": calibration or mi.calibration}


def repredict(mi: ModelInputs, predicted: Sequence[Row], cal: ServeCalibration, engine: str | None = None
              ) -> tuple[Row, ...]:
    """Every predicted key (of `engine`, if given) predicted again with `cal` on its own workload."""
    return tuple(predict_row(mi.model, mi.hardware, p.key, w.prompt_tokens, w.output_tokens, mi.slo, mi.mem_util,
                             mi.usd_per_gpu_hour, cal, requests_per_run=w.requests_per_run)
                 for p in predicted if (engine is None or p.key.engine == engine)
                 and (w := mi.workloads.get(p.key.label)))


def rerun_priors(measured: Sequence[Row], predicted: Sequence[Row]) -> tuple[Row, ...]:
    """The current model with its stated priors (nothing fitted), on the rows that were measured."""
    mi = model_inputs(predicted, measured)
    if mi is None:
        return ()
    done = {r.key.label for r in measured if r.status == "ok" and closed_loop(r)}
    return repredict(mi, [p for p in predicted if p.key.label in done], ServeCalibration())


@dataclass(frozen=True)
class Calibrated:
    calibration: ServeCalibration | None
    rows: tuple[Row, ...]       # every predicted key, predicted again with the fitted constants
    note: str                   # what was fitted on what, or why nothing was


def calibrate(measured: Sequence[Row], predicted: Sequence[Row], fit_on: Sequence[str] | None = None) -> Calibrated:
    """Fit the model's constants on `fit_on` (default: serve.calibrate.default_fit_labels) of the measured rows
    of one engine (the most measured one), starting from the current priors, and predict every row again; the
    other measured rows are the held-out test."""
    mi = model_inputs(predicted, measured)
    ok = [r for r in measured if r.status == "ok" and closed_loop(r) and mi and r.key.label in mi.workloads]
    if mi is None or len(ok) < 2:
        return Calibrated(None, (), "not fitted: needs the model's record in predictions.json and at least two "
                                    "measured closed-loop rows with predictions")
    engine = max(sorted({r.key.engine for r in ok}), key=lambda e: sum(r.key.engine == e for r in ok))
    mine = [r for r in ok if r.key.engine == engine]
    labels = tuple(fit_on) if fit_on is not None else default_fit_labels(mine)
    try:
        cal = fit_calibration(mine, mi.model, mi.hardware, (), (), mi.slo, mi.mem_util, fit_on=labels,
                              prior=ServeCalibration(), workloads=mi.workloads)
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as e:
        return Calibrated(None, (), f"not fitted: {type(e).__name__}: {e}")
    held = len(mine) - len(cal.fitted_on)
    return Calibrated(cal, repredict(mi, predicted, cal, engine),
                      f"{cal.source}. Fitted on {', '.join(cal.fitted_on)}; {held} measured {engine} row(s) held "
                      f"out for scoring")


def _readable(name: str, value: float) -> str:
    if name == "allreduce_latency_s":
        return f"{value * 1e6:.3g} us"
    return f"{value * 1e3:.3g} ms" if name.endswith("_s") else f"{value:.3g}"


def fitted_summary(cal: ServeCalibration) -> str:
    """'hbm_eff 0.852, request_overhead_s 20.6 ms, ...': the constants the fit moved, in readable units."""
    return ", ".join(f"{n} {_readable(n, getattr(cal, n))}" for n in cal.fitted_params)


def smallest_tp_labels(measured: Sequence[Row]) -> tuple[str, ...]:
    """The measured closed-loop rows of the smallest TP, when a larger TP was measured too; else ()."""
    ok = [r for r in measured if r.status == "ok" and closed_loop(r)]
    tps = sorted({r.key.tp for r in ok})
    return tuple(r.key.label for r in ok if r.key.tp == tps[0]) if len(tps) > 1 else ()


def tp_check(measured: Sequence[Row], predicted: Sequence[Row]) -> Calibrated | None:
    """Fitted on the smallest TP's rows alone, every larger TP held out: can the model carry a TP it was fitted
    on to one it was not (what it is used for at TPs that were not measured)? None with one TP measured."""
    labels = smallest_tp_labels(measured)
    return calibrate(measured, predicted, labels) if labels else None

"""Out-of-sample scoring of the ladder's loss law, and the loss predictions it supports.

A law L(N, D) = E + A/N^α + B/D^β fitted on every ladder point says nothing about how it extrapolates. So it is
refitted with the largest token budget held out, and again with the largest model held out, and each refit
predicts the points it never saw: the larger of those errors is the interval a prediction beyond the ladder gets
(never narrower than the fit's own interval). Predictions for bigger models are made at token budgets the ladder
itself ran, so a single run of bench/gpu_scaling_ladder.sh at that size checks them. Kaplan et al.'s joint form
(kaplan_law.py), whose size effect depends on D, goes through the same scoring beside it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from scalelab.pretrain.kaplan_law import fit_kaplan_law
from scalelab.pretrain.scaling_law import LossPoint, fit_scaling_law

Fit = Callable[..., Any]   # (points, source=...) -> a law with .loss(n, d) and .rel_interval


@dataclass(frozen=True)
class HeldOut:
    split: str                      # which points were held out
    fitted_on: int
    law: Any                        # ScalingLaw or KaplanLaw
    errors: tuple[dict, ...]        # per held-out point: n_params, tokens, measured, predicted, rel_error

    @property
    def max_abs_error(self) -> float:
        return max(abs(e["rel_error"]) for e in self.errors)


def to_points(rows: Sequence[dict]) -> list[LossPoint]:
    """Ladder-file points (scaling_ladder.json "points") -> LossPoints."""
    return [LossPoint(float(p["n_params"]), float(p["tokens"]), float(p["final_val_loss"])) for p in rows]


def hold_out(points: Sequence[LossPoint], split: str, fit: Fit = fit_scaling_law) -> HeldOut:
    """Refit without the largest token budget (split="largest D") or the largest model ("largest N") and score
    the refit on the points it left out."""
    key = {"largest D": lambda p: p.tokens, "largest N": lambda p: p.n_params}[split]
    top = max(key(p) for p in points)
    train = [p for p in points if key(p) < top]
    test = [p for p in points if key(p) == top]
    law = fit(train, source=f"ladder without its {split}")
    errors = tuple({"n_params": p.n_params, "tokens": p.tokens, "measured": p.loss,
                    "predicted": law.loss(p.n_params, p.tokens),
                    "rel_error": law.loss(p.n_params, p.tokens) / p.loss - 1} for p in test)
    return HeldOut(split, len(train), law, errors)


def residuals(law: Any, points: Sequence[LossPoint]) -> list[dict]:
    """The full fit's error at every point: a pattern in them (here: the larger N, the more the fit over-predicts
    at the largest D) is what the additive form cannot express."""
    return [{"n_params": p.n_params, "tokens": p.tokens, "measured": p.loss,
             "fitted": law.loss(p.n_params, p.tokens), "rel_error": law.loss(p.n_params, p.tokens) / p.loss - 1}
            for p in points]


def predictions(law: Any, rel_interval: float, sizes: dict[str, float], tokens: Sequence[float]) -> list[dict]:
    """Loss of each named size at each token budget, with a symmetric relative interval."""
    return [{"size": name, "n_params": n, "tokens": d, "loss": law.loss(n, d),
             "interval": [law.loss(n, d) * (1 - rel_interval), law.loss(n, d) * (1 + rel_interval)]}
            for name, n in sizes.items() for d in tokens]


def score_form(points: Sequence[LossPoint], fit: Fit, sizes: dict[str, float], name: str) -> dict:
    """One law form: fit on all points, two held-out refits, predictions at the largest budget with the interval
    the held-out errors justify."""
    law = fit(points, source=f"{name} ladder fit")
    held = [hold_out(points, s, fit) for s in ("largest D", "largest N")]
    interval = max(law.rel_interval, *(h.max_abs_error for h in held))
    return {"law": asdict(law), "residuals": residuals(law, points),
            "held_out": [{"split": h.split, "fitted_on": h.fitted_on, "law": asdict(h.law),
                          "max_abs_error": h.max_abs_error, "errors": list(h.errors)} for h in held],
            "prediction_interval": interval,
            "predictions": predictions(law, interval, sizes, [max(p.tokens for p in points)])}


def check_ladder(rows: Sequence[dict], sizes: dict[str, float]) -> dict:
    """The additive form (the one `predict` uses) at the top level, Kaplan's joint form under "joint"."""
    points = to_points(rows)
    return {**score_form(points, fit_scaling_law, sizes, "additive"),
            "prediction_tokens": max(p.tokens for p in points),
            "tokens_per_param_max": max(p.tokens / p.n_params for p in points),
            "joint": score_form(points, fit_kaplan_law, sizes, "joint (Kaplan)")}

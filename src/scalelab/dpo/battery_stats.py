"""The battery's numbers: base vs tuned per part, response lengths, and the evidence bar, as battery.json rows.

Pure functions over part records (dpo.battery writes them) and over battery.json itself, so a report can
recompute every verdict from the folder alone.

A comparison row (one per scored metric; accuracies as fractions):
    {"name", "part", "metric", "kind": "binary"|"continuous", "n", "base", "tuned", "delta", "ci_low",
     "ci_high", "confidence", "n_resamples", "seed"}   + for binary: tuned_only, base_only, both_correct,
                                                         neither_correct, mcnemar_p
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from scalelab.dpo.evidence import (
    CriterionResult, EvidenceBar, LengthStats, PairedBinaryComparison, PairedDifference, RunMetrics,
    compare_paired_binary, length_stats, paired_bootstrap, paired_length_ratios, unmeasured_extras, verdict,
)

MEASURED = "measured"
MTBENCH_ROW = "MT-Bench"

# ---------------------------------------------------------------------------------------------
# paired comparisons


def aligned(base: Mapping[str, float], tuned: Mapping[str, float], what: str) -> tuple[list[float], list[float]]:
    """Scores of the examples both sides graded, in the base side's order; a different set is an error."""
    if set(base) != set(tuned):
        only = sorted(set(base) ^ set(tuned))
        raise ValueError(f"{what}: base and tuned were graded on different examples (e.g. {only[:3]})")
    keys = list(base)
    return [float(base[k]) for k in keys], [float(tuned[k]) for k in keys]


def comparison_row(name: str, part: str, metric: str, base: Mapping[str, float], tuned: Mapping[str, float],
                   binary: bool, n_resamples: int, seed: int) -> dict:
    b, t = aligned(base, tuned, name)
    if binary:
        c = compare_paired_binary(b, t, n_resamples=n_resamples, seed=seed)
        d, extra = c.diff, {"tuned_only": c.tuned_only, "base_only": c.base_only, "both_correct": c.both_correct,
                            "neither_correct": c.neither_correct, "mcnemar_p": c.mcnemar_p}
    else:
        d, extra = paired_bootstrap(b, t, n_resamples=n_resamples, seed=seed), {}
    return {"name": name, "part": part, "metric": metric, "kind": "binary" if binary else "continuous",
            "n": d.n, "base": d.base_mean, "tuned": d.tuned_mean, "delta": d.difference, "ci_low": d.ci_low,
            "ci_high": d.ci_high, "confidence": d.confidence, "n_resamples": d.n_resamples, "seed": d.seed, **extra}


def row_comparison(row: Mapping) -> PairedDifference | PairedBinaryComparison:
    """A comparison row back as evidence.py's record."""
    d = PairedDifference(n=int(row["n"]), base_mean=row["base"], tuned_mean=row["tuned"], difference=row["delta"],
                         ci_low=row["ci_low"], ci_high=row["ci_high"], confidence=row.get("confidence", 0.95),
                         n_resamples=row.get("n_resamples", 10_000), seed=row.get("seed", 0))
    if row.get("kind") != "binary":
        return d
    return PairedBinaryComparison(d, int(row["tuned_only"]), int(row["base_only"]), int(row["both_correct"]),
                                  int(row["neither_correct"]), float(row["mcnemar_p"]))

# ---------------------------------------------------------------------------------------------
# lengths


@dataclasses.dataclass(frozen=True)
class LengthRecord:
    n_tokens: int
    hit_limit: bool


def pooled_lengths(records: Sequence[LengthRecord]) -> LengthStats:
    """Lengths pooled over parts generated with different limits: the hit share counts each response's own flag."""
    stats = length_stats([r.n_tokens for r in records], max_new_tokens=1)
    return dataclasses.replace(stats, hit_limit_share=float(np.mean([r.hit_limit for r in records])))


def lengths_block(base: Mapping[str, Sequence[LengthRecord]], tuned: Mapping[str, Sequence[LengthRecord]],
                  paired: tuple[Sequence[int], Sequence[int]]) -> dict:
    """battery.json's "lengths": per source and pooled stats, ratio of means, per-prompt ratios.

    paired: (base tokens, tuned tokens) of the same prompts; pairs whose base response is empty are left out
    of the per-prompt ratios (their ratio is undefined) and counted."""
    sources = [s for s in base if s in tuned and base[s] and tuned[s]]
    if not sources:
        return {}
    rows = {s: {"base": dataclasses.asdict(pooled_lengths(base[s])),
                "tuned": dataclasses.asdict(pooled_lengths(tuned[s]))} for s in sources}
    b = pooled_lengths([r for s in sources for r in base[s]])
    t = pooled_lengths([r for s in sources for r in tuned[s]])
    keep = [(x, y) for x, y in zip(*paired) if x > 0]
    ratios = (dataclasses.asdict(paired_length_ratios([x for x, _ in keep], [y for _, y in keep]))
              if keep else None)
    return {"sources": sources, "per_source": rows, "base": dataclasses.asdict(b), "tuned": dataclasses.asdict(t),
            "ratio": t.mean_tokens / b.mean_tokens if b.mean_tokens > 0 else None,
            "paired_ratios": ratios, "paired_excluded_empty_base": len(paired[0]) - len(keep)}

# ---------------------------------------------------------------------------------------------
# the evidence bar


def mtbench_criterion(mt: Mapping, max_drop: float) -> CriterionResult:
    """The MT-Bench row, reported beside the bar: a measured score may drop by at most max_drop points (1-10
    scale), else the verdict fails; without a capable judge it is "not measured" and named beside the verdict."""
    name = f"MT-Bench drop <= {max_drop:g}"
    if mt.get("status") != MEASURED or mt.get("base_mean") is None or mt.get("tuned_mean") is None:
        return CriterionResult(name, None, max_drop, None, mt.get("reason") or "not run", required=False)
    drop = mt["base_mean"] - mt["tuned_mean"]
    detail = f"drop {drop:.2f} ({mt['base_mean']:.2f} -> {mt['tuned_mean']:.2f}, judge {mt.get('judge_model', '?')})"
    return CriterionResult(name, drop, max_drop, drop <= max_drop + 1e-9, detail, required=False)


def run_metrics(battery: Mapping) -> RunMetrics:
    """What evidence.EvidenceBar needs, read back from battery.json's rows."""
    rows, lengths = battery.get("comparisons", {}), battery.get("lengths") or {}
    mmlu = rows.get("mmlu")
    return RunMetrics(
        target=row_comparison(rows["target"]) if "target" in rows else None,
        mmlu_base_points=100 * mmlu["base"] if mmlu else None,
        mmlu_tuned_points=100 * mmlu["tuned"] if mmlu else None,
        mmlu_n=int(mmlu["n"]) if mmlu and mmlu.get("n") else None,
        mmlu_delta_ci_points=(100 * mmlu["ci_low"], 100 * mmlu["ci_high"]) if mmlu and "ci_low" in mmlu else None,
        length_before=LengthStats(**lengths["base"]) if lengths.get("base") else None,
        length_after=LengthStats(**lengths["tuned"]) if lengths.get("tuned") else None)


def evidence(battery: Mapping, bar: EvidenceBar = EvidenceBar(), mtbench_max_drop: float | None = None) -> \
        list[CriterionResult]:
    """The bar's three criteria and the MT-Bench row, from battery.json alone."""
    drop = battery.get("mtbench_max_drop", 0.5) if mtbench_max_drop is None else mtbench_max_drop
    return bar.evaluate(run_metrics(battery)) + [mtbench_criterion(battery.get("mtbench") or {}, drop)]


def criterion_dict(c: CriterionResult) -> dict:
    value = None if c.value is None or (isinstance(c.value, float) and math.isnan(c.value)) else c.value
    return {"name": c.name, "status": c.status, "value": value, "threshold": c.threshold, "detail": c.detail,
            "required": c.required}


def evidence_block(battery: Mapping) -> dict:
    results = evidence(battery)
    return {"criteria": [criterion_dict(c) for c in results], "verdict": verdict(results),
            "not_measured_beside_bar": unmeasured_extras(results)}


def criterion_status(results: Sequence[CriterionResult], prefix: str) -> str | None:
    """The status of the criterion whose name starts with prefix ("MMLU", "length", "target", "MT-Bench")."""
    return next((r.status for r in results if r.name.startswith(prefix)), None)

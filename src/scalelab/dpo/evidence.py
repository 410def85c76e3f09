"""The regression battery's evidence bar: response lengths, paired comparisons and a pass/fail table.

A tuned run clears the bar when (1) its target metric improved on held-out examples, judged by the
lower bound of a paired 95% confidence interval, (2) MMLU dropped by at most 2 points and (3) mean
response length grew by at most 1.3x. A bar criterion that could not be measured makes the verdict
"not measured", never a pass. Reported criteria beyond the bar (MT-Bench, which needs a capable judge)
fail the verdict when measured and failed; when not measured they are named beside it
("PASS; not measured: MT-Bench") instead of hiding the bar's result. Pure functions; the markdown
renderer returns a string.

Paired statistics, base and tuned graded on the same examples:
- the percentile bootstrap (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13.3),
  resampling example indices so each draw keeps a base score with its own tuned score;
- for binary metrics, also McNemar's test (McNemar 1947, Psychometrika 12(2)) in its exact form: under
  no difference the b + c discordant examples split as Binomial(b + c, 1/2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

PASS, FAIL, NOT_MEASURED = "PASS", "FAIL", "not measured"
_EDGE_TOL = 1e-9                 # a value on a threshold (2.0 pts, 1.3x) passes despite float rounding
_BOOTSTRAP_CHUNK_ELEMS = 1 << 22  # resampled indices held in memory at once

# ---------------------------------------------------------------------------------------------
# response lengths


@dataclass(frozen=True)
class LengthStats:
    n: int
    mean_tokens: float
    median_tokens: float
    p90_tokens: float               # numpy's default (linear) quantile
    hit_limit_share: float          # share of responses with tokens >= the generation limit


def _counts(token_counts: Sequence[int], what: str) -> np.ndarray:
    a = np.asarray(token_counts, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{what}: expected a non-empty list of token counts, got shape {a.shape}")
    if (a < 0).any():
        raise ValueError(f"{what}: token counts must be >= 0")
    return a


def length_stats(token_counts: Sequence[int], max_new_tokens: int) -> LengthStats:
    """Summary of generated-response lengths; max_new_tokens is the generation limit they were sampled with."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    a = _counts(token_counts, "length_stats")
    return LengthStats(n=int(a.size), mean_tokens=float(a.mean()), median_tokens=float(np.median(a)),
                       p90_tokens=float(np.quantile(a, 0.9)),
                       hit_limit_share=float((a >= max_new_tokens).mean()))


def length_ratio(before: LengthStats, after: LengthStats) -> float:
    """Length inflation: mean tokens after tuning / mean tokens before."""
    if before.mean_tokens <= 0:
        raise ValueError("length_ratio: mean length before tuning is 0")
    return after.mean_tokens / before.mean_tokens


@dataclass(frozen=True)
class LengthRatioSummary:
    n: int
    mean_ratio: float
    median_ratio: float
    geometric_mean_ratio: float     # exp(mean log ratio): 2x longer and 2x shorter cancel out
    share_longer: float             # prompts whose tuned response is longer than the base one


def paired_length_ratios(before_tokens: Sequence[int], after_tokens: Sequence[int]) -> LengthRatioSummary:
    """Per-prompt ratios after / before, for responses to the same prompts in the same order."""
    b, a = _counts(before_tokens, "before"), _counts(after_tokens, "after")
    if a.size != b.size:
        raise ValueError(f"paired_length_ratios: {b.size} before vs {a.size} after responses")
    if (b == 0).any():
        raise ValueError("paired_length_ratios: a base response has 0 tokens; its ratio is undefined")
    r = a / b
    with np.errstate(divide="ignore"):
        geo = float(np.exp(np.log(r).mean()))
    return LengthRatioSummary(n=int(r.size), mean_ratio=float(r.mean()), median_ratio=float(np.median(r)),
                              geometric_mean_ratio=geo, share_longer=float((r > 1).mean()))

# ---------------------------------------------------------------------------------------------
# paired comparisons


@dataclass(frozen=True)
class PairedDifference:
    """Mean of tuned - base over the same examples, with a percentile-bootstrap confidence interval."""
    n: int
    base_mean: float
    tuned_mean: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float = 0.95
    n_resamples: int = 10_000
    seed: int = 0


@dataclass(frozen=True)
class PairedBinaryComparison:
    """Accuracy difference (tuned - base, as a fraction) with the bootstrap CI and McNemar's exact test."""
    diff: PairedDifference
    tuned_only: int                 # b: tuned right, base wrong
    base_only: int                  # c: base right, tuned wrong
    both_correct: int
    neither_correct: int
    mcnemar_p: float                # two-sided exact p-value


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: min(1, 2 P[X <= min(b, c)]), X ~ Bin(b+c, 1/2).

    McNemar 1947; the exact (binomial) form avoids the chi-square approximation for small b + c.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def _bootstrap_means(d: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of n_resamples resamples (with replacement, size n) of d, drawn in memory-bounded chunks."""
    rows = max(1, _BOOTSTRAP_CHUNK_ELEMS // d.size)
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, rows):
        stop = min(start + rows, n_resamples)
        out[start:stop] = d[rng.integers(0, d.size, size=(stop - start, d.size))].mean(axis=1)
    return out


def paired_bootstrap(base_scores: Sequence[float], tuned_scores: Sequence[float], *, confidence: float = 0.95,
                     n_resamples: int = 10_000, seed: int = 0) -> PairedDifference:
    """Paired percentile-bootstrap CI of mean(tuned - base) (Efron & Tibshirani 1993, ch. 13.3).

    Resampling whole examples keeps each example's base and tuned score together, so the interval
    reflects the per-example correlation that an unpaired comparison would ignore.
    """
    base = np.asarray(base_scores, dtype=np.float64)
    tuned = np.asarray(tuned_scores, dtype=np.float64)
    if base.ndim != 1 or base.shape != tuned.shape or base.size == 0:
        raise ValueError(f"paired scores must be two non-empty lists of equal length, "
                         f"got {base.shape} and {tuned.shape}")
    if not 0.0 < confidence < 1.0 or n_resamples < 1:
        raise ValueError(f"need 0 < confidence < 1 and n_resamples >= 1, got {confidence}, {n_resamples}")
    d = tuned - base
    means = _bootstrap_means(d, n_resamples, np.random.default_rng(seed))
    alpha = 1.0 - confidence
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return PairedDifference(n=int(d.size), base_mean=float(base.mean()), tuned_mean=float(tuned.mean()),
                            difference=float(d.mean()), ci_low=float(lo), ci_high=float(hi),
                            confidence=confidence, n_resamples=n_resamples, seed=seed)


def compare_paired_binary(base_correct: Sequence[bool], tuned_correct: Sequence[bool], *,
                          confidence: float = 0.95, n_resamples: int = 10_000,
                          seed: int = 0) -> PairedBinaryComparison:
    """Base vs tuned on the same held-out examples, each graded right (1) or wrong (0)."""
    base, tuned = np.asarray(base_correct), np.asarray(tuned_correct)
    for name, a in (("base_correct", base), ("tuned_correct", tuned)):
        if a.size and not np.isin(a, (0, 1)).all():
            raise ValueError(f"{name}: expected 0/1 or booleans")
    diff = paired_bootstrap(base.astype(np.float64), tuned.astype(np.float64), confidence=confidence,
                            n_resamples=n_resamples, seed=seed)
    base, tuned = base.astype(bool), tuned.astype(bool)
    b, c = int((tuned & ~base).sum()), int((base & ~tuned).sum())
    return PairedBinaryComparison(diff=diff, tuned_only=b, base_only=c, both_correct=int((base & tuned).sum()),
                                  neither_correct=int((~base & ~tuned).sum()), mcnemar_p=mcnemar_exact_p(b, c))

def wilson_interval(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927, JASA 22(158)); sound near 0 and 1."""
    if n <= 0:
        raise ValueError(f"wilson_interval: n must be > 0, got {n}")
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half

# ---------------------------------------------------------------------------------------------
# the evidence bar


@dataclass(frozen=True)
class CriterionResult:
    name: str
    value: float | None             # the number compared with the threshold; None when not measured
    threshold: float
    passed: bool | None             # None = not measured, never counted as a pass
    detail: str
    required: bool = True           # one of the bar's criteria; False = reported beside it (MT-Bench)

    @property
    def status(self) -> str:
        return NOT_MEASURED if self.passed is None else (PASS if self.passed else FAIL)


@dataclass(frozen=True)
class RunMetrics:
    """What one tuned run measured against its base model; None = not measured."""
    target: PairedDifference | PairedBinaryComparison | None = None   # higher is better
    mmlu_base_points: float | None = None      # MMLU accuracy in percentage points (0-100)
    mmlu_tuned_points: float | None = None
    mmlu_n: int | None = None                  # questions both models answered; None = unknown (no chance check)
    mmlu_delta_ci_points: tuple[float, float] | None = None   # paired CI of tuned - base, points
    length_before: LengthStats | None = None
    length_after: LengthStats | None = None
    not_measured: Mapping[str, str] = field(default_factory=dict)  # extra criterion -> why, e.g. MT-Bench


@dataclass(frozen=True)
class EvidenceBar:
    target_ci_low_above: float = 0.0           # target improved: CI lower bound strictly above this
    mmlu_max_drop_points: float = 2.0
    mmlu_chance_points: float = 25.0           # four choices: a base whose CI reaches this cannot show a drop
    max_length_ratio: float = 1.3              # mean tokens after / before

    def evaluate(self, m: RunMetrics) -> list[CriterionResult]:
        results = [self._target(m), self._mmlu(m), self._length(m)]
        results += [CriterionResult(name, None, math.nan, None, why, required=False)
                    for name, why in m.not_measured.items()]
        return results

    def _target(self, m: RunMetrics) -> CriterionResult:
        name = f"target improved (CI low > {self.target_ci_low_above:g})"
        if m.target is None:
            return CriterionResult(name, None, self.target_ci_low_above, None, "no paired target scores")
        d = m.target.diff if isinstance(m.target, PairedBinaryComparison) else m.target
        detail = f"{d.difference:+.3f}, {d.confidence:.0%} CI [{d.ci_low:+.3f}, {d.ci_high:+.3f}]"
        if isinstance(m.target, PairedBinaryComparison):
            detail += f", McNemar p={m.target.mcnemar_p:.3g}"
        return CriterionResult(name, d.ci_low, self.target_ci_low_above,
                               d.ci_low > self.target_ci_low_above, detail)

    def _mmlu(self, m: RunMetrics) -> CriterionResult:
        name = f"MMLU drop <= {self.mmlu_max_drop_points:g} pts"
        if m.mmlu_base_points is None or m.mmlu_tuned_points is None:
            return CriterionResult(name, None, self.mmlu_max_drop_points, None, "MMLU not run on both models")
        drop = m.mmlu_base_points - m.mmlu_tuned_points
        detail = f"drop {drop:.2f} pts ({m.mmlu_base_points:.2f} -> {m.mmlu_tuned_points:.2f})"
        if m.mmlu_delta_ci_points is not None:   # a true drop of about half the CI's width would have shown
            detail += f"; detectable drop ~{(m.mmlu_delta_ci_points[1] - m.mmlu_delta_ci_points[0]) / 2:.1f} pts"
        if m.mmlu_n:
            low = 100 * wilson_interval(m.mmlu_base_points / 100, m.mmlu_n)[0]
            if low <= self.mmlu_chance_points:
                return CriterionResult(name, drop, self.mmlu_max_drop_points, None,
                                       f"{detail}; base CI low {low:.1f} <= chance {self.mmlu_chance_points:g}: "
                                       "at chance, a regression cannot be seen")
        return CriterionResult(name, drop, self.mmlu_max_drop_points,
                               drop <= self.mmlu_max_drop_points + _EDGE_TOL, detail)

    def _length(self, m: RunMetrics) -> CriterionResult:
        name = f"length ratio <= {self.max_length_ratio:g}x"
        if m.length_before is None or m.length_after is None:
            return CriterionResult(name, None, self.max_length_ratio, None, "lengths not recorded before and after")
        r = length_ratio(m.length_before, m.length_after)
        b, a = m.length_before, m.length_after
        detail = (f"{r:.2f}x ({b.mean_tokens:.1f} -> {a.mean_tokens:.1f} tokens, "
                  f"hit limit {b.hit_limit_share:.0%} -> {a.hit_limit_share:.0%})")
        return CriterionResult(name, r, self.max_length_ratio, r <= self.max_length_ratio + _EDGE_TOL, detail)


def verdict(results: Sequence[CriterionResult]) -> str:
    """FAIL if any criterion failed, else "not measured" if a bar criterion was not measured, else PASS."""
    if any(r.status == FAIL for r in results):
        return FAIL
    return NOT_MEASURED if not results or any(r.required and r.passed is None for r in results) else PASS


def unmeasured_extras(results: Sequence[CriterionResult]) -> list[str]:
    """Names of the reported criteria beyond the bar that were not measured (shown beside a verdict)."""
    return [r.name.split(" drop")[0] for r in results if not r.required and r.passed is None]


def verdict_text(results: Sequence[CriterionResult]) -> str:
    """The verdict, with the reported criteria that were not measured named beside a pass."""
    v, extras = verdict(results), unmeasured_extras(results)
    return f"{v}; not measured: {', '.join(extras)}" if v == PASS and extras else v


def _cell(r: CriterionResult | None) -> str:
    if r is None:
        return NOT_MEASURED
    return f"{r.status} ({r.detail})".replace("|", "\\|")


def _run_verdict(results: Sequence[CriterionResult], others: Sequence[CriterionResult]) -> str:
    """This run's verdict in a table of several: a criterion only the other runs have counts as not measured."""
    have = {r.name for r in results}
    missing = {r.name: CriterionResult(r.name, None, r.threshold, None, "not run", r.required)
               for r in others if r.name not in have}
    return verdict_text([*results, *missing.values()])


def render_evidence_table(rows: Mapping[str, Sequence[CriterionResult]]) -> str:
    """Markdown: one row per criterion, one column per run (e.g. "dpo β=0.1", "ipo", "orpo"), and a verdict row.

    A criterion missing from a run's results shows as "not measured" there.
    """
    runs = list(rows)
    names: list[str] = []
    for results in rows.values():
        names += [r.name for r in results if r.name not in names]
    lines = ["| criterion | " + " | ".join(run.replace("|", "\\|") for run in runs) + " |",
             "|---|" + "---|" * len(runs)]
    for name in names:
        cells = [_cell(next((r for r in rows[run] if r.name == name), None)) for run in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    every = [r for results in rows.values() for r in results]
    overall = [_run_verdict(rows[run], every) for run in runs]
    lines.append("| **verdict** | " + " | ".join(f"**{v}**" for v in overall) + " |")
    return "\n".join(lines) + "\n"

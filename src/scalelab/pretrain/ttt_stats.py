"""Time to target by the speedrun's rules (issue 27, item 1): the target from the baseline's seeds, each seed's
time and tokens to it with runs that never reach it counted, Welch's one-sided test, and the lr-grid rule the
baseline is tuned by.

modded-nanogpt (KellerJordan/modded-nanogpt, README "Rules" and its record logs) accepts a new record only when
several runs of it reach the fixed val-loss bar with p < 0.01, against a baseline timed again on the same
hardware; here the bar is not a published number but the baseline's own one-pass loss, so it is fixed from the
baseline's seeds first:

    target = mean over the baseline's seeds of its val loss after one pass over the training tokens

Every run evaluates on the same val tokens. A run reaches the target at its first evaluation at or below it; the
time is its training seconds up to that evaluation (compile and evaluation excluded, as the speedrun's clock).
A run that never reaches it is right-censored: counted at its end (its whole training time and tokens), which is
a lower bound on its true time. About half of the baseline's seeds end above a target that is their own mean,
so the baseline is mostly censored at one pass; counting those at their end understates the baseline's time,
which works against the recipe. A censored recipe run would understate the recipe's time, which works for it,
so the verdict "faster" also requires that every recipe run reached the target.

Welch's t-test (Welch 1947, "The generalization of Student's problem when several different population
variances are involved", Biometrika 34) compares the means without assuming equal variances; the
Welch-Satterthwaite degrees of freedom, and the one-sided alternative "the recipe's mean time is smaller".

    target_loss(one_pass_losses) -> float
    SideTimes.from_runs(...), welch_less(a, b) -> Welch, compare(baseline, recipe) -> dict
    grid_rule(lrs, losses) -> GridRule (extend the grid low / high, or the tuned lr)
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

ALPHA = 0.01        # modded-nanogpt's bar for a new record: p < 0.01
MIN_SEEDS = 5       # the minimum per side
GOAL_RATIO = 0.5    # the goal: the recipe's mean time <= 0.5 x the tuned baseline's
MIN_GRID = 4        # lrs in the baseline's grid


def target_loss(one_pass_losses: Sequence[float]) -> float:
    """The mean over the baseline's seeds of the val loss after one pass."""
    finite = [x for x in one_pass_losses if math.isfinite(x)]
    if len(finite) != len(one_pass_losses) or not finite:
        raise ValueError(f"baseline one-pass losses {list(one_pass_losses)}: need finite values from every seed")
    return statistics.fmean(finite)


@dataclass(frozen=True)
class SeedTime:
    seed: int
    reached: bool     # False: right-censored at the run's end
    train_s: float    # to the first evaluation at or below the target, else the run's whole training time
    tokens: int


def seed_time(seed: int, val: Sequence[tuple[int, float, float]], target: float, end_s: float,
              end_tokens: int) -> SeedTime:
    """val: (tokens, train_s, val_loss) per evaluation in step order; end_*: the run's last step."""
    for tokens, train_s, loss in val:
        if loss <= target:
            return SeedTime(seed, True, train_s, tokens)
    return SeedTime(seed, False, end_s, end_tokens)


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); std 0 for one value."""
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


@dataclass(frozen=True)
class Welch:
    t: float
    df: float
    p_less: float     # P(T <= t) under H0: equal means; small when the first sample's mean is smaller


def welch_less(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's t-test of H1: mean(a) < mean(b). t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b),
    df = (v_a + v_b)^2 / (v_a^2/(n_a-1) + v_b^2/(n_b-1)) with v = s^2/n (Welch 1947, eq. 9; Satterthwaite 1946)."""
    from scipy.stats import t as student_t  # lazy: scipy takes a second to import
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs two values per side, got {len(a)} and {len(b)}")
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    if va + vb == 0:  # both sides constant: the sign of the difference is the whole answer
        return Welch(math.copysign(math.inf, ma - mb) if ma != mb else 0.0, math.nan,
                     0.0 if ma < mb else 1.0 if ma > mb else 0.5)
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return Welch(t, df, float(student_t.cdf(t, df)))


def side_summary(times: Sequence[SeedTime]) -> dict:
    (ms, ss), (mt, st) = mean_std([x.train_s for x in times]), mean_std([float(x.tokens) for x in times])
    return {"seeds": [x.seed for x in times], "n": len(times), "reached": sum(x.reached for x in times),
            "censored": [x.seed for x in times if not x.reached], "train_s_mean": ms, "train_s_std": ss,
            "tokens_mean": mt, "tokens_std": st, "runs": [asdict(x) for x in times]}


def compare(baseline: Sequence[SeedTime], recipe: Sequence[SeedTime], target: float) -> dict:
    """The verdict on time to target: Welch on seconds (the claim) and on tokens (reported), the ratio of
    means, and `faster` = p < ALPHA, >= MIN_SEEDS per side, and no censored recipe run."""
    base, rec = side_summary(baseline), side_summary(recipe)
    w_s = welch_less([x.train_s for x in recipe], [x.train_s for x in baseline])
    w_tok = welch_less([float(x.tokens) for x in recipe], [float(x.tokens) for x in baseline])
    enough = len(baseline) >= MIN_SEEDS and len(recipe) >= MIN_SEEDS
    ratio = rec["train_s_mean"] / base["train_s_mean"]
    return {"target_val_loss": target, "baseline": base, "recipe": rec,
            "welch_train_s": asdict(w_s), "welch_tokens": asdict(w_tok), "ratio_train_s": ratio,
            "ratio_tokens": rec["tokens_mean"] / base["tokens_mean"], "alpha": ALPHA, "min_seeds": MIN_SEEDS,
            "enough_seeds": enough, "recipe_all_reached": not rec["censored"],
            "faster": bool(enough and not rec["censored"] and w_s.p_less < ALPHA),
            "goal_ratio": GOAL_RATIO, "goal_met": bool(enough and not rec["censored"] and w_s.p_less < ALPHA
                                                       and ratio <= GOAL_RATIO)}


# ---------------------------------------------------------------------------------------------
# the baseline's lr grid


@dataclass(frozen=True)
class GridRule:
    status: str                  # "tuned", "extend low", "extend high", "too few"
    best_lr: float | None
    next_lr: float | None        # the lr to add: one grid step past the end the best sits at
    lrs: tuple[float, ...]
    losses: tuple[float, ...]    # per lr, sorted by lr; a diverged run (nan/inf) counts as +inf


def grid_rule(lrs: Sequence[float], losses: Sequence[float], min_grid: int = MIN_GRID) -> GridRule:
    """A tuned lr is one whose grid of >= min_grid lrs (same budget) has its best loss strictly inside: a best at
    either end may be beaten past it, so the grid is extended there by the grid's own step at that end. A tie
    with an end counts as at the end."""
    if len(lrs) != len(losses) or len(set(lrs)) != len(lrs) or any(lr <= 0 for lr in lrs):
        raise ValueError(f"lrs {list(lrs)} and losses {list(losses)}: one loss per distinct positive lr")
    pairs = sorted(zip(lrs, (x if math.isfinite(x) else math.inf for x in losses)))
    xs, ys = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    if not xs:  # no grid run has finished yet (a first, cut-off call)
        return GridRule("too few", None, None, xs, ys)
    best = min(ys)
    if best == math.inf:
        return GridRule("extend low", None, xs[0] / 2, xs, ys)  # every run diverged: smaller lrs
    best_lr = xs[ys.index(best)]
    if len(xs) < min_grid:
        return GridRule("too few", best_lr, None, xs, ys)
    if ys[0] == best:
        return GridRule("extend low", xs[0], xs[0] * xs[0] / xs[1], xs, ys)
    if ys[-1] == best:
        return GridRule("extend high", xs[-1], xs[-1] * xs[-1] / xs[-2], xs, ys)
    return GridRule("tuned", best_lr, None, xs, ys)

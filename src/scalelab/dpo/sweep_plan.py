"""The sweep a config implies, before anything runs: its runs ([sweep]), each run's optimizer steps and margin
points, and the verifier set's expected size, so a config can be checked to train long enough to see its
held-out curves flatten.

Expected pairs. A verifier set keeps one pair per question whose k samples are neither all right nor all wrong.
With per-question accuracy p spread as Beta(a, b) around the mean accuracy m = a / (a + b), the number of right
samples is beta-binomial (Skellam 1948), and

    P(all k right) = B(a + k, b) / B(a, b),   P(all k wrong) = B(a, b + k) / B(a, b)

The concentration a + b is the unknown: large = every question near m (homogeneous, the fewest one-sided groups),
small = questions mostly always or never solved. A plan quotes a range over it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.dpo.config import DpoConfig, TrainConfig


@dataclass(frozen=True)
class PlannedRun:
    loss: str
    beta: float                      # DPO's beta, IPO's tau, ORPO's lambda
    learning_rate: float

    @property
    def name(self) -> str:
        return f"{self.loss}-beta{self.beta:g}"


def planned_runs(cfg: DpoConfig) -> list[PlannedRun]:
    """The runs of cfg's [sweep] table: DPO per beta, then IPO per tau, then ORPO per lambda."""
    s, lr = cfg.sweep, cfg.train.learning_rate
    return ([PlannedRun("dpo", b, lr) for b in s.dpo_betas]
            + [PlannedRun("ipo", t, s.ipo_learning_rate or lr) for t in s.ipo_taus]
            + [PlannedRun("orpo", x, s.orpo_learning_rate or lr) for x in s.orpo_lambdas])


def planned_steps(train: TrainConfig, n_train_pairs: int) -> int:
    """Optimizer steps: max_steps, else ceil(epochs x steps per epoch), an epoch being ceil(pairs / batch)
    micro-batches in ceil(that / grad_accum) optimizer steps, as the HF Trainer counts (versions that drop a last
    partial accumulation count one step fewer per epoch)."""
    if train.max_steps:
        return train.max_steps
    if n_train_pairs < 1:
        raise ValueError(f"planned_steps: {n_train_pairs} train pairs; expected >= 1")
    per_epoch = math.ceil(math.ceil(n_train_pairs / train.batch_size) / train.grad_accum)
    return math.ceil(train.num_epochs * per_epoch)


def margin_points(cfg: DpoConfig, n_train_pairs: int) -> int:
    """Margin evaluations of a run: at step 0, every margins.every_steps steps, and at the end (dpo.margins)."""
    steps, every = planned_steps(cfg.train, n_train_pairs), cfg.margins.every_steps
    return 1 + steps // every + (1 if steps % every else 0)


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def mixed_share(mean_accuracy: float, k: int, concentration: float) -> float:
    """Share of questions whose k samples are mixed (some right, some wrong), per-question accuracy
    Beta(m c, (1 - m) c); concentration = inf gives the homogeneous 1 - m^k - (1 - m)^k."""
    m = mean_accuracy
    if not 0.0 < m < 1.0 or k < 2 or concentration <= 0:
        raise ValueError(f"mixed_share: need 0 < accuracy < 1, k >= 2, concentration > 0; got {m}, {k}, "
                         f"{concentration}")
    if math.isinf(concentration):
        return 1.0 - m ** k - (1.0 - m) ** k
    a, b = m * concentration, (1.0 - m) * concentration
    all_right = math.exp(_log_beta(a + k, b) - _log_beta(a, b))
    all_wrong = math.exp(_log_beta(a, b + k) - _log_beta(a, b))
    return 1.0 - all_right - all_wrong


def expected_pairs(cfg: DpoConfig, mean_accuracy: float, concentration: float) -> int:
    """Verifier pairs expected from cfg's verifier settings at this per-sample accuracy and spread (with
    pairs_per_prompt > 1 an upper bound: a group with one right answer has fewer distinct pairs)."""
    v = cfg.verifier
    return round(v.num_prompts * mixed_share(mean_accuracy, v.samples_per_prompt, concentration)
                 * v.pairs_per_prompt)


def train_share(cfg: DpoConfig) -> float:
    """Share of pairs left for training after the validation split."""
    return 1.0 - cfg.data.val_fraction

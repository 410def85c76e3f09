"""The run a sweep chooses, by the rule its config's [selection] table fixed before the runs.

The rule reads only what training already measured on the held-out preference pairs (dpo.margins), so it is
applied before the battery and the battery's test sets never take part in the choice (choosing on the numbers
one then reports would inflate them: the winner's curse). Among the trained runs of `selection.losses`:

1. the metric is the held-out implicit-reward accuracy at the last margins point: the share of held-out pairs
   whose chosen answer gains more log-probability over the reference than the rejected one. It is the sign of
   the margin, so it does not depend on beta; the margin itself is in beta x nats (Rafailov et al. 2023, eq. 5)
   and cannot be compared across betas;
2. runs within `tie_tolerance` of the best accuracy are tied (differences of about one binomial standard error
   are noise), and the tie goes by `tie_break`: larger_beta takes the run held closest to the reference by the
   KL term (Rafailov et al. 2023, eq. 3), the one with the least drift for MMLU and response length to pay for;
   remaining ties go to the higher accuracy, then the run name;
3. each candidate is said to have plateaued or not: its accuracy (and margin) changed by at most the tolerance
   over the last `plateau_window` of its steps. A choice among runs still climbing is reported as provisional.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from scalelab.core.config import config_from_dict, to_dict
from scalelab.dpo.config import DpoConfig, SelectionConfig
from scalelab.dpo.runfiles import RunFiles

SELECTION_FILE = "selection.json"


@dataclass(frozen=True)
class Candidate:
    run: str
    loss: str
    beta: float
    trained: bool                        # training ended (a train_end event)
    accuracy: float | None               # held-out reward accuracy at the last margins point
    margin: float | None                 # held-out margin mean there (beta x nats)
    n_points: int                        # margins points of the last fresh training
    accuracy_plateaued: bool | None      # None: too few points in the window to tell
    margin_plateaued: bool | None


@dataclass(frozen=True)
class Selection:
    rule: str
    chosen: Candidate | None
    tied: tuple[str, ...]                # runs tied with the best (the chosen one among them)
    candidates: tuple[Candidate, ...]    # every run of the sweep, eligible or not
    reason: str
    provisional: bool                    # some eligible run has not plateaued


def rule_text(rule: SelectionConfig) -> str:
    toward = "larger" if rule.tie_break == "larger_beta" else "smaller"
    return (f"among the trained {'/'.join(rule.losses)} runs, the highest held-out implicit-reward accuracy at "
            f"the last margins point; runs within {rule.tie_tolerance:g} of it are tied and the tie goes to the "
            f"{toward} beta; a curve has plateaued when it moved by at most {rule.plateau_accuracy_tol:g} "
            f"(accuracy) or {rule.plateau_margin_rel_tol:.0%} (margin) over the last {rule.plateau_window:.0%} "
            "of the steps")


def _window(points: Sequence[dict], share: float) -> list[dict]:
    last = points[-1]["step"]
    return [p for p in points if p["step"] >= last * (1.0 - share)]


def plateaued(points: Sequence[dict], key: str, share: float, tol: float, relative: bool) -> bool | None:
    """Whether points[key] moved by at most tol (times |last| when relative) between the first and last point
    of the final `share` of the steps; None with fewer than two points there."""
    vals = [p[key] for p in _window(points, share) if isinstance(p.get(key), (int, float))] if points else []
    if len(vals) < 2:
        return None
    return abs(vals[-1] - vals[0]) <= tol * (abs(vals[-1]) if relative else 1.0) + 1e-12


def candidate(run: RunFiles, rule: SelectionConfig) -> Candidate:
    t, m = run.config.get("train", {}), run.margins
    last = m[-1] if m else {}
    return Candidate(run.name, t.get("loss", "?"), float(t.get("beta", float("nan"))),
                     run.results.get("wall_s") is not None, last.get("reward_accuracy"), last.get("margin_mean"),
                     len(m), plateaued(m, "reward_accuracy", rule.plateau_window, rule.plateau_accuracy_tol, False),
                     plateaued(m, "margin_mean", rule.plateau_window, rule.plateau_margin_rel_tol, True))


def select(candidates: Sequence[Candidate], rule: SelectionConfig) -> Selection:
    """The rule applied to the candidates (pure: hand-built candidates test it)."""
    text = rule_text(rule)
    eligible = [c for c in candidates if c.loss in rule.losses and c.trained and c.accuracy is not None]
    if not eligible:
        return Selection(text, None, (), tuple(candidates), f"no trained {'/'.join(rule.losses)} run with "
                         "held-out margins, so no run is chosen", False)
    best = max(c.accuracy for c in eligible)
    tied = [c for c in eligible if c.accuracy >= best - rule.tie_tolerance - 1e-12]
    sign = 1.0 if rule.tie_break == "larger_beta" else -1.0
    chosen = sorted(tied, key=lambda c: (-sign * c.beta, -c.accuracy, c.run))[0]
    unsettled = [c.run for c in eligible if c.accuracy_plateaued is not True]
    reason = (f"held-out reward accuracy {chosen.accuracy:.3f} (best {best:.3f}) at beta {chosen.beta:g}"
              + (f", tied with {', '.join(c.run for c in tied if c is not chosen)}; the tie goes to the "
                 f"{'larger' if sign > 0 else 'smaller'} beta" if len(tied) > 1 else "")
              + (f"; provisional: not plateaued: {', '.join(unsettled)}" if unsettled else "; every candidate "
                 "plateaued"))
    return Selection(text, chosen, tuple(c.run for c in tied), tuple(candidates), reason, bool(unsettled))


def sweep_rule(runs: Sequence[RunFiles]) -> SelectionConfig:
    """The [selection] table the runs were configured with; runs that disagree are an error, since a rule
    changed between runs was not fixed before them."""
    tables = {run.name: to_dict(config_from_dict(DpoConfig, {"selection": run.config.get("selection", {})},
                                                 f"{run.path / 'config.toml'} [selection]").selection)
              for run in runs}
    distinct = {json.dumps(t, sort_keys=True) for t in tables.values()}
    if len(distinct) > 1:
        raise ValueError(f"the sweep's runs have different [selection] tables ({', '.join(sorted(tables))}): "
                         "the rule must be fixed once, before the runs")
    return config_from_dict(DpoConfig, {"selection": next(iter(tables.values()))}, "[selection]").selection


def select_runs(runs: Sequence[RunFiles]) -> Selection:
    if not runs:
        raise ValueError("select_runs: no runs to choose from")
    rule = sweep_rule(runs)
    return select([candidate(r, rule) for r in runs], rule)


def write_selection(sweep_dir: Path, selection: Selection) -> Path:
    """<sweep>/selection.json: the rule, the chosen run and every candidate's numbers."""
    out = Path(sweep_dir) / SELECTION_FILE
    out.write_text(json.dumps(asdict(selection), indent=1) + "\n")
    return out

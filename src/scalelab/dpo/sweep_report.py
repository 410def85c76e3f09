"""A sweep's REPORT.md: the β ablation (DPO, IPO and ORPO in one table), the run chosen by the rule the config's
[selection] table fixed before the runs (dpo.selection), the evidence bar per run, from the sweep folder alone.

Beside the chosen run the report names the best battery row after the fact: among runs that pass the MMLU
criterion (drop <= 2 points) and the length criterion (<= 1.3x), the largest target gain (ties: the larger CI
lower bound); a gain whose CI still includes 0 is said to be unproven; with no eligible run nothing is named.
Picked on the test examples it reports, its gain is optimistic, which is why the choice itself is made before.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from scalelab.core.config import read_toml
from scalelab.dpo import battery_stats as stats
from scalelab.dpo.evidence import PASS, render_evidence_table, verdict_text
from scalelab.dpo.runfiles import RunFiles, fmt, is_run_dir, load_run, pts, table
from scalelab.dpo.selection import Candidate, select_runs, write_selection

LOSS_ORDER = ("dpo", "ipo", "orpo")


@dataclass(frozen=True)
class SweepRow:
    run: str
    loss: str
    beta: float
    loss_last: float | None
    heldout_reward_accuracy: float | None
    margin_mean: float | None
    target_delta: float | None          # fraction; None = target not measured
    target_ci: tuple[float, float] | None
    mmlu_delta_points: float | None
    length_ratio: float | None
    mmlu_status: str | None             # PASS / FAIL / not measured
    length_status: str | None
    verdict: str

    @property
    def label(self) -> str:
        return f"{self.loss} β={self.beta:g}"


@dataclass(frozen=True)
class Choice:
    row: SweepRow | None
    eligible: tuple[str, ...]           # runs passing the MMLU and length criteria
    reason: str


def find_runs(sweep_dir: str | Path) -> list[Path]:
    """Run folders directly under the sweep folder, ordered by loss then β; hidden ones (a base-only battery
    folder, .base) are not runs."""
    sweep = Path(sweep_dir)
    if not sweep.is_dir():
        raise FileNotFoundError(f"{sweep}: no such folder")
    runs = [p for p in sorted(sweep.iterdir()) if p.is_dir() and not p.name.startswith(".") and is_run_dir(p)]
    if not runs:
        raise FileNotFoundError(f"{sweep}: no run folders (subfolders with config.toml and metrics.jsonl)")

    def key(p: Path) -> tuple:
        t = read_toml(p / "config.toml").get("train", {})
        loss = t.get("loss", "")
        return (LOSS_ORDER.index(loss) if loss in LOSS_ORDER else len(LOSS_ORDER), t.get("beta", 0.0), p.name)
    return sorted(runs, key=key)


def sweep_row(run: RunFiles) -> SweepRow:
    t, r, b = run.config.get("train", {}), run.results, run.battery or {}
    rows = b.get("comparisons", {})
    target, mmlu = rows.get("target"), rows.get("mmlu")
    results = stats.evidence(b) if b else []
    return SweepRow(run.name, t.get("loss", "?"), float(t.get("beta", float("nan"))), r.get("loss_last"),
                    r.get("heldout_reward_accuracy_last"), r.get("heldout_margin_mean_last"),
                    target["delta"] if target else None, (target["ci_low"], target["ci_high"]) if target else None,
                    100 * mmlu["delta"] if mmlu else None, (b.get("lengths") or {}).get("ratio"),
                    stats.criterion_status(results, "MMLU"), stats.criterion_status(results, "length"),
                    verdict_text(results) if results else "not measured")


def choose(rows: Sequence[SweepRow]) -> Choice:
    eligible = [r for r in rows if r.mmlu_status == PASS and r.length_status == PASS and r.target_delta is not None]
    names = tuple(r.run for r in eligible)
    if not eligible:
        return Choice(None, names, "no run passes both the MMLU (drop <= 2 pts) and the length (<= 1.3x) criteria "
                                   "with a measured target, so no β is chosen")
    best = max(eligible, key=lambda r: (r.target_delta, r.target_ci[0] if r.target_ci else float("-inf")))
    proven = best.target_ci is not None and best.target_ci[0] > 0
    reason = (f"the largest target gain ({pts(best.target_delta)} pts) among the {len(eligible)} "
              f"of {len(rows)} runs that pass the MMLU and length criteria ({', '.join(names)})"
              + ("; its CI excludes 0." if proven else
                 "; its CI includes 0, so the gain is not established at this sample size."))
    return Choice(best, names, reason)


def ablation_cells(r: SweepRow) -> list[str]:
    ci = f"[{pts(r.target_ci[0])}, {pts(r.target_ci[1])}]" if r.target_ci else "-"
    return [r.run, r.loss, f"{r.beta:g}", fmt(r.loss_last), fmt(r.heldout_reward_accuracy, "{:.2f}"),
            fmt(r.margin_mean), pts(r.target_delta), ci, fmt(r.mmlu_delta_points, "{:+.2f}"),
            fmt(r.length_ratio, "{:.2f}x"), r.verdict]


ABLATION_HEADER = ["run", "loss", "β", "final loss", "held-out reward acc", "margin mean", "target Δ (pts)",
                   "target CI", "MMLU Δ (pts)", "length ratio", "evidence"]


def _yes_no(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def selection_lines(runs: Sequence[RunFiles]) -> list[str]:
    """The pre-registered rule, the run it chose and every candidate's held-out numbers."""
    lines = ["## Chosen run (rule fixed in [selection] before the runs)", ""]
    try:
        sel = select_runs(runs)
    except ValueError as e:
        return lines + [f"The rule could not be applied: {e}.", ""]
    lines += [f"Rule: {sel.rule}.", ""]
    c = sel.chosen
    lines += [f"**{c.loss} β={c.beta:g}** (`{c.run}`): {sel.reason}." if c else sel.reason + ".", ""]

    def cells(c: Candidate) -> list[str]:
        return [c.run, c.loss, f"{c.beta:g}", "yes" if c.trained else "no", fmt(c.accuracy), fmt(c.margin),
                str(c.n_points), _yes_no(c.accuracy_plateaued), _yes_no(c.margin_plateaued)]
    header = ["run", "loss", "β", "trained", "held-out reward acc", "margin mean", "margin points",
              "accuracy plateaued", "margin plateaued"]
    return lines + table(header, [cells(c) for c in sel.candidates]) + [""]


def render_sweep(sweep_dir: Path, runs: Sequence[RunFiles]) -> str:
    rows = [sweep_row(r) for r in runs]
    choice = choose(rows)
    with_battery = {r.label: stats.evidence(r.battery) for r in runs if r.battery}
    lines = [f"# DPO sweep `{sweep_dir.name}`", "",
             f"_Regenerate with `scalelab dpo report {sweep_dir}` (from the folder's files alone)._", "",
             "## β ablation", "",
             "β is DPO's KL strength (Rafailov et al. 2023), IPO's τ (Azar et al. 2023) and ORPO's odds-ratio "
             "weight λ (Hong et al. 2024). Final loss is not comparable across losses; margins and reward accuracy "
             "are on the same held-out pairs.", ""]
    lines += table(ABLATION_HEADER, [ablation_cells(r) for r in rows]) + [""]
    lines += selection_lines(runs)
    lines += ["## Best battery row (after the fact)", "",
              "The best target gain among runs that pass the MMLU and length criteria. It is picked on the test "
              "examples it reports, so its gain is optimistic; the choice above was fixed before the battery.", "",
              f"**{choice.row.label}** (`{choice.row.run}`): {choice.reason}" if choice.row else choice.reason, ""]
    if with_battery:
        lines += ["## Evidence bar per run", "", render_evidence_table(with_battery).rstrip("\n"), ""]
    lines += ["## Runs", ""] + [f"- [{r.label}]({r.name}/REPORT.md)" for r in runs] + [""]
    return "\n".join(lines)


def write_sweep_report(sweep_dir: str | Path) -> Path:
    """<sweep>/REPORT.md from its runs' files (dpo.report.report also rewrites each run's REPORT.md first), and
    <sweep>/selection.json with the run the [selection] rule chooses (left out when the runs' rules differ)."""
    sweep = Path(sweep_dir)
    runs = [load_run(p) for p in find_runs(sweep)]
    out = sweep / "REPORT.md"
    out.write_text(render_sweep(sweep, runs))
    with contextlib.suppress(ValueError):  # REPORT.md says why the rule could not be applied
        write_selection(sweep, select_runs(runs))
    return out

"""A dpo run's REPORT.md, regenerated from its folder alone (DESIGN.md principle 3).

    load_run(run_dir) -> RunFiles               read: config.toml, metrics.jsonl, predictions.json, battery.json
    plot_training(run, path)                    figures/training.png: loss and reward accuracy per step
    render_run(run) -> str                      predicted vs measured, curves, battery, lengths, evidence bar
    write_run_report(run_dir) -> Path           all of the above (and figures/margins.png redrawn)

A sweep's table and choice of beta live in dpo.sweep_report; `write_report` picks by folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from scalelab.core.config import read_toml
from scalelab.core.jsonio import is_stored
from scalelab.core.pngsave import save_png
from scalelab.core.rundir import RunDir
from scalelab.dpo import battery_stats as stats
from scalelab.dpo.evidence import render_evidence_table, verdict_text

BATTERY_JSON = Path("battery") / "battery.json"


@dataclass(frozen=True)
class RunFiles:
    path: Path
    config: dict                    # config.toml as written by the run
    results: dict                   # dpo.run.results_from_run: measured, with predictions.json inside
    train: list[dict]               # "train" events since the last fresh start (TRL's log lines)
    margins: list[dict]             # "margins" events since the last fresh start
    step_s_total: float | None      # summed optimizer-step time
    battery: dict | None            # battery/battery.json

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        t = self.config.get("train", {})
        return f"{t.get('loss', '?')} β={t.get('beta', '?'):g}" if isinstance(t.get("beta"), (int, float)) \
            else self.name


def is_run_dir(path: Path) -> bool:
    return (path / "config.toml").is_file() and is_stored(path / "metrics.jsonl")


def load_run(run_dir: str | Path) -> RunFiles:
    from scalelab.core.jsonio import read_json
    from scalelab.dpo.run import _this_training, results_from_run
    path = Path(run_dir)
    if not is_run_dir(path):
        raise FileNotFoundError(f"{path}: not a dpo run folder (needs config.toml and metrics.jsonl)")
    rd = RunDir(path)
    steps = _this_training(rd, "step")
    battery = path / BATTERY_JSON
    return RunFiles(path, read_toml(path / "config.toml", "run config"), results_from_run(path),
                    _this_training(rd, "train"), _this_training(rd, "margins"),
                    sum(e["step_s"] for e in steps) if steps else None,
                    read_json(battery) if is_stored(battery) else None)

# ---------------------------------------------------------------------------------------------
# formatting


def fmt(value: Any, spec: str = "{:.3f}") -> str:
    return "-" if value is None else spec.format(value)


def pct(fraction: float | None, digits: int = 1) -> str:
    return "-" if fraction is None else f"{100 * fraction:.{digits}f}%"


def pts(fraction: float | None, digits: int = 1) -> str:
    return "-" if fraction is None else f"{100 * fraction:+.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |"
                                                                            for r in esc]

# ---------------------------------------------------------------------------------------------
# predicted vs measured


def prediction_rows(run: RunFiles) -> list[list[str]]:
    r, p = run.results, run.results.get("predictions") or {}

    def row(name: str, key: str, measured: float | None, spec: str, low: str = "", high: str = "") -> list[str]:
        pred = p.get(key)
        band = f"[{fmt(p.get(low), spec)}, {fmt(p.get(high), spec)}]" if low else ""
        ratio = fmt(measured / pred, "{:.2f}x") if measured is not None and pred else "-"
        inside = "-" if not low or measured is None or p.get(low) is None else \
            ("yes" if p[low] <= measured <= p[high] else "no")
        return [name, fmt(pred, spec), band or "-", fmt(measured, spec), ratio, inside]
    return [row("step time (s, median)", "step_s", r.get("step_s_median"), "{:.2f}", "step_s_low", "step_s_high"),
            row("training time (s, steps summed)", "train_s", run.step_s_total, "{:.0f}"),
            row("peak memory (GiB)", "peak_memory_gib", r.get("peak_memory_gib"), "{:.2f}"),
            row("initial loss", "initial_loss", r.get("loss_first"), "{:.3f}"),
            row("held-out reward accuracy (last)", "heldout_reward_accuracy", r.get("heldout_reward_accuracy_last"),
                "{:.2f}", "heldout_reward_accuracy_low", "heldout_reward_accuracy_high")]


def predictions_md(run: RunFiles) -> list[str]:
    p = run.results.get("predictions")
    if not p:
        return ["## Predicted vs measured", "", "No predictions.json in this folder.", ""]
    head = ["## Predicted vs measured", "",
            f"Written before step 0 (sha256 logged in metrics.jsonl). Step time assumes MFU {p.get('assumed_mfu')} "
            f"({p.get('mfu_why', '')}).", ""]
    return head + table(["quantity", "predicted", "interval", "measured", "measured / predicted", "inside"],
                        prediction_rows(run)) + [""]

# ---------------------------------------------------------------------------------------------
# curves


def plot_training(run: RunFiles, out: Path) -> Path | None:
    """Left: training loss per step. Right: train-batch and held-out reward accuracy per step."""
    if not run.train:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_l.plot([e["step"] for e in run.train if "loss" in e], [e["loss"] for e in run.train if "loss" in e], "o-")
    ax_l.set(xlabel="step", ylabel="loss", title=f"training loss ({run.label})")
    acc = [e for e in run.train if "rewards_accuracies" in e]
    if acc:
        ax_a.plot([e["step"] for e in acc], [e["rewards_accuracies"] for e in acc], "o-", label="train batch")
    if run.margins:
        ax_a.plot([m["step"] for m in run.margins], [m["reward_accuracy"] for m in run.margins], "s--",
                  label=f"held-out pairs (n={run.margins[-1]['n_pairs']})")
    ax_a.set(xlabel="step", ylabel="reward accuracy (margin > 0)", ylim=(-0.02, 1.02), title="reward accuracy")
    ax_a.legend(fontsize=8)
    for ax in (ax_l, ax_a):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out, dpi=110)
    plt.close(fig)
    return out


def curves_md(run: RunFiles, figures: Sequence[str]) -> list[str]:
    r = run.results
    lines = ["## Training", "",
             f"{r.get('steps')} steps; loss {fmt(r.get('loss_first'))} -> {fmt(r.get('loss_last'))}; held-out "
             f"reward accuracy {fmt(r.get('heldout_reward_accuracy_first'), '{:.2f}')} -> "
             f"{fmt(r.get('heldout_reward_accuracy_last'), '{:.2f}')}; held-out margin mean "
             f"{fmt(r.get('heldout_margin_mean_first'))} -> {fmt(r.get('heldout_margin_mean_last'))}; drift "
             f"|log pi - log pi_ref| on chosen responses {fmt(r.get('drift_abs_logratio_chosen_nats_last'))} nats.",
             ""]
    return lines + [f"![{Path(f).stem}]({f})" for f in figures] + [""]

# ---------------------------------------------------------------------------------------------
# battery


def comparison_cells(row: dict) -> list[str]:
    ci = f"[{pts(row['ci_low'])}, {pts(row['ci_high'])}]"
    p = fmt(row.get("mcnemar_p"), "{:.3g}") if row.get("kind") == "binary" else "-"
    name = f"{row['name']} ({row['task']}, {row.get('split', '')})" if row["name"] == "target" else row["name"]
    metric = row["metric"] + (" (mass)" if row.get("kind") == "continuous" else "")
    return [name, metric, str(row["n"]), pct(row["base"]), pct(row["tuned"]), pts(row["delta"]), ci, p]


def mtbench_cells(mt: dict) -> list[str]:
    if mt.get("status") != stats.MEASURED:
        return ["MT-Bench", "judge 1-10", "-", "not measured", "not measured", "-", "-", mt.get("reason", "")]
    return ["MT-Bench", f"judge 1-10 ({mt.get('judge_model')})", str(mt.get("n_questions")),
            fmt(mt["base_mean"], "{:.2f}"), fmt(mt["tuned_mean"], "{:.2f}"), fmt(mt["delta"], "{:+.2f}"), "-", "-"]


def battery_md(b: dict) -> list[str]:
    rows = [comparison_cells(r) for r in b["comparisons"].values()] + [mtbench_cells(b.get("mtbench") or {})]
    conf = next(iter(b["comparisons"].values()), {}).get("confidence", 0.95)
    lines = ["## Regression battery: base vs tuned", "",
             f"Same examples on both sides; Δ in percentage points, {conf:.0%} paired percentile-bootstrap CI "
             "(Efron & Tibshirani 1993), exact McNemar p for right/wrong metrics (McNemar 1947). Base model "
             f"`{b.get('base_model')}`; base results cached in `{b.get('base_cache')}`.", ""]
    return lines + table(["part", "metric", "n", "base", "tuned", "Δ (pts)", "CI (pts)", "McNemar p / note"],
                         rows) + [""]


def length_cells(name: str, base: dict, tuned: dict) -> list[str]:
    ratio = tuned["mean_tokens"] / base["mean_tokens"] if base["mean_tokens"] > 0 else None
    return [name, str(base["n"]), f"{base['mean_tokens']:.1f} -> {tuned['mean_tokens']:.1f}",
            f"{base['median_tokens']:.0f} -> {tuned['median_tokens']:.0f}",
            f"{base['p90_tokens']:.0f} -> {tuned['p90_tokens']:.0f}", fmt(ratio, "{:.2f}x"),
            f"{pct(base['hit_limit_share'], 0)} -> {pct(tuned['hit_limit_share'], 0)}"]


def lengths_md(b: dict) -> list[str]:
    ln = b.get("lengths") or {}
    if not ln:
        return ["## Response lengths", "", "No generated part ran on both models.", ""]
    rows = [length_cells(s, v["base"], v["tuned"]) for s, v in ln["per_source"].items()]
    rows.append(length_cells("**all**", ln["base"], ln["tuned"]))
    pr = ln.get("paired_ratios")
    paired = "" if not pr else (
        f" Per prompt (own + target tasks, n={pr['n']}): median ratio {pr['median_ratio']:.2f}, geometric mean "
        f"{pr['geometric_mean_ratio']:.2f}, {pct(pr['share_longer'], 0)} of tuned responses longer.")
    return ["## Response lengths", "",
            f"Generated tokens per response, base -> tuned (greedy). Ratio of means {fmt(ln.get('ratio'), '{:.2f}')}x."
            + paired, ""] + table(["responses", "n", "mean", "median", "p90", "ratio", "hit limit"], rows) + [""]


def evidence_md(run: RunFiles) -> list[str]:
    results = stats.evidence(run.battery)
    return ["## Evidence bar", "",
            "The bar: target improved (paired CI lower bound > 0), MMLU drop at most 2 points, mean length at most "
            "1.3x; a bar criterion that was not measured is never a pass. Reported beside it: MT-Bench drop at most "
            f"{run.battery.get('mtbench_max_drop', 0.5):g} (of 10), which fails the verdict when measured and "
            "exceeded and is named beside it when it could not be measured (no capable judge).", "",
            render_evidence_table({run.label: results}).rstrip("\n"), "",
            f"Verdict: **{verdict_text(results)}**.", ""]

# ---------------------------------------------------------------------------------------------
# the whole report


def render_run(run: RunFiles, figures: Sequence[str] = ()) -> str:
    c = run.config
    m, t, d = c.get("model", {}), c.get("train", {}), c.get("data", {})
    lines = [f"# DPO run `{run.name}`", "",
             f"_Regenerate with `scalelab dpo report {run.path}` (from this folder's files alone)._", "",
             f"{t.get('loss', '?').upper()} (β={t.get('beta')}) + LoRA r={c.get('lora', {}).get('rank')} on "
             f"`{m.get('name')}`, data source `{d.get('source')}`; {fmt(run.results.get('wall_s'), '{:.0f}')} s from "
             "model load to saved adapter.",
             ""]
    lines += predictions_md(run) + curves_md(run, figures)
    if run.battery is None:
        return "\n".join(lines + ["## Regression battery", "", "Not run (battery.enabled = false, or run "
                                  f"`scalelab dpo battery {run.path}`).", ""])
    return "\n".join(lines + battery_md(run.battery) + lengths_md(run.battery) + evidence_md(run))


def write_run_report(run_dir: str | Path) -> Path:
    from scalelab.dpo.margins import plot_margins
    run = load_run(run_dir)
    rd = RunDir(run.path)
    figures = []
    if plot_training(run, rd.path / "figures" / "training.png"):
        figures.append("figures/training.png")
    if plot_margins(run.margins, rd.path / "figures" / "margins.png"):
        figures.append("figures/margins.png")
    return rd.write_report(render_run(run, figures))


def write_report(path: str | Path) -> Path:
    """REPORT.md for a run folder, or for a sweep folder (its table, the chosen beta, and each run's report)."""
    path = Path(path)
    if is_run_dir(path):
        return write_run_report(path)
    from scalelab.dpo.sweep_report import write_sweep_report
    return write_sweep_report(path)

"""A dpo run's REPORT.md, regenerated from its folder alone.

    load_run(run_dir) -> RunFiles               read (dpo.runfiles): config.toml, metrics.jsonl, predictions.json,
                                                battery.json
    plot_training(run, path)                    figures/training.png: loss and reward accuracy per step
    render_run(run) -> str                      predicted vs measured, curves, battery, lengths, evidence bar
    write_run_report(run_dir) -> Path           all of the above (and figures/margins.png redrawn)
    report(path) -> Path                        a run folder's REPORT.md, or a sweep's: each run's, then its table

A sweep's table and choice of beta live in dpo.sweep_report.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from scalelab.core import figures as figs
from scalelab.core.rundir import RunDir
from scalelab.dpo import battery_stats as stats
from scalelab.dpo.evidence import render_evidence_table, verdict_text
from scalelab.dpo.runfiles import RunFiles, fmt, is_run_dir, load_run, pct, pts, table
from scalelab.dpo.sweep_report import find_runs, write_sweep_report

__all__ = ["RunFiles", "battery_md", "fmt", "is_run_dir", "lengths_md", "load_run", "pct", "plot_training",
           "prediction_rows", "pts", "render_run", "report", "table", "write_report", "write_run_report"]

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
    fig, (ax_l, ax_a) = figs.axes(1, 2, width_in=10, height_in=3.6, dpi=110)
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
    return figs.save(fig, out)


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

def verifier_md(v: dict) -> list[str]:
    """The verifier set's groups: how many questions gave a pair and how many were dropped, and why."""
    need = ("n_prompts", "samples_per_prompt", "sample_accuracy", "prompts_informative", "prompts_all_correct",
            "prompts_all_wrong")
    if any(k not in v for k in need):  # a summary from before these counts were recorded
        return []
    lines = [f"Verifier set: {v['n_prompts']} questions x {v['samples_per_prompt']} samples, sampled accuracy "
             f"{100 * v['sample_accuracy']:.1f}%; {v['prompts_informative']} gave pairs, "
             f"{v['prompts_all_correct']} dropped as all right, {v['prompts_all_wrong']} as all wrong."]
    d = v.get("length_diff")
    if d:
        lines.append(f"Chosen - rejected length over {d['n']} pairs: mean {d['mean']:+.1f} tokens, median "
                     f"{d['median']:+.1f}, p10 {d['p10']:+.1f}, p90 {d['p90']:+.1f}; chosen longer in "
                     f"{100 * d['share_chosen_longer']:.0f}% (DPO's implicit reward sums over tokens, so a "
                     "systematic difference teaches length).")
    return lines


def data_md(d: dict | None) -> list[str]:
    if not d:
        return []
    lines = ["## Preference data", "",
             f"{d.get('rows_read')} rows read from `{d.get('path')}`, {d.get('skipped', 0)} skipped; "
             f"{d.get('n_train')} train / {d.get('n_val')} held-out pairs (split: {d.get('val_split', 'seeded')})."]
    for reason, n in (d.get("skipped_by_reason") or {}).items():
        lines.append(f"- skipped: {reason}: {n}")
    if d.get("verifier"):
        lines += [""] + verifier_md(d["verifier"])
    return lines + [""]


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
    lines += data_md(run.data) + predictions_md(run) + curves_md(run, figures)
    if run.battery is None:
        return "\n".join(lines + ["## Regression battery", "", "Not run (battery.enabled = false, or run "
                                  f"`scalelab dpo battery {run.path}`).", ""])
    return "\n".join(lines + battery_md(run.battery) + lengths_md(run.battery) + evidence_md(run))


def write_run_report(run_dir: str | Path) -> Path:
    from scalelab.dpo.margins import plot_margins   # margins imports torch and transformers; only its plot is used
    run = load_run(run_dir)
    rd = RunDir(run.path)
    figures = []
    if plot_training(run, rd.path / "figures" / "training.png"):
        figures.append("figures/training.png")
    if plot_margins(run.margins, rd.path / "figures" / "margins.png"):
        figures.append("figures/margins.png")
    return rd.write_report(render_run(run, figures))


def report(path: str | Path) -> Path:
    """REPORT.md for a run folder, or for a sweep folder (each run's report, then the sweep's table and choice)."""
    path = Path(path)
    if is_run_dir(path):
        return write_run_report(path)
    for run in find_runs(path):
        write_run_report(run)
    return write_sweep_report(path)


write_report = report   # the name the CLI and callers have used

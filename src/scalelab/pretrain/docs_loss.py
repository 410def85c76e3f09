"""The loss-side section of docs/pretrain.md: the
scaling-law ladder (bench/gpu_scaling_ladder.sh, scored by pretrain/ladder_check.py), with their figures.
Every number is read from the results files; docs.py places these sections."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from scalelab.pretrain.scaling_law import ScalingLaw

FigureLine = Callable[[str, str], list[str]]   # (figure name, caption) -> Markdown lines


def _size(n: float) -> str:
    return f"{n / 1e6:.0f}M" if n < 1e9 else f"{n / 1e9:.1f}B"


def _misses(form: dict) -> str:
    held = {h["split"]: h["max_abs_error"] for h in form["held_out"]}
    return f"up to {100 * held['largest D']:+.1f}% and {100 * held['largest N']:+.1f}%"


def _check_sentence(checks: list[dict], top: dict) -> str:
    """The out-of-fit runs against the law's predictions and the largest ladder run at the same budget."""
    if not checks:
        return ("One unrun job checks 350M (`SIZES_ENV=\"24 16 1024\" STEPS_ENV=2048 bash "
                "bench/gpu_scaling_ladder.sh`). ")
    return " ".join(
        f"The check, a {c['size']} run outside the fit at that budget, measured **{c['measured']:.3f}**: "
        f"{'inside' if c['inside_interval'] else 'outside'} the interval, the centre {100 * c['rel_error']:+.1f}% "
        f"high (Kaplan's form {100 * c['joint_rel_error']:+.1f}%), yet "
        f"{'above' if c['measured'] > top['measured'] else 'below'} the {_size(top['n_params'])} run's "
        f"{top['measured']:.3f}. Its final train loss is {c['final_train_loss']:.2f}: past one epoch of this "
        "corpus the larger model memorizes, which a law in N and D alone cannot see. " for c in checks)


def ladder_section(ladder: dict | None, check: dict | None, figure: FigureLine) -> list[str]:
    if not ladder or not check:
        return []
    pts, law = ladder["points"], check["law"]
    sizes, budgets = sorted({p["n_params"] for p in pts}), sorted({p["tokens"] for p in pts})
    loss = {(p["n_params"], p["tokens"]): p["final_val_loss"] for p in pts}
    rows = ["| model | " + " | ".join(f"{d / 1e6:.1f}M tokens" for d in budgets) + " |",
            "|---|" + "---:|" * len(budgets)]
    for n in sizes:
        rows.append(f"| {_size(n)} | " + " | ".join(f"{loss[(n, d)]:.3f}" if (n, d) in loss else "—"
                                                 for d in budgets) + " |")
    held = {h["split"]: h for h in check["held_out"]}
    at_top = sorted((r for r in check["residuals"] if r["tokens"] == max(budgets)), key=lambda r: r["n_params"])
    preds = check["predictions"]
    return ["## The scaling-law ladder", "",
            f"{len(sizes)} GPT-2-family sizes x {len(budgets)} token budgets on the same ShareGPT shards, each run "
            "with its own cosine schedule (batch 16,384 tokens, lr 6e-4 x 768/width, warmup 10%, decay to 10%), "
            "final val loss on the same first 1,048,576 val tokens:", "", *rows, "",
            f"Fit of L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022, eq. 2): E = {law['E']:.3f}, "
            f"A = {law['A']:.3g}, α = {law['alpha']:.3f}, B = {law['B']:.3g}, β = {law['beta']:.3f}. "
            f"E is not identified: no run has more than {check['tokens_per_param_max']:.1f} tokens per parameter "
            "(compute-optimal is ~20), so the loss still falls steeply with D and the fit puts it all in the data "
            f"term. Out of sample, a refit without the largest budget misses those runs by up to "
            f"{100 * held['largest D']['max_abs_error']:+.1f}%, one without the largest model by up to "
            f"{100 * held['largest N']['max_abs_error']:+.1f}%. At the largest budget the full fit is off by "
            + ", ".join(f"{100 * r['rel_error']:+.1f}% ({_size(r['n_params'])})" for r in at_top)
            + ": the gain from size grows with D here. The additive form has no term for that; Kaplan et al. "
            "(2020)'s joint form [(N_c/N)^(α_N/α_D) + D_c/D]^α_D has, yet fitted and scored the same way it does "
            f"no better ({_misses(check['joint'])}): at these budgets neither form captures how sharply size starts "
            "to pay.", "",
            ("Predicted on this data at that budget, the held-out error as interval: "
             + "; ".join(f"{p['size']} {p['loss']:.2f} ({p['interval'][0]:.2f}–{p['interval'][1]:.2f})"
                         for p in preds)
             + f". Both centres lie above the {_size(at_top[-1]['n_params'])} run's "
             f"{at_top[-1]['measured']:.2f}, which a bigger model should beat: trust the interval, not the centre. "
             + _check_sentence(check.get("checks", []), at_top[-1])).rstrip(),
            "",
            *figure("ladder", "final val loss against tokens per model size, with the fitted law"), ""]


def make_figures(ladder: dict | None, check: dict | None, fig_dir: Path, new_figure,
                 save) -> list[tuple[str, str]]:
    """The ladder: loss vs tokens per size with the fit. Returns (name, file)."""
    made = []
    if ladder and check:
        law = ScalingLaw(**check["law"])
        fig, ax = new_figure()
        for n in sorted({p["n_params"] for p in ladder["points"]}):
            pts = sorted((p["tokens"], p["final_val_loss"]) for p in ladder["points"] if p["n_params"] == n)
            line = ax.plot([d for d, _ in pts], [v for _, v in pts], "o", label=_size(n))[0]
            ax.plot([d for d, _ in pts], [law.loss(n, d) for d, _ in pts], "-", color=line.get_color(), alpha=0.6)
        ax.set_xscale("log")
        save(fig, ax, "training tokens D", "final val loss (points) and fit (lines)", fig_dir / "pretrain_ladder.png")
        made.append(("ladder", "pretrain_ladder.png"))
    return made

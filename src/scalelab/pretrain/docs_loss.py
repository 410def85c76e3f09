"""The loss-side sections of docs/pretrain.md: time to a target loss (bench/gpu_pretrain_ttt.sh) and the
scaling-law ladder (bench/gpu_scaling_ladder.sh, scored by pretrain/ladder_check.py), with their figures.
Every number is read from the results files; docs.py places these sections."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from scalelab.pretrain.scaling_law import ScalingLaw

FigureLine = Callable[[str, str], list[str]]   # (figure name, caption) -> Markdown lines


def _size(n: float) -> str:
    return f"{n / 1e6:.0f}M" if n < 1e9 else f"{n / 1e9:.1f}B"


def _sets(run_cmd: str) -> str:
    """The --set overrides after the ones both runs share, as they appear in the command."""
    parts = run_cmd.replace("\\", "").split("--set ")[1:]   # the command is shell-quoted (printf %q)
    return " ".join(p.strip() for p in parts if p.split("=")[0] in
                    ("train.optimizer", "train.attention", "train.loss_chunks", "train.fp8", "optim.lr",
                     "optim.muon_lr"))


def time_to_target(ttt: dict | None, ladder: dict | None, figure: FigureLine) -> list[str]:
    if ttt is None or ttt["verdict"].get("status") != "done":
        return []
    base, rec, v = ttt["runs"]["baseline"], ttt["runs"]["recipe"], ttt["verdict"]
    budget = int(ttt["settings"]["tokens"])
    rows = ["| run | steps | tokens | training s | tokens/s | last val loss |", "|---|---:|---:|---:|---:|---:|"]
    for name, c in (("baseline", base), ("recipe", rec)):
        rows.append(f"| {name} | {c['steps']} | {c['tokens'] / 1e6:.1f}M | {c['train_s']:.1f} | "
                    f"{c['tokens_per_s'] / 1e3:,.0f}k | {c['final_val_loss']:.3f} |")
    hit = v["recipe_to_target"]
    speed = rec["tokens_per_s"] / base["tokens_per_s"]
    return ["## Time to a target loss", "",
            "Proxy corpus: the ShareGPT shards (a fixed 5% held-out split). The target, fixed "
            f"before any recipe was chosen, is the plain baseline's val loss after {budget / 1e6:.1f}M tokens "
            f"({budget // int(ttt['settings']['tokens_per_step'])} steps of "
            f"{int(ttt['settings']['tokens_per_step']):,} tokens; llm.c's AdamW recipe, lr 6e-4, warmup 10%, "
            f"cosine to 0): **{v['target_val_loss']:.3f}**. The recipe (`{_sets(ttt['commands']['recipe'])}`; "
            "Muon, Jordan et al. 2024, on the hidden matrices) has its own schedule of "
            f"{int(ttt['settings']['recipe_tokens']) / 1e6:.1f}M tokens (0.6 of the budget) and stops at its first "
            f"evaluation at or below the target. Both evaluate every {ttt['settings']['val_every']} steps on the "
            "same val tokens; the clock counts training steps only.", "", *rows, "",
            f"**The recipe reached {v['target_val_loss']:.3f} after {hit['train_s']:.1f} s of training against the "
            f"baseline's {v['baseline_train_s']:.1f} s: ratio {v['ratio']:.3f}** (interpolated inside the last "
            f"evaluation interval: {v['ratio_interpolated']:.3f}); goal ≤ {v['goal_ratio']}: "
            f"{'met' if v['goal_met'] else 'not met'}. It needed {v['token_ratio']:.2f} of the tokens at "
            f"{speed:.2f}x the tokens/s, so nearly all of the gain is per token, not per second.", "",
            *_ttt_reading(base, ladder), "",
            *figure("ttt", "val loss against training seconds, baseline and recipe, with the target"), ""]


def _ttt_reading(base: dict, ladder: dict | None) -> list[str]:
    """Why the margin is large: the baseline's budget is step-limited, which the ladder shows."""
    if not ladder:
        return []
    top = max(ladder["points"], key=lambda p: (p["n_params"], p["tokens"]))
    return [f"Read it with care: {base['steps']} steps are few. The ladder's {_size(top['n_params'])} model reaches "
            f"{top['final_val_loss']:.2f} on {top['tokens'] / 1e6:.1f}M tokens in {top['steps']} small steps, the "
            f"baseline {base['final_val_loss']:.2f} on {base['tokens'] / 1e6:.0f}M: at this budget the baseline is "
            "limited by steps (its batch is far above Kaplan et al. 2020's critical batch at these losses), where "
            "an optimizer that does more per step wins most. At the 10B-token bar the ratio will be smaller: "
            "Jordan (2024) reports Muon 1.35x faster to 3.28 with GPT-2 124M."]


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


def make_figures(ttt: dict | None, ladder: dict | None, check: dict | None, fig_dir: Path, new_figure,
                 save) -> list[tuple[str, str]]:
    """ttt: val loss vs training seconds; ladder: loss vs tokens per size with the fit. Returns (name, file)."""
    made = []
    if ttt is not None and ttt["verdict"].get("status") == "done":
        fig, ax = new_figure()
        for name in ("baseline", "recipe"):
            xs, ys = zip(*ttt["runs"][name]["val_loss_by_train_s"])
            ax.plot(xs, ys, "o-", markersize=3, label=name)
        ax.axhline(ttt["verdict"]["target_val_loss"], color="gray", linestyle="--", label="target")
        ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
        save(fig, ax, "training seconds (one H200)", "val loss (nats/token)", fig_dir / "pretrain_ttt.png")
        made.append(("ttt", "pretrain_ttt.png"))
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

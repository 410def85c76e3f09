"""The time-to-target section of docs/pretrain.md, by the speedrun's rules (bench/gpu_pretrain_ttt_real.sh): the
baseline's lr grid, every seed's one-pass loss and held-out loss, and, once both sides have all their seeds, the
target, each side's time and tokens to it and Welch's one-sided test (pretrain/ttt_stats.py). Also the lm-eval
scores of the trained models the manifest names. Every number is read from the folder's stats.json, its run
folders and the eval.json files; docs.py places the section."""
from __future__ import annotations

import tomllib
from statistics import fmean
from dataclasses import dataclass
from pathlib import Path

from scalelab.core.jsonio import iter_jsonl, read_json

LAYOUTS = ("grid", "baseline", "recipe")
LABELS = {"muon": "Muon", "adamw": "AdamW", "cudnn": "cuDNN", "sdpa": "SDPA"}   # config values as the page names them
TASKS = (("hellaswag", "HellaSwag", 0.25), ("arc_easy", "ARC-Easy", 0.25), ("piqa", "PIQA", 0.5))  # name, label, chance


@dataclass(frozen=True)
class TttRun:
    layout: str                  # "grid/lr-6e-4", "baseline/seed-1", "recipe/seed-1"
    val_loss: float              # at the run's end (one pass; a recipe run stops at the target)
    heldout_loss: float | None   # WikiText-2, scored from the run's checkpoint
    tokens: int
    tokens_per_s: float
    gpu: str
    val_curve: tuple[tuple[int, float], ...]   # (tokens, val loss) at every evaluation


@dataclass(frozen=True)
class TttInputs:
    name: str                    # the folder as the manifest names it
    stats: dict                  # stats.json of bench/gpu_pretrain_ttt_real.py
    runs: tuple[TttRun, ...]
    tokens_per_step: int
    val_every: int
    folder: Path                 # where the run folders are


def _run(folder: Path, layout: str, stats: dict) -> TttRun | None:
    d = folder / layout
    if not (d / "train_summary.json").is_file():
        return None
    s, prov = read_json(d / "train_summary.json"), read_json(d / "provenance.json")
    curve = tuple((e["tokens"], e["val_loss"]) for e in iter_jsonl(d / "metrics.jsonl") if e.get("event") == "val")
    return TttRun(layout, s["final_val_loss"], stats.get("losses", {}).get(layout, {}).get("wikitext2_loss"),
                  s["tokens"], s["tokens_per_s"], ", ".join(prov["hardware"]["gpus"]), curve)


def load_ttt(folder: Path, name: str) -> TttInputs | None:
    """The folder's stats.json and finished runs; None before its first call wrote stats.json."""
    if not (folder / "stats.json").is_file():
        return None
    stats = read_json(folder / "stats.json")
    layouts = sorted(f"{p.parent.name}/{p.name}" for kind in LAYOUTS for p in (folder / kind).glob("*") if p.is_dir())
    runs = tuple(r for r in (_run(folder, lay, stats) for lay in layouts) if r is not None)
    if not runs:
        return TttInputs(name, stats, (), 0, 0, folder)
    cfg = tomllib.loads((folder / runs[0].layout / "config.toml").read_text())
    return TttInputs(name, stats, runs, cfg["train"]["total_batch_tokens"], cfg["train"]["val_every"],
                     folder)


def _side(t: TttInputs, kind: str) -> list[TttRun]:
    return [r for r in t.runs if r.layout.startswith(kind + "/")]


def _loss(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _grid(t: TttInputs) -> list[str]:
    g = t.stats["grid"]
    rows = ["| AdamW lr | val loss after one pass | WikiText-2 loss |", "|---:|---:|---:|"]
    runs = {float(r.layout.removeprefix("grid/lr-")): r for r in _side(t, "grid")}   # as the folders name them
    names = {lr: r.layout.removeprefix("grid/lr-") for lr, r in runs.items()}
    for lr, loss in zip(g["lrs"], g["losses"]):
        mark = "**" if lr == g["best_lr"] else ""
        held = runs[lr].heldout_loss if lr in runs else None
        rows.append(f"| {mark}{names.get(lr, f'{lr:g}')}{mark} | {mark}{loss:.3f}{mark} | {_loss(held)} |")
    best = names.get(g["best_lr"], f"{g['best_lr']:g}") if g["best_lr"] is not None else None
    verdict = (f"tuned: the best, {best}, lies strictly inside the grid" if g["status"] == "tuned" else
               f"not tuned yet ({g['status']})")
    return [*rows, "", f"Grid verdict: {verdict}." + _grid_noise(t, runs)]


def _grid_noise(t: TttInputs, grid: dict[float, TttRun]) -> str:
    """The grid's margin beside the seed-to-seed spread at the chosen lr (its seed 0 and the baseline's seeds)."""
    g = t.stats["grid"]
    if g["status"] != "tuned" or g["best_lr"] not in grid or not _side(t, "baseline"):
        return ""
    at_best = [grid[g["best_lr"]].val_loss, *(r.val_loss for r in _side(t, "baseline"))]
    margin = sorted(g["losses"])[1] - min(g["losses"])
    spread = max(at_best) - min(at_best)
    return (f" Its margin over the next lr ({margin:.3f}) is {'smaller' if margin < spread else 'larger'} than the "
            f"spread of {len(at_best)} seeds at the chosen lr ({spread:.3f}; each seed also orders the data "
            "differently)" + (", so the grid locates the optimum only to within its neighbours." if margin < spread
                              else "."))


def _seeds(t: TttInputs) -> list[str]:
    rows = ["| run | val loss | WikiText-2 loss | tokens | tokens/s | GPU |", "|---|---:|---:|---:|---:|---|"]
    for r in [*_side(t, "baseline"), *_side(t, "recipe")]:
        rows.append(f"| {r.layout} | {r.val_loss:.3f} | {_loss(r.heldout_loss)} | {r.tokens / 1e6:.1f}M | "
                    f"{r.tokens_per_s / 1e3:,.0f}k | {r.gpu} |")
    return rows if len(rows) > 2 else []


def _verdict(s: dict) -> list[str]:
    b, r, w, wt = s["baseline"], s["recipe"], s["welch_train_s"], s["welch_tokens"]
    rows = ["| side | seeds | reached the target | time to target, s (mean ± std) | tokens to target (mean ± std) |",
            "|---|---:|---:|---:|---:|"]
    for name, x in (("AdamW baseline", b), ("recipe", r)):
        rows.append(f"| {name} | {x['n']} | {x['reached']} | {x['train_s_mean']:.1f} ± {x['train_s_std']:.1f} | "
                    f"{x['tokens_mean'] / 1e6:.2f}M ± {x['tokens_std'] / 1e6:.2f}M |")
    call = "faster" if s["faster"] else "not shown faster"
    return [f"Target (mean of the baseline seeds' one-pass val loss): **{s['target_val_loss']:.3f}**.", "", *rows, "",
            f"**Recipe / baseline time to target: {s['ratio_train_s']:.3f}** (tokens: {s['ratio_tokens']:.3f}). "
            f"Welch's one-sided t-test on seconds: t = {w['t']:.2f}, df = {w['df']:.1f}, p = {w['p_less']:.2g} "
            f"(on tokens: p = {wt['p_less']:.2g}); at p < {s['alpha']} with {s['min_seeds']}+ seeds a side and every "
            f"recipe run at the target: **{call}**; goal ≤ {s['goal_ratio']}x: "
            f"{'met' if s['goal_met'] else 'not met'}. Baseline seeds that end above the target are counted at "
            "their end (censored), which understates the baseline's time and works against the recipe."]


def _recipe(folder: Path, layout: str) -> str:
    """What the recipe changes, from its first run's config.toml."""
    cfg = tomllib.loads((folder / layout / "config.toml").read_text())
    tr = cfg["train"]
    opt, attn = (tr.get(k, d) for k, d in (("optimizer", "adamw"), ("attention", "sdpa")))
    return (f"{LABELS.get(opt, opt)} at lr {cfg['optim']['lr']:g} with {LABELS.get(attn, attn)} "
            f"attention and the loss in {tr.get('loss_chunks', 1)} chunks")


def _reading(t: TttInputs) -> list[str]:
    """Where the gain comes from (tokens/s against tokens), the clock's granularity, and the held-out check."""
    base, rec = _side(t, "baseline"), _side(t, "recipe")
    if not base or not rec:
        return []
    speed = fmean([r.tokens_per_s for r in rec]) / fmean([r.tokens_per_s for r in base])
    grain = t.val_every * t.tokens_per_step
    stops = sorted({r.tokens // t.tokens_per_step for r in rec})
    held_b = [r.heldout_loss for r in base if r.heldout_loss is not None]
    held_r = [r.heldout_loss for r in rec if r.heldout_loss is not None]
    held = (f" Held out (WikiText-2), the recipe at the target scores {fmean(held_r):.3f} on average, the baseline "
            f"after its pass {fmean(held_b):.3f}: not a fit to the val split." if held_b and held_r else "")
    where = ("the gain is the optimizer's, in tokens" if speed < 1.2 else  # within 20%: kernels are a small part
             f"a factor {speed:.2f} of the gain is kernel speed, the rest tokens")
    return [f"The recipe ({_recipe(t.folder, rec[0].layout)}) runs at {speed:.2f}x the baseline's tokens/s: "
            f"{where}. Time is read at the first evaluation at or below the target, every "
            f"{t.val_every} steps ({grain / 1e6:.2f}M tokens; the recipe stopped at step "
            f"{', '.join(map(str, stops))}), which overstates the recipe's time relatively more: against it." + held]


def ttt_section(t: TttInputs | None, figure_line) -> list[str]:
    if t is None:
        return []
    steps = max((r.tokens for r in _side(t, "grid")), default=0) // max(t.tokens_per_step, 1)
    head = ["## Time to target by the speedrun's rules", "",
            f"Corpus: ShareGPT with the Gutenberg, NLTK and tiny-shakespeare texts in one manifest "
            "(configs/pretrain/prepare-sharegpt-corpora.toml), its fixed val split; WikiText-2 stays out as a "
            f"held-out check. One pass = {steps} steps of {t.tokens_per_step:,} tokens, so neither side sees a token "
            f"twice. Every run evaluates on the whole val split every {t.val_every} steps; the clock counts training "
            f"steps only (compile and evaluation excluded). Run folders: `{t.name}`.", "",
            "The AdamW baseline (GPT-2 124M, warmup 10%, cosine to 0) is tuned first, at seed 0 and one pass:", "",
            *_grid(t), ""]
    seeds = _seeds(t)
    body = ([*seeds, ""] if seeds else [])
    if t.stats.get("status") == "done":
        body += [*_verdict(t.stats), "", *_reading(t), ""]
    else:
        body += [f"Not complete ({t.stats.get('status')}): the target is fixed by all the baseline's seeds, then "
                 "the recipe's seeds run against it.", ""]
    return head + body + [*figure_line("ttt", "val loss against tokens, every time-to-target run"), ""]


def lm_eval_section(evals: tuple[tuple[Path, str], ...]) -> list[str]:
    """A table of the trained models' zero-shot scores: (eval.json, model label) each, in the manifest's order."""
    if not evals:
        return []
    head = "| model | " + " | ".join(f"{label} acc / acc_norm (n)" for _, label, _ in TASKS) + " |"
    rows = [head, "|---|" + "---:|" * len(TASKS)]
    for path, label in evals:
        by = {x["name"]: x for x in read_json(path)["tasks"]}
        cells = []
        for task, _, _ in TASKS:
            if task not in by:
                cells.append("not scored")
                continue
            m = {x["name"]: x for x in by[task]["metrics"]}
            cells.append(f"{100 * m['acc']['value']:.1f} ± {100 * m['acc']['stderr']:.1f} / "
                         f"{100 * m['acc_norm']['value']:.1f} ({by[task]['n_examples']:,})")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    chance = ", ".join(f"{label} {100 * c:.0f}%" for _, label, c in TASKS)
    return ["### lm-eval on the trained models", "",
            f"Zero-shot, full sets, lm-eval 0.4.13 on the local copies (`scalelab pretrain eval`); in % ± stderr. "
            f"Chance: {chance}.", "", *rows, "",
            "Nothing here is far from chance, and nothing should be: tens of millions of tokens are well under 1% of "
            "GPT-2's training (GPT-2 124M itself scores about 30% acc_norm on HellaSwag). " + _above_chance(evals)
            + " The harness is checked separately, item by item, against an independent log-likelihood computation "
            "on a model that does score (tests/evals/test_harness_real.py, the real Qwen2.5-Coder-0.5B).", ""]


def _above_chance(evals: tuple[tuple[Path, str], ...]) -> str:
    """The largest acc above chance of any model on any task, in standard errors."""
    chance = {name: c for name, _, c in TASKS}
    zs = []
    for path, label in evals:
        for x in read_json(path)["tasks"]:
            acc = next(m for m in x["metrics"] if m["name"] == "acc")
            if x["name"] in chance and acc["stderr"] > 0:
                zs.append(((acc["value"] - chance[x["name"]]) / acc["stderr"], x["name"], label))
    if not zs:
        return ""
    z, name, label = max(zs)
    return f"No score is more than {z:.1f} standard errors above chance ({name}, {label})."


def _shade(i: int, n: int) -> tuple[float, ...]:
    from matplotlib import colormaps   # lazy: only the figure needs matplotlib
    return colormaps["viridis"](0.85 * i / max(n - 1, 1))


def make_figure(t: TttInputs | None, fig_dir: Path, new_figure, save) -> list[tuple[str, str]]:
    if t is None or not t.runs:
        return []
    fig, ax = new_figure()
    grid = sorted(_side(t, "grid"), key=lambda r: float(r.layout.removeprefix("grid/lr-")))
    for i, r in enumerate(grid):   # the grid from low lr (dark) to high (light); the seeds one colour a side
        xs, ys = zip(*r.val_curve)
        ax.plot([x / 1e6 for x in xs], ys, ":", color=_shade(i, len(grid)), label=f"grid, AdamW {r.layout[5:]}")
    for kind, colour, style in (("baseline", "tab:blue", "-"), ("recipe", "tab:orange", "--")):
        for i, r in enumerate(_side(t, kind)):
            xs, ys = zip(*r.val_curve)
            ax.plot([x / 1e6 for x in xs], ys, style, color=colour, alpha=0.8,
                    label=f"{kind} seeds" if i == 0 else None)
    if t.stats.get("status") == "done":
        ax.axhline(t.stats["target_val_loss"], color="gray", linestyle="--", label="target")
    ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
    save(fig, ax, "tokens (millions)", "val loss (nats/token)", fig_dir / "pretrain_ttt.png")
    return [("ttt", "pretrain_ttt.png")]

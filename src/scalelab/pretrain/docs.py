"""docs/pretrain.md, generated from the result folders a docs manifest (docs/pretrain.toml) names.

    load_inputs(manifest) -> DocInputs  read: the calibration, the scaling runs, the rounds, the loss runs, the recipe
    render(d) -> str                    compute + render: one function per section, numbers only from the inputs
    docs(manifest) -> Path              save: the Markdown and its figures under figures/ beside it
"""
from __future__ import annotations

import csv
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from scalelab.core import figures
from scalelab.core.hardware import get_hardware
from scalelab.core.jsonio import is_stored, read_json
from scalelab.core.numfmt import pct as _pct
from scalelab.core.numfmt import signed_pct as _signed
from scalelab.core.numfmt import thousands as _k
from scalelab.core.sections import Manifest, ManifestError, read_manifest, write_doc
from scalelab.pretrain import calibrate as cal
from scalelab.pretrain import docs_loss, docs_speed, docs_ttt
from scalelab.pretrain.docs_blind import blind_section, blind_summary
from scalelab.pretrain.config import PretrainConfig, load_pretrain_config
from scalelab.pretrain.predict import workload
from scalelab.pretrain.rounds import Rounds, load_round
from scalelab.pretrain.train_gpt import lr_at

FIGURES = "figures"                 # beside the Markdown file
LEDGER_CARDS = {"H100": "h100-sxm", "H200": "h200"}   # the GPU ledger's cards -> hardware-table keys (prices)


@dataclass(frozen=True)
class DocInputs:
    calibration: dict
    ddp: dict                       # 1 GPU against 2 with DDP and FSDP2 (whole-model compile)
    fsdp2: dict                     # FSDP2 with the bf16 MixedPrecisionPolicy
    rounds: Rounds                  # the recipe-variant rounds, in the manifest's order; the first holds the goal
    ladder: dict | None             # absent until bench/gpu_scaling_ladder.sh ran
    ttt: docs_ttt.TttInputs | None  # bench/gpu_pretrain_ttt_real.sh's folder, once its first call wrote stats
    forecast: dict | None           # bench/pretrain_kernel_forecast.py: the next kernels' step time, before running
    recipe: PretrainConfig
    recipe_path: str                # as the manifest names it (printed)
    demo_path: str                  # the CPU demo's run folder, as the manifest names it (printed)
    demo: dict | None               # the CPU demo's results.json, when the run folder exists
    demo_cpu: str = "CPU"           # the demo machine's CPU model (its provenance.json)
    blind: tuple[tuple[Path, str], ...] = ()    # blind-size prediction folders: (path, name printed)
    lm_evals: tuple[tuple[Path, str], ...] = ()  # trained models' eval.json files: (path, model label)
    ledger: tuple[dict, ...] = ()   # the GPU leases behind these results: the rows of the manifest's [cost] ledger
    ledger_path: str = ""           # that file, as the manifest names it (printed)
    figures: tuple[tuple[str, str], ...] = ()   # (name, relative path) written beside the Markdown

    @property
    def variants(self) -> dict:
        """The first round: the goal, its variant table and the first quality check."""
        return self.rounds.get("goal")


def _results(m: Manifest, *keys: str, required: bool = True) -> dict | None:
    """The results.json of the folder the manifest names under keys; a missing optional one is None."""
    rel = m.require(*keys) if required else m.get(*keys)
    path = None if rel is None else m.path_of(rel) / "results.json"
    if path is None or not is_stored(path):  # plain or packed (.xz)
        if required:
            raise ManifestError(f"{m.path}: {'.'.join(keys)} = {rel}: no results.json there")
        return None
    return read_json(path)


def _rounds(m: Manifest) -> Rounds:
    entries = m.require("speed", "rounds")
    return Rounds(tuple(load_round(m.root, m.path_of(e["path"]), str(e["name"]), e["kind"]) for e in entries))


def load_inputs(manifest: Manifest | str | Path) -> DocInputs:
    m = manifest if isinstance(manifest, Manifest) else read_manifest(manifest, job="pretrain")
    demo = m.get("demo", default="runs/pretrain/tiny-cpu")
    demo_results = m.path_of(demo) / "results.json"
    return DocInputs(calibration=_results(m, "calibration", "path"), ddp=_results(m, "scaling", "ddp"),
                     fsdp2=_results(m, "scaling", "fsdp2"), rounds=_rounds(m),
                     ladder=_results(m, "loss", "ladder", required=False),
                     ttt=_ttt(m),
                     forecast=_results(m, "speed", "forecast", required=False),
                     recipe=load_pretrain_config(m.path_of(m.require("recipe"))), recipe_path=m.require("recipe"),
                     demo_path=demo, demo=read_json(demo_results) if demo_results.is_file() else None,
                     demo_cpu=_demo_cpu(m.path_of(demo)),
                     blind=tuple((m.path_of(b), b) for b in m.get("blind", "folders", default=[])),
                     lm_evals=tuple((m.path_of(e["path"]), e["label"]) for e in m.get("lm_eval", default=[])),
                     ledger=_ledger(m), ledger_path=m.get("cost", "ledger", default=""))


def _demo_cpu(run: Path) -> str:
    prov = run / "provenance.json"
    model = read_json(prov).get("hardware", {}).get("cpu_model") if prov.is_file() else None
    return model or "CPU"


def _ledger(m: Manifest) -> tuple[dict, ...]:
    rel = m.get("cost", "ledger")
    if rel is None:
        return ()
    with open(m.path_of(rel), newline="") as f:
        return tuple(csv.DictReader(f))


def _ttt(m: Manifest) -> docs_ttt.TttInputs | None:
    rel = m.get("ttt", "folder")
    return None if rel is None else docs_ttt.load_ttt(m.path_of(rel), rel)


# ---------------------------------------------------------------------------------------------
# formatting


def _ref(d: DocInputs, key: str) -> float:
    return d.calibration["references"][key]["value"]


# ---------------------------------------------------------------------------------------------
# sections


def _intro(d: DocInputs) -> list[str]:
    c, s = d.calibration, d.calibration["summary"]
    t, m = s["tokens_per_s"], s["peak_memory_gib"]
    ttt = next(x for x in c["time_to_target"] if x["bar"] == "llmc_tokens")
    blind = blind_summary(d.blind)
    bullets = [
        f"- **Throughput and memory, predicted from two fitted constants each**: {t['within_10pct']} of "
        f"{t['held_out']} held-out throughputs and {m['within_10pct']} of {m['held_out']} held-out peak memories "
        f"within ±{_pct(cal.GOAL_REL, 0)} (worst {_pct(t['max_abs_error'])} and {_pct(m['max_abs_error'])}).",
        *([f"- **Blind predictions of sizes never run**, committed before their runs: {blind}."] if blind else []),
        "- **Time to a target loss by the speedrun's rules**: " + (_ttt_sentence(d) or "in progress (below)."),
        f"- **The full recipe on 8 x H100, predicted**: the {_ref(d, 'target_val_loss')} bar in **{ttt['hours']:.2f} "
        f"h** ({ttt['hours_interval'][0]:.2f}–{ttt['hours_interval'][1]:.2f}) for **${ttt['cost_usd']:.2f}**.",
        f"- **Recipe speed on one H200** (goal: {_goal(d)}): {_latest(d)['verdict'].split(' (')[0]} (Appendix B)."]
    return ["# Pretraining GPT-2: predicted first, then measured", "",
            "*Generated by `scalelab pretrain docs docs/pretrain.toml` from the result folders it names, "
            f"`{d.recipe_path}`, the hardware table and the CPU demo's run; every number is read from "
            "them.*", "",
            "Every expensive run here is preceded by a written prediction of what it will measure: tokens per "
            "second, peak memory, final loss, time to a loss. The bar is the speedrun's: GPT-2 124M at "
            f"{_ref(d, 'target_val_loss')} val loss on FineWeb's val tokens (modded-nanogpt; llm.c's AdamW "
            f"reproduction reaches it in {_ref(d, 'llmc_tokens') / 1e9:.0f}B tokens). That number belongs to "
            "FineWeb's 10,485,760 val tokens; the same model scores about 3.29 on FineWeb-Edu's, so the two are "
            "kept apart (configs/pretrain/prepare-fineweb-edu.toml trains on FineWeb-Edu and scores on FineWeb's "
            "val shard). What came out:", "", *bullets, ""]


def _latest(d: DocInputs) -> dict:
    return d.rounds.latest()


def _goal(d: DocInputs) -> str:
    return d.variants["goal"].split(" with ")[0].split(":")[0]


def _ttt_sentence(d: DocInputs) -> str:
    s = d.ttt.stats if d.ttt else {}
    if s.get("status") != "done":
        return ""
    return (f"{s['recipe']['n']} seeds a side against a tuned AdamW baseline: the recipe needs "
            f"**{s['ratio_train_s']:.2f}x** the baseline's training time (Welch p = "
            f"{s['welch_train_s']['p_less']:.2g}; goal ≤ {s['goal_ratio']}: "
            f"{'met' if s['goal_met'] else 'not met'}).")


def _forms(d: DocInputs) -> list[str]:
    t, m = d.calibration["throughput_fit"], d.calibration["memory_fit"]
    return ["## The predictor and its calibration", "",
            "Per device, one optimizer step of k micro-steps of b = B·T tokens takes",
            "", "    step_s = k·b·( F_exec / (peak·u) + q·V / HBM ) + t_step,    F_exec = 6N + f·12·L·d·T", "",
            f"with the model FLOPs of Kaplan et al. (2020) and PaLM's attention term (Chowdhery et al. 2022, app. B). "
            f"Two terms are counted, not fitted: f = {t['attention_executed_fraction']:g} (causal "
            f"FlashAttention skips the masked half of the T x T square) and q = {t['bytes_per_logit']:g} bytes of HBM "
            "traffic per logit for the cross-entropy. "
            f"Fitted: **u = {t['mfu_matmul']:.3f}** (the share of the {t['peak_flops_per_s'] / 1e12:.1f} TFLOP/s "
            f"peak the executed FLOPs reach) and **t_step = {1000 * t['step_overhead_s']:.2f} ms** per optimizer "
            "step (AdamW, grad-norm, host sync).", "",
            "Peak memory is `static + r + b·(c·A + G)`: fp32 weights, AdamW moments and the gradients alive at "
            "backward's start; A the activation bytes per token (Korthikanti et al. 2022, eq. 1, for SDPA and bf16 "
            f"autocast); G the head's output. Fitted: **c = {m['activation_scale']:.4f}** (the count needs no "
            f"correction) and **r = {m['runtime_bytes'] / cal.GIB:.2f} GiB** of workspaces. All four were fitted on "
            f"{len(d.calibration['fitted_on'])} one-GPU H200 runs; every other measured run scores them (Appendix "
            "A).", ""]


def _calibration_table(d: DocInputs) -> list[str]:
    c = d.calibration
    rows = ["| run | role | tokens/s predicted | measured | pred/meas | peak GiB predicted | measured | pred/meas |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in c["rows"]:
        t, m = r["tokens_per_s"], r["peak_memory_gib"]
        mem = ("— | —" if m["measured"] is None else f"{m['measured']:.2f} | {m['ratio']:.3f}")
        rows.append(f"| {r['label']} | {r['role']} | {_k(t['predicted'])} | {_k(t['measured'])} | "
                    f"{t['ratio']:.3f} | {m['predicted']:.2f} | {mem} |")
    split = ", ".join(c["fitted_on"])
    return [f"Fitted on **{split}**; every other row is held out. Intervals on every prediction are "
            f"[p/(1+e), p/(1−e)] with e the largest held-out error: ±{_pct(c['intervals']['tokens_per_s_rel'])} "
            f"for tokens/s, ±{_pct(c['intervals']['memory_rel'])} for memory.", "", *rows, "",
            *_calibration_notes(d), ""]


def _calibration_notes(d: DocInputs) -> list[str]:
    c = d.calibration
    abl = {a["form"]: a for a in c["ablation"]}
    bare = abl["neither: u and t_step only"]
    fsdp = next(r for r in c["rows"] if r["key"] == "fsdp2-2gpu")["peak_memory_gib"]["ratio"]
    return [f"The bare two-constant form (no loss term, full attention square) missed the 350M row by "
            f"{_signed(bare['error_350m'])}; the two counted terms were added after seeing that, so that row checks "
            f"the form's physics rather than being a blind test (now {_signed(abl['as used']['error_350m'])}). "
            "2-GPU rows are predicted as 1-GPU work, so their errors are the second GPU's measured cost. FSDP2 "
            f"memory is {_signed(fsdp - 1)} high: its bf16 residual stream is not modelled. Not scored: "
            + "; ".join(dict.fromkeys(e["reason"].split(":")[0] for e in c["excluded"])) + ". " + _variants_scored(d),
            "", f"H100: {c['transfer']['h100-sxm']} ({get_hardware('h200').hbm_tb_s:g} TB/s on H200, "
            f"{get_hardware('h100-sxm').hbm_tb_s:g} on H100)."]


def _scored_rounds(d: DocInputs) -> str:
    """The rounds after the first, whose runs the calibration scores against predict's intervals."""
    return d.rounds.names(*(r.kind for r in d.rounds.rounds[1:]))


def _variants_scored(d: DocInputs) -> str:
    c = d.calibration
    s = c.get("variants_scored", {}).get("summary")
    if not s:
        return ""
    fits = " ".join(f"The {f['family']} recipe family (per-row FP8) has its own u = {f['mfu_matmul']:.3f} "
                    f"({len(f['fitted_on'])} runs of rounds {d.rounds.names('fp8-row', 'row-kernels')}): "
                    f"{_held_out_within(c, f['family'])} later runs "
                    f"within ±10% (worst {_pct(f['tokens_per_s_rel'])})." for f in c.get("recipe_fits", []))
    return (f"{fits} Against `predict`'s intervals (calibrated for bf16 and that family, else priors), "
            f"{s['runs']} recipe-variant runs of rounds {_scored_rounds(d)}: {s['peak_memory_gib_inside']} inside in "
            "memory, "
            f"{s['tokens_per_s_inside']} in tokens/s.")


def _held_out_within(c: dict, family: str) -> str:
    held = [r for r in c["recipe_rows"][family] if r["role"] == "held-out"]
    return f"{sum(r['tokens_per_s']['within_10pct'] for r in held)} of {len(held)}"


def _extrapolation(d: DocInputs) -> float:
    """Parameters of the largest prediction over those of the largest measured (calibration) setup."""
    preds = d.calibration["predictions"]
    measured = max(p["n_params"] for p in preds if p["measured_tokens_per_s"] is not None)
    return max(p["n_params"] for p in preds) / measured


def _predictions(d: DocInputs) -> list[str]:
    rows = ["| setup | tokens/s (interval) | peak GiB/GPU (interval) | tokens D | val loss (interval) |",
            "|---|---:|---:|---:|---:|"]
    for p in d.calibration["predictions"]:
        lo, hi = p["tokens_per_s_interval"]
        mlo, mhi = p["memory_gib_interval"]
        llo, lhi = p["final_loss_interval"]
        rows.append(f"| {p['label']} | {_k(p['tokens_per_s'])} ({_k(lo)}–{_k(hi)}) | {p['memory_gib']:.1f} "
                    f"({mlo:.1f}–{mhi:.1f}) of {p['device_memory_gib']:.0f} | {p['train_tokens'] / 1e9:.1f}B | "
                    f"{p['final_loss']:.2f} ({llo:.2f}–{lhi:.2f}) |")
    check = next(p for p in d.calibration["predictions"] if p["key"] == "350m-1xh200")
    ratio = check["tokens_per_s"] / check["measured_tokens_per_s"]
    return ["## Predictions: 124M, 350M, 1B", "", *rows, "",
            f"The 350M check: predicted {_k(check['tokens_per_s'])} tokens/s and {check['memory_gib']:.1f} GiB "
            f"against {_k(check['measured_tokens_per_s'])} and {check['measured_memory_gib']:.1f} GiB measured "
            f"({_signed(ratio - 1)}, {_signed(check['memory_gib'] / check['measured_memory_gib'] - 1)}); it is "
            "the worst held-out row, so it sets the throughput interval's edge. The 1B rows extrapolate "
            f"{_extrapolation(d):.1f}x past the largest measured model, so their intervals may be optimistic. D is "
            f"10B tokens for 124M, else {_ref(d, 'chinchilla_tokens_per_param'):.0f} per parameter "
            "(Hoffmann et al. 2022).", "",
            "Loss law: the Chinchilla fit (Hoffmann et al. 2022, approach 3) as a prior, ±25% because its "
            "tokenizer and data differ from ours"
            + ("." if d.ladder is None else "; our own ladder (Appendix D) is on ShareGPT, so it does not replace the "
               "prior for FineWeb-Edu."), ""]


def _variant_rounds(d: DocInputs) -> list[tuple[str, dict]]:
    """(round, {variant: record}) per measurement call; each call's ratios are to the plain run beside it."""
    first, *later = d.rounds.rounds
    return [(first.name, first.doc["variants"])] + [(r.name, call["variants"]) for r in later
                                                    for call in r.doc["calls"].values()]


def _variants(d: DocInputs) -> list[str]:
    v, rounds = d.variants, _variant_rounds(d)
    rows = ["| variant | round | tokens/s | x plain (same call) | peak GiB |", "|---|---:|---:|---:|---:|"]
    for rnd, variants in rounds:
        for name, r in sorted(variants.items(), key=lambda kv: kv[1]["tokens_per_s"]):
            if name != "plain":
                ratio = "—" if r["speedup_vs_plain"] is None else f"{r['speedup_vs_plain']:.3f}"
                rows.append(f"| {name} | {rnd} | {_k(r['tokens_per_s'])} | {ratio} | {r['peak_memory_gib']:.1f} |")
    q = v["quality"]
    tokens = max(int(t) for t in q["val_loss_by_tokens"]["plain"])
    plains = [x["plain"]["tokens_per_s"] for _, x in rounds if "plain" in x]
    plain = f"{_k(min(plains))}–{_k(max(plains))} over {len(plains)} calls"
    return ["## Recipe variants: the speed goal", "",
            f"Goal: {v['goal']}. Each variant is the 124M recipe on one H200, 10-12 steps (`-bf16res`: its 80-step "
            f"quality run), beside a plain run in the same call (plain: {plain}).", "", *rows, "", *_variants_notes(d),
            f"Quality: `{q['variant_sets']}` trained side by side with plain to {tokens / 1e6:.1f}M tokens (same "
            f"seed and data order) ends {q['final_val_diff']:+.4f} off in val loss; the chunked loss computes the "
            "same loss exactly.", "",
            *docs_speed.quality_sentence(d.rounds),
            f"**Verdict: {_latest(d)['verdict']}.**", "",
            *(_next_steps(d) if d.rounds.get("loader-bf16res") is None else []),
            *docs_speed.profile_section(d.rounds, d.forecast)]


def _variants_notes(d: DocInputs) -> list[str]:
    more = d.rounds.get("variants")
    if more is None:
        return []
    calls = more["calls"].values()
    skipped = [f"`{k}`: not measured, still compiling when cut off ({v['autotune_benchmark_s']:.0f} s of kernel "
               "benchmarking by then)" for c in calls for k, v in c.get("not_finished", {}).items()]
    fp8 = d.rounds.round("fp8-tensor")
    since = (f"; combined since the {docs_speed._ordinal(fp8.name)} round, whose chunked head runs FP8 itself"
             if fp8 else "")
    refused = [f"`{k}`: refused by config validation ({v.split(': ', 1)[-1].split(',')[0]}{since})"
               for c in calls for k, v in c.get("rejected", {}).items()]
    return [*(f"- {x}" for x in skipped + refused), ""]


def _next_steps(d: DocInputs) -> list[str]:
    """What the goal would need, from the calibrated form: the executed-FLOP efficiency u it implies."""
    found = re.search(r"(\d+)k tokens/s", d.variants["goal"])
    if not found:
        return []
    goal, t = 1e3 * float(found.group(1)), cal.ThroughputFit(**d.calibration["throughput_fit"])
    recipe = next(p for p in d.calibration["predictions"] if p["key"] == "124m-1xh200")
    per_token_s = 1.0 / recipe["tokens_per_s"]
    overhead_s = t.step_overhead_s / recipe["tokens_per_step"]
    loss_s = cal.loss_seconds_per_token(workload(d.recipe, 1), t)
    compute_s = per_token_s - overhead_s - loss_s          # the part that scales as 1/u
    needed = lambda other_s: t.mfu_matmul * compute_s / (1.0 / goal - other_s)  # noqa: E731
    return [f"What it would take, read off the calibrated form: the loss term is {_pct(loss_s / per_token_s)} of a "
            f"step and the per-step overhead {_pct(overhead_s / per_token_s)}, so {_k(goal)} tokens/s needs the "
            f"executed-FLOP efficiency u to rise from {t.mfu_matmul:.2f} to {needed(loss_s + overhead_s):.2f}, or "
            f"to {needed(overhead_s):.2f} with the loss term gone. The chunked loss gave about the size of that "
            "term." + (" Left to try: FP8 forward GEMMs with fast accumulation (`train.fp8_fast_accum`, built, not "
                        "yet measured), a fused linear + cross-entropy kernel (llm.c's fused classifier), row-wise "
                        "FP8 scales (torchao float8), an autotuned compile given the minutes it needs."
                        if d.rounds.get("fp8-tensor") is None else ""), ""]


def _scaling(d: DocInputs) -> list[str]:
    s1, s2 = d.ddp, d.fsdp2
    ddp, fsdp = s1["scaling_efficiency_2gpu"]["ddp"], s2["scaling_efficiency_2gpu_vs_earlier_1gpu_whole_compile"]
    one, two = s1["runs"]["1gpu"], s1["runs"]["ddp"]
    return ["## One GPU to two", "",
            f"Same 524,288-token step, {_k(one['tokens_per_s'])} tokens/s on one H200 and "
            f"{_k(two['tokens_per_s'])} on two with DDP: **{_pct(ddp)}** scaling efficiency. FSDP2 with the bf16 "
            f"policy reaches **{_pct(fsdp['fsdp2'])}** ({_k(s2['runs']['fsdp2']['tokens_per_s'])}) and uses "
            f"{s2['runs']['fsdp2']['peak_memory_gib']:.1f} GiB per GPU against DDP's {two['peak_memory_gib']:.1f}; "
            f"without the policy it managed {_pct(s1['scaling_efficiency_2gpu']['fsdp2'])}, its whole-model compile "
            "broken at every FSDP2 hook. For a 124M model DDP is the right choice: the model fits, and one "
            "overlapped all-reduce costs less than FSDP2's per-block gathers.", ""]


def _recipe(d: DocInputs) -> list[str]:
    cfg, o = d.recipe, d.recipe.optim
    step = cfg.train.total_batch_tokens
    b_crit = _ref(d, "kaplan_b_star_tokens") / _ref(d, "target_val_loss") ** (1 / _ref(d, "kaplan_alpha_b"))
    accum = ", ".join(f"{cfg.grad_accum(w)} on {w} GPU{'s' * (w > 1)}" for w in (8, 2, 1))
    return ["## The full-scale recipe and why", "",
            f"`{d.recipe_path}` is llm.c's GPT-2 124M recipe, which is what makes its token count apply.", "",
            f"- **Batch: {step:,} tokens per step**, GPT-3's {_ref(d, 'gpt3_125m_batch_tokens') / 1e6:.1f}M for "
            f"125M (Brown et al. 2020, Table 2.1). Kaplan et al. (2020, sec. 5.1) put the critical batch at "
            f"B* / L^(1/α_B) = {b_crit / 1e6:.2f}M tokens at L = {_ref(d, 'target_val_loss')}: the batch sits just "
            "below it, where more tokens per step would buy fewer steps at a rising token cost.",
            f"- **Grad-accum**: micro-batch {cfg.train.micro_batch_size} x {cfg.model.block_size} per GPU, so "
            f"accumulation is {accum}: the optimizer sees the same batch, learning rate and schedule on any number "
            "of GPUs, and averaging micro-batch losses gives the gradient of the whole batch.",
            f"- **Peak LR {o.lr:.0e}**, GPT-3's {_ref(d, 'gpt3_125m_lr'):.0e} for this size and batch, and llm.c's; "
            f"AdamW β = ({o.beta1}, {o.beta2}), weight decay {o.weight_decay} on matrices only, clip at "
            f"{o.grad_clip} (GPT-3 app. B).",
            f"- **Warmup {cfg.schedule.warmup_steps} steps = {cfg.schedule.warmup_steps * step / 1e6:.0f}M tokens**, "
            f"GPT-3's {_ref(d, 'gpt3_warmup_tokens') / 1e6:.0f}M: Adam's second-moment estimates are noisy early, "
            "and full-size steps before they settle are what diverge.",
            f"- **Decay**: {cfg.schedule.kind} (Loshchilov & Hutter 2017) to {o.min_lr_ratio:g} x peak over "
            f"{cfg.train.max_steps:,} steps = {cfg.train.max_steps * step / 1e9:.2f}B tokens, as llm.c; GPT-3 stops "
            f"at {_ref(d, 'gpt3_min_lr_ratio'):g} x, which matters only for a run cut short.", "",
            *_figure_line(d, "lr", "the recipe's learning rate over its steps"), ""]


def _figure_line(d: DocInputs, name: str, caption: str) -> list[str]:
    path = dict(d.figures).get(name)
    return [f"![{caption}]({path})"] if path else []


def _loss_curve(d: DocInputs) -> list[str]:
    q = d.variants["quality"]["val_loss_by_tokens"]
    last = max(q["plain"], key=int)
    quality = (f"the variants' quality check ({int(last) / 1e6:.1f}M tokens, val loss {q['plain'][last]:.2f} on "
               "ShareGPT)")
    if d.ttt and d.ttt.runs:
        longest = max(d.ttt.runs, key=lambda r: r.tokens)
        quality += (f"; beside it, the time-to-target runs above ({longest.tokens / 1e6:.1f}M tokens each; "
                    f"{longest.layout} ends at {longest.val_loss:.2f} on their own corpus and val split)")
    lines = ["## The loss curve", "", f"No 10B-token run exists yet. The longest GPU curve is {quality}.", "",
             *_figure_line(d, "quality", "val loss vs tokens, plain vs cuDNN attention + FP8, one H200"), ""]
    if d.demo is None:
        return lines + [f"The CPU demo's curve is made by `scalelab pretrain prepare` then `scalelab pretrain "
                        f"train --config configs/pretrain/tiny-cpu.toml` ({d.demo_path}/figures/loss.png).", ""]
    r = d.demo
    return lines + [f"The CPU demo ({d.demo_path}, {r['n_params'] / 1e6:.1f}M parameters, {r['tokens']:,} tokens): "
                    f"val loss {r['final_val_loss']:.2f} against the unigram baseline's {r['unigram_val_loss']:.2f} "
                    f"on the same val tokens, at {r['tokens_per_s']:.0f} tokens/s on two {d.demo_cpu} cores for "
                    f"${r['cost']['cost_usd']:.3f}.", "",
                    *_figure_line(d, "demo", "CPU demo: train and val loss"), ""]


def _cost(d: DocInputs) -> list[str]:
    c = d.calibration
    rows = ["| bar | tokens | 8 x H100 tokens/s | minutes (interval) | GPU-hours | cost (interval) | |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for t in c["time_to_target"]:
        h, usd = t["hours_interval"], t["cost_usd_interval"]
        rows.append(f"| {c['references'][t['bar']]['label']} | {t['tokens'] / 1e9:g}B | {_k(t['tokens_per_s'])} | "
                    f"{60 * t['hours']:.1f} ({60 * h[0]:.1f}–{60 * h[1]:.1f}) | {t['hours'] * t['gpus']:.1f} | "
                    f"${t['cost_usd']:.2f} (${usd[0]:.2f}–${usd[1]:.2f}) | {t['note']} |")
    llmc = next(t for t in c["time_to_target"] if t["bar"] == "llmc_tokens")
    one = next(p for p in c["predictions"] if p["key"] == "124m-1xh200")
    h200 = get_hardware("h200").price_per_hour
    per_b = lambda tps, gpus, price: 1e9 / tps / 3600 * gpus * price  # noqa: E731  USD per 1B tokens
    return ["## Cost accounting", "",
            f"Time to {_ref(d, 'target_val_loss')} = tokens / (predicted 8 x H100 tokens/s x the "
            f"{_pct(c['ddp_efficiency_2gpu']['value'])} DDP efficiency measured on 2 x H200, assumed to hold at 8), "
            f"priced at ${llmc['price_per_gpu_hour']:.2f} per H100-hour (core/hardware.py default).", "", *rows, "",
            f"llm.c reports {_ref(d, 'llmc_8xh100_minutes'):.0f} minutes for this run on 8 x H100; we predict "
            f"{60 * llmc['hours']:.0f}. Per billion tokens: "
            f"${per_b(llmc['tokens_per_s'], 8, llmc['price_per_gpu_hour']):.2f} on 8 x H100, "
            f"${per_b(one['tokens_per_s'], 1, h200):.2f} on one H200 at ${h200:.2f}/h "
            f"({one['wall_h']:.1f} h for the whole recipe): the money is about the same, the wait is not.", "",
            *_spent(d)]


def _spent(d: DocInputs) -> list[str]:
    """What the results on this page cost: the recorded device time of the leases, GPU-hours and dollars."""
    if not d.ledger:
        return []
    known = [r for r in d.ledger if r["pretrain_s"]]
    hours: dict[str, float] = {}   # "H100" / "H200" (as the ledger's gpu_kind names the card) -> GPU-hours
    for r in known:
        card = "H100" if "H100" in r["gpu_kind"] else "H200"
        hours[card] = hours.get(card, 0.0) + float(r["pretrain_s"]) * int(r["gpus"]) / 3600
    usd = sum(h * get_hardware(LEDGER_CARDS[card]).price_per_hour for card, h in hours.items())
    each = " and ".join(f"{h:.1f} {card}-hours" for card, h in sorted(hours.items()))
    unknown = [r for r in d.ledger if not r["pretrain_s"]]
    return [f"What the measurements on this page cost ({d.ledger_path}): {len(d.ledger)} leases of "
            f"lent GPUs, each at most 30 minutes. The {len(known)} whose pretraining time is recorded were charged "
            f"{sum(float(r['pretrain_s']) for r in known) / 3600:.1f} h of machine time = {each} (refused machine "
            f"starts and idle gaps included), about ${usd:.0f} at the same prices; "
            + (f"{len(unknown)} more ({'; '.join(r['what'].split(';')[0] for r in unknown)}) did not record it or "
               "shared it with other work, at most 0.5 h each." if unknown else "that is all of them."), ""]


def _not_measured(d: DocInputs) -> list[str]:
    ladder = ("the scaling-law ladder: `bench/gpu_scaling_ladder.sh` writes the ladder's results folder, "
              "and `predict` then fits L(N, D) on it for runs on the same data; until then every loss above is the "
              "Chinchilla prior" if d.ladder is None or not d.ladder.get("law") else
              ("" if d.calibration.get("loss_ladder", {}).get("checks") else "a 350M run on the ladder's data to "
               "check the ladder law's 350M prediction, and ") + "a ladder on FineWeb-Edu itself: the FineWeb loss "
              "predictions stay on the Chinchilla prior")
    status = d.ttt.stats.get("status", "not run") if d.ttt else "not run"
    ttt = (f"time to target by the speedrun's rules ({status})" if status != "done" else
           "time to 3.28 on FineWeb-Edu itself (the corpus above is ShareGPT and books), and an ablation of the "
           "recipe's parts (Muon against the higher AdamW learning rate)")
    return ["## Not measured yet", "",
            f"- {ladder};",
            f"- {ttt};",
            "- the 8 x H100 run itself: its time and cost above are predictions;",
            f"- the 1B predictions (no run that size, and the model is extrapolated {_extrapolation(d):.1f}x);",
            "- FSDP2's bf16 residual stream in the memory count, and communication at 8 GPUs (assumed hidden, as "
            "measured at 2).", ""]


def _appendix(letter: str, lines: list[str]) -> list[str]:
    """A section moved to the appendix: its first heading becomes 'Appendix <letter>: <heading>'; none stays none."""
    at = next((i for i, line in enumerate(lines) if line.startswith("## ")), None)
    if at is None:
        return lines
    return [*lines[:at], f"## Appendix {letter}: {lines[at][3:]}", *lines[at + 1:]]


def render(d: DocInputs) -> str:
    """The post (recipe, predictions, their scores, the loss runs, cost), then the appendix: the calibration rows,
    the variant tables, one GPU to two, and the scaling-law ladder behind the loss predictions."""
    figure = lambda name, caption: _figure_line(d, name, caption)  # noqa: E731
    check = d.calibration.get("loss_ladder")
    post = [*_intro(d), *_recipe(d), *_forms(d), *_predictions(d), *blind_section(d.blind),
            *docs_ttt.ttt_section(d.ttt, figure),
            *docs_ttt.lm_eval_section(d.lm_evals), *_loss_curve(d), *_cost(d), *_not_measured(d)]
    appendix = [*_appendix("A", ["## The calibration rows", "", *_calibration_table(d)]),
                *_appendix("B", _variants(d)), *_appendix("C", _scaling(d)),
                *_appendix("D", docs_loss.ladder_section(d.ladder, check, figure))]
    return "\n".join(post + appendix)


# ---------------------------------------------------------------------------------------------
# figures and save


def _figure():
    fig = figures.figure(7, 4, dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig, ax, xlabel: str, ylabel: str, path: Path) -> None:
    figures.label(ax, xlabel, ylabel)
    figures.save(fig, path)


def make_figures(d: DocInputs, demo_dir: Path, fig_dir: Path) -> tuple[tuple[str, str], ...]:
    """The recipe's LR schedule, the quality-check val curves, and a copy of the CPU demo's loss figure."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = _figure()
    steps = range(0, d.recipe.train.max_steps, 10)
    ax.plot(list(steps), [lr_at(s, d.recipe) for s in steps], label=f"{d.recipe.schedule.kind}, warmup "
            f"{d.recipe.schedule.warmup_steps} steps")
    _save(fig, ax, "optimizer step", "learning rate", fig_dir / "pretrain_recipe_lr.png")
    fig, ax = _figure()
    q = d.variants["quality"]
    for name, label in (("plain", "plain"), ("variant", q["variant_sets"])):
        points = sorted((int(t), v) for t, v in q["val_loss_by_tokens"][name].items())
        ax.plot([t / 1e6 for t, _ in points], [v for _, v in points], "o-", label=label)
    _save(fig, ax, "tokens (millions)", "val loss (nats/token)", fig_dir / "pretrain_quality_val_loss.png")
    made = [("lr", f"{FIGURES}/pretrain_recipe_lr.png"), ("quality", f"{FIGURES}/pretrain_quality_val_loss.png")]
    made += [(name, f"{FIGURES}/{file}") for name, file in
             docs_loss.make_figures(d.ladder, d.calibration.get("loss_ladder"), fig_dir, _figure, _save)
             + docs_ttt.make_figure(d.ttt, fig_dir, _figure, _save)]
    demo, copy = demo_dir / "figures" / "loss.png", fig_dir / "pretrain_tiny_cpu_loss.png"
    if d.demo is not None and demo.is_file():
        shutil.copyfile(demo, copy)
    if d.demo is not None and copy.is_file():   # a committed demo folder keeps its figure only as this copy
        made.append(("demo", f"{FIGURES}/pretrain_tiny_cpu_loss.png"))
    return tuple(made)


def docs(manifest: str | Path, out: Path | None = None) -> Path:
    """docs/pretrain.md (the manifest's `out`, or `out`) and its figures, from the result folders the manifest
    names."""
    m = read_manifest(manifest, job="pretrain")
    d, out = load_inputs(m), out or m.out
    figs = make_figures(d, m.path_of(d.demo_path), out.parent / FIGURES)
    return write_doc(render(replace(d, figures=figs)), out)

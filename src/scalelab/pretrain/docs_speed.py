"""docs/pretrain.md's speed reading: where a training step's GPU time goes (the committed profiles of
bench/gpu_pretrain_profile.py, the GEMM table of bench/gpu_fp8_gemm.py), what the later rounds' fastest recipes kept
of the loss, how the fused row kernels met their forecast, what the tuned launches moved and what the batch loader and
the bf16 residual stream did against their forecasts. Numbers come only from the rounds the docs manifest lists
(pretrain/rounds.py, by kind), the kernel forecast, and the files they name."""
from __future__ import annotations

from scalelab.core.numfmt import thousands
from scalelab.pretrain.rounds import Rounds

HEAD_ONLY = "cudnn-fp8-head-chunks8-b128-tk"  # FP8 in the chunked head only: what FP8 in the blocks adds
_ORDINALS = ("zeroth", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def _ordinal(name: str) -> str:
    """A round's name as an ordinal word ('3' -> 'third'); other names are printed as given."""
    return _ORDINALS[int(name)] if name.isdigit() and int(name) < len(_ORDINALS) else f"{name}"


def _profiles(v3: dict) -> list[dict]:
    return [p for p in v3["profiles"].values() if isinstance(p, dict) and "summary" in p]


def _profile_table(*docs: dict | None) -> list[str]:
    profiles = [p for doc in docs if doc for p in _profiles(doc)]
    kinds = list(dict.fromkeys(k for p in profiles for k in p["summary"]["ms_per_step_by_kind"]))
    head = "| kind of GPU kernel | " + " | ".join(f"`{p['variant']}` ms/step" for p in profiles) + " |"
    rows = [head, "|---|" + "---:|" * len(profiles)]
    for kind in kinds:
        if all(p["summary"]["ms_per_step_by_kind"].get(kind, 0.0) < 0.5 for p in profiles):
            continue  # e.g. copies: nothing to read
        rows.append(f"| {kind} | " + " | ".join(f"{p['summary']['ms_per_step_by_kind'].get(kind, 0.0):.0f}"
                                                for p in profiles) + " |")
    rows.append("| **step (wall)** | " + " | ".join(f"**{p['summary']['wall_ms_per_step']:.0f}**"
                                                   for p in profiles) + " |")
    return rows


def profile_section(r: Rounds, forecast: dict | None = None) -> list[str]:
    v3, v4 = r.get("fp8-tensor"), r.get("fp8-row")
    v5, v6, v7 = r.get("row-kernels"), r.get("tuned-launches"), r.get("loader-bf16res")
    doc = v4 or v3
    if doc is None:
        return []
    later = [(k, v) for k, v in (("row-kernels", v5), ("tuned-launches", v6), ("loader-bf16res", v7)) if v and v4]
    busy = min(p["summary"]["gpu_busy_fraction"] for d in (doc, *(v for _, v in later)) for p in _profiles(d))
    rounds = (f"s {r.name('fp8-row')}-{r.name(later[-1][0])}" if later
              else f" {r.name('fp8-row' if v4 else 'fp8-tensor')}")
    return ["### Where the step goes", "",
            f"Two profiled steps per recipe (`bench/gpu_pretrain_profile.py`, round{rounds}; `triton`: "
            "Inductor's fused kernels):", "", *_profile_table(doc, *(v for _, v in later)), "",
            f"The GPU is busy ≥ {100 * busy:.1f}% of the wall clock: the host is not the limit. "
            + (_reading4(v4, forecast, tail=v5 is None, goal=v6 is None) if v4 else _reading3(v3)), "",
            *(_reading5(v5, r.name("row-kernels")) if v5 and v4 else []),
            *(_reading6(v5, v6, r.name("tuned-launches")) if v5 and v6 and v4 else []),
            *(_reading7(v7, r.name("loader-bf16res")) if v7 and v6 else [])]


def _reading3(v3: dict) -> str:
    last = _profiles(v3)[-1]["summary"]
    head = next(c["variants"][HEAD_ONLY] for c in v3["calls"].values() if HEAD_ONLY in c["variants"])
    return (f"With FP8 the elementwise kernels ({last['ms_per_step_by_kind']['triton']:.0f} of "
            f"{last['wall_ms_per_step']:.0f} ms) rival the GEMMs: mostly the FP8 scaling before each GEMM (an amax, a "
            "cast, a transposed copy for the weight gradient). At d = 768 these passes cost about what FP8 saves: "
            f"with FP8 in the head alone the step ran at {thousands(head['tokens_per_s'])} tokens/s, "
            f"{head['speedup_vs_plain']:.3f}x its plain, against {v3['best']['speedup_vs_plain']:.3f}x with FP8 "
            "everywhere. " + _goal(v3))


def _goal(doc: dict) -> str:
    plain = doc["best"]["plain_tokens_per_s"]
    return f"650k tokens/s needs a {524288 / 650e3 * 1000:.0f} ms step ({650e3 / plain:.2f}x plain)."


def _reading4(v4: dict, forecast: dict | None, tail: bool = True, goal: bool = True) -> str:
    """The per-row FP8 round's profiles; `tail`: then what is left, or the forecast for the next kernels (until they
    ran);
    `goal`: the step time the goal needs (until a later verdict states it)."""
    prof = v4["profiles"]
    head, before, after = (prof[k]["summary"] for k in ("call2_head", "call2_row", "call3_row"))
    fused = max((k for k in before["top_kernels"] if "sum" in k["name"] and "amax" in k["name"]),
                key=lambda k: k["ms_per_step"])
    block = v4["gemm"]["summary"]["per_block_ms"]
    return (f"With FP8 in the head alone, bf16 block GEMMs dominate ({head['ms_per_step_by_kind']['gemm']:.0f} of "
            f"{head['wall_ms_per_step']:.0f} ms). Timed alone (`bench/gpu_fp8_gemm.py`), a block's twelve GEMMs take "
            f"{block['bf16_ms']:.2f} ms in bf16, {block['fp8_tensor_ms']:.2f} in per-tensor FP8 and "
            f"{block['fp8_row_ms']:.2f} in per-row FP8; per-tensor scaling spends its saving on amax passes, casts and "
            "transposed copies. Per-row scales (`train.fp8_scaling=\"row\"`, torchao's rowwise recipe, weight "
            "gradient in bf16) fuse each row's amax into the kernel that writes the row and need no transposes. "
            f"The bias in the GEMM epilogue took the step from {before['wall_ms_per_step']:.0f} to "
            f"{after['wall_ms_per_step']:.0f} ms (Inductor had fused its gradient's token-sum with the row amax into "
            f"one slow kernel, {fused['ms_per_step']:.0f} ms/step); multi-kernel reductions added "
            f"{100 * (_mk_gain(v4) - 1):.1f}%."
            + (" " + _goal(v4) if goal else "")
            + (" " + (_forecast(forecast) if forecast else _left(after)) if tail else ""))


def _left(after: dict) -> str:
    looped = sum(k["ms_per_step"] for k in after["top_kernels"]
                 if k["name"].startswith("triton_red_") and "amax" in k["name"])
    return (f"Left: per-row casts that read their rows twice ({looped:.0f} ms before multi-kernel), FP8 weight "
            f"gradients with a fused cast-transpose, attention ({after['ms_per_step_by_kind']['attention']:.0f} ms).")


def _forecast(f: dict) -> str:
    """The kernels built after the round, with the step time forecast for them before they run."""
    both = next(v["tokens_per_s"] for k, v in f["forecasts"].items() if "tk8" in k and k.endswith("-gk"))
    return ("Not yet run: `train.loss_kernel=\"triton-e5m2\"` and `train.fp8_gelu_kernel`; "
            f"`bench/pretrain_kernel_forecast.py` forecasts {thousands(both['centre'])} tokens/s with both "
            f"({thousands(both['low'])}–{thousands(both['high'])}).")


def _mk_gain(v4: dict) -> float:
    """The best variant's speed over the same recipe without its last switch, measured in the same call."""
    variants = v4["calls"][v4["best"]["call"]]["variants"]
    return variants[v4["best"]["variant"]]["tokens_per_s"] / variants[v4["best"]["variant"][:-3]]["tokens_per_s"]


def _reading5(v5: dict, name: str) -> list[str]:
    """The fused row kernels against their forecast, and the launch shapes timed alone."""
    rows = list(v5["forecast_check"]["rows"].values())
    got = ", ".join(f"{r['measured_saving_ms']:.0f}" for r in rows)
    want = ", ".join(f"{r['forecast_saving_ms'][0]:.0f}–{r['forecast_saving_ms'][2]:.0f}" for r in rows)
    k = v5["row_kernels"]["kernels"]
    return [f"Round {name}'s kernels (`-tk8`: the loss kernel writes the e5m2 logit gradient; `-gk`: GELU and its "
            f"gradient fused with their row casts) saved {got} ms/step (each, then both) against {want} "
            f"forecast: alone (`bench/gpu_row_kernels.py`), the e5m2 kernel moves "
            f"{k['loss e5m2 tile 64x128 w4']['tb_per_s']:.1f} TB/s, not the bf16 kernel's 3.2, and GELU at 8 warps "
            f"{k['gelu triton w8']['tb_per_s']:.1f} ({k['gelu triton w16']['tb_per_s']:.1f} at 16, now its launch). "
            f"At B=256 the step takes {v5['best']['median_step_ms']:.0f} ms; Inductor's autotuning failed on FP8 "
            "GEMM operands.", ""]


def _reading6(v5: dict, v6: dict, name: str) -> list[str]:
    """What the launch tuning moved: the tuned launches in the profile, the hardware-cast loss tile (A/B)."""
    before, after = (next(iter(_profiles(v)))["summary"] for v in (v5, v6))
    kinds = [(k, before["ms_per_step_by_kind"][k], after["ms_per_step_by_kind"][k]) for k in ("gelu kernel",
                                                                                                "loss kernel", "gemm")]
    moved = ", ".join(f"{k} {a:.0f} → {b:.0f}" for k, a, b in kinds)
    hw = v6["hw_cast_ablation"]
    return [f"Round {name}, at the tuned launches: {moved} ms (another GPU). The hardware-cast loss tile, forecast "
            f"from its time alone to save {hw['forecast_saving_ms']:.1f} ms/step, saved "
            f"{hw['measured_saving_ms']:.1f} in an A/B on one GPU.", ""]


def _reading7(v7: dict, name: str) -> list[str]:
    """The batch loader and the bf16 residual stream against their forecasts; the GPUs' spread."""
    lv, bf = v7["loader_vs_forecast"], v7["bf16res_vs_forecast"]
    idle = list(lv["idle_by_batch_copies_ms"].values())
    saved = sorted(bf["measured_saving_ms"].values())
    runs = [(n, r) for c in v7["calls"].values() for n, r in c["variants"].items()]
    plains = [r["tokens_per_s"] for n, r in runs if n == "plain"]
    recipe = [r["tokens_per_s"] for _, r in runs if r.get("sets", "").endswith("train.fp8_gelu_kernel=true")]
    mem = bf["peak_memory_gib"]
    return [f"Round {name}: a pinned one-ahead batch loader (`train.batch_prefetch`) cut the idle time around batch "
            f"copies from {idle[0]:.1f} to {idle[1]:.2f} ms/step but the step by "
            f"{lv['measured_saving_ms']['recipe']:.1f} ms (forecast {lv['forecast_saving_ms'][0]:.1f}–"
            f"{lv['forecast_saving_ms'][1]:.1f}). A bf16 residual stream (`train.residual_dtype=\"compute\"`, as "
            f"llm.c), forecast from the LayerNorm kernels' bytes at {bf['forecast_saving_ms'][0]:.1f}–"
            f"{bf['forecast_saving_ms'][1]:.1f} ms/step, saved {saved[0]:.0f}–{saved[1]:.0f} on one machine; the "
            f"peak fell {mem['without (call 5)'] - mem['measured']:.2f} GiB, not to the forecast "
            f"{mem['forecast'][0]:.0f}–{mem['forecast'][1]:.0f}. Across three H200s plain ran "
            f"{thousands(min(plains))}–{thousands(max(plains))}, the recipe without it "
            f"{thousands(min(recipe))}–{thousands(max(recipe))}.", ""]


def quality_sentence(r: Rounds) -> list[str]:
    v3, v4, v5 = r.get("fp8-tensor"), r.get("fp8-row"), r.get("row-kernels")
    v6 = r.get("tuned-launches")
    if v5 and v6:  # the tuned round reran the check on equal val tokens; the loader round checked its bf16 stream so
        return _quality6(r, [d["quality"]["final_val_diff"] for d in (v3, v4) if d]
                         + [v5["quality"]["final_val_diff_as_measured"]])
    if v5:  # the row-kernel round found these checks scored different val tokens: one reading for all three
        return _quality5(r, [d["quality"]["final_val_diff"] for d in (v3, v4) if d])
    out = []
    for kind, doc, why in (("fp8-tensor", v3, "the Triton loss kernel writes the gradient over the logits, and the "
                                              "logit gradient takes a static e5m2 scale, since |softmax − one_hot|/N "
                                              "≤ 1/N"),
                           ("fp8-row", v4, "per-row scales give each token its own range")):
        if doc is None:
            continue
        q, best = doc["quality"], doc["best"]
        tokens = max(int(t) for t in q["val_loss_by_tokens"]["plain"])
        out += [f"The {_ordinal(r.name(kind))} round's fastest, `{best['variant']}` "
                f"({thousands(best['tokens_per_s'])} tokens/s, "
                f"{best['speedup_vs_plain']:.3f}x), trained beside plain to {tokens / 1e6:.1f}M tokens, ends "
                f"{q['final_val_diff']:+.4f} off in val loss (within 0.02: {'yes' if q['within_0.02'] else 'no'}), "
                f"at {q['peak_memory_gib']['variant']:.0f} GiB against {q['peak_memory_gib']['plain']:.0f}: {why}.",
                ""]
    return out


def _quality5(r: Rounds, earlier: list[float]) -> list[str]:
    """The B=128/256 quality checks (FP8 rounds to the row kernels), and why they do not yet compare like with like."""
    v5 = r.get("row-kernels")
    q = v5["quality"]
    shift = q["subset_shift_estimate"]["value"]
    moved = [d for n, d in v5["quality_ablation"]["final_val_diff_vs_tk"].items() if n != "tk"]
    diffs = ", ".join(f"{x:+.4f}" for x in [*earlier, q["final_val_diff_as_measured"]])
    return [f"The fastest recipes of rounds {_fp8_rounds(r)} ended {diffs} off plain. These checks scored plain "
            "(B=64) and the "
            "B=128/256 recipes on different val prefixes: the trainer read val in B·T strides, now fixed "
            "(`shards.ValWindows`). A train-unigram proxy (`bench/val_subset_shift.py`) "
            f"prices the B=256 prefix at {shift:+.3f}, leaving {q['final_val_diff_estimated_same_tokens']:+.3f} for "
            f"the recipe; at equal B the round-{r.name('row-kernels')} kernels move the loss by {min(moved):+.3f} to "
            f"{max(moved):+.3f}. "
            "Quality is unproven until rerun on equal tokens.", ""]


def _quality6(r: Rounds, earlier: list[float]) -> list[str]:
    """The B=128/256 quality checks of the FP8 rounds (unequal val tokens), the tuned round's rerun on equal ones,
    and the loader round's check of the bf16 residual stream on that recipe."""
    v6, v7 = r.get("tuned-launches"), r.get("loader-bf16res")
    q = v6["quality"]
    tokens = max(int(t) for t in q["val_loss_by_tokens"]["plain"])
    scored = q["val_tokens_scored"]["plain (B=64)"]
    q7 = v7["quality"] if v7 else None
    return [f"The fastest recipes of rounds {_fp8_rounds(r)} ended {', '.join(f'{x:+.4f}' for x in earlier)} off "
            "plain, "
            "but on different val prefixes: the trainer read val in B·T strides, now fixed (`shards.ValWindows`). "
            f"Rerun on the same {scored / 1e6:.2f}M val tokens to {tokens / 1e6:.1f}M training tokens, round "
            f"{r.name('row-kernels')}'s "
            f"recipe ends **{q['final_val_diff']:+.4f}** off plain (within 0.02: "
            f"{'yes' if q['within_0.02'] else 'no'})"
            + (f"; with round {r.name('loader-bf16res')}'s bf16 residual stream, **{q7['final_val_diff']:+.4f}** "
               "(within 0.02: "
               f"{'yes' if q7['within_0.02'] else 'no'})." if q7 else "."), ""]


def _fp8_rounds(r: Rounds) -> str:
    return r.names("fp8-tensor", "fp8-row", "row-kernels")

"""The write-up's throughput section, from the JSON of bench/dpo_throughput.py (TRL's defaults vs our recipe).

    find_throughput(sweep) -> list[Path]      bench results beside the sweep folder (throughput*.json)
    throughput_md(path, shown) -> list[str]   the table, the loss check and the flags that differ
"""
from __future__ import annotations

from pathlib import Path

from scalelab.core.jsonio import read_json


def find_throughput(sweep: Path) -> list[Path]:
    return sorted(sweep.parent.glob("throughput*.json"))


def _row(name: str, what: str, row: dict, peak: float | None) -> str:
    if not row.get("ok"):
        return f"| {name} | {what} | failed: {row.get('error', '')[:60]} | | | | |"
    t, c = row["throughput"], row.get("vs_trl_default", {})
    return (f"| {name} | {what} | {t['tokens_per_s']:,.0f} | {t['tokens_per_s_end_to_end']:,.0f} | "
            f"{t['step_s_mean']:.2f} | {peak:.1f} | {c.get('speedup_step', 1.0):.2f}x |")


def throughput_md(path: Path, shown: str | None = None) -> list[str]:
    """shown: the file's name as the page prints it (default: the path as given)."""
    d = read_json(path)
    s, shape, summary = d["settings"], d["model_shape"], d["summary"]
    peaks = {r["name"]: r.get("peak_memory_gib") for r in d["results"]}
    prov = d["provenance"]
    rows = summary["variants"]
    ours = rows.get("ours", {}).get("vs_trl_default", {})
    repeat = rows.get("trl_default_repeat", {}).get("throughput", {}).get("tokens_per_s")
    lines = ["## Throughput at 7B scale", "",
             f"LoRA-DPO (r={s['lora_rank']}) of a random-weight model of Qwen2.5-7B's shape (hidden {shape['hidden']}, "
             f"{shape['layers']} layers, vocab {shape['vocab']:,}), bf16, {s['batch_pairs']} pairs per step, "
             f"sequences up to {s['max_length']} tokens (prompt ~U{tuple(s['prompt_tokens'])}, responses "
             f"~U{tuple(s['response_tokens'])}), {s['measured_steps']} measured steps after {s['warmup_steps']} "
             f"warm-up, each variant in a fresh process on one {prov.get('gpu', 'GPU')} "
             f"(`{shown or path.as_posix()}`, git {str(prov.get('git_sha', '?'))[:10]}). Tokens/s counts real "
             "(non-pad) chosen + rejected tokens; \"end to end\" charges a reference precompute to the steps.", "",
             "| variant | what | tok/s | tok/s end to end | step s | peak GiB | vs trl_default |",
             "|---|---|---|---|---|---|---|"]
    lines += [_row(n, d["variants_described"].get(n, ""), r, peaks.get(n) or 0.0) for n, r in rows.items()]
    lines += ["", f"DPOConfig flags that differ from TRL's defaults in our recipe: "
                  f"{', '.join(f'`{k}` {v[0]} -> {v[1]}' for k, v in ours.get('dpo_config_diff', {}).items())}."]
    if repeat and rows.get("ours", {}).get("ok"):
        tps = rows["ours"]["throughput"]["tokens_per_s"]
        lines.append(f"TRL's defaults ran twice; against the faster of the two ({repeat:,.0f} tok/s) our recipe is "
                     f"{tps / max(repeat, rows['trl_default']['throughput']['tokens_per_s']):.2f}x. ")
    lines += [f"Equal loss: the per-step losses of our recipe stay within "
              f"{ours.get('loss_max_abs_diff', float('nan')):.3f} of TRL's, against a run-to-run drift of "
              f"{summary.get('loss_noise_floor', float('nan')):.3f} between two runs of TRL's defaults themselves "
              f"(bf16 backward kernels are not bitwise repeatable and Adam's first steps amplify that): "
              f"**{'PASS' if summary.get('passed') else 'FAIL'}**. The recipe trades memory for speed: no activation "
              "recompute keeps every layer's activations (peak memory above).", ""]
    return lines

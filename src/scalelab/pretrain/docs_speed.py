"""docs/pretrain.md's speed reading: where a training step's GPU time goes (the committed profiles of
bench/gpu_pretrain_profile.py) and what the third variants round's fastest recipe kept of the loss.
Numbers come only from results/h200/pretrain_variants_round3.json and the profile files it names."""
from __future__ import annotations

from pathlib import Path

from scalelab.core.jsonio import read_json

VARIANTS3 = "results/h200/pretrain_variants_round3.json"
HEAD_ONLY = "cudnn-fp8-head-chunks8-b128-tk"  # FP8 in the chunked head only: what FP8 in the blocks adds


def load(repo: Path) -> dict | None:
    """The round-3 results with each profile's summary under profiles.<call>.summary; None before it exists."""
    path = repo / VARIANTS3
    if not path.is_file():
        return None
    doc = read_json(path)
    for key, entry in doc["profiles"].items():
        if isinstance(entry, dict) and "file" in entry:
            entry["summary"] = read_json(repo / entry["file"])
    return doc


def thousands(x: float) -> str:
    """A count as docs/pretrain.md writes it: 578k, 1.23M."""
    return f"{x / 1e3:,.0f}k" if x < 1e6 else f"{x / 1e6:,.2f}M"


def _profiles(v3: dict) -> list[dict]:
    return [p for p in v3["profiles"].values() if isinstance(p, dict) and "summary" in p]


def profile_section(v3: dict | None) -> list[str]:
    if v3 is None:
        return []
    profiles = _profiles(v3)
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
    busy = min(p["summary"]["gpu_busy_fraction"] for p in profiles)
    last = profiles[-1]["summary"]["ms_per_step_by_kind"]
    plain = v3["best"]["plain_tokens_per_s"]
    goal_ms = 524288 / 650e3 * 1000
    head = next(c["variants"][HEAD_ONLY] for c in v3["calls"].values() if HEAD_ONLY in c["variants"])
    return ["### Where the step goes", "",
            "Two profiled steps per recipe (`bench/gpu_pretrain_profile.py`; Inductor's fused kernels count as "
            "`triton` even when they feed a GEMM):", "", *rows, "",
            f"The GPU is busy at least {100 * busy:.1f}% of the wall clock, so the host is not the limit. With FP8 "
            f"the elementwise kernels ({last['triton']:.0f} of {profiles[-1]['summary']['wall_ms_per_step']:.0f} ms) "
            "rival the GEMMs: mostly the FP8 scaling before each GEMM (an amax, a cast, a transposed copy for the "
            "weight gradient). At d = 768 these passes cost about what FP8 saves: with FP8 in the head alone "
            f"(bf16 blocks) the step ran at {thousands(head['tokens_per_s'])} tokens/s, {head['speedup_vs_plain']:.3f}x "
            f"its plain, against {v3['best']['speedup_vs_plain']:.3f}x with FP8 everywhere. 650k tokens/s needs a "
            f"{goal_ms:.0f} ms step ({650e3 / plain:.2f}x plain). Left: "
            "LayerNorm and GELU fused with the FP8 cast and its transpose, delayed scaling (Transformer Engine's "
            "previous-step amax) to drop the amax passes, faster attention at head size 64.", ""]


def quality_sentence(v3: dict | None) -> list[str]:
    if v3 is None:
        return []
    q, best = v3["quality"], v3["best"]
    tokens = max(int(t) for t in q["val_loss_by_tokens"]["plain"])
    return [f"The third round's fastest, `{best['variant']}` ({thousands(best['tokens_per_s'])} tokens/s, "
            f"{best['speedup_vs_plain']:.3f}x), trained beside plain to {tokens / 1e6:.1f}M tokens ends "
            f"{q['final_val_diff']:+.4f} off in val loss (within 0.02: "
            f"{'yes' if q['within_0.02'] else 'no'}), at {q['peak_memory_gib']['variant']:.0f} GiB against "
            f"{q['peak_memory_gib']['plain']:.0f}: the Triton loss kernel writes the gradient over the logits. "
            "The logit gradient goes to e5m2 with a static scale, since |softmax − one_hot|/N ≤ 1/N; measuring "
            "its amax had cost a full pass per chunk.", ""]

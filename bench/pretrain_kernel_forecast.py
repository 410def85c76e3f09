"""Forecast, before any GPU run, the step time of the two kernels built after round 4 and not yet measured:
train.loss_kernel='triton-e5m2' (bench suffix -tk8) and train.fp8_gelu_kernel (-gk), from round 4's profile.

Both kernels are single-pass row kernels bound by memory traffic. Each removes profiled Inductor kernels and
adds its own bytes, so per step: saving = (ms of the kernels it removes) - (bytes it moves) / bandwidth. The
bandwidth is calibrated on kernels of the same profile whose bytes are known exactly: the loss kernel _ce_rows
(reads the logits twice, writes the gradient once) and the static e5m2 cast of the head's logit gradient with
its transposed copy (reads bf16, writes e5m2 twice). The interval takes the new kernels from 80% of the slower of
those two bandwidths (a kernel not yet tuned) to the faster. The forecast applies the saving to the best measured
recipe (-mk, the same recipe with multi-kernel reductions); multi-kernel may already have sped up the removed
kernels, which would shrink the saving: a reason to trust the interval's low end more than its high end.

    .venv/bin/python bench/pretrain_kernel_forecast.py --out results/h200/pretrain/kernel-forecast/results.json
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from scalelab.core.provenance import git_sha

PROFILE = "results/h200/pretrain/variants-round4/profiles/profile_fp8row_all_chunks8_b128_tk_fast_biasgemm.json"
ROUND4 = "results/h200/pretrain/variants-round4/results.json"
GOAL_TOKENS_PER_S = 650_000
UNTUNED = 0.8  # the low end: a new kernel at 80% of the slower calibrating kernel's bandwidth
# profiled kernels, by name prefix
CE_ROWS = "_ce_rows"                                                                # the loss kernel
HEAD_CAST = "triton_poi_fused__scaled_mm__to_copy_add_clamp_clone_full_mul"       # static e5m2 cast + transpose
GELU_FWD = "triton_red_fused__scaled_mm__to_copy_abs_amax_clamp_gelu_mul"          # GELU, row amax, e4m3 cast
GELU_BWD = "triton_red_fused__scaled_mm__to_copy_abs_amax_clamp_clone_gelu_gelu_backward"  # GELU', e5m2 cast


@dataclass(frozen=True)
class Shapes:
    """One micro-step of the profiled recipe: GPT-2 124M, B=128 x T=1024, 8 loss chunks, 4 micro-steps a step."""
    rows: int = 128 * 1024         # tokens per micro-step
    hidden: int = 4 * 768          # MLP width
    vocab: int = 50304             # padded head rows
    chunks: int = 8                # train.loss_chunks
    micro_steps: int = 4           # 524,288 tokens / step
    layers: int = 12

    @property
    def chunk_elems(self) -> int:
        return self.rows // self.chunks * self.vocab

    @property
    def hidden_elems(self) -> int:
        return self.rows * self.hidden


@dataclass(frozen=True)
class Forecast:
    variant: str                # bench suffix on the best measured recipe
    removed_ms: float           # profiled ms/step of the kernels the new one replaces
    added_gb: float             # GB/step the new kernel moves in their place (-tk8: none beyond the loss kernel's)
    saving_ms: tuple[float, float, float]  # low, centre, high
    assumption: str


def kernel_ms(profile: dict, prefix: str) -> tuple[float, float]:
    """(ms per step, calls per step) of the profiled kernel whose name starts with prefix; exactly one must."""
    hits = [k for k in profile["top_kernels"] if k["name"].startswith(prefix)]
    if len(hits) != 1:
        raise ValueError(f"profile: {len(hits)} kernels start with {prefix!r}; expected exactly one")
    return hits[0]["ms_per_step"], hits[0]["calls_per_step"]


def bandwidths(profile: dict, s: Shapes) -> dict[str, float]:
    """GB/s of the two calibrating kernels: the bytes they must move per step over their measured ms."""
    ce_ms, ce_calls = kernel_ms(profile, CE_ROWS)
    cast_ms, cast_calls = kernel_ms(profile, HEAD_CAST)
    return {"loss_kernel": ce_calls * s.chunk_elems * (2 + 2 + 2) / ce_ms / 1e6,        # logits read twice, written
            "head_gradient_cast": cast_calls * s.chunk_elems * (2 + 1 + 1) / cast_ms / 1e6}  # bf16 in, 2x e5m2 out


def saving(removed_ms: float, gb: float, gb_per_s: tuple[float, float, float]) -> tuple[float, float, float]:
    return tuple(round(removed_ms - gb / b * 1e3, 1) for b in gb_per_s)


def gelu_forecast(profile: dict, s: Shapes, bw: tuple[float, float, float]) -> Forecast:
    """-gk: forward reads h, writes a (bf16) and a8; backward reads da and h, writes gh (bf16) and gh8. a is saved
    from the forward, where the compiled backward recomputed it."""
    removed = kernel_ms(profile, GELU_FWD)[0] + kernel_ms(profile, GELU_BWD)[0]
    gb = s.micro_steps * s.layers * s.hidden_elems * ((2 + 2 + 1) + (2 + 2 + 2 + 1)) / 1e9
    return Forecast("-gk", round(removed, 2), round(gb, 2), saving(removed, gb, bw),
                    "the two GELU kernels at the calibrated bandwidths")


def loss_e5m2_forecast(profile: dict, s: Shapes, bw: tuple[float, float, float]) -> Forecast:
    """-tk8: the loss kernel writes e5m2 twice (row-major and transposed) where it wrote bf16 once, the same
    bytes, and the cast-and-transpose kernel goes. At the low end the transposed half is written at the untuned
    bandwidth instead of the loss kernel's own."""
    removed, _ = kernel_ms(profile, HEAD_CAST)
    gb = s.micro_steps * s.chunks * s.chunk_elems / 1e9  # the transposed e5m2 write
    low = removed - (gb / bw[0] - gb / bw[1]) * 1e3
    return Forecast("-tk8", round(removed, 2), 0.0, (round(low, 1), round(removed, 1), round(removed, 1)),
                    "the loss kernel's time unchanged (same bytes); low end: its transposed write untuned")


def forecast(profile: dict, round4: dict, s: Shapes = Shapes()) -> dict:
    if profile["tokens_per_step"] != s.rows * s.micro_steps or f"train.loss_chunks={s.chunks}" not in profile["sets"]:
        raise ValueError(f"the profile is not of the shapes forecast here ({s}): {profile['sets']}")
    measured = bandwidths(profile, s)
    bw = (UNTUNED * min(measured.values()), measured["loss_kernel"], max(measured.values()))
    parts = [gelu_forecast(profile, s, bw), loss_e5m2_forecast(profile, s, bw)]
    best = round4["best"]
    tokens = profile["tokens_per_step"]
    base_ms = tokens / best["tokens_per_s"] * 1e3
    base = best["variant"]  # cudnn-fp8row-all-chunks8-b128-tk-fast-mk
    variants = {base.replace("-tk-", "-tk8-"): parts[1:], base + "-gk": parts[:1],
                base.replace("-tk-", "-tk8-") + "-gk": parts}
    rows = {}
    for name, chosen in variants.items():
        step = [round(base_ms - sum(p.saving_ms[i] for p in chosen), 1) for i in (0, 1, 2)]  # low saving first
        rows[name] = {"step_ms": dict(zip(("high", "centre", "low"), step)),
                      "tokens_per_s": dict(zip(("low", "centre", "high"), (round(tokens / m * 1e3) for m in step)))}
    return {"base": {"variant": best["variant"], "tokens_per_s": round(best["tokens_per_s"]),
                     "step_ms": round(base_ms, 1)},
            "goal_step_ms": round(tokens / GOAL_TOKENS_PER_S * 1e3, 1),
            "bandwidth_gb_per_s": {**{k: round(v, 1) for k, v in measured.items()}, "untuned_low": round(bw[0], 1)},
            "parts": [asdict(p) for p in parts], "forecasts": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=PROFILE)
    ap.add_argument("--round4", default=ROUND4)
    ap.add_argument("--out", type=Path, default=None, help="write the forecast JSON here (else print it)")
    args = ap.parse_args(argv)
    result = forecast(json.loads(Path(args.profile).read_text()), json.loads(Path(args.round4).read_text()))
    command = "python bench/pretrain_kernel_forecast.py" + (f" --out {args.out}" if args.out else "")
    result = {"what": "forecast before measuring: ms/step and tokens/s of the round-4 best recipe with the "
                      "unmeasured kernels, from round 4's profile and the bandwidth of its measured kernels",
              **result, "inputs": {"profile": args.profile, "round4": args.round4},
              "git_sha": git_sha(), "command": command,
              "provenance": {"git_sha": git_sha(), "command": command, "gpu": "none: computed from H200 results"}}
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    for name, row in result["forecasts"].items():
        t = row["tokens_per_s"]
        print(f"{name:48s} {t['centre']:>9,} tokens/s  ({t['low']:,} to {t['high']:,})")
    print(f"goal {GOAL_TOKENS_PER_S:,} tokens/s = {result['goal_step_ms']} ms/step; base {result['base']['step_ms']}")
    return 0 if args.out else (sys.stdout.write(text) and 0)


if __name__ == "__main__":
    sys.exit(main())

"""Forecast of the staleness ablation on the real task, from runs of the same recipe at k = 0, before any stale run.

    python bench/grpo_staleness_forecast.py RUN [RUN ...] [--steps 40] [--ks 1,2,4,8] [--out FILE.json]

What staleness k costs is off-policyness: step t learns from samples of the weights of step t - k. Its size is the
divergence between those two policies, which the runs at k = 0 do not log directly but bound: they log, per step,
the KL of the policy to the base (`kl_mean`, k3 on the sampled tokens) and the behaviour mismatch at k = 0
(`behavior_mismatch_k3`: the engine's log-probs against the trainer's on the same weights, numerics only). With
KL(t) the runs' median over steps t - 2 ... t + 2, the divergence across k steps at step t is

    random walk (updates in independent directions, KL grows ~ t):  KL(t) k / t
    directed    (every update in the same direction, KL ~ t^2):      (sqrt KL(t) - sqrt KL(t - k))^2

and the exponent p of KL(t) = a t^p fitted to the first STEPS steps says which the runs are closer to (p = 1: random
walk, p = 2: directed); the forecast adds the k = 0 floor to each. The held-out score is not forecast here (the
prediction beside the forecast reads it from the k = 0 runs' held-out curves).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalelab.core.jsonio import write_json  # noqa: E402
from scalelab.core.provenance import git_sha  # noqa: E402
from scalelab.grpo.steps import read_steps  # noqa: E402


def fit_power(steps: np.ndarray, kl: np.ndarray) -> tuple[float, float]:
    """(a, p) of KL(t) = a t^p, least squares in log-log over the per-step medians (one outlier step of one run
    does not move it); steps with a non-positive KL are left out."""
    ts = np.unique(steps)
    med = np.array([np.median(kl[steps == t]) for t in ts])
    keep = (ts > 0) & (med > 0)
    p, log_a = np.polyfit(np.log(ts[keep]), np.log(med[keep]), 1)
    return float(math.exp(log_a)), float(p)


def smoothed(steps: np.ndarray, kl: np.ndarray, t: int, half: int = 2) -> float:
    """The median KL over steps t - half ... t + half of every run (0 at step 0 and before)."""
    if t <= 0:
        return 0.0
    window = (steps >= t - half) & (steps <= t + half)
    return float(np.median(kl[window]))


def divergence(kl_t: float, kl_back: float, t: int, k: int) -> dict[str, float]:
    """The KL between the policies of steps t and t - k under the two drift models (nats/token), from the KL to
    the base at t and at t - k."""
    return {"random_walk": kl_t * k / t, "directed": (math.sqrt(kl_t) - math.sqrt(max(kl_back, 0.0))) ** 2}


def forecast(runs: list[Path], steps: int, ks: list[int]) -> dict:
    rows = [r for run in runs for r in read_steps(run) if 1 <= r.step <= steps + 2]
    t = np.array([r.step for r in rows])
    kl = np.array([r.kl_mean for r in rows])
    floor = float(np.median([r.behavior_mismatch_k3 for r in rows if steps // 2 <= r.step <= steps]))
    a, p = fit_power(t[t <= steps], kl[t <= steps])
    table = []
    for k in ks:
        for at in (steps // 2, steps):
            d = divergence(smoothed(t, kl, at), smoothed(t, kl, at - k), at, k)
            table.append({"k": k, "step": at, "random_walk": floor + d["random_walk"],
                          "directed": floor + d["directed"]})
    return {"runs": [str(r) for r in runs], "steps": steps, "fit": {"a": a, "p": p}, "floor_k3": floor,
            "kl_at_end": smoothed(t, kl, steps), "mismatch": table}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders of the recipe at k = 0 (metrics.jsonl[.xz])")
    ap.add_argument("--steps", type=int, default=40, help="the ablation's steps per run (default 40)")
    ap.add_argument("--ks", default="1,2,4,8", help="the staleness values to forecast (default 1,2,4,8)")
    ap.add_argument("--out", type=Path, help="also write the forecast here (JSON)")
    args = ap.parse_args(argv)
    f = forecast(args.runs, args.steps, [int(k) for k in args.ks.split(",")])
    print(f"KL to the base fitted as {f['fit']['a']:.2e} t^{f['fit']['p']:.2f} over steps 1-{f['steps']} "
          f"(median at step {f['steps']}: {f['kl_at_end']:.4f}); k = 0 mismatch floor {f['floor_k3']:.5f} nats/token")
    print("| k | step | behaviour mismatch, random walk | directed |")
    print("|---:|---:|---:|---:|")
    for row in f["mismatch"]:
        print(f"| {row['k']} | {row['step']} | {row['random_walk']:.4f} | {row['directed']:.4f} |")
    if args.out:
        command = "python bench/grpo_staleness_forecast.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_json(args.out, {**f, "git_sha": git_sha(), "command": command})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

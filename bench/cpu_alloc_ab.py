#!/usr/bin/env python
"""glibc's default allocator against core/cpualloc.py's thresholds, on the CPU demo's trainer.

    python bench/cpu_alloc_ab.py [--steps 15] [--repeats 2] [--out results/cpu/pretrain/cpu-alloc-ab.json]

Runs `scalelab pretrain train --config configs/pretrain/tiny-cpu.toml` for --steps steps (no evaluation), A B B A
... with SCALELAB_CPU_MALLOPT=0 (glibc's defaults) and =1 (the thresholds), each in a fresh process and run folder,
and reports per arm the median over repeats of the trainer's median step time, and of the kernel (system) CPU
seconds of the whole process, which is where page faults on freshly mapped memory are paid. Run it on quiet cores.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from scalelab.core.hardware import cpu_model  # noqa: E402
from scalelab.core.provenance import git_sha  # noqa: E402


def one_run(keep: bool, steps: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "scalelab.cli", "pretrain", "train", "--config",
                        "configs/pretrain/tiny-cpu.toml", "--set", f'run.out_dir="{out}"', "--set",
                        f"train.max_steps={steps}", "--set", "train.val_every=0"], cwd=ROOT, check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                                 "SCALELAB_CPU_MALLOPT": "1" if keep else "0"})
        summary = json.loads(next(Path(out).glob("*/train_summary.json")).read_text())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"median_step_ms": summary["median_step_ms"], "sys_s": after.ru_stime - before.ru_stime,
            "user_s": after.ru_utime - before.ru_utime}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    order = [k for i in range(args.repeats) for k in ((False, True) if i % 2 == 0 else (True, False))]  # A B B A
    runs = {"defaults": [], "thresholds": []}
    for keep in order:
        runs["thresholds" if keep else "defaults"].append(one_run(keep, args.steps))
    arms = {name: {key: statistics.median(r[key] for r in rs) for key in ("median_step_ms", "sys_s", "user_s")}
            for name, rs in runs.items()}
    doc = {"arms": arms, "runs": runs, "order": ["thresholds" if k else "defaults" for k in order],
           "step_ratio": arms["thresholds"]["median_step_ms"] / arms["defaults"]["median_step_ms"],
           "steps": args.steps, "cpu": cpu_model(), "cores": os.cpu_count(),
           "command": " ".join(["python bench/cpu_alloc_ab.py", *(argv if argv is not None else sys.argv[1:])]),
           "git_sha": git_sha()}
    for name, a in arms.items():
        print(f"{name:10s} step {a['median_step_ms']:7.1f} ms   kernel {a['sys_s']:5.1f} s   user {a['user_s']:5.1f} s")
    print(f"thresholds / defaults step time: {doc['step_ratio']:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

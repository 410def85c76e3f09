"""SASS of the trainer's Triton kernels for sm_90, compiled here without a GPU (scalelab.pretrain.kernel_builds):
instructions, registers, shared memory, global loads/stores, exps (MUFU) and conversions (F2FP) per kernel at the
124M recipe's shapes, each kernel with an HW switch both ways (the hardware's round-to-nearest-even casts, or
the interpreter's integer rounding). A static reading, not a timing: a memory-bound row kernel wants few
instructions per byte moved and registers few enough for many warps to stay resident.

    PYTHONPATH=src python bench/triton_kernel_sass.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scalelab.core.provenance import git_sha, package_versions
from scalelab.pretrain.kernel_builds import BUILDS, compile_sm90, sass_stats


def rows() -> list[dict]:
    out = []
    for name, build in BUILDS.items():
        for hw in ((True, False) if "HW" in build.constants else (None,)):
            compiled = compile_sm90(build) if hw is None else compile_sm90(build, HW=hw)
            launched = hw is None or hw == build.constants["HW"]
            out.append({"kernel": name, "hw_casts": hw, "as_launched": launched, "num_warps": build.num_warps,
                        **sass_stats(compiled)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    table = rows()
    print(f"{'kernel':16s} {'HW':>5s} {'launch':>6s} {'warps':>5s} {'instr':>6s} {'regs':>4s} {'smem':>6s} "
          f"{'LDG':>4s} {'STG':>4s} {'MUFU':>4s} {'F2FP':>4s}")
    for r in table:
        print(f"{r['kernel']:16s} {r['hw_casts']!s:>5s} {'yes' if r['as_launched'] else 'no':>6s} {r['num_warps']:>5d} "
              f"{r['instructions']:>6d} {r['registers']:>4d} {r['shared_bytes']:>6d} {r['ldg']:>4d} {r['stg']:>4d} "
              f"{r['mufu']:>4d} {r['f2fp']:>4d}")
    if args.out:
        command = f"PYTHONPATH=src python bench/triton_kernel_sass.py --out {args.out}"
        versions = package_versions(("triton", "torch"))
        args.out.write_text(json.dumps({"what": __doc__.split("\n\n")[0], "target": "sm_90 (Hopper), no GPU used",
                                        "rows": table, "git_sha": git_sha(), "command": command,
                                        "provenance": {"git_sha": git_sha(), "command": command, **versions}},
                                       indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

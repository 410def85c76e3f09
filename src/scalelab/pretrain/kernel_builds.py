"""The trainer's Triton kernels compiled ahead of time for Hopper (sm_90) on any machine, GPU or not: Triton ships
its own ptxas and cuobjdump. What the CPU interpreter cannot check (types the compiler refuses, layouts it cannot
lower, the instructions it emits) can be read here before any GPU time: the tests compile every kernel, and
bench/triton_kernel_sass.py counts each one's SASS instructions and registers."""
from __future__ import annotations

import collections
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scalelab.pretrain import ce_kernel, fp8_kernels
from scalelab.pretrain.triton_support import triton


@dataclass(frozen=True)
class KernelBuild:
    """One kernel at the 124M recipe's shapes: argument types (pointers and scalars, in order), the compile-time
    constants, the warps its launch uses, and the hardware casts (PTX) its outputs must be rounded by."""
    kernel: str           # attribute of `module`
    module: str           # "ce_kernel" | "fp8_kernels"
    types: str
    constants: dict
    num_warps: int
    casts: tuple[str, ...]

    def jit(self):
        return getattr({"ce_kernel": ce_kernel, "fp8_kernels": fp8_kernels}[self.module], self.kernel)


GELU = {"N": 3072, "BLOCK": 4096, "K": fp8_kernels.GELU_K, "HW": True}  # warps: as fp8_kernels launches them
BUILDS = {
    "gelu_rows": KernelBuild("_GELU_ROWS", "fp8_kernels", "*bf16 *bf16 *u8 *fp32", GELU, fp8_kernels.GELU_WARPS,
                             ("cvt.rn.bf16", "cvt.rn.satfinite.e4m3x2.f32")),
    "gelu_grad_rows": KernelBuild("_GELU_GRAD_ROWS", "fp8_kernels", "*bf16 *bf16 *bf16 *u8 *fp32", GELU,
                                  fp8_kernels.GELU_GRAD_WARPS, ("cvt.rn.bf16", "cvt.rn.satfinite.e5m2x2.f32")),
    "ce_rows": KernelBuild("_CE_ROWS", "ce_kernel", "*bf16 i64 *i64 *fp32 *fp32 fp32",
                           {"VOCAB": 50257, "PADDED": 50304, "WANT_GRAD": True, "BLOCK": 4096}, 4, ("cvt.rn.bf16",)),
    "ce_grad_e5m2": KernelBuild("_CE_GRAD_E5M2", "ce_kernel", "*bf16 i64 *fp32 *i64 *u8 *u8 i32",
                                {"VOCAB": 50257, "PADDED": 50304, "SCALE": 57344.0, "BR": ce_kernel.E5M2_TILE[0],
                                 "BV": ce_kernel.E5M2_TILE[1], "HW": ce_kernel.E5M2_HW_CAST},
                                ce_kernel.E5M2_TILE_WARPS, ("cvt.rn.satfinite.e5m2x2.f32",)),
}


def compile_sm90(build: KernelBuild, **constants):
    """The compiled kernel (asm: ttgir, ptx, cubin) for sm_90, with the launch's specialization: pointers and
    integers divisible by 16 (as the recipe's are), so loads may vectorize. constants override the build's."""
    from triton.backends.compiler import GPUTarget  # lazy: triton only on CUDA machines
    from triton.compiler import ASTSource
    kernel, const = build.jit(), {**build.constants, **constants}
    types = build.types.split()
    args = [a for a in kernel.arg_names if a not in const]
    signature = {**dict(zip(args, types, strict=True)), **{c: "constexpr" for c in const}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types) if not t.startswith("fp")}
    return triton.compile(ASTSource(kernel, signature, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": build.num_warps})


def sass_stats(compiled) -> dict:
    """Instruction count, registers and the opcodes that matter for a memory-bound row kernel, read from the
    cubin with Triton's own cuobjdump."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    lines = [line.split("*/")[1].strip() for line in sass.splitlines() if line.strip().startswith("/*") and ";" in line]
    ops = collections.Counter((ln.split()[1] if ln.startswith("@") else ln.split()[0]).split(".")[0] for ln in lines)
    registers = next(int(w[4:]) for line in usage.splitlines() for w in line.split() if w.startswith("REG:"))
    return {"instructions": len(lines), "registers": registers, "shared_bytes": compiled.metadata.shared,
            **{op.lower(): ops[op] for op in ("LDG", "STG", "MUFU", "F2FP")}}

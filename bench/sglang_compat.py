#!/usr/bin/env python
"""Which SGLang release can run on the GPU image (torch 2.11.0, a CUDA 13 build, no package index)?

    python bench/sglang_compat.py --from 0.5.10 --out results/cpu/sglang_compat.json

SGLang pins torch exactly, and its kernel wheel (`sglang-kernel`, formerly `sgl-kernel`) is compiled against one
CUDA major: a kernel linked to libcudart.so.12 cannot load beside a cu130 torch, whatever the pins say. So a release
fits only when all three hold:
0. it has a wheel for the image's CPython and glibc (since 0.5.11 SGLang ships per-CPython binary wheels);
1. its `torch==` pin is the image's torch (read from the release's wheel metadata, through pip's resolver report:
   `pip install --dry-run --no-deps --report`, which reads PEP 658 metadata and downloads no wheel);
2. the kernel wheel it pins links the image's CUDA major: the DT_NEEDED entries of its shared objects
   (libcudart.so.N, libcublas.so.N), read from the ELF dynamic section of each .so in the wheel.
Only the kernel wheels of releases passing 1 are downloaded (hundreds of MB each; cached in --cache).
"""
from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from scalelab.core import provenance

KERNEL_PACKAGES = ("sglang-kernel", "sgl-kernel")
PINNED = ("torch", "transformers", "flashinfer_python", "flashinfer-python") + KERNEL_PACKAGES
CUDA_LIBS = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc)\.so\.(\d+)$")


@dataclass(frozen=True)
class Release:
    version: str
    requires_python: str
    pins: dict            # package -> exact version, for the packages in PINNED that are pinned with ==
    kernel: str           # "sglang-kernel==0.4.5", or "" when the release pins none
    wheel: str = ""       # the file pip picked for the image's Python and glibc


@dataclass(frozen=True)
class KernelLinks:
    wheel: str
    cuda_majors: tuple[int, ...]   # CUDA majors its .so files link (libcudart.so.13 -> 13)
    libraries: tuple[str, ...]     # the CUDA libraries named, for the record


def exact_pins(requires_dist: list[str]) -> dict[str, str]:
    """`name==version` requirements without an environment marker (or with one that holds on x86-64 Linux, where
    the GPU image runs: SGLang marks its aarch64-only pins with platform_machine), by name."""
    out = {}
    for req in requires_dist:
        spec, _, marker = req.partition(";")
        if "extra ==" in marker or ("platform_machine ==" in marker and "x86_64" not in marker):
            continue
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s,;]+)\s*$", spec)
        if m:
            out[m.group(1)] = m.group(3)
    return out


def release_from_report(version: str, report: dict) -> Release:
    """The resolver report's one install entry (pip --no-deps) -> the release's pins."""
    items = report.get("install") or []
    if len(items) != 1:
        raise ValueError(f"sglang=={version}: pip's report lists {len(items)} installs, expected 1")
    meta = items[0]["metadata"]
    pins = exact_pins(meta.get("requires_dist") or [])
    kernel = next((f"{k}=={pins[k]}" for k in KERNEL_PACKAGES if k in pins), "")
    wheel = items[0].get("download_info", {}).get("url", "").rsplit("/", 1)[-1]
    return Release(version, meta.get("requires_python") or "", {k: v for k, v in pins.items() if k in PINNED},
                   kernel, wheel)


def elf_needed(data: bytes) -> list[str]:
    """DT_NEEDED names of a 64-bit little-endian ELF shared object: the dynamic section's entries of tag 1,
    each an offset into the string table its section header links to."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = [s for s in sections if s[1] == 6]          # SHT_DYNAMIC
    if not dynamic:
        return []
    dyn = dynamic[0]
    strtab = sections[dyn[6]]                              # sh_link -> .dynstr
    names = []
    for off in range(dyn[4], dyn[4] + dyn[5], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:                                       # DT_NULL ends the table
            break
        if tag == 1:                                       # DT_NEEDED
            start = strtab[4] + val
            names.append(data[start:data.index(b"\0", start)].decode())
    return names


def kernel_links(wheel: Path) -> KernelLinks:
    libs: set[str] = set()
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.endswith(".so"):
                libs.update(n for n in elf_needed(z.read(info)) if CUDA_LIBS.match(n))
    majors = sorted({int(CUDA_LIBS.match(n).group(2)) for n in libs})
    return KernelLinks(wheel.name, tuple(majors), tuple(sorted(libs)))


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, capture_output=True, text=True)


def image_wheel_args(python: str, glibc: str) -> list[str]:
    """pip options that pick wheels as the image would: its CPython, and every manylinux tag its glibc accepts
    (SGLang ships per-CPython binary wheels tagged manylinux_2_34 since 0.5.11)."""
    major, minor = (int(p) for p in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(17, minor + 1)] + ["manylinux2014_x86_64", "any"]
    abi = "cp" + python.replace(".", "")
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", abi,
            "--abi", "abi3", "--abi", "none", *(a for t in tags for a in ("--platform", t))]


def resolve(version: str, wheel_args: list[str]) -> Release:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--dry-run", "--no-deps", "--ignore-installed", "--target", str(Path(tmp) / "t"),
            "--report", str(report), *wheel_args, f"sglang=={version}")
        return release_from_report(version, json.loads(report.read_text()))


def fetch_kernel(requirement: str, cache: Path, wheel_args: list[str]) -> Path:
    name, _, version = requirement.partition("==")
    stem = name.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if not found:
        pip("download", "--no-deps", *wheel_args, "-d", str(cache), requirement)
        found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"{requirement}: pip download left no wheel in {cache}")
    return found[0]


def verdict(release: Release, links: KernelLinks | None, torch: str, cuda_major: int) -> str:
    if release.pins.get("torch") != torch:
        return f"torch pin {release.pins.get('torch', 'none')} != {torch}"
    if links is None:
        return "no kernel wheel pinned"
    if cuda_major not in links.cuda_majors:
        return f"kernel links CUDA {links.cuda_majors}, not {cuda_major}"
    return "fits"


def versions_from(start: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang"], check=True,
                         capture_output=True, text=True).stdout
    listed = re.search(r"Available versions: (.*)", out)
    if not listed:
        raise RuntimeError("pip index versions sglang: no version list in its output")
    key = lambda v: tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.]|post", v))  # noqa: E731
    return sorted((v for v in listed.group(1).split(", ") if key(v) >= key(start)), key=key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="start", default="0.5.10", help="the oldest sglang release checked")
    ap.add_argument("--torch", default="2.11.0", help="the GPU image's torch version")
    ap.add_argument("--cuda-major", type=int, default=13, help="the CUDA major of the image's torch build")
    ap.add_argument("--python", default="3.12", help="the image's CPython")
    ap.add_argument("--glibc", default="2.39", help="the image's glibc")
    ap.add_argument("--cache", default="/tmp/sglang-kernel-cache", help="where kernel wheels are kept")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows, links = [], {}
    wheel_args = image_wheel_args(a.python, a.glibc)
    for v in versions_from(a.start):
        try:
            r = resolve(v, wheel_args)
        except subprocess.CalledProcessError:
            rows.append({"version": v, "verdict": f"no wheel for CPython {a.python} / glibc {a.glibc}"})
            print(f"sglang {v:12s} {rows[-1]['verdict']}")
            continue
        if r.pins.get("torch") == a.torch and r.kernel and r.kernel not in links:
            links[r.kernel] = kernel_links(fetch_kernel(r.kernel, cache, wheel_args))
        k = links.get(r.kernel)
        rows.append({**asdict(r), "kernel_links": asdict(k) if k else None,
                     "verdict": verdict(r, k, a.torch, a.cuda_major)})
        print(f"sglang {v:12s} torch {r.pins.get('torch', '-'):8s} {r.kernel:26s} {rows[-1]['verdict']}  {r.wheel}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    record = {"image": {"torch": a.torch, "cuda_major": a.cuda_major, "python": a.python, "glibc": a.glibc},
              "releases": rows,
              "provenance": provenance.collect({"pip": metadata.version("pip")})}
    Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

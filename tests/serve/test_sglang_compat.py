"""bench/sglang_compat.py: a release's exact pins from its wheel metadata (aarch64-only and extra pins left out),
the DT_NEEDED names of a real shared object (against binutils' readelf), a kernel wheel's CUDA majors, and the
verdict's three outcomes."""
from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from bench import sglang_compat as sc

REQUIRES = [
    "torch==2.11.0",
    "sglang-kernel==0.4.5",
    "flashinfer_python[cu13]==0.6.15.post1",
    "transformers==5.12.1",
    "torch_memory_saver>=0.0.9.post1",
    'av==16.1.0; sys_platform == "linux" and (platform_machine == "aarch64" or platform_machine == "arm64")',
    'torchcodec==0.11.1; sys_platform != "linux" or (sys_platform == "linux" and platform_machine != "aarch64")',
    'pytest==8.0.0; extra == "test"',
]


def test_exact_pins_keep_x86_pins_and_drop_extras_and_arm_only_ones():
    pins = sc.exact_pins(REQUIRES)
    assert pins == {"torch": "2.11.0", "sglang-kernel": "0.4.5", "flashinfer_python": "0.6.15.post1",
                    "transformers": "5.12.1", "torchcodec": "0.11.1"}


def test_release_from_report_names_the_kernel_pin():
    report = {"install": [{"metadata": {"requires_dist": REQUIRES, "requires_python": ">=3.10"}}]}
    r = sc.release_from_report("0.5.17", report)
    assert r.kernel == "sglang-kernel==0.4.5" and r.requires_python == ">=3.10"
    assert r.pins == {"torch": "2.11.0", "sglang-kernel": "0.4.5", "flashinfer_python": "0.6.15.post1",
                      "transformers": "5.12.1"}
    with pytest.raises(ValueError, match="sglang==0.5.17: pip's report lists 0 installs"):
        sc.release_from_report("0.5.17", {"install": []})


def _a_shared_object() -> Path:
    for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"):
        if Path(p).is_file():
            return Path(p)
    pytest.skip("no x86-64 libm here")


def test_elf_needed_agrees_with_readelf():
    so = _a_shared_object()
    ours = sc.elf_needed(so.read_bytes())
    assert "libc.so.6" in ours
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
        theirs = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
        assert ours == theirs
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        sc.elf_needed(b"#!/bin/sh\n")


def test_kernel_links_reads_cuda_majors_from_every_so(tmp_path, monkeypatch):
    wheel = tmp_path / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sgl_kernel/a.so", b"A")
        z.writestr("sgl_kernel/sm90/b.so", b"B")
        z.writestr("sgl_kernel/__init__.py", b"not read")
    needed = {b"A": ["libtorch.so", "libcudart.so.13", "libc.so.6"], b"B": ["libcublas.so.13", "libcublasLt.so.13"]}
    monkeypatch.setattr(sc, "elf_needed", lambda data: needed[data])
    k = sc.kernel_links(wheel)
    assert k.cuda_majors == (13,)
    assert k.libraries == ("libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13")


def test_verdict_names_the_constraint_that_fails():
    fits = sc.Release("0.5.17", ">=3.10", {"torch": "2.11.0"}, "sglang-kernel==0.4.5")
    cu13 = sc.KernelLinks("w.whl", (13,), ("libcudart.so.13",))
    cu12 = sc.KernelLinks("w.whl", (12,), ("libcudart.so.12",))
    assert sc.verdict(fits, cu13, "2.11.0", 13) == "fits"
    assert sc.verdict(fits, cu12, "2.11.0", 13) == "kernel links CUDA (12,), not 13"
    newer = sc.Release("0.5.23", ">=3.11", {"torch": "2.14.1"}, "sglang-kernel==0.4.10")
    assert sc.verdict(newer, None, "2.11.0", 13) == "torch pin 2.14.1 != 2.11.0"
    bare = sc.Release("0.5.0", ">=3.10", {"torch": "2.11.0"}, "")
    assert sc.verdict(bare, None, "2.11.0", 13) == "no kernel wheel pinned"


def test_image_wheel_args_accept_every_manylinux_tag_up_to_the_image_glibc():
    args = sc.image_wheel_args("3.12", "2.39")
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    # SGLang's cp312 wheels are tagged manylinux_2_34: an image with glibc 2.39 takes them, one with 2.31 not
    assert "manylinux_2_34_x86_64" in platforms and "manylinux_2_39_x86_64" in platforms
    assert "manylinux_2_40_x86_64" not in platforms
    assert "manylinux_2_34_x86_64" not in [args[i + 1] for i, a in enumerate(sc.image_wheel_args("3.12", "2.31"))
                                           if a == "--platform"]
    assert args[args.index("--python-version") + 1] == "3.12" and "cp312" in args

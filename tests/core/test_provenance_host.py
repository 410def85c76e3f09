"""Provenance's host record: the CPU model is read from /proc/cpuinfo's first "model name"."""
from __future__ import annotations

import platform

from scalelab.core.hardware import cpu_model, host_description


def test_the_cpu_model_is_the_first_model_name_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                    "processor\t: 1\nmodel name\t: Other\n")
    assert cpu_model(info) == "Intel(R) Xeon(R) Platinum 8480+"


def test_without_a_model_name_it_falls_back_to_the_platform(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n")   # e.g. some ARM kernels name no model
    assert cpu_model(info) == platform.processor()
    assert cpu_model(tmp_path / "absent") == platform.processor()


def test_provenance_names_this_hosts_cpu():
    assert host_description()["cpu_model"] == cpu_model()

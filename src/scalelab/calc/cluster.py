"""A cluster: GPUs from the hardware table, grouped in nodes, with intra- and inter-node links.

Intra-node links come from core/hardware.py (NVLink bandwidth per direction, small-message latency),
or, when <results>/<gpu>/nccl_*.json exists, from the alpha-beta fit to those measurements
(calc/calibration.py), per collective. core/hardware.py has no inter-node numbers, so the NIC per GPU
is given here, per hardware key, with its source.

A group of ranks that does not fit in one node is limited by the NICs: a ring (all-reduce, all-gather,
reduce-scatter) with k members per node gets B_bus = min(B_nvlink, k·B_nic) because NCCL runs one ring
per NIC and every ring crosses each node boundary once; an all-to-all sends (n-k)/n of its buffer off
the node through its own NIC while the (k-1)/n on-node part moves over NVLink at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scalelab.calc.calibration import load_calibration
from scalelab.calc.collectives import BUS_FACTOR, Link
from scalelab.core.hardware import Hardware, get_hardware


@dataclass(frozen=True)
class NodeSpec:
    gpus_per_node: int
    nic_gb_s: float             # per GPU per direction, GB/s
    nic_latency_us: float       # small-message collective latency across nodes
    source: str


NODES: dict[str, NodeSpec] = {
    "h100-sxm": NodeSpec(8, 50.0, 20.0, "DGX H100: 8x ConnectX-7 400 Gb/s InfiniBand, one per GPU"),
    "h200": NodeSpec(8, 50.0, 20.0, "DGX H200: 8x ConnectX-7 400 Gb/s InfiniBand, one per GPU"),
    "a100-80gb": NodeSpec(8, 25.0, 20.0, "DGX A100: 8x ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU"),
    "l40s": NodeSpec(8, 6.25, 30.0, "8x L40S cloud node (e.g. AWS g6e.48xlarge): 400 Gb/s per node"),
    "cpu": NodeSpec(1, 1.25, 50.0, "one CPU host per node on 10 GbE"),
}


@dataclass(frozen=True)
class Cluster:
    hardware: Hardware
    n_gpus: int
    gpus_per_node: int
    intra: dict[str, Link] = field(hash=False)      # per collective
    inter_bw_bytes_s: float = 50e9
    inter_latency_s: float = 20e-6
    calibrated: bool = False                          # intra links fitted from <results>/<gpu>/nccl_*.json

    @property
    def node_size(self) -> int:
        return min(self.gpus_per_node, self.n_gpus)


def _intra_links(hw: Hardware, bw_gb_s: float | None, latency_us: float | None, calibrate: bool,
                 root: Path | None = None) -> tuple[dict[str, Link], bool]:
    table = Link(hw.link_gb_s * 1e9, hw.link_latency_us * 1e-6, f"core/hardware.py {hw.key}: {hw.source}")
    links = {c: table for c in BUS_FACTOR}
    fits = load_calibration(hw.key, root) if calibrate else {}
    for c, f in fits.items():
        links[c] = Link(f.busbw_bytes_s, f.alpha_s, f"fit to {f.source} (max rel. err {f.max_rel_err:.0%})")
    if bw_gb_s is not None or latency_us is not None:   # explicit overrides win over table and fit
        links = {c: Link(bw_gb_s * 1e9 if bw_gb_s is not None else l.bus_bw_bytes_s,
                         latency_us * 1e-6 if latency_us is not None else l.latency_s, "command-line override")
                 for c, l in links.items()}
    return links, bool(fits)


def make_cluster(gpu: str, n_gpus: int, *, intra_bw_gb_s: float | None = None, inter_bw_gb_s: float | None = None,
                 latency_us: float | None = None, inter_latency_us: float | None = None,
                 gpus_per_node: int | None = None, calibrate: bool = True,
                 calibration_root: Path | None = None) -> Cluster:
    """calibration_root: the folder whose <gpu>/nccl_*.json fits replace the table's links (default
    calibration.results_dir())."""
    hw = get_hardware(gpu)
    node = NODES.get(gpu, NodeSpec(8, 50.0, 20.0, "assumed"))
    links, calibrated = _intra_links(hw, intra_bw_gb_s, latency_us, calibrate, calibration_root)
    return Cluster(hw, n_gpus, gpus_per_node or node.gpus_per_node, links,
                   (inter_bw_gb_s if inter_bw_gb_s is not None else node.nic_gb_s) * 1e9,
                   (inter_latency_us if inter_latency_us is not None else node.nic_latency_us) * 1e-6,
                   calibrated and intra_bw_gb_s is None and latency_us is None)


def group_link(cluster: Cluster, collective: str, size: int, stride: int) -> tuple[Link, str]:
    """The effective link of a group of `size` ranks spaced `stride` apart, and "intra" or "inter"."""
    intra = cluster.intra[collective]
    g = cluster.node_size
    if size * stride <= g:
        return intra, "intra"
    k = min(size, max(1, g // stride))      # members of this group on one node
    latency = max(intra.latency_s, cluster.inter_latency_s)
    if collective == "all_to_all":
        s_per_byte = max((k - 1) / size / intra.bus_bw_bytes_s, (size - k) / size / cluster.inter_bw_bytes_s)
        bw = ((size - 1) / size) / s_per_byte
    elif collective == "send_recv":
        bw = cluster.inter_bw_bytes_s
    else:
        bw = min(intra.bus_bw_bytes_s, k * cluster.inter_bw_bytes_s)
    return Link(bw, latency, f"{k} per node over {cluster.inter_bw_bytes_s / 1e9:.0f} GB/s NICs"), "inter"

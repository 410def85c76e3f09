"""How a training job is laid out: parallel degrees, batch, precision and recompute policy, as records.

Rank order follows Megatron-LM (`RankGenerator` order tp-cp-dp-pp; Narayanan et al. 2021 sec. 3, takeaway #1):
TP is innermost (consecutive ranks, inside one node), then CP, then DP, then PP outermost. Expert
parallelism is carved out of the DP x CP ranks right after TP (order tp-ep-dp-pp for expert layers).
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.calc.cluster import Cluster
from scalelab.calc.models import ModelSpec
from scalelab.calc.precision import Precision

DP_MODES = ("ddp", "zero1", "zero2", "fsdp")
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1                     # expert-parallel degree; divides dp x cp
    vpp: int = 1                    # virtual stages per pipeline rank (> 1: interleaved 1F1B)
    sp: bool = False                # sequence parallelism with TP (Korthikanti et al. 2022 sec. 4.2.2)
    dp_mode: str = "ddp"            # one of DP_MODES
    recompute: str = "selective"    # one of RECOMPUTE; "selective" = attention core not stored (FlashAttention)
    ep_overlap: bool = False        # EP all-to-all hidden behind compute (DeepSeek-V3 DualPipe, sec. 3.2.1)
    ddp_bucket_mib: float = 25.0    # torch DDP bucket_cap_mb default

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    # stride between consecutive members of each group, in ranks (Megatron order)
    @property
    def stride(self) -> dict[str, int]:
        # EDP: ranks holding the same experts, one per EP group
        return {"TP": 1, "CP": self.tp, "DP": self.tp, "EP": self.tp, "EDP": self.tp * self.ep,
                "PP": self.tp * self.cp * self.dp}

    def stage_layers(self, n_layers: int) -> int:
        """Layers on the fullest pipeline rank: ceil(L / (p·v)) per virtual stage, v stages."""
        return -(-n_layers // (self.pp * self.vpp)) * self.vpp

    def stage_moe_layers(self, n_layers: int, n_moe_layers: int) -> int:
        """MoE layers on the fullest pipeline rank (the dense ones are assumed to sit on the first stage)."""
        return min(self.stage_layers(n_layers), -(-n_moe_layers // (self.pp * self.vpp)) * self.vpp)

    def stage_imbalance(self, n_layers: int) -> float:
        """Fullest pipeline rank's share of the layers over the mean share (1 when p·v divides L)."""
        return self.stage_layers(n_layers) * self.pp / n_layers

    def check(self, n_gpus: int, n_layers: int, is_moe: bool) -> None:
        problems = []
        if self.world != n_gpus:
            problems.append(f"tp*pp*dp*cp = {self.world} but --gpus = {n_gpus}")
        if (self.dp * self.cp) % self.ep:
            problems.append(f"ep={self.ep} must divide dp*cp={self.dp * self.cp}")
        if self.ep > 1 and not is_moe:
            problems.append("ep > 1 needs a mixture-of-experts model")
        if n_layers < self.pp * self.vpp:
            problems.append(f"layers={n_layers} < pp*vpp={self.pp * self.vpp}")
        if self.dp_mode not in DP_MODES:
            problems.append(f"dp mode {self.dp_mode!r}; allowed: {', '.join(DP_MODES)}")
        if self.recompute not in RECOMPUTE:
            problems.append(f"recompute {self.recompute!r}; allowed: {', '.join(RECOMPUTE)}")
        if problems:
            raise ValueError("invalid layout: " + "; ".join(problems))


@dataclass(frozen=True)
class Batch:
    micro_batch: int                # sequences per micro-batch per model replica
    seq: int                        # tokens per sequence
    global_batch: int               # sequences per optimizer step, all replicas

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    def micro_batches(self, layout: Layout) -> int:
        """m: micro-batches per step per replica (gradient accumulation steps, or pipeline micro-batches)."""
        per = self.micro_batch * layout.dp
        if self.global_batch % per:
            raise ValueError(f"global batch {self.global_batch} is not a multiple of micro_batch*dp = {per}")
        return self.global_batch // per


@dataclass(frozen=True)
class TrainSetup:
    """Everything a step estimate depends on."""
    model: ModelSpec
    layout: Layout
    batch: Batch
    cluster: Cluster
    precision: Precision
    forward_only: bool = False      # one forward pass, no backward/optimizer (a benchmark of a layer stack)
    with_head: bool = True          # False: a bare layer stack, no embedding or output head
    dropout: bool = False           # dropout masks stored (Korthikanti's 34 assumes dropout; LLM pretraining uses none)

    def check(self) -> None:
        self.layout.check(self.cluster.n_gpus, self.model.n_layers, self.model.is_moe)
        self.batch.micro_batches(self.layout)
        if self.batch.seq % self.layout.cp:
            raise ValueError(f"invalid layout: seq={self.batch.seq} not divisible by cp={self.layout.cp}")

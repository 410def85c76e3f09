"""Data-parallel GRPO under torchrun: one process per GPU, each with its own rollout engine.

    torchrun --nproc-per-node N -m scalelab.cli grpo train --config ...

A step's P prompts are split into N contiguous shards (`shard`); prompt i's G completions stay on the rank
that owns prompt i, so each group's advantages (group-relative, advantages.py) are computed where its rewards
are, and equal the single-process ones. Every rank generates and scores its shard; the shards are gathered
into the whole batch (rank order = prompt order) on every rank, so the staleness queue, the step record and
the checkpoint hold the same whole batch at any world size, and a checkpoint resumes under any N.

The update is the single-process update on the whole batch. The loss of a rank is its share of the step's
loss: it is divided by the counts of the whole batch (tokens for token_mean, sequences for seq_mean and
seq_sum_norm; advantages.Normalizer), which every rank reads off the gathered batch. So the sum over ranks of
their gradients is the gradient of the full-batch loss, and the grads are all-reduced with SUM (not DDP's
mean, which would be right only for equal shards of a per-rank mean; P = 3 on 2 ranks gives shards of 2 and 1).

Why an explicit all-reduce and not DDP: the gradient is summed once per optimizer step after the micro-batch
backward passes (DDP would need no_sync on every micro-batch but the last); the model stays the plain peft/HF
module that the HF engine shares and whose adapters `disable_adapter` switches off for the reference pass
(DDP wraps it, and would reduce on every forward that builds a graph); and a LoRA policy has a few MB of
trainable weights, for which one bucketed all-reduce costs less than a millisecond on NVLink. What DDP would
add is overlap of the all-reduce with the backward pass, which pays for full-weight training of a large model.

Sampling: the HF engine draws the whole call's samples from one torch RNG stream, so a prompt's completions
depend on which prompts share the call, i.e. on N. Under torchrun (`Dist.prompt_seeds`) each prompt is
generated in its own call under a seed of (train.seed, step, position in the step's batch) (parts.py), so a
2-process run samples what a 1-process torchrun run samples. vLLM seeds a generator per request with the
request's seed, so one call per rank is already independent of N there (up to batch-dependent GPU numerics).
A plain launch (no torchrun) keeps the batched HF call and its per-step seed.

Only rank 0 writes the run folder (metrics, checkpoints, predictions, eval, results); the others hold a
`FollowerRunDir` that reads it and writes nothing. Each rank's engine files (server model folders, sync
folders) go to rollout/rank<r>/. The held-out evaluation runs on rank 0 alone: it is the single-process
evaluation, so its result (and a study's shared base result, heldout.base_key) does not depend on N.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as tdist

from scalelab.core.rundir import RunDir
from scalelab.grpo.capabilities import capabilities
from scalelab.grpo.telemetry import StepTiming
from scalelab.grpo.types import RolloutBatch

# Rank 0 evaluates the held-out split alone while the others wait in a collective; the default timeout
# (10 min for NCCL) would kill a long evaluation of a 7B model, so the wait may last this long.
TIMEOUT = timedelta(minutes=60)
BUCKET_BYTES = 64 * 2**20  # gradient all-reduce bucket


@dataclass(frozen=True)
class Dist:
    """This process's place in the run; the defaults are a plain single-process run (no collectives)."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"  # where collective tensors live: cuda:<local_rank> under NCCL
    prompt_seeds: bool = False  # one HF generate call per prompt under its own seed (launched by torchrun)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        tdist.all_gather_object(out, obj)
        return out

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks, in float64."""
        if not self.distributed:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        tdist.all_reduce(t)
        return t.tolist()

    def all_reduce_grads(self, params: Sequence[torch.Tensor]) -> None:
        """Sum every gradient over ranks, in flat buckets of one dtype. Parameters without a gradient are
        the same on every rank (the same model, every rank has >= 1 prompt) and are left out."""
        if not self.distributed:
            return
        for bucket in _buckets([p.grad for p in params if p.grad is not None]):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            tdist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def broadcast(self, params: Sequence[torch.Tensor]) -> None:
        """Rank 0's values into every rank's tensors (in place)."""
        if not self.distributed:
            return
        with torch.no_grad():
            for p in params:
                tdist.broadcast(p.data, src=0)

    def barrier(self) -> None:
        if self.distributed:
            tdist.barrier()


def _buckets(grads: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        if bucket and (g.dtype != bucket[0].dtype or size + g.numel() * g.element_size() > BUCKET_BYTES):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += g.numel() * g.element_size()
    if bucket:
        yield bucket


def wants_cuda(device: str) -> bool:
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


@contextmanager
def launch(train_device: str) -> Iterator[Dist]:
    """The process's `Dist` from torchrun's RANK / WORLD_SIZE / LOCAL_RANK (a plain run without them); with
    WORLD_SIZE > 1 the process group (NCCL on CUDA, gloo on CPU) lives for the block. Under CUDA the rank's
    GPU becomes the current device first, so a model loaded to 'cuda' lands on cuda:LOCAL_RANK."""
    if "RANK" not in os.environ:
        yield Dist()
        return
    rank, world = int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = wants_cuda(train_device)
    if cuda:
        torch.cuda.set_device(local)
    dist = Dist(rank, world, local, f"cuda:{local}" if cuda else "cpu", prompt_seeds=True)
    if world == 1:
        yield dist
        return
    tdist.init_process_group(backend="nccl" if cuda else "gloo", timeout=TIMEOUT)
    yield dist
    # Not in a `finally`: after an error the other ranks may sit in a collective, and tearing NCCL down under
    # them can block this process; exiting lets torchrun see the failure and stop the rest.
    tdist.destroy_process_group()


def env_rank() -> int:
    """This process's rank (0 without torchrun): who prints and writes the report."""
    return int(os.environ.get("RANK", "0"))


# ---------------------------------------------------------------------------------------------
# splitting a step's batch


def shard(n_prompts: int, rank: int, world: int) -> range:
    """Positions (in the step's prompt list) of `rank`'s prompts: contiguous, sizes differing by at most one
    (the first n % world ranks take one more), every position on exactly one rank."""
    base, extra = divmod(n_prompts, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def take_rows(batch: RolloutBatch, rows: range) -> RolloutBatch:
    """The batch restricted to sequences `rows` (group-major: prompt i's G sequences are rows iG .. iG+G-1)."""
    if rows == range(len(batch.texts)):
        return batch
    cut = slice(rows.start, rows.stop)
    return replace(batch, prompt_ids=batch.prompt_ids[cut], completion_ids=batch.completion_ids[cut],
                   texts=batch.texts[cut], logprobs=batch.logprobs[cut], finished=batch.finished[cut])


def join_batches(batches: Sequence[RolloutBatch], generation_ms: float) -> RolloutBatch:
    """Batches of one weights version, concatenated in order; `generation_ms` is the caller's (the max over
    ranks generating at once, the sum over calls made one after another)."""
    versions = {b.weights_version for b in batches}
    if len(versions) != 1:
        raise ValueError(f"joining rollout batches of different weights versions {sorted(versions)}")
    cat = lambda name: tuple(x for b in batches for x in getattr(b, name))  # noqa: E731
    return RolloutBatch(cat("prompt_ids"), cat("completion_ids"), cat("texts"), cat("logprobs"), cat("finished"),
                        generation_ms, batches[0].weights_version, batches[0].engine)


def max_timing(timings: Sequence[StepTiming]) -> StepTiming:
    """Each phase's slowest rank: the step waits for it."""
    return StepTiming(**{f.name: max(getattr(t, f.name) for t in timings) for f in dataclasses.fields(StepTiming)})


# ---------------------------------------------------------------------------------------------
# per-rank setup


def check_world(cfg: Any, dist: Dist) -> None:
    """What a data-parallel run of `cfg` cannot do, said before anything starts."""
    if not dist.distributed:
        return
    if cfg.data.prompts_per_step < dist.world:
        raise ValueError(f"data.prompts_per_step={cfg.data.prompts_per_step} is fewer than the {dist.world} "
                         f"ranks: every rank needs at least one prompt (whole groups stay on one rank)")
    caps = capabilities(cfg.rollout.engine)
    if not caps.torchrun:
        raise ValueError(f"rollout.engine={cfg.rollout.engine!r} under torchrun {caps.torchrun_refusal}")
    if caps.server_per_rank and cfg.rollout.server.gpus:
        raise ValueError(f"rollout.server.gpus={cfg.rollout.server.gpus!r} under torchrun: each rank starts its "
                         f"own server on its own GPU; leave it '' (one GPU list cannot name N servers' GPUs)")


def visible_gpu(local_rank: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of the rank's GPU (a child process inherits the parent's list)."""
    listed = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return listed[local_rank] if listed else str(local_rank)


def engine_config(cfg: Any, dist: Dist) -> Any:
    """The config the rank's engine is built from: a vLLM server per rank on the rank's GPU, on its own port."""
    if not dist.distributed or not capabilities(cfg.rollout.engine).server_per_rank:
        return cfg
    out = copy.deepcopy(cfg)
    s = out.rollout.server
    if dist.device.startswith("cuda"):
        s.gpus = visible_gpu(dist.local_rank)
    if s.port:
        s.port += dist.rank
    return out


def engine_dir(run_path: Path, dist: Dist) -> Path:
    return run_path / "rollout" if dist.is_main else run_path / "rollout" / f"rank{dist.rank}"


def scale_prediction(pred: dict, world: int, sequences_per_step: int) -> dict:
    """A per-rank prediction (one rank's share of the prompts) as the run's: phase times are the rank's (the
    ranks run side by side), rollout tokens/s is measured over all ranks (their tokens / the slowest rank)."""
    out = copy.deepcopy(pred)
    out["step"]["rollout_tokens_per_s"] *= world
    out["sequences_per_rank"], out["sequences_per_step"], out["world_size"] = (
        out["sequences_per_step"], sequences_per_step, world)
    out["assumptions"]["gradient_all_reduce"] = "not predicted (a LoRA policy's grads: < 1 ms on NVLink)"
    return out


class FollowerRunDir(RunDir):
    """A rank > 0's view of the run folder: it reads what rank 0 wrote and writes nothing."""

    def create(self, cfg: Any) -> "FollowerRunDir":
        return self

    def write_provenance(self, extra: dict | None = None) -> dict:
        return {}

    def write_predictions(self, predictions: dict, event: str = "predictions_written") -> str:
        return ""

    def log_event(self, event: str, **fields: Any) -> dict:
        return {"event": event, **fields}

    def write_results(self, results: dict) -> None:
        return None

    def write_report(self, markdown: str) -> Path:
        return self.path / "REPORT.md"

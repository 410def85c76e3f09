"""The GRPO loop: rollout (generate) -> reward (verify) -> update (policy gradient) -> weight sync, each timed.

Why our own loop and not TRL's GRPOTrainer: the experiments need (1) staleness k as an exact knob (a queue
of batches made by the weights of step t - k, checked per batch), (2) wall-clock per phase with GPU samples
tagged by phase, and (3) the weight sync as its own measured phase with a choice of method (shared module,
in-place copy, safetensors reload/restart, LoRA adapter). GRPOTrainer fuses generation, scoring and the
update inside `_prepare_inputs`/`training_step` and syncs weights internally, with no hook for any of the
three. The loss, advantages and aggregation are the same algorithm (advantages.py cites the papers).

Each step's record keeps every completion's length and every reward component's value per completion, so the
report draws real length distributions. With eval.at_end the base policy is scored on the held-out split before
step 0 and the trained one after the last step (heldout.py). With data.curriculum the prompts of a batch come
from the curriculum's current stage (curriculum.py), chosen when the batch is generated.

Under torchrun every rank runs this loop on its share of each step's prompts, and the update is the
single-process update on the whole batch (distributed.py says how, and why an explicit all-reduce).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from scalelab.core.config import ConfigError, config_hash
from scalelab.core.rundir import RunDir
from scalelab.evals.codetasks import sandbox_record
from scalelab.evals.tasks import get_task
from scalelab.grpo import curve, heldout
from scalelab.grpo.advantages import (LossSettings, Normalizer, group_advantages, grpo_loss, k3_kl,
                                      signal_groups, zero_signal_fraction)
from scalelab.grpo.batch import Micro, StepTensors, collate, frame_logprobs_entropy, frozen_logprobs, micro_batches
from scalelab.grpo.precision import compute_autocast
from scalelab.grpo.checkpoint import CHECKPOINT, find_checkpoint, load_checkpoint, save_checkpoint
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.curriculum import Curriculum
from scalelab.grpo.dynsample import Selection, selection, take_groups
from scalelab.grpo.distributed import (Dist, FollowerRunDir, check_world, engine_config, engine_dir, join_batches,
                                       launch, max_timing, scale_prediction, shard, take_rows)
from scalelab.grpo.layercompile import compile_layers
from scalelab.grpo.parts import (Parts, RewardFn, build_parts, encode_prompt, open_engine, prompt_indices,
                                sampling_for_prompt, sampling_for_step)
from scalelab.grpo.types import CurriculumStep, RolloutBatch, RolloutEngine, StepRecord
from scalelab.grpo.staleness import StalenessPipeline
from scalelab.grpo.telemetry import (GpuMonitor, PhaseTimer, gpu_phase_summary, length_stats, open_nvml,
                                     predict_step, samples_record, step_line)
from scalelab.grpo.weightsync import SyncRecord, sync_weights


# ---------------------------------------------------------------------------------------------
# reward


def score(texts: Sequence[str], examples: Sequence[Any],
          rewards: Sequence[tuple[str, float, RewardFn]]) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """(total reward (N,), each component's value per completion): total = sum of weight * component."""
    total = torch.zeros(len(texts))
    values = {}
    for name, weight, fn in rewards:
        v = [float(x) for x in fn(list(texts), list(examples))]
        if len(v) != len(texts):
            raise ValueError(f"reward {name!r} returned {len(v)} values for {len(texts)} completions")
        total += weight * torch.tensor(v)
        values[name] = v
    return total, values


@dataclass(frozen=True)
class Learned:
    """What learning from one batch gives the step record."""
    reward_mean: float
    reward_std: float
    zero_signal_frac: float
    adv_abs_mean: float
    lr: float
    values: dict[str, list[float]]  # each reward component's value per completion
    stats: dict[str, float]  # UpdateStats.summary() of the step's updates

    def metric(self, name: str) -> float:
        """A logged reward by its metrics.jsonl name: 'reward_mean' or 'reward/<component>'."""
        if name == "reward_mean":
            return self.reward_mean
        return float(np.mean(self.values[name.removeprefix("reward/")]))


def component_fields(values: dict[str, list[float]]) -> dict[str, Any]:
    """reward/<name> = the component's mean (the monitor reads these) plus every per-completion value."""
    return {"reward_components": {n: float(np.mean(v)) for n, v in values.items()},
            "completion_rewards": {n: tuple(round(x, 4) for x in v) for n, v in values.items()}}


# ---------------------------------------------------------------------------------------------
# update


@dataclass
class UpdateStats:
    loss: float = 0.0
    tokens: float = 0.0
    clipped: float = 0.0
    kl_sum: float = 0.0
    is_weight_sum: float = 0.0
    is_truncated: float = 0.0
    mismatch_k3_sum: float = 0.0  # k3 of current vs behaviour log-probs before the update
    mismatch_abs_sum: float = 0.0  # |current - behaviour| log-prob: sees fp32-level differences k3 rounds to 0
    entropy_sum: float = 0.0  # the policy's exact entropy over completion tokens, first update only
    entropy_tokens: float = 0.0
    seq_tokens: float = 0.0  # non-pad tokens through the forward passes
    padded_tokens: float = 0.0  # rows x cropped length, summed over the passes
    grad_norm: float = 0.0

    def summary(self) -> dict[str, float]:
        tok = max(self.tokens, 1.0)
        return {"loss": self.loss, "grad_norm": self.grad_norm, "clip_frac": self.clipped / tok,
                "kl_mean": self.kl_sum / tok, "entropy_mean": self.entropy_sum / max(self.entropy_tokens, 1.0),
                "is_weight_mean": self.is_weight_sum / tok,
                "is_truncated_frac": self.is_truncated / tok, "behavior_mismatch_k3": self.mismatch_k3_sum / tok,
                "behavior_logp_abs_diff": self.mismatch_abs_sum / tok,
                "update_tokens": int(self.seq_tokens), "update_padded_tokens": int(self.padded_tokens)}

    def summed(self, dist: Dist) -> "UpdateStats":
        """Every sum over all ranks (grad_norm is already the global one)."""
        names = [f.name for f in fields(self) if f.name != "grad_norm"]
        return replace(self, **dict(zip(names, dist.sum([getattr(self, n) for n in names]))))


def loss_settings(cfg: GrpoConfig) -> LossSettings:
    lc = cfg.loss
    return LossSettings(lc.clip_low, lc.clip_high, lc.kl_coef, lc.aggregation,
                        lc.is_cap if lc.is_correction else None)


def optimizer_step(policy: Any, t: StepTensors, optimizer: torch.optim.Optimizer, cfg: GrpoConfig,
                   old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None, first: bool,
                   norm: Normalizer | None = None, dist: Dist = Dist(),
                   micros: list[Micro] | None = None) -> UpdateStats:
    """One optimizer step over the whole batch, accumulated over micro-batches (the normalizer is the step's).

    Data-parallel: `t` is this rank's shard and `norm` the counts of the whole batch, so each rank's loss is
    its share of the whole-batch loss, and the SUM of the ranks' gradients is the whole-batch gradient."""
    norm = norm or Normalizer(t.n, int(t.mask.sum()), cfg.rollout.max_new_tokens)
    settings, stats = loss_settings(cfg), UpdateStats()
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    for m in step_micros(t, cfg) if micros is None else micros:
        with compute_autocast(policy, cfg.optim.bf16_autocast):
            logp, entropy = frame_logprobs_entropy(policy, t, m, cfg.rollout.temperature, entropy=first,
                                                   compile_head=cfg.optim.compile_head)
        old = m.take(old_logp) if old_logp is not None else logp.detach()
        terms = grpo_loss(logp, old, t.advantages[m.rows], m.take(t.mask), norm, settings,
                          behavior_logp=m.take(t.behavior_logp),
                          ref_logp=None if ref_logp is None else m.take(ref_logp))
        terms.loss.backward()
        stats.loss += float(terms.loss.detach())
        stats.tokens += terms.tokens
        stats.clipped += terms.clipped_tokens
        stats.kl_sum += terms.kl_sum
        stats.is_weight_sum += terms.is_weight_sum
        stats.is_truncated += terms.is_truncated_tokens
        stats.seq_tokens += float(t.attention_mask[m.rows].sum())
        stats.padded_tokens += float(len(m.rows) * m.length)
        if first:
            behavior, current, mask = m.take(t.behavior_logp), logp.detach(), m.take(t.mask)
            stats.mismatch_k3_sum += float((k3_kl(behavior, current) * mask).sum())
            stats.mismatch_abs_sum += float(((behavior - current).abs() * mask).sum())
            stats.entropy_sum += float((entropy * mask).sum())
            stats.entropy_tokens += float(mask.sum())
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:  # a rank whose rows were all skipped (loss.skip_zero_signal) still joins the reduction
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    dist.all_reduce_grads(params)
    stats = stats.summed(dist)
    stats.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or math.inf))
    optimizer.step()
    return stats


def step_micros(t: StepTensors, cfg: GrpoConfig, rows: Sequence[int] | None = None) -> list[Micro]:
    return micro_batches(t, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens, rows)


def signal_rows(rewards: torch.Tensor, group_size: int) -> list[int]:
    """Rows (of the whole batch) whose group's rewards are not all equal: the rows a zero advantage spares."""
    return [g * group_size + j for g, keep in enumerate(signal_groups(rewards, group_size).tolist()) if keep
            for j in range(group_size)]


def make_optimizer(policy: Any, cfg: GrpoConfig) -> torch.optim.Optimizer:
    o = cfg.optim
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)


def lr_at(step: int, cfg: GrpoConfig) -> float:
    warm = cfg.optim.warmup_steps
    return cfg.optim.lr * min(1.0, (step + 1) / warm) if warm else cfg.optim.lr


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass(frozen=True)
class BatchPlan:
    """Which examples a queued batch was generated from: its curriculum stage and indices into that pool."""
    stage: int
    indices: tuple[int, ...]


@dataclass
class Loop:
    """Everything one run's steps share."""
    cfg: GrpoConfig
    parts: Parts
    run: RunDir
    engine: RolloutEngine
    sync_method: str
    optimizer: torch.optim.Optimizer
    pipe: StalenessPipeline
    monitor: GpuMonitor
    device: torch.device
    curriculum: Curriculum | None = None
    plans: dict[int, BatchPlan] = field(default_factory=dict)  # queued batches (staleness pipeline) by step
    dist: Dist = Dist()
    engine_dir: Path = Path("rollout")  # this rank's engine files
    rank_rollout: dict[int, dict] = field(default_factory=dict)  # per-rank ms and tokens of queued batches

    @property
    def checkpoint_path(self) -> Path:
        return self.run.path / CHECKPOINT

    def state_dict(self) -> dict:
        return {"plans": {s: [p.stage, list(p.indices)] for s, p in self.plans.items()},
                "curriculum": self.curriculum.state_dict() if self.curriculum else None,
                "world_size": self.dist.world}  # informational: the queue holds whole batches, any N resumes

    def load_state_dict(self, state: dict) -> None:
        self.plans = {int(s): BatchPlan(int(st), tuple(ix)) for s, (st, ix) in state.get("plans", {}).items()}
        if self.curriculum is not None and state.get("curriculum"):
            self.curriculum.load_state_dict(state["curriculum"])


def plan_batch(loop: Loop, step: int) -> BatchPlan:
    stage = loop.curriculum.stage if loop.curriculum else 0
    n = len(loop.parts.pool(stage))
    return BatchPlan(stage, tuple(prompt_indices(n, step, loop.cfg.rollout_prompts_per_step, loop.cfg.train.seed)))


def keep_signal_groups(loop: Loop, batch: RolloutBatch, plan: BatchPlan,
                       timer: PhaseTimer) -> tuple[RolloutBatch, BatchPlan, Selection | None]:
    """With data.oversample > 1: the step's P groups out of those rolled out (dynsample.py), scored here to
    choose (the kept ones are scored again in learn: the same rewards, ~0.1 ms a sequence)."""
    cfg = loop.cfg
    if cfg.data.oversample <= 1.0:
        return batch, plan, None
    with timer.phase("reward"):
        rewards, _ = score_shard(loop, batch, plan, range(len(plan.indices)))
    chosen = selection(rewards, cfg.rollout.group_size, cfg.data.prompts_per_step)
    return (take_groups(batch, chosen.kept, cfg.rollout.group_size),
            BatchPlan(plan.stage, tuple(plan.indices[g] for g in chosen.kept)), chosen)


def rollout(loop: Loop, prompts: list[list[int]], positions: range, step: int) -> RolloutBatch:
    """This rank's prompts (at `positions` of `step`'s batch). With prompt seeds the HF engine gets one call
    per prompt under the prompt's own seed, since its sampler draws a whole call from one RNG stream; vLLM
    seeds each request's generator itself, so one call keeps each prompt's samples its own (distributed.py)."""
    cfg, engine = loop.cfg, loop.engine
    if not (loop.dist.prompt_seeds and not engine.capabilities.seeds_per_request):
        return engine.generate(prompts, sampling_for_step(cfg, step))
    calls = [engine.generate([p], sampling_for_prompt(cfg, step, j)) for p, j in zip(prompts, positions)]
    return join_batches(calls, sum(b.generation_ms for b in calls))


def generate_due(loop: Loop, step: int, timer: PhaseTimer) -> int:
    """Generate every batch the pipeline needs from the current weights (version `step`); tokens made. Each
    rank generates its shard; the queue holds the whole batch, gathered in prompt order."""
    cfg, parts, dist, tokens = loop.cfg, loop.parts, loop.dist, 0
    with timer.phase("rollout"):
        for s in loop.pipe.due(step, cfg.train.max_steps):
            plan = loop.plans[s] = plan_batch(loop, s)
            pool = parts.pool(plan.stage)
            mine = shard(len(plan.indices), dist.rank, dist.world)
            prompts = [encode_prompt(parts.tokenizer, pool[plan.indices[j]].prompt) for j in mine]
            shards = dist.gather(rollout(loop, prompts, mine, s))
            batch = join_batches(shards, max(b.generation_ms for b in shards))  # the ranks generate side by side
            loop.rank_rollout[s] = {"rank_rollout_ms": [b.generation_ms for b in shards],
                                    "rank_rollout_tokens": [b.num_tokens for b in shards]}
            loop.pipe.put(s, batch)
            tokens += batch.num_tokens
    return tokens


def score_shard(loop: Loop, batch: RolloutBatch, plan: BatchPlan,
                mine: range) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Rewards of the whole batch, (N,) and per component: each rank scores its rows, then they are gathered."""
    G, pool = loop.cfg.rollout.group_size, loop.parts.pool(plan.stage)
    rows = take_rows(batch, range(mine.start * G, mine.stop * G))
    examples = [pool[plan.indices[j]] for j in mine for _ in range(G)]
    shards = loop.dist.gather(score(rows.texts, examples, loop.parts.rewards))
    values = {name: [v for _, vals in shards for v in vals[name]] for name in shards[0][1]}
    return torch.cat([r for r, _ in shards]), values


def learn(loop: Loop, step: int, batch: RolloutBatch, plan: BatchPlan, timer: PhaseTimer) -> Learned:
    """Reward, advantages, reference/old passes and the optimizer step(s) on one batch (this rank's shard of
    it; the statistics are the whole batch's)."""
    cfg, parts, G = loop.cfg, loop.parts, loop.cfg.rollout.group_size
    mine = shard(len(plan.indices), loop.dist.rank, loop.dist.world)
    with timer.phase("reward"):
        rewards, values = score_shard(loop, batch, plan, mine)
    adv = group_advantages(rewards, G, cfg.loss.scale_rewards)  # (N,) whole groups: as one process computes it
    rows = range(mine.start * G, mine.stop * G)
    pad = parts.tokenizer.pad_token_id if parts.tokenizer.pad_token_id is not None else 0
    t = collate(take_rows(batch, rows), adv[rows.start:rows.stop], pad, loop.device)
    norm = Normalizer(len(batch.texts), batch.num_tokens, cfg.rollout.max_new_tokens)  # the whole batch's counts
    kept = None
    if cfg.loss.skip_zero_signal:
        kept = signal_rows(rewards, G)
        norm = Normalizer(len(kept), sum(batch.lengths[i] for i in kept), cfg.rollout.max_new_tokens)
        kept = [i - rows.start for i in kept if i in rows]  # this rank's, as rows of t
    ref_logp = old_logp = None
    micros = step_micros(t, cfg, kept)
    if cfg.loss.kl_coef > 0 or cfg.loss.log_kl:  # at kl_coef 0 the KL is logged, its gradient is 0
        with timer.phase("reference"):
            ref_model = parts.reference if parts.reference is not None else parts.policy
            ref_logp = frozen_logprobs(ref_model, t, cfg.rollout.temperature, micros,
                                       adapters_off=parts.reference is None, autocast=cfg.optim.bf16_autocast,
                                       compile_head=cfg.optim.compile_head)
    if cfg.loss.updates_per_batch > 1:
        with timer.phase("old_logprob"):
            old_logp = frozen_logprobs(parts.policy, t, cfg.rollout.temperature, micros, False,
                                       autocast=cfg.optim.bf16_autocast, compile_head=cfg.optim.compile_head)
    with timer.phase("update"):
        for g in loop.optimizer.param_groups:
            g["lr"] = lr_at(step, cfg)
        updates = [optimizer_step(parts.policy, t, loop.optimizer, cfg, old_logp, ref_logp, first=(u == 0),
                                  norm=norm, dist=loop.dist, micros=micros) for u in range(cfg.loss.updates_per_batch)]
    stats = {**updates[0].summary(), "loss": updates[-1].loss, "grad_norm": updates[-1].grad_norm}
    return Learned(float(rewards.mean()), float(rewards.std()), zero_signal_fraction(rewards, cfg.rollout.group_size),
                   float(adv.abs().mean()), lr_at(step, cfg), values, stats)


def advance_curriculum(loop: Loop, step: int, plan: BatchPlan, learned: Learned) -> CurriculumStep | None:
    """Feed the step's metric to the curriculum; only batches of the current stage count toward promotion
    (with staleness k the first k batches after a promotion were generated at the previous stage)."""
    c = loop.curriculum
    if c is None:
        return None
    promoted, rolling = False, None
    if plan.stage == c.stage:
        promoted, rolling = c.observe(step, learned.metric(loop.cfg.data.curriculum.metric))
    return CurriculumStep(plan.stage, rolling, promoted, c.stage)


def run_step(loop: Loop, step: int) -> StepRecord:
    cfg = loop.cfg
    timer = PhaseTimer(loop.monitor)
    generated_tokens = generate_due(loop, step, timer)
    generated, plan = loop.pipe.take(step), loop.plans.pop(step)
    batch, plan, chosen = keep_signal_groups(loop, generated, plan, timer)
    learned = learn(loop, step, batch, plan, timer)
    curriculum = advance_curriculum(loop, step, plan, learned)
    sync: SyncRecord | None = None
    if step + 1 < cfg.train.max_steps:
        with timer.phase("weight_sync"):
            sync = sync_weights(loop.sync_method, loop.parts.policy, loop.engine, step + 1, loop.engine_dir / "sync")
    timing = max_timing(loop.dist.gather(timer.timing()))
    per_rank = loop.rank_rollout.pop(step, {})
    per_rank = per_rank if loop.dist.distributed else {}  # one rank: its numbers are the step's
    samples = loop.monitor.drain()
    rec = StepRecord(
        step=step, rollout_version=batch.weights_version, staleness=cfg.rollout.staleness, **asdict(timing),
        overlapped_step_ms=timing.overlapped_step_ms, rollout_tokens=generated.num_tokens,
        rollout_tokens_per_s=generated.tokens_per_s, generated_tokens_this_step=generated_tokens,
        finished_frac=float(np.mean(batch.finished)), **length_stats(batch.lengths),
        completion_lengths=batch.lengths, reward_mean=learned.reward_mean, reward_std=learned.reward_std,
        zero_signal_frac=learned.zero_signal_frac, adv_abs_mean=learned.adv_abs_mean, lr=learned.lr,
        **component_fields(learned.values), **learned.stats, curriculum=curriculum,
        example_ids=tuple(str(loop.parts.pool(plan.stage)[i].id) for i in plan.indices),
        sync_bytes=sync.bytes if sync else 0, sync_restarted=bool(sync and sync.restarted),
        **{k: tuple(v) for k, v in per_rank.items()}, gpu=gpu_phase_summary(samples) if samples else None,
        generated_groups=chosen.generated_groups if chosen else None,
        generated_zero_signal_frac=chosen.generated_zero_signal_frac if chosen else None)
    if samples:
        loop.run.log_event("gpu_samples", step=step, **samples_record(samples))
    return rec


def check_queue(pipe: StalenessPipeline, start: int, max_steps: int) -> None:
    """Batches a resumed run needs from older weights must be in the checkpoint's queue."""
    missing = [s for s in range(start, min(start + pipe.k, max_steps)) if s not in pipe.pending]
    if missing:
        raise ValueError(f"resuming at step {start} with staleness {pipe.k}: the batches for steps {missing} were "
                         f"never generated (the run was planned for fewer steps), and the weights that should make "
                         f"them are gone; extend a stale run by starting a new one")


def make_curriculum(cfg: GrpoConfig, parts: Parts) -> Curriculum | None:
    c = cfg.data.curriculum
    if not c.enabled:
        return None
    if not parts.stages or len(parts.stages) != len(c.levels) + 1:
        raise ValueError(f"data.curriculum has {len(c.levels) + 1} stages but the run's parts hold "
                         f"{len(parts.stages or [])} example pools")
    return Curriculum(len(parts.stages), c.promote_at, c.window)


def start_loop(cfg: GrpoConfig, parts: Parts, run: RunDir, dist: Dist = Dist()) -> tuple[Loop, int]:
    """Optimizer, queue and (on resume) the checkpoint; then the engine, synced to the current weights. Every
    rank reads the checkpoint; rank 0's trainable weights are then broadcast (as DDP does at construction)."""
    if cfg.data.oversample > 1.0 and dist.world > 1:
        raise ConfigError(f"config field 'data.oversample' = {cfg.data.oversample}: the choice of groups runs in one "
                          f"process; this run has {dist.world} (set it to 1 under torchrun)")
    pipe = StalenessPipeline(cfg.rollout.staleness)
    optimizer = make_optimizer(parts.policy, cfg)
    start, ckpt, state = 0, find_checkpoint(run.path) if cfg.train.resume else None, {}
    if ckpt is not None:
        start, saved_hash, state = load_checkpoint(ckpt, parts.policy, optimizer, pipe)
        run.log_event("resumed", step=start, config_changed=saved_hash != config_hash(cfg),
                      **({"world_size": dist.world, "saved_world_size": state.get("world_size", 1)}
                         if dist.prompt_seeds else {}))
        check_queue(pipe, start, cfg.train.max_steps)
    dist.broadcast([p for p in parts.policy.parameters() if p.requires_grad])
    curriculum = make_curriculum(cfg, parts)
    workdir = engine_dir(run.path, dist)
    engine, method = open_engine(engine_config(cfg, dist), parts, workdir, start, run.log_event)
    if n_compiled := compile_policy_layers(cfg, parts.policy):  # after the engine took any copy of the policy
        run.log_event("compile_layers", layers=n_compiled)
    # every rank sees the same GPUs (torchrun gives them one CUDA_VISIBLE_DEVICES): rank 0 samples them all
    sampler, reason = open_nvml() if dist.is_main else (None, f"rank {dist.rank}: rank 0 samples every GPU")
    monitor = GpuMonitor(sampler, cfg.train.gpu_sample_hz, reason).start()
    run.log_event("gpu_monitor", available=monitor.available, reason=reason, hz=cfg.train.gpu_sample_hz)
    if (sandbox := sandbox_record(get_task(cfg.data.task, **cfg.data.task_options))) is not None:
        run.log_event("sandbox", **sandbox)  # how the rewards' code runs were confined on this host
    device = next(parts.policy.parameters()).device
    loop = Loop(cfg, parts, run, engine, method, optimizer, pipe, monitor, device, curriculum, dist=dist,
                engine_dir=workdir)
    loop.load_state_dict(state)
    for s in pipe.pending:  # a checkpoint from before plans were saved: its batches came from the one pool
        loop.plans.setdefault(s, BatchPlan(0, tuple(prompt_indices(len(parts.pool(0)), s, cfg.rollout_prompts_per_step,
                                                                   cfg.train.seed))))
    return loop, start


_LAYERS_BACKEND_OFF_CUDA: str | None = None  # tests: compile the layers off CUDA too, with this backend


def compile_policy_layers(cfg: GrpoConfig, policy: Any) -> int:
    """optim.compile_layers: the policy's decoder layers through torch.compile (grpo.layercompile) when it sits on
    a CUDA device; the number of layers routed, 0 when off. On the CPU the update is not launch-bound and
    Inductor's first compile is long, so off CUDA only a test's _LAYERS_BACKEND_OFF_CUDA turns it on."""
    if not cfg.optim.compile_layers:
        return 0
    if next(policy.parameters()).device.type == "cuda":
        return compile_layers(policy)
    return compile_layers(policy, _LAYERS_BACKEND_OFF_CUDA) if _LAYERS_BACKEND_OFF_CUDA else 0


def write_predictions(cfg: GrpoConfig, parts: Parts, run: RunDir, world: int = 1) -> None:
    """predictions.json before the engine starts and before step 0 (kept, never rewritten, on resume). With
    N ranks: the step of the rank with the most prompts, and rollout tokens/s over all ranks."""
    if (run.path / "predictions.json").is_file():
        return
    pool = parts.pool(0)
    idx = prompt_indices(len(pool), 0, cfg.data.prompts_per_step, cfg.train.seed)
    prompt_len = float(np.mean([len(encode_prompt(parts.tokenizer, pool[i].prompt)) for i in idx]))
    device = next(parts.policy.parameters()).device
    rank_cfg = cfg
    if world > 1:
        rank_cfg = copy.deepcopy(cfg)
        rank_cfg.data.prompts_per_step = len(shard(cfg.data.prompts_per_step, 0, world))
    pred = predict_step(rank_cfg, parts.policy, prompt_len, device.type)
    run.write_predictions(pred if world == 1 else scale_prediction(pred, world, cfg.sequences_per_step))


# ---------------------------------------------------------------------------------------------
# held-out evaluation inside the run (eval.at_end)


def run_eval(loop: Loop, policy: str) -> heldout.PolicyEval:
    cfg, parts = loop.cfg, loop.parts
    if parts.heldout is None:
        raise ValueError("eval.at_end needs the held-out examples in the run's parts (build_parts loads them)")
    loop.monitor.mark("eval")
    try:
        ev = heldout.evaluate_policy(loop.engine, parts.tokenizer, parts.heldout,
                                     heldout.EvalSettings.from_config(cfg), policy, heldout.base_key(cfg),
                                     cfg.eval.split)
    finally:
        loop.monitor.mark("other")
    heldout.save_eval(loop.run.path, ev)
    loop.run.log_event("heldout_eval", policy=policy, weights_version=ev.weights_version, split=ev.split,
                       greedy_pass1=ev.greedy_pass1, sampled_pass1=ev.sampled_pass1, wall_s=ev.wall_s)
    samples = loop.monitor.drain()
    if samples:
        loop.run.log_event("gpu_samples", step=-1, **samples_record(samples))
    return ev


def eval_base(loop: Loop) -> None:
    if heldout.load_eval(loop.run.path, "base", heldout.base_key(loop.cfg)) is None:
        run_eval(loop, "base")


def log_curve(loop: Loop, steps_done: int, log: Callable[[str], None],
              ev: heldout.PolicyEval | None = None) -> None:
    """A held-out curve point for the policy after `steps_done` steps (eval.every), read off `ev` (an evaluation of
    those weights) when it covers the curve's examples, its first ones. Step 0 reads the base evaluation; with
    eval.at_end the last step is left to eval_trained, which passes the trained evaluation."""
    cfg = loop.cfg
    if not (loop.dist.is_main and curve.due(cfg, steps_done)):
        return
    if ev is None and steps_done == 0:
        ev = heldout.load_eval(loop.run.path, "base", heldout.base_key(cfg))
    if ev is None and steps_done == cfg.train.max_steps and cfg.eval.at_end:
        return
    if ev is not None and len(ev.examples) >= cfg.eval.curve_limit:
        pt = curve.point(ev, cfg, steps_done, f"{ev.policy} evaluation")
    else:
        if loop.engine.weights_version != steps_done:
            sync_weights(loop.sync_method, loop.parts.policy, loop.engine, steps_done, loop.engine_dir / "sync")
        loop.monitor.mark("eval")
        try:
            pt = curve.measure(loop.engine, loop.parts.tokenizer, loop.parts.heldout, cfg, steps_done)
        finally:
            loop.monitor.mark("other")
    loop.run.log_event("heldout_curve", **pt)
    log(f"held-out curve, step {steps_done}: greedy pass@1 {pt['greedy_pass1']:.1%} on {pt['n']} examples")


def eval_trained(loop: Loop, log: Callable[[str], None]) -> None:
    cfg, run, final = loop.cfg, loop.run, loop.cfg.train.max_steps
    trained = heldout.load_eval(run.path, "trained", heldout.base_key(cfg))
    if trained is None or trained.weights_version != final:
        if loop.engine.weights_version != final:
            sync_weights(loop.sync_method, loop.parts.policy, loop.engine, final, loop.engine_dir / "sync")
        trained = run_eval(loop, "trained")
    log_curve(loop, final, log, trained)
    base = heldout.load_eval(run.path, "base", heldout.base_key(cfg))
    if base is None:
        log(f"no base evaluation in {run.path / 'eval'}; `scalelab grpo eval {run.path}` makes it")
        return
    summary = heldout.compare(base, trained, cfg)
    heldout.save_summary(run.path, summary)
    log(heldout.headline(summary))


# ---------------------------------------------------------------------------------------------
# the run


def train(cfg: GrpoConfig, parts: Parts | None = None, log: Callable[[str], None] = print,
          dist: Dist | None = None) -> dict:
    """Run (or resume) the GRPO run `cfg` describes; returns results.json's content (rank 0; {} elsewhere).
    `dist` None: this process's place from torchrun's environment (a plain run without it)."""
    if dist is None:
        with launch(cfg.train.device) as dist:
            return train(cfg, parts, log, dist)
    launched = time.perf_counter()  # train.budget_s counts from here: model load and engine start included
    check_world(cfg, dist)
    if cfg.train.torch_threads:
        torch.set_num_threads(cfg.train.torch_threads)
    parts = parts or build_parts(cfg)
    run = (RunDir if dist.is_main else FollowerRunDir)(cfg.run_dir).create(cfg)
    log = log if dist.is_main else (lambda line: None)
    if not (run.path / "provenance.json").is_file():
        run.write_provenance({"model": cfg.model.name, "task": cfg.data.task, "engine": cfg.rollout.engine,
                              "world_size": dist.world})
    if dist.is_main:
        write_predictions(cfg, parts, run, dist.world)
    if dist.prompt_seeds:
        run.log_event("data_parallel", world_size=dist.world, device=dist.device, prompt_seeds=dist.prompt_seeds,
                      prompts_per_rank=[len(shard(cfg.data.prompts_per_step, r, dist.world))
                                        for r in range(dist.world)])
    loop, start = start_loop(cfg, parts, run, dist)
    t0 = time.perf_counter()
    try:
        finished = run_steps(loop, start, log, launched)
        if cfg.eval.at_end and finished and dist.is_main:
            eval_trained(loop, log)
        dist.barrier()  # the others wait for rank 0's evaluation (distributed.TIMEOUT)
    finally:
        loop.monitor.stop()
        loop.engine.close()
    if not dist.is_main:
        return {}
    results = summarize(run, time.perf_counter() - t0)
    run.write_results(results)
    return results


def over_budget(cfg: GrpoConfig, t0: float, dist: Dist) -> bool:
    """Whether train.budget_s has passed since `t0`; every rank takes rank 0's answer, so all stop together."""
    if not cfg.train.budget_s:
        return False
    return dist.sum([float(dist.is_main and time.perf_counter() - t0 > cfg.train.budget_s)])[0] > 0


def run_steps(loop: Loop, start: int, log: Callable[[str], None], launched: float | None = None) -> bool:
    """Steps `start`.. to the end, a checkpoint (rank 0) every train.checkpoint_every and after the last; with
    train.budget_s, also after the step that passed the budget, and then stop. True when the last step ran."""
    cfg, run = loop.cfg, loop.run
    t0 = time.perf_counter() if launched is None else launched
    if cfg.eval.at_end and start == 0 and loop.dist.is_main:
        eval_base(loop)
    if start == 0:
        log_curve(loop, 0, log)
    for step in range(start, cfg.train.max_steps):
        rec = run_step(loop, step)
        run.log_event("grpo_step", **rec.to_json())
        log(step_line(rec))
        log_curve(loop, step + 1, log)
        every, last = cfg.train.checkpoint_every, step + 1 == cfg.train.max_steps
        stop = not last and over_budget(cfg, t0, loop.dist)
        if loop.dist.is_main and (last or stop or (every and (step + 1) % every == 0)):
            save_checkpoint(loop.checkpoint_path, loop.parts.policy, loop.optimizer, step + 1, loop.pipe,
                            config_hash(cfg), loop.state_dict())
        if stop:
            run.log_event("budget_stop", next_step=step + 1, budget_s=cfg.train.budget_s)
            log(f"train.budget_s={cfg.train.budget_s:g} passed after step {step}: checkpoint saved; run the same "
                f"command to continue at step {step + 1}")
            return False
    return True


def summarize(run: RunDir, wall_s: float) -> dict:
    """results.json from metrics.jsonl (all steps, also those before a resume) and eval/summary.json."""
    records = (StepRecord.from_json(e, f"{run.metrics_path} step event") for e in run.events("grpo_step"))
    by_step = {s.step: s for s in records}  # a step re-run after a crash: the last record
    steps = [by_step[k] for k in sorted(by_step)]
    if not steps:
        return {"steps": 0}
    med = lambda k: float(np.median([getattr(s, k) for s in steps]))  # noqa: E731
    quarter = max(1, len(steps) // 4)
    out = {"steps": len(steps), "wall_s_this_launch": wall_s,
           "reward_first_quarter": float(np.mean([s.reward_mean for s in steps[:quarter]])),
           "reward_last_quarter": float(np.mean([s.reward_mean for s in steps[-quarter:]])),
           **{f"median_{k}": med(k) for k in ("rollout_ms", "reward_ms", "reference_ms", "update_ms",
                                               "weight_sync_ms", "step_ms", "rollout_tokens_per_s",
                                               "overlapped_step_ms")},
           "predictions": run.read_optional("predictions.json")}
    if steps[-1].curriculum is not None:
        out["curriculum_final_stage"] = int(steps[-1].curriculum.next_stage)
    summary = run.read_optional("eval/summary.json")
    if summary is not None:
        out["heldout"] = summary
    return out

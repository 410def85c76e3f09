"""The GRPO loop: rollout (generate) -> reward (verify) -> update (policy gradient) -> weight sync, each timed.

Why our own loop and not TRL's GRPOTrainer: the experiments need (1) staleness k as an exact knob (a queue
of batches made by the weights of step t - k, checked per batch), (2) wall-clock per phase with GPU samples
tagged by phase, and (3) the weight sync as its own measured phase with a choice of method (shared module,
in-place copy, safetensors reload/restart, LoRA adapter). GRPOTrainer fuses generation, scoring and the
update inside `_prepare_inputs`/`training_step` and syncs weights internally, with no hook for any of the
three. The loss, advantages and aggregation are the same algorithm (advantages.py cites the papers).

Layout of one step's tensors (N = P * G sequences, right-padded [prompt | completion | pad], length L):
the loss only needs positions that predict completion tokens, so everything per token lives in a frame of
W = L - p_min positions starting at p_min - 1 (p_min = shortest prompt of the step): frame column j holds
the log-probability of token p_min + j.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from scalelab.core.config import config_hash
from scalelab.core.rundir import RunDir
from scalelab.grpo.advantages import (LossSettings, Normalizer, group_advantages, grpo_loss, k3_kl,
                                      token_logprobs, zero_signal_fraction)
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.rollout import EngineContext, RolloutBatch, SamplingParams, build_engine
from scalelab.grpo.staleness import StalenessPipeline
from scalelab.grpo.telemetry import (GpuMonitor, PhaseTimer, gpu_phase_summary, length_stats, open_nvml,
                                     predict_step, samples_record, step_line)
from scalelab.grpo.weightsync import SyncRecord, resolve_method, sync_weights

RewardFn = Callable[[list[str], list[Any]], list[float]]


# ---------------------------------------------------------------------------------------------
# parts: model, reference, data, rewards


@dataclass
class Parts:
    policy: Any  # HF causal LM, peft-wrapped when LoRA
    tokenizer: Any
    examples: list[Any]  # evals Example-like: .prompt is a chat message list
    rewards: list[tuple[str, float, RewardFn]]  # (name, weight, fn)
    reference: Any = None  # frozen copy for full-weight training with kl_coef > 0; None with LoRA


def apply_lora(model: Any, lora: Any) -> Any:
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def prepare_policy(model: Any, cfg: GrpoConfig) -> tuple[Any, Any]:
    """(policy, reference): LoRA -> peft model and no reference copy (adapters off = the base)."""
    if cfg.model.lora.enabled:
        return apply_lora(model, cfg.model.lora), None
    reference = None
    if cfg.loss.kl_coef > 0:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    return model, reference


def reward_functions(cfg: GrpoConfig) -> list[tuple[str, float, RewardFn]]:
    from scalelab.evals import rewards
    weights = cfg.data.reward_weights or [1.0] * len(cfg.data.rewards)
    options = cfg.data.reward_options
    return [(name, w, rewards.get_reward(name, **options.get(name, {}))) for name, w in zip(cfg.data.rewards, weights)]


def build_parts(cfg: GrpoConfig) -> Parts:
    """Model (core.hfmodel), task examples (evals.tasks) and reward functions (evals.rewards) by name."""
    from scalelab.core.hfmodel import load_causal_lm
    from scalelab.evals.tasks import get_task
    torch.manual_seed(cfg.train.seed)  # LoRA init
    model, tokenizer = load_causal_lm(cfg.model.name, cfg.model.dtype, cfg.train.device,
                                      cfg.model.cache_dir or None)
    policy, reference = prepare_policy(model, cfg)
    examples = get_task(cfg.data.task, **cfg.data.task_options).load(cfg.data.split, source=cfg.data.source, limit=cfg.data.limit or None,
                                            seed=cfg.train.seed)
    return Parts(policy, tokenizer, list(examples), reward_functions(cfg), reference)


# ---------------------------------------------------------------------------------------------
# prompts


def encode_prompt(tokenizer: Any, messages: Any) -> list[int]:
    """Chat-templated prompt ids, ending with the assistant header the completion continues."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_indices(n_examples: int, step: int, per_step: int, seed: int) -> list[int]:
    """Examples of `step`: consecutive slices of a seeded permutation per epoch, a pure function of step."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n_examples)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(n_examples)[pos]))
    return out


def sampling_for_step(cfg: GrpoConfig, step: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(n=r.group_size, temperature=r.temperature, top_p=r.top_p,
                          max_new_tokens=r.max_new_tokens, seed=cfg.train.seed * 1_000_003 + step)


# ---------------------------------------------------------------------------------------------
# tensors of one step


@dataclass(frozen=True)
class StepTensors:
    input_ids: torch.Tensor  # (N, L) right-padded
    attention_mask: torch.Tensor  # (N, L)
    targets: torch.Tensor  # (N, W) token predicted at each frame column
    mask: torch.Tensor  # (N, W) 1 on completion tokens
    behavior_logp: torch.Tensor  # (N, W) from the rollout engine
    advantages: torch.Tensor  # (N,)
    keep: int  # logits_to_keep = W + 1

    @property
    def n(self) -> int:
        return self.input_ids.shape[0]


def collate(batch: RolloutBatch, advantages: torch.Tensor, pad_id: int, device: torch.device) -> StepTensors:
    rows = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    L, p_min = max(len(r) for r in rows), min(len(p) for p in batch.prompt_ids)
    W = L - p_min
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    mask, behav = torch.zeros((len(rows), W)), torch.zeros((len(rows), W))
    for i, (p, c, lp) in enumerate(zip(batch.prompt_ids, batch.completion_ids, batch.logprobs)):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        attn[i, :len(p) + len(c)] = 1
        start = len(p) - p_min  # frame column of the first completion token
        mask[i, start:start + len(c)] = 1
        behav[i, start:start + len(c)] = torch.tensor(lp, dtype=torch.float32)
    targets = ids[:, p_min:]
    return StepTensors(ids.to(device), attn.to(device), targets.to(device), mask.to(device), behav.to(device),
                       advantages.to(device), W + 1)


def frame_logprobs(model: Any, t: StepTensors, rows: slice, temperature: float) -> torch.Tensor:
    """(n, W) log softmax(logits / T) of each frame target under `model` (graph kept when grad is on)."""
    out = model(input_ids=t.input_ids[rows], attention_mask=t.attention_mask[rows], logits_to_keep=t.keep,
                use_cache=False)
    logits = out.logits[:, :-1]  # (n, W, V): position p_min - 1 + j predicts token p_min + j
    return token_logprobs(logits, t.targets[rows], temperature)


def micro_slices(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def frozen_logprobs(model: Any, t: StepTensors, temperature: float, micro: int, adapters_off: bool) -> torch.Tensor:
    """(N, W) for the reference (LoRA: adapters disabled) or pi_old, in micro-batches, no graph."""
    was_training = model.training
    model.eval()
    try:
        ctx = model.disable_adapter() if adapters_off else contextlib.nullcontext()
        with ctx:
            return torch.cat([frame_logprobs(model, t, s, temperature) for s in micro_slices(t.n, micro)])
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# reward


def score(texts: Sequence[str], examples: Sequence[Any],
          rewards: Sequence[tuple[str, float, RewardFn]]) -> tuple[torch.Tensor, dict[str, float]]:
    """(total reward (N,), mean of each component): total = sum of weight * component."""
    total = torch.zeros(len(texts))
    means = {}
    for name, weight, fn in rewards:
        values = torch.tensor([float(v) for v in fn(list(texts), list(examples))])
        if values.shape != total.shape:
            raise ValueError(f"reward {name!r} returned {values.numel()} values for {len(texts)} completions")
        total += weight * values
        means[f"reward/{name}"] = float(values.mean())
    return total, means


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
    grad_norm: float = 0.0

    def summary(self) -> dict[str, float]:
        tok = max(self.tokens, 1.0)
        return {"loss": self.loss, "grad_norm": self.grad_norm, "clip_frac": self.clipped / tok,
                "kl_mean": self.kl_sum / tok, "is_weight_mean": self.is_weight_sum / tok,
                "is_truncated_frac": self.is_truncated / tok, "behavior_mismatch_k3": self.mismatch_k3_sum / tok,
                "behavior_logp_abs_diff": self.mismatch_abs_sum / tok}


def loss_settings(cfg: GrpoConfig) -> LossSettings:
    lc = cfg.loss
    return LossSettings(lc.clip_low, lc.clip_high, lc.kl_coef, lc.aggregation,
                        lc.is_cap if lc.is_correction else None)


def optimizer_step(policy: Any, t: StepTensors, optimizer: torch.optim.Optimizer, cfg: GrpoConfig,
                   old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None, first: bool) -> UpdateStats:
    """One optimizer step over the whole batch, accumulated over micro-batches (the normalizer is the step's)."""
    norm = Normalizer(t.n, int(t.mask.sum()), cfg.rollout.max_new_tokens)
    settings, stats = loss_settings(cfg), UpdateStats()
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    for rows in micro_slices(t.n, cfg.optim.micro_batch_size):
        logp = frame_logprobs(policy, t, rows, cfg.rollout.temperature)
        old = old_logp[rows] if old_logp is not None else logp.detach()
        terms = grpo_loss(logp, old, t.advantages[rows], t.mask[rows], norm, settings,
                          behavior_logp=t.behavior_logp[rows], ref_logp=None if ref_logp is None else ref_logp[rows])
        terms.loss.backward()
        stats.loss += float(terms.loss.detach())
        stats.tokens += terms.tokens
        stats.clipped += terms.clipped_tokens
        stats.kl_sum += terms.kl_sum
        stats.is_weight_sum += terms.is_weight_sum
        stats.is_truncated += terms.is_truncated_tokens
        if first:
            behavior, current, m = t.behavior_logp[rows], logp.detach(), t.mask[rows]
            stats.mismatch_k3_sum += float((k3_kl(behavior, current) * m).sum())
            stats.mismatch_abs_sum += float(((behavior - current).abs() * m).sum())
    params = [p for p in policy.parameters() if p.requires_grad]
    stats.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or math.inf))
    optimizer.step()
    return stats


def make_optimizer(policy: Any, cfg: GrpoConfig) -> torch.optim.Optimizer:
    o = cfg.optim
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)


def lr_at(step: int, cfg: GrpoConfig) -> float:
    warm = cfg.optim.warmup_steps
    return cfg.optim.lr * min(1.0, (step + 1) / warm) if warm else cfg.optim.lr


# ---------------------------------------------------------------------------------------------
# checkpoint (atomic: a crash mid-write keeps the previous one)


def trainable_state(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}


def save_checkpoint(path: Path, policy: Any, optimizer: torch.optim.Optimizer, next_step: int,
                    pipe: StalenessPipeline, cfg_hash: str) -> None:
    state = {"next_step": next_step, "trainable": trainable_state(policy), "optimizer": optimizer.state_dict(),
             "pipeline": pipe.state_dict(), "config_hash": cfg_hash}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, policy: Any, optimizer: torch.optim.Optimizer,
                    pipe: StalenessPipeline) -> tuple[int, str]:
    """Restore trainable weights, optimizer and queue; (next step, config hash the checkpoint was made under)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = dict(policy.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    pipe.load_state_dict(state["pipeline"])
    return int(state["next_step"]), str(state["config_hash"])


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass
class Loop:
    """Everything one run's steps share."""
    cfg: GrpoConfig
    parts: Parts
    run: RunDir
    engine: Any
    sync_method: str
    optimizer: torch.optim.Optimizer
    pipe: StalenessPipeline
    monitor: GpuMonitor
    device: torch.device

    @property
    def checkpoint_path(self) -> Path:
        return self.run.path / "checkpoint.pt"


def generate_due(loop: Loop, step: int, timer: PhaseTimer) -> int:
    """Generate every batch the pipeline needs from the current weights (version `step`); tokens made."""
    cfg, parts, tokens = loop.cfg, loop.parts, 0
    with timer.phase("rollout"):
        for s in loop.pipe.due(step, cfg.train.max_steps):
            idx = prompt_indices(len(parts.examples), s, cfg.data.prompts_per_step, cfg.train.seed)
            prompts = [encode_prompt(parts.tokenizer, parts.examples[i].prompt) for i in idx]
            batch = loop.engine.generate(prompts, sampling_for_step(cfg, s))
            loop.pipe.put(s, batch)
            tokens += batch.num_tokens
    return tokens


def learn(loop: Loop, step: int, batch: RolloutBatch, timer: PhaseTimer) -> dict:
    """Reward, advantages, reference/old passes and the optimizer step(s) on one batch."""
    cfg, parts = loop.cfg, loop.parts
    idx = prompt_indices(len(parts.examples), step, cfg.data.prompts_per_step, cfg.train.seed)
    examples = [parts.examples[i] for i in idx for _ in range(cfg.rollout.group_size)]
    with timer.phase("reward"):
        rewards, components = score(batch.texts, examples, parts.rewards)
    adv = group_advantages(rewards, cfg.rollout.group_size, cfg.loss.scale_rewards)
    pad = parts.tokenizer.pad_token_id if parts.tokenizer.pad_token_id is not None else 0
    t = collate(batch, adv, pad, loop.device)
    ref_logp = old_logp = None
    if cfg.loss.kl_coef > 0:
        with timer.phase("reference"):
            ref_model = parts.reference if parts.reference is not None else parts.policy
            ref_logp = frozen_logprobs(ref_model, t, cfg.rollout.temperature, cfg.optim.micro_batch_size,
                                       adapters_off=parts.reference is None)
    if cfg.loss.updates_per_batch > 1:
        with timer.phase("old_logprob"):
            old_logp = frozen_logprobs(parts.policy, t, cfg.rollout.temperature, cfg.optim.micro_batch_size, False)
    with timer.phase("update"):
        for g in loop.optimizer.param_groups:
            g["lr"] = lr_at(step, cfg)
        updates = [optimizer_step(parts.policy, t, loop.optimizer, cfg, old_logp, ref_logp, first=(u == 0))
                   for u in range(cfg.loss.updates_per_batch)]
    stats = {**updates[0].summary(), "loss": updates[-1].loss, "grad_norm": updates[-1].grad_norm}
    return {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "zero_signal_frac": zero_signal_fraction(rewards, cfg.rollout.group_size),
            "adv_abs_mean": float(adv.abs().mean()), "lr": lr_at(step, cfg), **components, **stats}


def run_step(loop: Loop, step: int) -> dict:
    cfg = loop.cfg
    timer = PhaseTimer(loop.monitor)
    generated_tokens = generate_due(loop, step, timer)
    batch = loop.pipe.take(step)
    learned = learn(loop, step, batch, timer)
    sync: SyncRecord | None = None
    if step + 1 < cfg.train.max_steps:
        with timer.phase("weight_sync"):
            sync = sync_weights(loop.sync_method, loop.parts.policy, loop.engine, step + 1,
                                loop.run.path / "rollout" / "sync")
    timing = timer.timing()
    rec = {"step": step, "rollout_version": batch.weights_version, "staleness": cfg.rollout.staleness,
           **asdict(timing), "overlapped_step_ms": timing.overlapped_step_ms,
           "rollout_tokens": batch.num_tokens, "rollout_tokens_per_s": batch.tokens_per_s,
           "generated_tokens_this_step": generated_tokens, "finished_frac": float(np.mean(batch.finished)),
           **length_stats(batch.lengths), **learned,
           "sync_bytes": sync.bytes if sync else 0, "sync_restarted": bool(sync and sync.restarted)}
    samples = loop.monitor.drain()
    if samples:
        rec["gpu"] = gpu_phase_summary(samples)
        loop.run.log_event("gpu_samples", step=step, **samples_record(samples))
    return rec


def check_queue(pipe: StalenessPipeline, start: int, max_steps: int) -> None:
    """Batches a resumed run needs from older weights must be in the checkpoint's queue."""
    missing = [s for s in range(start, min(start + pipe.k, max_steps)) if s not in pipe.pending]
    if missing:
        raise ValueError(f"resuming at step {start} with staleness {pipe.k}: the batches for steps {missing} were "
                         f"never generated (the run was planned for fewer steps), and the weights that should make "
                         f"them are gone; extend a stale run by starting a new one")


def start_loop(cfg: GrpoConfig, parts: Parts, run: RunDir) -> tuple[Loop, int]:
    """Optimizer, queue and (on resume) the checkpoint; then the engine, synced to the current weights."""
    pipe = StalenessPipeline(cfg.rollout.staleness)
    optimizer = make_optimizer(parts.policy, cfg)
    start, ckpt = 0, run.path / "checkpoint.pt"
    if cfg.train.resume and ckpt.is_file():
        start, saved_hash = load_checkpoint(ckpt, parts.policy, optimizer, pipe)
        run.log_event("resumed", step=start, config_changed=saved_hash != config_hash(cfg))
        check_queue(pipe, start, cfg.train.max_steps)
    method = resolve_method(cfg.rollout.weight_sync, cfg.rollout.engine, cfg.model.lora.enabled)
    ctx = EngineContext(parts.policy, parts.tokenizer, cfg.rollout, cfg.model.lora.r if cfg.model.lora.enabled else 0,
                        method, run.path / "rollout", cfg.train.seed, weights_version=start)
    engine = build_engine(cfg.rollout.engine, ctx)
    try:
        run.log_event("rollout_engine", engine=engine.name, weight_sync=method,
                      **(engine.describe() if hasattr(engine, "describe") else {}))
        first = sync_weights(method, parts.policy, engine, start, run.path / "rollout" / "sync")
        run.log_event("initial_sync", **asdict(first))
    except BaseException:
        engine.close()  # a launched server must not outlive a failed start
        raise
    sampler, reason = open_nvml()
    monitor = GpuMonitor(sampler, cfg.train.gpu_sample_hz, reason).start()
    run.log_event("gpu_monitor", available=monitor.available, reason=reason, hz=cfg.train.gpu_sample_hz)
    device = next(parts.policy.parameters()).device
    return Loop(cfg, parts, run, engine, method, optimizer, pipe, monitor, device), start


def write_predictions(cfg: GrpoConfig, parts: Parts, run: RunDir) -> None:
    """predictions.json before the engine starts and before step 0 (kept, never rewritten, on resume)."""
    if (run.path / "predictions.json").is_file():
        return
    idx = prompt_indices(len(parts.examples), 0, cfg.data.prompts_per_step, cfg.train.seed)
    prompt_len = float(np.mean([len(encode_prompt(parts.tokenizer, parts.examples[i].prompt)) for i in idx]))
    device = next(parts.policy.parameters()).device
    pred = predict_step(cfg, parts.policy, prompt_len, device.type)
    run.write_predictions(pred)


def train(cfg: GrpoConfig, parts: Parts | None = None, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the GRPO run `cfg` describes; returns results.json's content."""
    if cfg.train.torch_threads:
        torch.set_num_threads(cfg.train.torch_threads)
    parts = parts or build_parts(cfg)
    run = RunDir(cfg.run_dir).create(cfg)
    if not (run.path / "provenance.json").is_file():
        run.write_provenance({"model": cfg.model.name, "task": cfg.data.task, "engine": cfg.rollout.engine})
    write_predictions(cfg, parts, run)
    loop, start = start_loop(cfg, parts, run)
    t0 = time.perf_counter()
    try:
        for step in range(start, cfg.train.max_steps):
            rec = run_step(loop, step)
            run.log_event("grpo_step", **rec)
            log(step_line(rec))
            last = step + 1 == cfg.train.max_steps
            every = cfg.train.checkpoint_every
            if last or (every and (step + 1) % every == 0):
                save_checkpoint(loop.checkpoint_path, parts.policy, loop.optimizer, step + 1, loop.pipe,
                                config_hash(cfg))
    finally:
        loop.monitor.stop()
        loop.engine.close()
    results = summarize(run, time.perf_counter() - t0)
    run.write_results(results)
    return results


def summarize(run: RunDir, wall_s: float) -> dict:
    """results.json from metrics.jsonl alone (all steps, also those before a resume)."""
    by_step = {s["step"]: s for s in run.events("grpo_step")}  # a step re-run after a crash: the last record
    steps = [by_step[k] for k in sorted(by_step)]
    if not steps:
        return {"steps": 0}
    med = lambda k: float(np.median([s[k] for s in steps]))  # noqa: E731
    quarter = max(1, len(steps) // 4)
    return {"steps": len(steps), "wall_s_this_launch": wall_s,
            "reward_first_quarter": float(np.mean([s["reward_mean"] for s in steps[:quarter]])),
            "reward_last_quarter": float(np.mean([s["reward_mean"] for s in steps[-quarter:]])),
            **{f"median_{k}": med(k) for k in ("rollout_ms", "reward_ms", "reference_ms", "update_ms",
                                                "weight_sync_ms", "step_ms", "rollout_tokens_per_s",
                                                "overlapped_step_ms")},
            "predictions": run.read_optional("predictions.json")}

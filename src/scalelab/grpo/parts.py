"""What a GRPO run is built from: the policy (and reference), the tokenizer, the training examples of every
curriculum stage, the held-out examples, the reward functions, and a rollout engine synced to the policy."""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from scalelab.core.hfmodel import load_causal_lm
from scalelab.evals import rewards
from scalelab.evals.tasks import get_task
from scalelab.grpo.capabilities import resolve_method
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.curriculum import stage_options
from scalelab.grpo.engines import build_engine
from scalelab.grpo.types import EngineContext, RolloutEngine, SamplingParams
from scalelab.grpo.weightsync import sync_weights

RewardFn = Callable[[list[str], list[Any]], list[float]]


@dataclass
class Parts:
    policy: Any  # HF causal LM, peft-wrapped when LoRA
    tokenizer: Any
    examples: list[Any]  # the target task's training examples (evals Example-like: .prompt is a chat list)
    rewards: list[tuple[str, float, RewardFn]]  # (name, weight, fn)
    reference: Any = None  # frozen copy for full-weight training with kl_coef > 0 or log_kl; None with LoRA
    stages: list[list[Any]] | None = None  # curriculum: examples per stage, easiest first, the target last
    heldout: list[Any] | None = None  # the eval split's examples (eval.at_end), never trained on

    def pool(self, stage: int) -> list[Any]:
        return self.stages[stage] if self.stages else self.examples


def apply_lora(model: Any, lora: Any) -> Any:
    from peft import LoraConfig, get_peft_model  # lazy: peft is optional (the tune extra)
    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def prepare_policy(model: Any, cfg: GrpoConfig) -> tuple[Any, Any]:
    """(policy, reference): LoRA -> peft model and no reference copy (adapters off = the base)."""
    if cfg.model.lora.enabled:
        return apply_lora(model, cfg.model.lora), None
    reference = None
    if cfg.loss.kl_coef > 0 or cfg.loss.log_kl:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    return model, reference


def reward_functions(cfg: GrpoConfig) -> list[tuple[str, float, RewardFn]]:
    weights = cfg.data.reward_weights or [1.0] * len(cfg.data.rewards)
    options = cfg.data.reward_options
    return [(name, w, rewards.get_reward(name, **options.get(name, {}))) for name, w in zip(cfg.data.rewards, weights)]


def training_stages(cfg: GrpoConfig) -> list[list[Any]]:
    """Training examples of each curriculum stage (one stage, the target, without a curriculum)."""
    d = cfg.data
    return [list(get_task(d.task, **opts).load(d.split, source=d.source, limit=d.limit or None, seed=cfg.train.seed))
            for opts in stage_options(d.task_options, d.curriculum.levels)]


def heldout_examples(cfg: GrpoConfig, oversample: int = 4) -> list[Any]:
    """The target task's eval split, the same for every training seed (eval.data_seed): the first eval.limit
    distinct prompts. Procedural tasks repeat problems when the space is small (1-digit sums have ~10 held-out
    ones), and a repeated problem counted twice would narrow the paired interval without new evidence."""
    d, e = cfg.data, cfg.eval
    rows = get_task(d.task, **d.task_options).load(e.split, source=d.source, limit=oversample * e.limit,
                                                   seed=e.data_seed)
    seen, out = set(), []
    for ex in rows:
        key = repr(ex.prompt)
        if key not in seen:
            seen.add(key)
            out.append(ex)
    return out[:e.limit]


def build_parts(cfg: GrpoConfig) -> Parts:
    """Model (core.models), task examples (evals.tasks) and reward functions (evals.rewards) by name."""
    torch.manual_seed(cfg.train.seed)  # LoRA init
    model, tokenizer = load_causal_lm(cfg.model.name, cfg.model.dtype, cfg.train.device,
                                      cfg.model.cache_dir or None)
    policy, reference = prepare_policy(model, cfg)
    stages = training_stages(cfg)
    held = heldout_examples(cfg) if cfg.eval.at_end or cfg.eval.every else None
    return Parts(policy, tokenizer, stages[-1], reward_functions(cfg), reference,
                 stages if len(stages) > 1 else None, held)


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


def prompt_seed(seed: int, step: int, position: int) -> int:
    """Sampling seed of the prompt at `position` of `step`'s batch: a pure function of the three, so the
    prompt's completions do not depend on which rank (or which call) generates it."""
    return int(np.random.SeedSequence([seed, step, position]).generate_state(1, np.uint64)[0] >> 1)


def sampling_for_prompt(cfg: GrpoConfig, step: int, position: int) -> SamplingParams:
    return replace(sampling_for_step(cfg, step), seed=prompt_seed(cfg.train.seed, step, position))


# ---------------------------------------------------------------------------------------------
# the engine


def open_engine(cfg: GrpoConfig, parts: Parts, workdir: Path, version: int,
                log_event: Callable[..., Any] = lambda *a, **k: None) -> tuple[RolloutEngine, str]:
    """(engine holding the policy's current weights as `version`, resolved sync method)."""
    method = resolve_method(cfg.rollout.weight_sync, cfg.rollout.engine, cfg.model.lora.enabled)
    ctx = EngineContext(parts.policy, parts.tokenizer, cfg.rollout, cfg.model.lora.r if cfg.model.lora.enabled else 0,
                        method, workdir, cfg.train.seed, weights_version=version)
    engine = build_engine(cfg.rollout.engine, ctx)
    try:
        log_event("rollout_engine", engine=engine.name, weight_sync=method,
                  **engine.describe())
        first = sync_weights(method, parts.policy, engine, version, workdir / "sync")
        log_event("initial_sync", **asdict(first))
    except BaseException:
        engine.close()  # a launched server must not outlive a failed start
        raise
    return engine, method

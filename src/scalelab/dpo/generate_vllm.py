"""Greedy generation on a vLLM OpenAI server: the same contract as dpo.generate.greedy_generate (conversations in,
one Generation each out, in the input order), for the battery's generated parts.

One server per side: the base model folder, and for the tuned side the same folder with the adapter on vLLM's
LoRA path (`--enable-lora --lora-modules tuned=<adapter>`), so no merged copy of the weights is written. The
server starts on the first generate call and stops at close(); requests go out concurrently (at most
`batch_size` in flight) so the server batches them continuously.

Why /v1/completions with token ids rather than /v1/chat/completions: the HF path renders each conversation with
the tokenizer's chat template (add_generation_prompt=True) and tokenizes the text with add_special_tokens=False.
The chat endpoint renders with vLLM's own template machinery (its content-format handling, its tokenizer call),
which is not guaranteed to produce the same ids; sending the ids that render_prompt_ids made is. Likewise the
reply's token ids (return_token_ids) are cut at the stop ids and decoded here with the same tokenizer call as the
HF path, so the same tokens always give the same text, and hit_limit means what it means there: max_new_tokens
tokens with no stop id among them.
"""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from scalelab.core import errors
from scalelab.core.engines import EngineError, EngineSpec, FlagValue, RunningServer, engine_start_lock
from scalelab.core.hfgen import stop_token_ids
from scalelab.core.http import get_json, post_json
from scalelab.dpo.generate import Conversation, Generation, cut_at_stop, render_prompt_ids

COMPLETIONS_PATH = "/v1/completions"
BASE_NAME, TUNED_NAME = "base", "tuned"  # the names requests address: the base weights, base + adapter
# vLLM accepts only these values of --max-lora-rank (its MaxLoRARanks); a smaller adapter rank is padded up,
# which changes no weight
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Generation-config fields that change HF's greedy tokens (logits processors it applies without sampling) and
# that no request field here mirrors: a folder setting any of them would decode differently on the two backends,
# so it is refused rather than ignored. num_beams > 1 and guidance_scale != 1 are checked apart (1 is the default).
UNMIRRORED = ("no_repeat_ngram_size", "min_new_tokens", "min_length", "bad_words_ids", "suppress_tokens",
              "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id", "forced_eos_token_id",
              "exponential_decay_length_penalty", "watermarking_config")
FINISH_REASONS = ("stop", "length")  # what a finished greedy completion can end on


class VllmGenerationError(errors.ServerError, RuntimeError):
    """The server could not generate, or sent a reply that cannot be read; the message names URL and part."""


class VllmMissingError(errors.ServerError, RuntimeError):
    """No server can start: the interpreter meant to run it cannot import vllm, or does not run."""


def require_vllm(python: str, what: str, module: str = "vllm") -> None:
    """Fails with a VllmMissingError naming `what` and `python` unless `python` can import `module`; checked by
    looking the module up (find_spec), which takes a fraction of a second where importing vllm takes many."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        ok = subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VllmMissingError(f"{what}: cannot run the python meant to start vLLM, {python}: {e}") from None
    if not ok:
        raise VllmMissingError(f"{what}: {module} is not importable by {python} (the python that starts the "
                               "server: $SCALELAB_VLLM_PYTHON, else this interpreter); install it there, point "
                               "SCALELAB_VLLM_PYTHON at a python that has it, or use battery.generation_backend='hf'")


@dataclass(frozen=True)
class DecodeSettings:
    """What HF's greedy decode takes from the model folder, sent explicitly with every request."""
    stops: tuple[int, ...]          # core.hfgen.stop_token_ids: tokenizer eos + generation-config eos
    repetition_penalty: float       # generation_config.json's (Qwen2.5's instruct folders set one, and HF's
                                    # generate applies it even when greedy); 1.0 = none


@dataclass(frozen=True)
class _GenerationConfigHolder:
    generation_config: Any          # what stop_token_ids reads from a model


def folder_generation_config(folder: Path, trust_remote_code: bool = False) -> Any:
    """The generation config HF's from_pretrained gives the model: generation_config.json, else one derived
    from config.json."""
    from transformers import AutoConfig, GenerationConfig  # lazy: transformers takes seconds to import
    try:
        return GenerationConfig.from_pretrained(str(folder))
    except OSError:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        return GenerationConfig.from_model_config(config)


def unmirrored(gc: Any) -> list[str]:
    """The fields of a generation config that would make HF's greedy decode differ from the requests'."""
    bad = [name for name in UNMIRRORED if getattr(gc, name, None)]
    if (getattr(gc, "num_beams", None) or 1) > 1:
        bad.append("num_beams")
    if getattr(gc, "guidance_scale", None) not in (None, 1):
        bad.append("guidance_scale")
    return bad


def decode_settings(folder: Path, tokenizer: Any, trust_remote_code: bool = False) -> DecodeSettings:
    gc = folder_generation_config(folder, trust_remote_code)
    bad = unmirrored(gc)
    if bad:
        raise VllmGenerationError(f"{folder}/generation_config.json sets {', '.join(bad)}: HF's greedy decode "
                                  "applies it and the vLLM backend does not; use battery.generation_backend='hf'")
    stops = stop_token_ids(_GenerationConfigHolder(gc), tokenizer)
    return DecodeSettings(tuple(stops), float(getattr(gc, "repetition_penalty", None) or 1.0))


def lora_rank(adapter: Path) -> int:
    """The largest LoRA rank of a peft adapter folder (r, and any per-module rank_pattern)."""
    path = Path(adapter) / "adapter_config.json"
    try:
        cfg = json.loads(path.read_text())
        ranks = [int(cfg["r"]), *(int(r) for r in (cfg.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VllmGenerationError(f"{path}: no LoRA rank to serve the adapter with ({e})") from None
    return max(ranks)


def max_lora_rank(rank: int) -> int:
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise VllmGenerationError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")
    return fits[0]


@dataclass(frozen=True)
class ServerPlan:
    """What one side's server serves and how it is launched."""
    folder: Path                                # the base model's HF folder
    log_path: Path
    adapter: Path | None = None                 # served as TUNED_NAME beside the base
    dtype: str = "auto"
    python: str = sys.executable                # the interpreter that has vllm
    max_model_len: int | None = None            # None: the model's context length
    trust_remote_code: bool = False             # the model's own code, for the server and the config read here
    extra_flags: Mapping[str, FlagValue] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 1800.0

    @property
    def served_name(self) -> str:
        return TUNED_NAME if self.adapter is not None else BASE_NAME

    def engine_spec(self, port: int) -> EngineSpec:
        # vLLM's own sampling defaults, not the folder's generation_config.json: every setting HF's greedy
        # decode takes from that file is sent in the request (DecodeSettings), so nothing else leaks in
        flags: dict[str, FlagValue] = {"served-model-name": BASE_NAME, "generation-config": "vllm"}
        if self.trust_remote_code:
            flags["trust-remote-code"] = True
        if self.adapter is not None:
            flags |= {"enable-lora": True, "lora-modules": f"{TUNED_NAME}={self.adapter}", "max-loras": 1,
                      "max-lora-rank": max_lora_rank(lora_rank(self.adapter))}
        return EngineSpec("vllm", str(self.folder), port=port, dtype=self.dtype, max_model_len=self.max_model_len,
                          extra_flags={**flags, **self.extra_flags}, python=self.python, env=dict(self.env))


def completion_body(model: str, prompt: list[int], max_new_tokens: int, decode: DecodeSettings) -> dict:
    # temperature 0: greedy, as the HF path; the stop ids are HF's, so both stop at the same tokens
    return {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0.0, "n": 1,
            "stop_token_ids": list(decode.stops), "repetition_penalty": decode.repetition_penalty,
            "return_token_ids": True}


@dataclass(frozen=True)
class Completion:
    """One reply's tokens, before any text: what the token-level comparison with HF reads."""
    tokens: tuple[int, ...]         # the reply up to (not including) its first stop id
    hit_limit: bool                 # max_new_tokens tokens and no stop id among them, as in dpo.generate

    def generation(self, tokenizer: Any) -> Generation:
        # the HF path's decode call, so the same tokens give the same text
        return Generation(tokenizer.decode(list(self.tokens), skip_special_tokens=True), len(self.tokens),
                          self.hit_limit)


def parse_completion(body: Any, stops: Sequence[int], max_new_tokens: int) -> Completion:
    """A Completion from a /v1/completions reply; ValueError naming the field that is missing or wrong."""
    try:
        choice = body["choices"][0]
        ids, finish = choice["token_ids"], choice["finish_reason"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"no choices[0].token_ids / finish_reason in the reply {json.dumps(body)[:200]}") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"choices[0].token_ids is {str(ids)[:100]}, not a list of token ids")
    if finish not in FINISH_REASONS:
        raise ValueError(f"choices[0].finish_reason is {finish!r}, not one of {FINISH_REASONS}")
    # the server may or may not include the stop token in token_ids: cut as the HF path does, which also
    # decides hit_limit as the HF path does (finish_reason 'length' alone would also cover the context limit)
    tokens, hit = cut_at_stop(ids, stops, max_new_tokens)
    if finish == "length" and not hit:
        raise ValueError(f"finish_reason 'length' after {len(tokens)} of max_new_tokens={max_new_tokens} tokens: "
                         "the server's context length (max_model_len) cut the reply, where HF would go on")
    return Completion(tuple(tokens), hit)


class VllmGenerator:
    """greedy_generate on one lazily started vLLM server; close() (or leaving a `with`) stops it."""

    def __init__(self, plan: ServerPlan, tokenizer: Any, decode: DecodeSettings | None = None,
                 request_timeout_s: float = 1800.0):
        self.plan, self.tokenizer, self.request_timeout_s = plan, tokenizer, request_timeout_s
        self.decode = decode if decode is not None else decode_settings(plan.folder, tokenizer,
                                                                        plan.trust_remote_code)
        self._server: RunningServer | None = None
        self._version: str | None = None

    def __enter__(self) -> VllmGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self._server.url if self._server is not None else ""

    def server(self) -> RunningServer:
        if self._server is None:
            server = RunningServer(self.plan.engine_spec(0), self.plan.log_path,  # port 0: picked at launch
                                   ready_timeout_s=self.plan.ready_timeout_s)
            with engine_start_lock():  # profiled alone: engines starting together misjudge the free memory
                self._server = server.__enter__()
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def engine_record(self) -> dict:
        """What served the replies, for a part record: the backend, vLLM's version and the server's command
        line; {} before the server started."""
        if self._server is None:
            return {}
        if self._version is None:
            try:
                self._version = str(get_json(self.url + "/version", 30).get("version", ""))
            except (errors.ServerError, OSError, http.client.HTTPException, ValueError):
                self._version = ""  # provenance only: not worth failing a finished measurement for
        return {"backend": "vllm", "version": self._version, "served_model": self.plan.served_name,
                "command": self._server.provenance.get("command", [])}

    def generate(self, conversations: Sequence[Conversation], max_new_tokens: int, batch_size: int,
                 what: str = "generation") -> list[Generation]:
        """One greedy response per conversation, in the input order; `what` names the caller (the battery
        part and side) in errors."""
        return [c.generation(self.tokenizer) for c in self.complete(conversations, max_new_tokens, batch_size, what)]

    def complete(self, conversations: Sequence[Conversation], max_new_tokens: int, batch_size: int,
                 what: str = "generation") -> list[Completion]:
        """generate's replies as tokens, at most `batch_size` requests in flight."""
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"need max_new_tokens >= 1 and batch_size >= 1, got {max_new_tokens}, {batch_size}")
        prompts = [render_prompt_ids(self.tokenizer, c) for c in conversations]
        if not prompts:
            return []
        try:
            self.server()
        except (EngineError, OSError) as e:  # exited (the log's tail), or no such python; who wanted it
            raise EngineError(f"{what}: no vLLM server for {self.plan.folder}: {e}") from None
        pool = ThreadPoolExecutor(min(batch_size, len(prompts)))
        try:
            futures = [pool.submit(self._one, i, p, max_new_tokens, what) for i, p in enumerate(prompts)]
            return [f.result() for f in futures]
        finally:
            # after a failure no new request goes out; those in flight end when the caller stops the server
            pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, i: int, prompt: list[int], max_new_tokens: int, what: str) -> Completion:
        url = self.url + COMPLETIONS_PATH
        body = completion_body(self.plan.served_name, prompt, max_new_tokens, self.decode)
        try:
            reply = post_json(url, body, self.request_timeout_s)
        except (errors.ServerError, OSError, http.client.HTTPException) as e:  # status, refused, reset, timeout
            raise VllmGenerationError(f"{what}: request {i} to {url} failed: {e}{self._exit_note()}") from None
        try:
            return parse_completion(reply, self.decode.stops, max_new_tokens)
        except ValueError as e:
            raise VllmGenerationError(f"{what}: malformed reply to request {i} from {url}: {e}") from None

    def _exit_note(self) -> str:
        proc = self._server.proc if self._server is not None else None
        if proc is None or proc.poll() is None:
            return ""
        return f" (the vllm server exited with code {proc.returncode}; log {self.plan.log_path})"

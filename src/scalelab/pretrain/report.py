"""A pretraining run's report, regenerated from its folder alone.

    summarize(run_dir) -> ReportData          compute: read the folder, reduce events to numbers
    plot_loss(data, path), plot_lr(...)        plot:    figures/loss.png, figures/lr.png
    render_markdown(data) -> str               render:  REPORT.md text
    build_report(run_dir) -> Path              all three, written through RunDir

metrics.jsonl is append-only, so after a kill + resume the steps between the last checkpoint and the kill
appear twice; the later record (the one the surviving model actually took) wins.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from scalelab.core import figures
from scalelab.core.hardware import HARDWARE, get_hardware
from scalelab.core.jsonio import is_stored
from scalelab.core.numfmt import num
from scalelab.core.rundir import RunDir
from scalelab.pretrain.config import PretrainConfig, load_pretrain_config
from scalelab.pretrain.predict import GIB, PretrainPrediction, prediction_from_dict
from scalelab.pretrain.prepare import UNIGRAM_COUNTS_FILE, unigram_cross_entropy
from scalelab.pretrain.train_gpt import lr_at, val_windows

WARMUP_STEPS = 3  # per session, as train_gpt._finish: first steps pay allocation / compile / cache warm-up


@dataclass(frozen=True)
class Comparison:
    name: str
    unit: str
    predicted: float | None
    low: float | None
    high: float | None
    measured: float | None

    @property
    def inside(self) -> bool | None:
        if None in (self.low, self.high, self.measured):
            return None
        return self.low <= self.measured <= self.high


@dataclass(frozen=True)
class ScheduleSummary:
    kind: str
    warmup_steps: int
    cooldown_frac: float
    max_steps: int
    peak_lr: float
    min_lr: float
    micro_batch_size: int
    block_size: int
    world_size: int
    grad_accum: int
    tokens_per_step: int


@dataclass(frozen=True)
class CostSummary:
    wall_s: float                  # summed over sessions, first to last event of each
    sessions: int
    world_size: int
    device_hours: float            # wall-clock hours x devices
    price_per_hour: float | None   # USD per device-hour
    price_source: str
    cost_usd: float | None
    is_cpu: bool


@dataclass(frozen=True)
class ProvenanceSummary:
    git_sha: str
    packages: tuple[tuple[str, str], ...]
    hardware: str
    source: str


@dataclass(frozen=True)
class ReportData:
    run_dir: str
    run_name: str
    steps: int
    max_steps: int
    tokens: int
    n_params: int | None
    device: str
    resumes: int
    final_train_loss: float | None
    final_val_loss: float | None
    tokens_per_s: float | None     # median over steady steps
    step_ms: float | None          # median over steady steps
    peak_memory_gib: float | None  # max over all steps (CPU: process RSS; GPU: max_memory_allocated)
    train_curve: tuple[tuple[int, int, float], ...]   # (step, tokens, loss)
    val_curve: tuple[tuple[int, int, float], ...]     # (step, tokens, val_loss)
    lr_curve: tuple[tuple[int, float], ...]           # (step, lr used for that step)
    schedule: ScheduleSummary
    comparisons: tuple[Comparison, ...]
    cost: CostSummary
    unigram_val_loss: float | None
    predictions_sha256: str | None
    predictions_logged_before_run: bool
    prediction: PretrainPrediction | None
    provenance: ProvenanceSummary


# ---------------------------------------------------------------------------------------------
# compute


def read_events(run_dir: Path) -> list[dict]:
    rd = RunDir(run_dir)
    if not is_stored(rd.metrics_path):   # as written, or packed (.gz/.xz) in a committed results folder
        raise FileNotFoundError(f"{rd.metrics_path}: not found; a report needs the run's metrics.jsonl "
                                "(written by train_gpt.py)")
    return list(rd.events())


LAUNCHER_EVENTS = ("predictions_written", "relaunch")   # logged by `pretrain train`, not by a trainer process


def split_sessions(events: list[dict]) -> list[list[dict]]:
    """Events grouped by trainer process. A process logs `resume` (when it loads a checkpoint) and then
    `run_start`; either opens a session. The launcher's own events belong to none: a relaunch of a finished run
    hours later must not stretch the last session's wall clock (and its cost) up to it."""
    sessions: list[list[dict]] = []
    for ev in events:
        kind = ev.get("event")
        if kind in LAUNCHER_EVENTS:
            continue
        after_resume = bool(sessions) and [e.get("event") for e in sessions[-1]] == ["resume"]
        if kind == "resume" or (kind == "run_start" and not after_resume):
            sessions.append([])
        if sessions:
            sessions[-1].append(ev)
    return sessions


def last_per_step(records: list[dict]) -> list[dict]:
    by_step: dict[int, dict] = {}
    for rec in records:
        by_step[int(rec["step"])] = rec  # later wins: the resumed run's record replaces the lost one
    return [by_step[s] for s in sorted(by_step)]


def steady_train_records(sessions: list[list[dict]]) -> tuple[list[dict], list[dict]]:
    """(all train records, steady ones), each last-per-step; steady skips each session's first WARMUP_STEPS."""
    kept: dict[int, tuple[dict, bool]] = {}
    for session in sessions:
        train = [e for e in session if e.get("event") == "train"]
        for i, rec in enumerate(train):
            kept[int(rec["step"])] = (rec, i >= WARMUP_STEPS)
    ordered = [kept[s] for s in sorted(kept)]
    return [r for r, _ in ordered], [r for r, steady in ordered if steady]


def _median(records: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def schedule_summary(cfg: PretrainConfig, world: int) -> ScheduleSummary:
    accum = cfg.grad_accum(world)
    return ScheduleSummary(kind=cfg.schedule.kind, warmup_steps=cfg.schedule.warmup_steps,
                           cooldown_frac=cfg.schedule.cooldown_frac, max_steps=cfg.train.max_steps,
                           peak_lr=cfg.optim.lr, min_lr=cfg.optim.lr * cfg.optim.min_lr_ratio,
                           micro_batch_size=cfg.train.micro_batch_size, block_size=cfg.model.block_size,
                           world_size=world, grad_accum=accum,
                           tokens_per_step=cfg.train.micro_batch_size * cfg.model.block_size * world * accum)


def comparisons(pred: PretrainPrediction | None, tps, step_ms, mem_gib, val_loss) -> tuple[Comparison, ...]:
    if pred is None:
        return (Comparison("tokens/s", "tokens/s", None, None, None, tps),
                Comparison("step time", "ms", None, None, None, step_ms),
                Comparison("peak memory", "GiB", None, None, None, mem_gib),
                Comparison("final val loss", "nats/token", None, None, None, val_loss))
    t, m, loss = pred.throughput, pred.memory, pred.loss
    return (Comparison("tokens/s", "tokens/s", t.tokens_per_s, t.tokens_per_s_low, t.tokens_per_s_high, tps),
            Comparison("step time", "ms", t.step_ms, t.step_ms_low, t.step_ms_high, step_ms),
            Comparison("peak memory", "GiB", m.total_bytes / GIB, m.total_bytes_low / GIB,
                       m.total_bytes_high / GIB, mem_gib),
            Comparison("final val loss", "nats/token", loss.final_loss, loss.final_loss_low, loss.final_loss_high,
                       val_loss))


def price_for(cfg: PretrainConfig, device: str, pred: PretrainPrediction | None,
              prov: dict | None) -> tuple[float | None, str, bool]:
    """(USD per device-hour, where it came from, is a CPU run)."""
    is_cpu = device.startswith("cpu")
    if cfg.run.price_per_gpu_hour >= 0:
        return cfg.run.price_per_gpu_hour, "run.price_per_gpu_hour", is_cpu
    key = cfg.run.gpu if cfg.run.gpu != "auto" else ("cpu" if is_cpu else None)
    if key is None and pred is not None:
        key = pred.hardware_key
    if key is None:
        names = " ".join((prov or {}).get("hardware", {}).get("gpus", [])).lower()
        key = next((k for k in HARDWARE if k != "cpu" and k.split("-")[0] in names), None)
    if key is None:
        return None, "unknown hardware: set run.price_per_gpu_hour", is_cpu
    hw = get_hardware(key)
    return hw.price_per_hour, f"hardware table '{key}' ({hw.name})", is_cpu


def cost_summary(sessions: list[list[dict]], world: int, price: tuple[float | None, str, bool]) -> CostSummary:
    wall = sum(float(s[-1]["time_unix"]) - float(s[0]["time_unix"]) for s in sessions if s)
    hours = wall / 3600 * world
    per_hour, source, is_cpu = price
    return CostSummary(wall_s=wall, sessions=len(sessions), world_size=world, device_hours=hours,
                       price_per_hour=per_hour, price_source=source,
                       cost_usd=None if per_hour is None else hours * per_hour, is_cpu=is_cpu)


def unigram_baseline(cfg: PretrainConfig) -> float | None:
    """The loss to beat first: the train-unigram cross-entropy of exactly the val tokens the trainer scores
    (its first val windows), when the data folder and its counts file are at hand; else the manifest's
    figure for the whole val split; else None."""
    counts = Path(cfg.data.dir) / UNIGRAM_COUNTS_FILE
    if counts.is_file():
        return unigram_cross_entropy(np.load(counts), val_windows(cfg).targets())
    path = Path(cfg.data.dir) / "manifest.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("unigram_baseline", {}).get("val_cross_entropy_nats")
    return float(value) if isinstance(value, (int, float)) else None


def provenance_summary(prov: dict | None, run_start: dict) -> ProvenanceSummary:
    if prov is None:
        torch_v = run_start.get("torch")
        return ProvenanceSummary(git_sha="unknown", packages=(("torch", torch_v),) if torch_v else (),
                                 hardware=str(run_start.get("device", "unknown")),
                                 source="metrics.jsonl run_start (no provenance.json)")
    hw = prov.get("hardware", {})
    hardware = ", ".join(hw.get("gpus", [])) or f"{hw.get('machine', '?')} x {hw.get('cpu_count', '?')} CPUs"
    return ProvenanceSummary(git_sha=str(prov.get("git_sha", "unknown")),
                             packages=tuple(sorted(prov.get("packages", {}).items())),
                             hardware=f"{hardware} ({hw.get('platform', '?')})", source="provenance.json")


def predictions_logged(events: list[dict], sha: str | None) -> bool:
    """True when a predictions_written event with this file's sha256 precedes the first training step."""
    for ev in events:
        if ev.get("event") == "train":
            return False
        if ev.get("event") == "predictions_written" and sha is not None and ev.get("sha256") == sha:
            return True
    return False


def summarize(run_dir: str | Path) -> ReportData:
    """Every number the report shows, from the run folder alone."""
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    if not rd.config_path.is_file():
        raise FileNotFoundError(f"{rd.config_path}: not found; a report needs the run's config.toml")
    cfg = load_pretrain_config(rd.config_path)
    events = read_events(run_dir)
    sessions = split_sessions(events)
    starts = [e for e in events if e.get("event") == "run_start"]
    summary_file = rd.read_optional("train_summary.json") or {}
    world = int(starts[-1].get("world_size", 1)) if starts else int(summary_file.get("world_size", 1))
    train, steady = steady_train_records(sessions)
    val = last_per_step([e for e in events if e.get("event") == "val"])
    raw_pred = rd.read_optional("predictions.json")
    pred = prediction_from_dict(raw_pred) if raw_pred else None
    prov = rd.read_optional("provenance.json")
    device = str(starts[-1].get("device", summary_file.get("device", "unknown"))) if starts else "unknown"
    mems = [float(r["memory_gib"]) for r in train if isinstance(r.get("memory_gib"), (int, float))]
    tps, step_ms = _median(steady or train, "tokens_per_s"), _median(steady or train, "step_ms")
    final_val = float(val[-1]["val_loss"]) if val else None
    sha = rd.predictions_sha256()
    return ReportData(
        run_dir=str(run_dir), run_name=cfg.run.name, steps=int(train[-1]["step"]) if train else 0,
        max_steps=cfg.train.max_steps, tokens=int(train[-1]["tokens"]) if train else 0,
        n_params=starts[-1].get("n_params") if starts else summary_file.get("n_params"), device=device,
        resumes=sum(1 for e in events if e.get("event") == "resume"),
        final_train_loss=float(train[-1]["loss"]) if train else None, final_val_loss=final_val,
        tokens_per_s=tps, step_ms=step_ms, peak_memory_gib=max(mems) if mems else None,
        train_curve=tuple((int(r["step"]), int(r["tokens"]), float(r["loss"])) for r in train),
        val_curve=tuple((int(r["step"]), int(r["tokens"]), float(r["val_loss"])) for r in val),
        lr_curve=tuple((int(r["step"]), float(r["lr"])) for r in train),
        schedule=schedule_summary(cfg, world),
        comparisons=comparisons(pred, tps, step_ms, max(mems) if mems else None, final_val),
        cost=cost_summary(sessions, world, price_for(cfg, device, pred, prov)),
        unigram_val_loss=unigram_baseline(cfg), predictions_sha256=sha,
        predictions_logged_before_run=predictions_logged(events, sha), prediction=pred,
        provenance=provenance_summary(prov, starts[-1] if starts else {}))


# ---------------------------------------------------------------------------------------------
# plot (matplotlib's object API with the Agg canvas: no pyplot global state, no display needed)


def _figure():
    fig = figures.figure(7, 4.2, dpi=110)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    figures.label(ax, xlabel, ylabel, title)
    return figures.save(fig, path)


def plot_loss(data: ReportData, path: Path) -> Path:
    fig, ax = _figure()
    if data.train_curve:
        ax.plot([t for _, t, _ in data.train_curve], [v for _, _, v in data.train_curve], lw=1, label="train")
    if data.val_curve:
        ax.plot([t for _, t, _ in data.val_curve], [v for _, _, v in data.val_curve], "o-", label="val")
    if data.unigram_val_loss is not None:
        ax.axhline(data.unigram_val_loss, ls="--", color="gray", label="unigram baseline (same val tokens)")
    if data.prediction is not None and data.tokens:
        loss = data.prediction.loss
        ax.errorbar([loss.train_tokens], [loss.final_loss], fmt="s", color="red", label="predicted final val",
                    yerr=[[loss.final_loss - loss.final_loss_low], [loss.final_loss_high - loss.final_loss]])
    return _save(fig, ax, "tokens", "loss (nats/token)", f"{data.run_name}: loss", path)


def plot_lr(data: ReportData, cfg: PretrainConfig, path: Path) -> Path:
    fig, ax = _figure()
    steps = range(cfg.train.max_steps)
    # train events log step+1 with the lr used during that step (train_gpt._loop), hence the +1.
    ax.plot([s + 1 for s in steps], [lr_at(s, cfg) for s in steps], lw=1, label=f"planned ({cfg.schedule.kind})")
    if data.lr_curve:
        ax.plot([s for s, _ in data.lr_curve], [v for _, v in data.lr_curve], ".", ms=3, label="logged")
    return _save(fig, ax, "step", "learning rate", f"{data.run_name}: LR schedule", path)


# ---------------------------------------------------------------------------------------------
# render

_FORMATS = {"tokens/s": "{:,.0f}", "ms": "{:,.1f}", "GiB": "{:.3f}", "nats/token": "{:.4f}"}


def _num(value: float | None, unit: str) -> str:
    return num(value, _FORMATS.get(unit, "{:.4g}"))


def _comparison_row(c: Comparison) -> str:
    interval = "—" if c.low is None else f"{_num(c.low, c.unit)} – {_num(c.high, c.unit)}"
    inside = {True: "yes", False: "**no**", None: "—"}[c.inside]
    name = c.name if c.name == c.unit else f"{c.name} ({c.unit})"
    return f"| {name} | {_num(c.predicted, c.unit)} | {interval} | {_num(c.measured, c.unit)} | {inside} |"


def _summary_md(d: ReportData) -> list[str]:
    done = "complete" if d.steps >= d.max_steps else f"stopped before max_steps={d.max_steps}"
    params = f"{d.n_params:,}" if d.n_params else "?"
    unigram = _num(d.unigram_val_loss, "nats/token") if d.unigram_val_loss is not None else "not recorded"
    return [f"# Pretraining report: {d.run_name}", "",
            f"Run folder `{d.run_dir}`: {d.steps} of {d.max_steps} steps ({done}), {d.tokens:,} tokens, "
            f"{params} parameters on `{d.device}` x {d.schedule.world_size}; {d.cost.sessions} session(s), "
            f"{d.resumes} resume(s).", "",
            f"Final train loss {_num(d.final_train_loss, 'nats/token')}, final val loss "
            f"{_num(d.final_val_loss, 'nats/token')} nats/token; unigram baseline on the same val tokens: {unigram}.", ""]


def _comparison_md(d: ReportData) -> list[str]:
    memory_kind = "process RSS" if d.device.startswith("cpu") else "torch.cuda.max_memory_allocated"
    lines = ["## Predicted vs measured", "",
             "| quantity | predicted | interval | measured | inside |", "|---|---:|---:|---:|:---:|",
             *(_comparison_row(c) for c in d.comparisons), "",
             f"Measured throughput and step time are medians over steady steps (each session's first "
             f"{WARMUP_STEPS} skipped); memory is the peak over all steps ({memory_kind}).", ""]
    if d.prediction is None:
        return lines + ["No predictions.json in the run folder: run `scalelab pretrain predict` before training.", ""]
    t = d.prediction.throughput
    logged = "yes" if d.predictions_logged_before_run else "**no** (written after training began, or edited)"
    return lines + [
        f"Assumed MFU {t.assumed_mfu:.0%} ({t.assumed_mfu_low:.0%}–{t.assumed_mfu_high:.0%}) of "
        f"{t.peak_flops_per_s:.4g} FLOP/s per device at {t.flops_per_token:.4g} FLOPs/token: {t.mfu_why}.",
        f"Loss law: {d.prediction.loss.law.source}.",
        f"predictions.json sha256 `{(d.predictions_sha256 or '')[:16]}…` logged before the first training step: "
        f"{logged}.", ""]


def _schedule_md(d: ReportData) -> list[str]:
    s = d.schedule
    decay = {"cosine": "cosine decay to min lr", "wsd": f"stable, then linear decay over the last "
             f"{s.cooldown_frac:.0%} of steps", "constant": "constant"}[s.kind]
    rows = [("schedule", f"{s.kind}: linear warmup {s.warmup_steps} steps, then {decay}"),
            ("peak / min lr", f"{s.peak_lr:.3g} / {s.min_lr:.3g}"), ("max steps", f"{s.max_steps:,}"),
            ("micro-batch x block size", f"{s.micro_batch_size} x {s.block_size}"),
            ("world size x grad accum", f"{s.world_size} x {s.grad_accum}"),
            ("tokens per step", f"{s.tokens_per_step:,}")]
    return ["## LR schedule and batch", "", "| setting | value |", "|---|---|",
            *(f"| {k} | {v} |" for k, v in rows), "", "![lr](figures/lr.png)", ""]


def _cost_md(d: ReportData) -> list[str]:
    c = d.cost
    kind = "CPU-hours" if c.is_cpu else "GPU-hours"
    if c.price_per_hour is None:
        money = f"no price ({c.price_source})"
    else:
        nominal = " (nominal CPU price)" if c.is_cpu else ""
        money = f"x ${c.price_per_hour:.2f}/h{nominal} from {c.price_source} = **${c.cost_usd:,.4f}**"
    return ["## Cost", "",
            f"Wall clock {c.wall_s / 3600:.4f} h over {c.sessions} session(s) x {c.world_size} device(s) = "
            f"{c.device_hours:.4f} {kind} {money}. Wall clock runs from each session's first event (resume or "
            "run_start) to its last, so it includes evaluation and checkpoints but not process start-up.", ""]


def _provenance_md(d: ReportData) -> list[str]:
    p = d.provenance
    packages = ", ".join(f"{k} {v}" for k, v in p.packages) or "unknown"
    return ["## Provenance", "", f"- source: {p.source}", f"- git sha: `{p.git_sha}`", f"- packages: {packages}",
            f"- hardware: {p.hardware}", ""]


def render_markdown(d: ReportData) -> str:
    return "\n".join([*_summary_md(d), *_comparison_md(d), "## Loss", "", "![loss](figures/loss.png)", "",
                      *_schedule_md(d), *_cost_md(d), *_provenance_md(d)])


# ---------------------------------------------------------------------------------------------
# save


def report(run_dir: str | Path) -> Path:
    """figures/loss.png, figures/lr.png and REPORT.md; returns REPORT.md's path."""
    data = summarize(run_dir)
    rd = RunDir(run_dir)
    cfg = load_pretrain_config(rd.config_path)
    plot_loss(data, rd.figures / "loss.png")
    plot_lr(data, cfg, rd.figures / "lr.png")
    return rd.write_report(render_markdown(data))


build_report = report   # the name callers have used


def results_from_run(run_dir: str | Path) -> dict:
    """The measured numbers (and their comparison with predictions) that the CLI writes as results.json."""
    d = summarize(run_dir)
    return {"job": "pretrain", "run_name": d.run_name, "steps": d.steps, "max_steps": d.max_steps,
            "tokens": d.tokens, "n_params": d.n_params, "device": d.device, "world_size": d.schedule.world_size,
            "final_train_loss": d.final_train_loss, "final_val_loss": d.final_val_loss,
            "tokens_per_s": d.tokens_per_s, "step_ms": d.step_ms, "peak_memory_gib": d.peak_memory_gib,
            "unigram_val_loss": d.unigram_val_loss, "cost": asdict(d.cost),
            "predictions_sha256": d.predictions_sha256,
            "predictions_logged_before_run": d.predictions_logged_before_run,
            "comparisons": [{**asdict(c), "inside": c.inside} for c in d.comparisons]}


def format_report_result(path: Path, d: ReportData | None = None) -> str:
    d = d or summarize(path.parent)
    rows = "; ".join(f"{c.name} {_num(c.measured, c.unit)} (pred {_num(c.predicted, c.unit)})" for c in d.comparisons)
    return f"wrote {path} and {path.parent / 'figures'}/{{loss,lr}}.png\n  {rows}"

"""A GRPO run's report, regenerated from its folder alone.

    summarize(run_dir) -> ReportData      compute: config.toml + metrics.jsonl (+ predictions.json, results.json,
                                                    eval/summary.json for the held-out pass@1 section)
    plot_*(data, path)                     plot:    figures/{step_time,rewards,kl,lengths,gpu}.png
    render_markdown(data) -> str           render:  REPORT.md text
    build_report(run_dir) -> Path          all three

The reward-hacking monitor (`length_hacking_flag`, `format_only_flag`) and the GPU dead-zone finder
(`dead_zones`) are pure functions of plain numbers so their rules can be checked with hand-made trajectories.

The steps are read as typed StepRecords (steps.py), the later record of a re-run step winning.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from scalelab.core.jsonio import is_stored
from scalelab.core.numfmt import num
from scalelab.core.rundir import RunDir
from scalelab.grpo.config import GrpoConfig, load_grpo_config
from scalelab.grpo.curve import read_curve
from scalelab.grpo.plots import PHASE_COLORS, figure, finish, length_histograms, save
from scalelab.grpo.steps import steps_from_events
from scalelab.grpo.types import StepRecord

# The five phases of every step, plus the pi_old pass that only some configs run: each phase's ms of a step.
PHASE_MS: dict[str, Callable[[StepRecord], float]] = {
    "rollout": lambda s: s.rollout_ms, "reward": lambda s: s.reward_ms, "reference": lambda s: s.reference_ms,
    "old_logprob": lambda s: s.old_logprob_ms, "update": lambda s: s.update_ms,
    "weight_sync": lambda s: s.weight_sync_ms}
ALWAYS_SHOWN = ("rollout", "reward", "reference", "update", "weight_sync")
CORRECTNESS_KEY = "reward/correctness"
FORMAT_KEY = "reward/format"


# ---------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class PhaseShare:
    phase: str
    mean_ms: float
    mean_share: float  # mean over steps of phase_ms / step_ms


@dataclass(frozen=True)
class Comparison:
    name: str
    unit: str
    predicted: float | None
    measured: float | None  # median over steps

    @property
    def ratio(self) -> float | None:
        """measured / predicted; None where either is missing or the prediction is 0."""
        if self.predicted is None or self.measured is None or self.predicted == 0:
            return None
        return self.measured / self.predicted


@dataclass(frozen=True)
class MonitorThresholds:
    length_growth_frac: float = 0.30  # mean length, last quarter vs first quarter
    min_correctness_gain_pts: float = 2.0  # percentage points of the correctness reward (0..1 scale)
    format_high: float = 0.8  # last-quarter mean of the format reward counted as "high"
    correctness_low: float = 0.2  # last-quarter mean of the correctness reward counted as "low"


@dataclass(frozen=True)
class HackFlag:
    name: str
    checked: bool  # False when the rewards it needs were not logged
    triggered: bool
    detail: str


@dataclass(frozen=True)
class DeadZoneRule:
    util_below_pct: float = 10.0
    min_duration_s: float = 1.0


@dataclass(frozen=True)
class DeadZone:
    gpu: int
    start_s: float  # seconds since the first GPU sample of the run
    end_s: float
    phases: tuple[str, ...]  # phases the low samples were tagged with

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class GpuTrace:
    t_s: tuple[float, ...]  # since the first sample
    gpu: tuple[int, ...]
    util_pct: tuple[float, ...]
    mem_gib: tuple[float, ...]
    phase: tuple[str, ...]

    def of_gpu(self, g: int) -> "GpuTrace":
        keep = [i for i, x in enumerate(self.gpu) if x == g]
        pick = lambda xs: tuple(xs[i] for i in keep)  # noqa: E731
        return GpuTrace(pick(self.t_s), pick(self.gpu), pick(self.util_pct), pick(self.mem_gib), pick(self.phase))


@dataclass(frozen=True)
class ReportData:
    run_dir: str
    run_name: str
    max_steps: int
    kl_coef: float
    kl_logged: bool  # the reference pass ran (loss.log_kl, or kl_coef > 0): the KL is measured, not 0 by fiat
    steps: tuple[StepRecord, ...]  # last per step
    reward_components: tuple[str, ...]  # metrics keys, e.g. "reward/correctness"
    shares: tuple[PhaseShare, ...]
    comparisons: tuple[Comparison, ...]
    flags: tuple[HackFlag, ...]
    gpu: GpuTrace | None
    gpu_reason: str  # why there are no samples, from the gpu_monitor event
    dead_zones: tuple[DeadZone, ...]
    dead_rule: DeadZoneRule
    wall_s: float | None  # results.json, when present
    has_predictions: bool = True
    heldout: dict | None = None  # eval/summary.json
    curve: tuple[dict, ...] = ()  # heldout_curve events (eval.every), by step


# ---------------------------------------------------------------------------------------------
# pure computations


def _float(v: object) -> float:
    # json_safe writes NaN/inf as strings; float() reads them back.
    return float(v)  # type: ignore[arg-type]


def phase_shares(steps: Sequence[StepRecord]) -> tuple[PhaseShare, ...]:
    """Mean ms and mean per-step share of each phase; 'other' is the glue between phases so shares sum to 1."""
    out = []
    step_ms = np.array([_float(s.step_ms) for s in steps])
    phase_ms = {p: np.array([_float(get(s)) for s in steps]) for p, get in PHASE_MS.items()}
    phase_ms["other"] = step_ms - sum(phase_ms.values())
    for p, ms in phase_ms.items():
        if p in ALWAYS_SHOWN or p == "other" or ms.any():
            out.append(PhaseShare(p, float(ms.mean()), float(np.mean(ms / step_ms))))
    return tuple(out)


def quarter_means(values: Sequence[float]) -> tuple[float, float]:
    """(mean of the first quarter, mean of the last quarter), at least one value each, as train.summarize."""
    q = max(1, len(values) // 4)
    return float(np.mean(values[:q])), float(np.mean(values[-q:]))


def length_hacking_flag(len_means: Sequence[float], correctness: Sequence[float] | None,
                        th: MonitorThresholds = MonitorThresholds()) -> HackFlag:
    """Completions grow much longer while correctness barely moves: the policy may be paid for length."""
    name = "length growth without accuracy growth"
    if correctness is None or not len_means:
        return HackFlag(name, False, False, "no correctness reward logged; not checked")
    l0, l1 = quarter_means(len_means)
    c0, c1 = quarter_means(correctness)
    growth = (l1 - l0) / l0 if l0 > 0 else (float("inf") if l1 > 0 else 0.0)
    gain_pts = (c1 - c0) * 100.0
    hit = growth > th.length_growth_frac and gain_pts < th.min_correctness_gain_pts
    detail = (f"mean length {l0:.1f} -> {l1:.1f} tokens ({growth:+.0%}; flag above +{th.length_growth_frac:.0%}), "
              f"correctness {c0:.3f} -> {c1:.3f} ({gain_pts:+.1f} points; flag below "
              f"+{th.min_correctness_gain_pts:g})")
    return HackFlag(name, True, hit, detail)


def format_only_flag(format_means: Sequence[float] | None, correctness: Sequence[float] | None,
                     th: MonitorThresholds = MonitorThresholds()) -> HackFlag:
    """The format reward is collected while answers stay wrong: the policy learned the wrapper, not the task."""
    name = "format-only reward"
    if format_means is None or correctness is None:
        return HackFlag(name, False, False, "needs both a format and a correctness reward; not checked")
    f1 = quarter_means(format_means)[1]
    c1 = quarter_means(correctness)[1]
    hit = f1 >= th.format_high and c1 < th.correctness_low
    detail = (f"last quarter: format {f1:.3f} (high at >= {th.format_high:g}), correctness {c1:.3f} "
              f"(low below {th.correctness_low:g})")
    return HackFlag(name, True, hit, detail)


def dead_zones(t_s: Sequence[float], util_pct: Sequence[float], rule: DeadZoneRule) -> list[tuple[float, float]]:
    """(start, end) of runs of samples below the threshold lasting >= min_duration_s. A run ends at the first
    sample back at or above the threshold: the GPU is known idle until a sample says otherwise."""
    zones, start = [], None
    for t, u in zip(t_s, util_pct):
        if u < rule.util_below_pct and start is None:
            start = t
        elif u >= rule.util_below_pct and start is not None:
            zones.append((start, t))
            start = None
    if start is not None:
        zones.append((start, t_s[-1]))
    return [(a, b) for a, b in zones if b - a >= rule.min_duration_s]


def phase_spans(t_s: Sequence[float], phases: Sequence[str]) -> list[tuple[float, float, str]]:
    """Contiguous runs of one phase tag as (start, end, phase); a run lasts until the next run's first sample."""
    spans: list[tuple[float, float, str]] = []
    for i, (t, p) in enumerate(zip(t_s, phases)):
        if spans and spans[-1][2] == p:
            continue
        if spans:
            spans[-1] = (spans[-1][0], t, spans[-1][2])
        spans.append((t, t, p))
    if spans:
        spans[-1] = (spans[-1][0], t_s[-1], spans[-1][2])
    return spans


def step_lengths(step: StepRecord) -> np.ndarray:
    """Every completion's length (tokens) of a step."""
    return np.asarray(step.completion_lengths, dtype=float)


def quarter_lengths(steps: Sequence[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths of the first quarter's steps, of the last quarter's), as quarter_means splits them."""
    q = max(1, len(steps) // 4)
    return (np.concatenate([step_lengths(s) for s in steps[:q]]),
            np.concatenate([step_lengths(s) for s in steps[-q:]]))


# ---------------------------------------------------------------------------------------------
# reading the folder


def _require(path: Path, why: str) -> Path:
    if not is_stored(path):
        raise FileNotFoundError(f"{path}: not found; a GRPO report needs the run's {path.name} ({why})")
    return path


def comparisons(pred: dict | None, steps: Sequence[StepRecord]) -> tuple[Comparison, ...]:
    """Measured medians over steps (as results.json) beside predictions.json's step prior; the prior's keys are
    StepRecord's field names."""
    prior = (pred or {}).get("step", {})
    rows = [("rollout tokens/s", "tokens/s", "rollout_tokens_per_s"), ("rollout", "ms", "rollout_ms"),
            ("reference", "ms", "reference_ms"), ("update", "ms", "update_ms"),
            ("weight sync", "ms", "weight_sync_ms"), ("step time", "ms", "step_ms")]
    out = []
    for name, unit, key in rows:
        measured = [_float(getattr(s, key)) for s in steps]
        out.append(Comparison(name, unit, _float(prior[key]) if key in prior else None,
                              float(np.median(measured)) if measured else None))
    return tuple(out)


def gpu_trace(events: Sequence[dict]) -> GpuTrace | None:
    """All gpu_samples events in file order; times relative to the first sample."""
    cols: dict[str, list] = {"t_s": [], "gpu": [], "util_pct": [], "mem_used_bytes": [], "phase": []}
    for ev in events:
        if ev.get("event") == "gpu_samples":
            for k in cols:
                cols[k] += ev[k]
    if not cols["t_s"]:
        return None
    t0 = min(cols["t_s"])
    return GpuTrace(tuple(t - t0 for t in cols["t_s"]), tuple(int(g) for g in cols["gpu"]),
                    tuple(float(u) for u in cols["util_pct"]), tuple(b / 2**30 for b in cols["mem_used_bytes"]),
                    tuple(cols["phase"]))


def find_dead_zones(trace: GpuTrace | None, rule: DeadZoneRule) -> tuple[DeadZone, ...]:
    if trace is None:
        return ()
    out = []
    for g in sorted(set(trace.gpu)):
        mine = trace.of_gpu(g)
        for a, b in dead_zones(mine.t_s, mine.util_pct, rule):
            tags = {p for t, u, p in zip(mine.t_s, mine.util_pct, mine.phase)
                    if a <= t < b and u < rule.util_below_pct}
            out.append(DeadZone(g, a, b, tuple(sorted(tags))))
    return tuple(out)


def component_series(steps: Sequence[StepRecord], key: str) -> list[float] | None:
    """A reward's mean per step: key 'reward/<name>' a component (None when a step lacks it), 'reward_mean' the
    weighted total; None for no steps."""
    if not steps:
        return None
    if key == "reward_mean":
        return [_float(s.reward_mean) for s in steps]
    name = key.removeprefix("reward/")
    return [_float(s.reward_components[name]) for s in steps] if all(name in s.reward_components for s in steps) \
        else None


def monitor_flags(steps: Sequence[StepRecord], th: MonitorThresholds) -> tuple[HackFlag, ...]:
    correct = component_series(steps, CORRECTNESS_KEY)
    lengths = [_float(s.len_mean) for s in steps]
    return (length_hacking_flag(lengths, correct, th),
            format_only_flag(component_series(steps, FORMAT_KEY), correct, th))


def summarize(run_dir: str | Path, rule: DeadZoneRule = DeadZoneRule(),
              th: MonitorThresholds = MonitorThresholds()) -> ReportData:
    """Every number the report shows, from the run folder alone."""
    rd = RunDir(run_dir)
    cfg: GrpoConfig = load_grpo_config(_require(rd.config_path, "the resolved config"))
    _require(rd.metrics_path, "the per-step events train.py writes")
    events = list(rd.events())
    steps = tuple(steps_from_events(events, str(rd.metrics_path)))
    if not steps:
        raise ValueError(f"{rd.metrics_path}: no grpo_step events; nothing to report")
    pred = rd.read_optional("predictions.json")
    results = rd.read_optional("results.json") or {}
    monitor = [e for e in events if e.get("event") == "gpu_monitor"]
    trace = gpu_trace(events)
    return ReportData(
        run_dir=str(rd.path), run_name=cfg.run.name, max_steps=cfg.train.max_steps, kl_coef=cfg.loss.kl_coef,
        kl_logged=cfg.loss.log_kl or cfg.loss.kl_coef > 0, steps=steps,
        reward_components=tuple(f"reward/{n}" for n in cfg.data.rewards),
        shares=phase_shares(steps), comparisons=comparisons(pred, steps), flags=monitor_flags(steps, th),
        gpu=trace, gpu_reason=str(monitor[-1].get("reason", "")) if monitor else "no gpu_monitor event",
        dead_zones=find_dead_zones(trace, rule), dead_rule=rule,
        wall_s=_float(results["wall_s_this_launch"]) if "wall_s_this_launch" in results else None,
        has_predictions=pred is not None, heldout=rd.read_optional("eval/summary.json"),
        curve=tuple(read_curve(events)))


# ---------------------------------------------------------------------------------------------
# plot (plots.py: the Agg canvas, no pyplot state)


def _x(d: ReportData) -> list[int]:
    return [s.step for s in d.steps]


def plot_step_time(d: ReportData, path: Path) -> Path:
    fig, (ax,) = figure()
    bottom = np.zeros(len(d.steps))
    for share in d.shares:
        if share.phase == "other":
            ms = np.array([_float(s.step_ms) for s in d.steps]) - bottom
        else:
            ms = np.array([_float(PHASE_MS[share.phase](s)) for s in d.steps])
        ax.bar(_x(d), ms, bottom=bottom, color=PHASE_COLORS[share.phase],
               label=f"{share.phase} ({share.mean_share:.0%})")
        bottom += ms
    finish(ax, "step", "wall-clock (ms)", f"{d.run_name}: step time by phase (mean share)")
    return save(fig, path)


def plot_rewards(d: ReportData, path: Path) -> Path:
    fig, (ax,) = figure()
    for key in d.reward_components:
        series = component_series(d.steps, key)
        if series is not None:
            ax.plot(_x(d), series, lw=1, label=key.split("/", 1)[1])
    ax.plot(_x(d), _series(d, lambda s: s.reward_mean), "k-", lw=2, label="total (weighted)")
    finish(ax, "step", "mean reward per completion", f"{d.run_name}: rewards")
    return save(fig, path)


def plot_kl(d: ReportData, path: Path) -> Path:
    fig, (ax,) = figure()
    ax.plot(_x(d), _series(d, lambda s: s.kl_mean), "o-", ms=3, label="k3 KL to reference")
    finish(ax, "step", "mean KL per token (nats)", f"{d.run_name}: KL to reference (kl_coef={d.kl_coef:g})")
    return save(fig, path)


def plot_lengths(d: ReportData, path: Path) -> Path:
    fig, (hist, mean) = figure(rows=2, height_in=3.4)
    q = max(1, len(d.steps) // 4)
    first, last = quarter_lengths(d.steps)
    length_histograms(hist, first, last, (f"first {q} step(s)", f"last {q} step(s)"))
    finish(hist, "completion length (tokens)", "density", "length distribution")
    mean.plot(_x(d), _series(d, lambda s: s.len_mean), "o-", ms=3, label="mean")
    mean.fill_between(_x(d), _series(d, lambda s: s.len_p10), _series(d, lambda s: s.len_p90),
                      alpha=0.2, label="p10-p90")
    finish(mean, "step", "tokens", "completion length over steps")
    return save(fig, path)


def _shade(ax, d: ReportData, first: GpuTrace) -> None:
    seen: set[str] = set()
    for a, b, p in phase_spans(first.t_s, first.phase):
        ax.axvspan(a, b, color=PHASE_COLORS.get(p, "tab:gray"), alpha=0.12, lw=0,
                   label=None if p in seen else p)
        seen.add(p)


def plot_gpu(d: ReportData, path: Path) -> Path:
    assert d.gpu is not None
    fig, (util, mem) = figure(rows=2, height_in=3.4)
    gpus = sorted(set(d.gpu.gpu))
    _shade(util, d, d.gpu.of_gpu(gpus[0]))  # all GPUs are sampled at the same ticks with the same tag
    for g in gpus:
        mine = d.gpu.of_gpu(g)
        util.plot(mine.t_s, mine.util_pct, lw=1, label=f"GPU {g}")
        mem.plot(mine.t_s, mine.mem_gib, lw=1, label=f"GPU {g}")
    util.axhline(d.dead_rule.util_below_pct, ls="--", color="gray")
    for i, z in enumerate(d.dead_zones):
        util.axvspan(z.start_s, z.end_s, ymax=0.08, color="black", alpha=0.8,
                     label=None if i else f"dead zone (<{d.dead_rule.util_below_pct:g}% for "
                                          f">={d.dead_rule.min_duration_s:g} s)")
    finish(util, "seconds since first sample", "utilization (%)", f"{d.run_name}: GPU utilization by phase")
    finish(mem, "seconds since first sample", "memory used (GiB)", "GPU memory")
    return save(fig, path)


# ---------------------------------------------------------------------------------------------
# render

_FORMATS = {"tokens/s": "{:,.1f}", "ms": "{:,.1f}"}


def _num(value: float | None, unit: str = "") -> str:
    return num(value, _FORMATS.get(unit, "{:.4g}"))


def _series(d: ReportData, get: Callable[[StepRecord], float]) -> list[float]:
    return [_float(get(s)) for s in d.steps]


def _headline_md(d: ReportData) -> list[str]:
    cmp = {c.name: c for c in d.comparisons}
    r0, r1 = quarter_means(_series(d, lambda s: s.reward_mean))
    top = max(d.shares, key=lambda s: s.mean_share)
    flagged = [f.name for f in d.flags if f.triggered]
    wall = f", {d.wall_s:,.1f} s wall-clock (last launch)" if d.wall_s is not None else ""
    return [f"# GRPO report: {d.run_name}", "",
            f"Run folder `{d.run_dir}`: {len(d.steps)} of {d.max_steps} steps{wall}.", "",
            f"- median step time {_num(cmp['step time'].measured, 'ms')} ms, median rollout "
            f"{_num(cmp['rollout tokens/s'].measured, 'tokens/s')} tokens/s; largest phase: {top.phase} "
            f"({top.mean_share:.1%} of a step on average)",
            f"- total reward {r0:.3f} (first quarter) -> {r1:.3f} (last quarter)",
            f"- reward-hacking monitor: {', '.join(flagged) if flagged else 'no flags'}", ""]


def _step_time_md(d: ReportData) -> list[str]:
    rows = [f"| {s.phase} | {s.mean_ms:,.1f} | {s.mean_share:.1%} |" for s in d.shares]
    return ["## Step time by phase", "", "| phase | mean ms | mean share of step |", "|---|---:|---:|", *rows, "",
            "Share = phase ms / step ms per step, averaged over steps; `other` is the step's time outside the "
            "timed phases (collation, advantages, logging).", "", "![step time](figures/step_time.png)", ""]


def _rewards_md(d: ReportData) -> list[str]:
    rows = []
    for key in (*d.reward_components, "reward_mean"):
        series = component_series(d.steps, key)
        if series is not None:
            a, b = quarter_means(series)
            rows.append(f"| {'total (weighted)' if key == 'reward_mean' else key} | {a:.3f} | {b:.3f} |")
    return ["## Rewards", "", "| reward | first quarter | last quarter |", "|---|---:|---:|", *rows, "",
            "![rewards](figures/rewards.png)", ""]


def _kl_md(d: ReportData) -> list[str]:
    kl = _series(d, lambda s: s.kl_mean)
    if not d.kl_logged:
        text = "loss.kl_coef = 0 and loss.log_kl off: no reference pass, so the logged KL is 0 by construction."
    else:
        a, b = quarter_means(kl)
        text = f"Mean k3 KL to the reference per token: {a:.4g} (first quarter) -> {b:.4g} (last), max {max(kl):.4g}."
        if d.kl_coef == 0:
            text += " Measured only (loss.kl_coef = 0: the KL is not in the loss)."
    return ["## KL to reference", "", text, "", "![kl](figures/kl.png)", ""]


def _lengths_md(d: ReportData) -> list[str]:
    a, b = quarter_means(_series(d, lambda s: s.len_mean))
    first, last = quarter_lengths(d.steps)
    source = "every completion's length as logged"
    return ["## Completion length", "",
            f"Mean completion length {a:.1f} tokens (first quarter) -> {b:.1f} (last quarter); median "
            f"{np.median(first):.0f} -> {np.median(last):.0f}, p90 {np.percentile(first, 90):.0f} -> "
            f"{np.percentile(last, 90):.0f}. Histograms: {source}.", "", "![lengths](figures/lengths.png)", ""]


def _curve_md(d: ReportData) -> list[str]:
    if not d.curve:
        return []
    best = max(d.curve, key=lambda p: p["greedy_pass1"])
    pct = lambda x: "—" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    rows = [f"| {p['step']} | {pct(p['greedy_pass1'])} | {pct(p.get('strict_pass1'))} | "
            f"{p['greedy_tokens_mean']:.0f} |" for p in d.curve]
    return ["## Held-out curve", "",
            f"Greedy pass@1 on the first {d.curve[0]['n']} held-out examples every few steps (eval.every); the best "
            f"point is step {best['step']} at {100 * best['greedy_pass1']:.1f}%.", "",
            "| step | greedy pass@1 | strict | mean tokens |", "|---:|---:|---:|---:|", *rows, ""]


def _heldout_md(d: ReportData) -> list[str]:
    h = d.heldout
    if h is None:
        return ["## Held-out pass@1", "", "Not measured (eval.at_end was off; `scalelab grpo eval <run>` adds it).", ""]
    rows = []
    for key, name in (("greedy_pass1", "greedy pass@1"), ("sampled_pass1", "sampled pass@1")):
        x = h.get(key)
        if x:
            rows.append(f"| {name} | {100 * x['base']:.1f}% | {100 * x['trained']:.1f}% | {100 * x['delta']:+.1f} | "
                        f"{100 * x['ci_low']:+.1f} to {100 * x['ci_high']:+.1f} |")
    n_at = h.get("pass_at_n")
    if n_at:
        rows.append(f"| pass@{n_at['n']} | {100 * n_at['base']:.1f}% | {100 * n_at['trained']:.1f}% | "
                    f"{100 * (n_at['trained'] - n_at['base']):+.1f} | — |")
    conf = next((h[k]["confidence"] for k in ("greedy_pass1", "sampled_pass1") if h.get(k)), 0.95)
    return ["## Held-out pass@1", "",
            f"Split `{h['split']}` of `{h['task']}` {h['task_options']} ({h['n_examples']} examples, never trained "
            f"on), base policy vs the policy after {h['trained_steps']} steps.", "",
            f"| metric | base | trained | difference (points) | {100 * conf:.0f}% paired bootstrap CI |",
            "|---|---:|---:|---:|---:|", *rows, ""]


def _curriculum_md(d: ReportData) -> list[str]:
    stages = [c for s in d.steps if (c := s.curriculum) is not None]
    if len(stages) < len(d.steps):      # logged only with data.curriculum.enabled
        return []
    promoted = [s.step for s, c in zip(d.steps, stages) if c.promoted]
    final = stages[-1].next_stage
    return ["## Curriculum", "",
            f"Stage of each batch is logged per step (`curriculum_stage`); promotions after steps "
            f"{', '.join(map(str, promoted)) or '(none)'}; the run ended at stage {final}.", ""]


def _gpu_md(d: ReportData) -> list[str]:
    if d.gpu is None:
        return ["## GPU utilization and memory", "",
                f"No NVML samples were recorded; the GPU monitor said: {d.gpu_reason or 'nothing'}.", ""]
    span_s = max(d.gpu.t_s) or 1.0
    rule = d.dead_rule
    rows = [f"| {z.gpu} | {z.start_s:.2f} | {z.end_s:.2f} | {z.duration_s:.2f} | {', '.join(z.phases)} |"
            for z in d.dead_zones]
    per_gpu = {g: sum(z.duration_s for z in d.dead_zones if z.gpu == g) for g in sorted(set(d.gpu.gpu))}
    dead = "; ".join(f"GPU {g}: {s:.2f} s ({s / span_s:.1%})" for g, s in per_gpu.items())
    return ["## GPU utilization and memory", "",
            f"{len(d.gpu.t_s)} samples over {span_s:.2f} s. Dead zones (utilization < {rule.util_below_pct:g}% "
            f"for >= {rule.min_duration_s:g} s, ending at the first sample back above): {len(d.dead_zones)}; "
            f"time in them: {dead}.", "",
            "| GPU | start s | end s | duration s | phases |", "|---:|---:|---:|---:|---|", *rows, "",
            "![gpu](figures/gpu.png)", ""]


def _comparison_md(d: ReportData) -> list[str]:
    rows = [f"| {c.name} ({c.unit}) | {_num(c.predicted, c.unit)} | {_num(c.measured, c.unit)} | "
            f"{'—' if c.ratio is None else f'{c.ratio:.2f}'} |" for c in d.comparisons]
    note = "" if d.has_predictions else " No predictions.json in the run folder."
    return ["## Predicted vs measured", "", "| quantity | predicted | measured (median over steps) | "
            "measured / predicted |", "|---|---:|---:|---:|", *rows, "",
            f"Predictions are predictions.json's per-step prior, written before step 0.{note}", ""]


def _monitor_md(d: ReportData) -> list[str]:
    mark = lambda f: "**FLAG**" if f.triggered else ("ok" if f.checked else "not checked")  # noqa: E731
    return ["## Reward-hacking monitor", "", *(f"- {mark(f)} — {f.name}: {f.detail}" for f in d.flags), ""]


def render_markdown(d: ReportData) -> str:
    return "\n".join([*_headline_md(d), *_step_time_md(d), *_rewards_md(d), *_heldout_md(d), *_curve_md(d),
                      *_curriculum_md(d), *_kl_md(d), *_lengths_md(d), *_gpu_md(d), *_comparison_md(d),
                      *_monitor_md(d)])


# ---------------------------------------------------------------------------------------------
# save


def report(run_dir: str | Path, rule: DeadZoneRule = DeadZoneRule(),
                 th: MonitorThresholds = MonitorThresholds()) -> Path:
    """figures/*.png and REPORT.md in the run folder; returns REPORT.md's path."""
    d = summarize(run_dir, rule, th)
    rd = RunDir(run_dir)
    plot_step_time(d, rd.figures / "step_time.png")
    plot_rewards(d, rd.figures / "rewards.png")
    plot_kl(d, rd.figures / "kl.png")
    plot_lengths(d, rd.figures / "lengths.png")
    if d.gpu is not None:
        plot_gpu(d, rd.figures / "gpu.png")
    return rd.write_report(render_markdown(d))


build_report = report   # the name callers have used

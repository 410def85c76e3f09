"""docs/grpo.md: a page of blocks from its manifest (docs/grpo.toml), or, from a results folder alone, the flat
list of sections below.

    docs(manifest, out) -> Path               the manifest's page (docs_blocks): prose, calc output and sections
                                              of any kind in KINDS, each reading the files its keys name
    KINDS                                     every section kind: the toy-model studies and benches below
                                              (EXISTING_KINDS), the real-model runs (docs_real) and benches
                                              (docs_bench)
    find_inputs(results_dir) -> DocInputs     read: the first rollout_bench.json, seeds.json, staleness.json,
                                              hacking.json found below the folder, and the GRPO run folder with
                                              the most GPU-sampled (else most) steps
    write_figures(d, fig_dir) -> {name: path} plot: every figure whose input exists
    render(d, figs) -> str                    render: one function per section; an absent input renders as
                                              "not measured yet", never as a number
    write_docs(results_dir, out) -> Path      all three, for a folder
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection

import numpy as np

from scalelab.core.jsonio import find_stored, read_json, read_text
from scalelab.core.sections import write_doc
from scalelab.grpo import docs_bench, docs_real, hacking, report, stalestudy
from scalelab.grpo.docs_blocks import FIGURES, NOT_MEASURED, BlockKind, Inputs, write_page
from scalelab.grpo.plots import figure, finish, save
from scalelab.grpo.rolloutcost import step_cost_lines, step_costs
from scalelab.grpo.serversync import server_sync_lines


@dataclass(frozen=True)
class DocInputs:
    results_dir: Path
    bench: dict | None  # rollout_bench.json (bench/grpo_rollout_bench.py)
    seeds: dict | None  # seeds.json (grpo seeds)
    staleness: dict | None  # staleness.json (grpo staleness)
    hacking: dict | None  # hacking.json (grpo hacking)
    run: report.ReportData | None  # the run whose step breakdown and GPU trace are shown
    sources: dict[str, str]  # input name -> path relative to results_dir
    more_benches: list[tuple[str, dict]] = field(default_factory=list)  # other rollout-bench files: (path, data)
    server_syncs: list[tuple[str, dict]] = field(default_factory=list)  # nccl_sync_bench files: (path, data)
    command: str = ""  # the command that regenerates the page


def _first(root: Path, name: str) -> Path | None:
    # plain names also for gzipped files, so the page names a source the same way either way
    found = sorted(find_stored(root, name), key=lambda p: (len(p.parts), str(p)))
    return found[0] if found else None


def _primary_run(root: Path) -> Path | None:
    """The run folder with the most GPU-sampled steps (ties: most steps; then path order)."""
    best, best_key = None, None
    for metrics in find_stored(root, "metrics.jsonl"):
        if not (metrics.parent / "config.toml").is_file():
            continue
        events = [line for line in read_text(metrics).splitlines() if line.strip()]
        steps = sum('"event": "grpo_step"' in e for e in events)
        sampled = sum('"event": "gpu_samples"' in e for e in events)
        key = (sampled > 0, steps)
        if steps and (best_key is None or key > best_key):
            best, best_key = metrics.parent, key
    return best


def _bench_files(root: Path, primary: Path | None) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    """One pass over every JSON under root: (path, data) of the rollout-bench files other than the primary (other
    batch sizes, vLLM option variants), then of bench/grpo_nccl_sync_bench.py's (timed syncs into a vLLM server)."""
    benches, syncs = [], []
    for f in find_stored(root, "*.json"):
        if f == primary or f.name in ("seeds.json", "staleness.json", "hacking.json"):
            continue
        try:
            data = read_json(f)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if "engines" in data and "batch" in data:
            benches.append((str(f.relative_to(root)), data))
        elif "timings" in data and "checks" in data:
            syncs.append((str(f.relative_to(root)), data))
    return benches, syncs


INPUTS = ("rollout_bench", "seeds", "staleness", "hacking")


def find_inputs(results_dir: str | Path, command: str = "") -> DocInputs:
    """The first file of each input found below results_dir, the primary run, and every other bench file."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such results folder")
    files = {k: _first(root, f"{k}.json") for k in INPUTS}
    run_dir = _primary_run(root)
    sources = {k: str(p.relative_to(root)) for k, p in files.items() if p is not None}
    if run_dir is not None:
        sources["run"] = str(run_dir.relative_to(root)) or "."
    load = lambda k: read_json(files[k]) if files[k] else None  # noqa: E731
    return DocInputs(root, load("rollout_bench"), load("seeds"), load("staleness"), load("hacking"),
                     report.summarize(run_dir) if run_dir else None, sources,
                     *_bench_files(root, files["rollout_bench"]),
                     command=command or f"scalelab grpo docs {root}")


# ---------------------------------------------------------------------------------------------
# figures


def plot_throughput(bench: dict, path: Path) -> Path:
    fig, (ax,) = figure(height_in=3.6)
    names = list(bench["engines"])
    ax.bar(names, [bench["engines"][n]["tokens_per_s"] for n in names], color=["tab:gray", "tab:blue"][:len(names)])
    b = bench["batch"]
    finish(ax, "engine", "completion tokens/s", f"rollout throughput: {b['prompts']} x {b['group_size']} sequences, "
           f"{b['max_new_tokens']} new tokens")
    return save(fig, path)


def plot_sync_share(bench: dict, path: Path) -> Path:
    """One stacked bar per sync method: the stated step = rollout (fastest engine) + update + sync."""
    fig, (ax,) = figure(height_in=3.6)
    rollout, update = _rollout_ms(bench), bench.get("update_ms") or 0.0
    labels = [s["label"] for s in bench["weight_sync"]]
    syncs = np.array([s["median_ms"] for s in bench["weight_sync"]])
    ax.barh(labels, [rollout] * len(labels), color="tab:blue", label="rollout")
    ax.barh(labels, [update] * len(labels), left=rollout, color="tab:red", label="update")
    ax.barh(labels, syncs, left=rollout + update, color="tab:purple", label="weight sync")
    finish(ax, "ms per step", "", "step time with each weight-sync method")
    return save(fig, path)


# figure key -> its file name (without .png): a block's figures add a suffix naming the block's input
FIGURE_FILES = {"step_time": "grpo_step_time", "gpu": "grpo_gpu", "throughput": "grpo_rollout_throughput",
                "sync": "grpo_weight_sync", "staleness": "grpo_staleness_curves",
                "staleness_final": "grpo_staleness_final", "lengths": "grpo_hacking_lengths"}


def _figure_makers(d: DocInputs) -> dict[str, Callable[[Path], Path]]:
    """figure key -> the function drawing it to a path, for every figure whose input is there."""
    out: dict[str, Callable[[Path], Path]] = {}
    if d.run is not None:
        out["step_time"] = lambda p: report.plot_step_time(d.run, p)
        if d.run.gpu is not None:
            out["gpu"] = lambda p: report.plot_gpu(d.run, p)
    if d.bench is not None:
        out["throughput"] = lambda p: plot_throughput(d.bench, p)
        if d.bench.get("weight_sync"):
            out["sync"] = lambda p: plot_sync_share(d.bench, p)
    if d.staleness is not None:
        out["staleness"] = lambda p: stalestudy.plot_curves(d.staleness["variants"], p)
        out["staleness_final"] = lambda p: stalestudy.plot_final(d.staleness["variants"], p)
    if d.hacking is not None:
        arms = [_arm(a) for a in d.hacking["arms"]]
        out["lengths"] = lambda p: hacking.plot_lengths(arms, d.hacking["lengths"], p)
    return out


def write_figures(d: DocInputs, fig_dir: Path, keys: Collection[str] | None = None,
                  suffix: str = "") -> dict[str, Path]:
    """Every figure whose input exists (only `keys`, when given), each as FIGURE_FILES' name + suffix."""
    return {k: make(fig_dir / f"{FIGURE_FILES[k]}{suffix}.png") for k, make in _figure_makers(d).items()
            if keys is None or k in keys}


def _arm(a: dict) -> hacking.Arm:
    flags = tuple(report.HackFlag(**f) for f in a["flags"])
    return hacking.Arm(**{**a, "flags": flags})


# ---------------------------------------------------------------------------------------------
# sections


def _img(figs: dict[str, Path], key: str, out_dir: Path, alt: str) -> list[str]:
    return [f"![{alt}]({figs[key].relative_to(out_dir).as_posix()})", ""] if key in figs else []


def _rollout_ms(bench: dict) -> float:
    fastest = max(bench["engines"].values(), key=lambda e: e["tokens_per_s"])
    return float(fastest["median_ms"])


def _intro(d: DocInputs) -> list[str]:
    found = ", ".join(f"`{k}` ({v})" for k, v in sorted(d.sources.items())) or "nothing"
    return ["# GRPO rollout infrastructure: where a step's time goes", "",
            f"*Generated by `{d.command}`; every number is read from the files found there: "
            f"{found}. A section whose file is absent says so.*", ""]


def _step_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## Step time by phase", ""]
    if d.run is None:
        return head + [f"{NOT_MEASURED}: no GRPO run folder (config.toml + metrics.jsonl) in the results.", ""]
    rows = [f"| {s.phase} | {s.mean_ms:,.1f} | {s.mean_share:.1%} |" for s in d.run.shares]
    top = max(d.run.shares, key=lambda s: s.mean_share)
    return head + [f"Run `{d.sources['run']}` ({d.run.run_name}, {len(d.run.steps)} steps): {top.phase} takes "
                   f"{top.mean_share:.1%} of a step on average.", "",
                   "| phase | mean ms | mean share of step |", "|---|---:|---:|", *rows, "",
                   *_img(figs, "step_time", out_dir, "step time by phase")]


def _gpu_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## GPU utilization and dead zones", ""]
    if d.run is None or d.run.gpu is None:
        why = "" if d.run is None else f" (the run's GPU monitor said: {d.run.gpu_reason or 'nothing'})"
        return head + [f"{NOT_MEASURED}: no NVML samples{why}.", ""]
    g, rule = d.run.gpu, d.run.dead_rule
    span = max(g.t_s) or 1.0
    dead = sum(z.duration_s for z in d.run.dead_zones)
    by_phase: dict[str, list[float]] = {}
    for u, p in zip(g.util_pct, g.phase):
        by_phase.setdefault(p, []).append(u)
    rows = [f"| {p} | {np.mean(v):.1f} | {len(v)} |" for p, v in sorted(by_phase.items())]
    return head + [f"{len(g.t_s)} samples over {span:.1f} s; {len(d.run.dead_zones)} dead zone(s) (utilization < "
                   f"{rule.util_below_pct:g}% for >= {rule.min_duration_s:g} s) totalling {dead:.1f} s "
                   f"({dead / span:.1%} of the sampled time, summed over GPUs). NVML reports the whole GPU's "
                   "utilization: where runs share a GPU (the studies run several at once), it is their sum, so "
                   "a run's own dead zones can be filled by its neighbours.", "",
                   "| phase | mean utilization % | samples |", "|---|---:|---:|", *rows, "",
                   *_img(figs, "gpu", out_dir, "GPU utilization")]


def _throughput_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## Rollout throughput: vLLM vs the trainer's own generate", ""]
    b = d.bench
    if b is None:
        return head + [f"{NOT_MEASURED}: no rollout_bench.json (bench/grpo_rollout_bench.py writes it).", ""]
    m, batch = b["model"], b["batch"]
    rows = [f"| {n} | {e['tokens_per_s']:,.0f} | {e['median_ms']:,.0f} | {e['completion_tokens']:,} |"
            for n, e in b["engines"].items()]
    ratio = b.get("ratio_vllm_over_hf")
    verdict = (" vLLM was not measured in this file." if ratio is None else
               f" Same prompt ids and sampling for both engines: vLLM generates **{ratio:.2f}x** the tokens/s of HF "
               "`generate`.")
    size = f"{m['n_params'] / 1e9:.2f}B" if m["n_params"] >= 1e8 else f"{m['n_params'] / 1e6:.2f}M"
    return head + [f"Model {m['name']} ({size} parameters, {m['dtype']}"
                   f"{', random weights' if m.get('random_weights') else ''}) on {b['device']}; one batch of "
                   f"{batch['prompts']} prompts x {batch['group_size']} samples = {batch['sequences']} sequences, "
                   f"prompt mean {batch['prompt_tokens_mean']:.0f} tokens, up to {batch['max_new_tokens']} new "
                   f"tokens, temperature {batch['temperature']:g}, top_p {batch['top_p']:g}.{verdict}", "",
                   "| engine | completion tokens/s | median ms per batch | completion tokens |", "|---|---:|---:|---:|",
                   *rows, "", *_img(figs, "throughput", out_dir, "rollout throughput"), *_more_benches(d),
                   *step_cost_lines(step_costs(_all_benches(d)))]


def _all_benches(d: DocInputs) -> list[tuple[str, dict]]:
    """(path, data) of the primary rollout bench, then of every other bench file."""
    primary = [] if d.bench is None else [(d.sources.get("bench", "rollout_bench.json"), d.bench)]
    return primary + d.more_benches


def _more_benches(d: DocInputs, goal: float = 5.0) -> list[str]:
    """The other batches and vLLM option sets, each with its own HF baseline measured in the same process."""
    if not d.more_benches:
        return []
    rows = []
    for path, b in d.more_benches:
        hf, v = b["engines"]["hf"], b["engines"].get("vllm_colocated")
        eff = (b.get("vllm_options") or {}).get("effective") or {}
        ratio = b.get("ratio_vllm_over_hf")
        rows.append(f"| {path} | {b['batch']['sequences']:,} x {b['batch']['max_new_tokens']} | {_lengths(b)} | "
                    f"{hf['tokens_per_s']:,.0f} | {v['tokens_per_s']:,.0f} | {ratio:.2f} | "
                    f"{eff.get('flat_logprobs', '-')} | {eff.get('max_cudagraph_capture_size', '-')} | "
                    f"{eff.get('engine_core', 'inprocess')} |"
                    if v else f"| {path} | {b['batch']['sequences']:,} | {_lengths(b)} | {hf['tokens_per_s']:,.0f} | "
                              "- | - | - | - | - |")
    return [_more_benches_head(d, goal), "",
            "Lengths 'fixed': every sequence runs to the cap; 'lognormal': emulated long-tailed lengths (mean, "
            "max / mean), HF generating each batch to its longest and counting useful tokens only.", "",
            "| file | sequences x new tokens | lengths | HF tok/s | vLLM tok/s | vLLM / HF | flat logprobs | "
            "CUDA graphs up to | engine core |",
            "|---|---:|---|---:|---:|---:|---|---:|---|", *rows, ""]


def _more_benches_head(d: DocInputs, goal: float) -> str:
    """The best ratio over every file, and apart with fixed lengths, where HF wastes no padded steps: a goal met
    only with long-tailed lengths says so."""
    ratios = [(r, p, b) for p, b in _all_benches(d) if (r := b.get("ratio_vllm_over_hf"))]
    fixed = [x for x in ratios if not (x[2].get("lengths") or {}).get("emulated")]
    verdict = ""
    if ratios:
        best, best_fixed = max(ratios, key=lambda x: x[0]), max(fixed, key=lambda x: x[0]) if fixed else None
        met = ("met" if best_fixed and best_fixed[0] >= goal else
               f"met only with long-tailed lengths ({_lengths(best[2])}), not with fixed lengths"
               if best[0] >= goal else "not met")
        verdict = (f" Best vLLM / HF ratio over these files: **{best[0]:.2f}x** ({best[1]})"
                   + (f"; with fixed lengths: **{best_fixed[0]:.2f}x** ({best_fixed[1]})" if best_fixed else "")
                   + f"; goal >= {goal:g}x: {met}.")
    return ("Other batches and vLLM settings (each file measures HF `generate` again as its own baseline; "
            "'-' = vLLM's default or not recorded)." + verdict)


def _lengths(bench: dict) -> str:
    """How a bench drew its response lengths: 'fixed', or the mode with mean and max/mean of the drawn lengths."""
    ln = bench.get("lengths") or {}
    if not ln.get("emulated"):
        return "fixed"
    return f"{ln['mode']} (mean {ln['mean']:.0f}, max/mean {ln['max_over_mean']:.1f})"


def _sync_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## Weight-sync cost", ""]
    b = d.bench
    server = server_sync_lines(d.server_syncs, _all_benches(d))
    if b is None or not b.get("weight_sync"):
        return head + [f"{NOT_MEASURED}: no weight-sync timings in rollout_bench.json.", "", *server]
    rows = []
    for path, bench in _all_benches(d):
        rollout, update = _rollout_ms(bench), bench.get("update_ms")
        core = ((bench.get("vllm_options") or {}).get("effective") or {}).get("engine_core", "inprocess")
        for s in bench.get("weight_sync") or []:
            step = rollout + (update or 0.0) + s["median_ms"]
            rows.append(f"| {path} | {s['label']} | {core} | {s['median_ms']:,.1f} | {s['bytes'] / 2**20:,.1f} | "
                        f"{rollout:,.0f} + {'-' if update is None else f'{update:,.0f}'} | "
                        f"{s['median_ms'] / step:.2%} |")
    return head + ["Stated step of each file: its rollout (the faster engine) + its update (one optimizer step on "
                   "the same batch) + the sync; share = sync / that step. The engine core says where vLLM ran: "
                   "in process the weights load through apply_model, in its own process as CUDA IPC handles.", "",
                   "| file | sync | vLLM engine core | median ms | MiB moved | rollout + update ms | share of step |",
                   "|---|---|---|---:|---:|---:|---:|", *rows, "", *_img(figs, "sync", out_dir, "weight sync share"),
                   *server]


def _staleness_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## Staleness: the cost of rollouts from older weights", ""]
    if d.staleness is None:
        return head + [f"{NOT_MEASURED}: no staleness.json (`scalelab grpo staleness`).", ""]
    rows = []
    for r in d.staleness["variants"]:
        f, h = r["final"], r["final"]["heldout"]
        held = "not measured" if h is None else f"{h['trained']:.1f}% ({h['delta']:+.1f})"
        over = f["median_overlapped_step_ms"]
        rows.append(f"| {r['name']} | {f['reward_last_quarter']:.3f} | {f['mismatch_last_quarter']:.2e} | "
                    f"{'—' if over is None else f'{over:,.0f}'} | {held} |")
    return head + [f"Study `{d.staleness['name']}`: one run per k, same seed and data.", "",
                   "| variant | reward, last quarter | behaviour mismatch (k3) | overlapped step ms | held-out pass@1 "
                   "(gain, points) |", "|---|---:|---:|---:|---:|", *rows, "",
                   *_img(figs, "staleness", out_dir, "staleness curves"),
                   *_img(figs, "staleness_final", out_dir, "final held-out per k")]


def _hacking_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## Reward hacking: length distributions under an exploitable reward", ""]
    h = d.hacking
    if h is None:
        return head + [f"{NOT_MEASURED}: no hacking.json (`scalelab grpo hacking`).", ""]
    rows = [f"| {a['name']} | {a['len_mean_first']:.1f} -> {a['len_mean_last']:.1f} | "
            f"{100 * a['correctness_first']:.1f} -> {100 * a['correctness_last']:.1f} | "
            f"{'FLAGGED' if any(f['triggered'] for f in a['flags']) else 'not flagged'} |" for a in h["arms"]]
    v = h["verdict"]
    return head + [f"Exploit `{h['exploit']}` vs the same reward with defense `{h['defense']}` (target "
                   f"{h['target_chars']} characters). **Verdict: the defense "
                   f"{'works' if v['works'] else 'is not shown to work'}** — {'; '.join(v['reasons'])}.", "",
                   "| arm | mean length, first -> last quarter | train correctness % | monitor |",
                   "|---|---:|---:|---|", *rows, "", *_img(figs, "lengths", out_dir, "length histograms")]


def _seeds_section(d: DocInputs, figs: dict, out_dir: Path) -> list[str]:
    head = ["## Held-out pass@1 across seeds", ""]
    s = d.seeds
    if s is None or not s.get("metrics"):
        return head + [f"{NOT_MEASURED}: no seeds.json (`scalelab grpo seeds`).", ""]
    lines = []
    for key, m in s["metrics"].items():
        a = m["across_seeds"]
        ci = "" if a["ci_low"] is None else f", {100 * a['confidence']:.0f}% t interval {a['ci_low']:+.1f} to " \
                                             f"{a['ci_high']:+.1f}"
        per = ", ".join(f"seed {r['seed']}: {r['base']:.1f} -> {r['trained']:.1f} ({r['delta']:+.1f})"
                        for r in m["per_seed"])
        lines.append(f"- {key.replace('_', ' ')}: mean gain **{a['mean']:+.1f} points** over {a['n_seeds']} "
                     f"seeds{ci}; {per}. Goal +{s['goal_points']:g}: "
                     f"{m.get('verdict', 'met' if m['meets_goal'] else 'not met')}.")
    return head + [f"Split `{s['split']}` of `{s['task']}` {s['task_options']}, {s['n_examples']} examples, after "
                   f"{s['trained_steps']} steps.", "", *lines, ""]


SECTIONS: tuple[Callable[[DocInputs, dict, Path], list[str]], ...] = (
    _step_section, _gpu_section, _throughput_section, _sync_section, _staleness_section, _hacking_section,
    _seeds_section)


def render(d: DocInputs, figs: dict[str, Path], out_dir: Path) -> str:
    lines = _intro(d)
    for section in SECTIONS:
        lines += section(d, figs, out_dir)
    return "\n".join(lines)


def write_docs(results_dir: str | Path, out: str | Path = "docs/grpo.md") -> Path:
    """Folder mode: every section above, in order, from the files found below results_dir."""
    d, out = find_inputs(results_dir), Path(out)
    figs = write_figures(d, out.parent / FIGURES)
    return write_doc(render(d, figs, out.parent), out)


# ---------------------------------------------------------------------------------------------
# the sections above as blocks of a manifest's page (docs_blocks): each reads the files its keys name


def _block_inputs(inp: Inputs) -> DocInputs:
    """A DocInputs holding only what the block names; the others absent."""
    v = inp.values
    load = lambda k: read_json(inp.path(k)) if k in v else None  # noqa: E731
    primary = inp.path("rollout_bench") if "rollout_bench" in v else None
    benches, syncs = _bench_files(inp.path("benches"), primary) if "benches" in v else ([], [])
    return DocInputs(inp.results, load("rollout_bench"), load("seeds"), load("staleness"), load("hacking"),
                     report.summarize(inp.path("run")) if "run" in v else None,
                     {k: str(v[k]) for k in inp.paths}, benches, syncs)


NOTHING = DocInputs(Path("."), None, None, None, None, None, {})


def _kind(name: str, section: Callable[[DocInputs, dict, Path], list[str]], paths: tuple[str, ...],
          figures: tuple[str, ...] = ()) -> BlockKind:
    def render(inp: Inputs) -> list[str]:
        d = _block_inputs(inp)
        return section(d, write_figures(d, inp.out_dir / FIGURES, figures, inp.suffix), inp.out_dir)
    # the heading the section prints when given nothing: its own first line
    return BlockKind(name, section(NOTHING, {}, Path("."))[0], paths, render)


EXISTING_KINDS = (
    _kind("step", _step_section, ("run",), ("step_time",)),
    _kind("gpu", _gpu_section, ("run",), ("gpu",)),
    _kind("throughput", _throughput_section, ("rollout_bench", "benches"), ("throughput",)),
    _kind("sync", _sync_section, ("rollout_bench", "benches"), ("sync",)),
    _kind("staleness", _staleness_section, ("staleness",), ("staleness", "staleness_final")),
    _kind("hacking", _hacking_section, ("hacking",), ("lengths",)),
    _kind("seeds", _seeds_section, ("seeds",)))

# every kind a docs/grpo.toml [[page]] entry may name as `section = KIND`, with the keys it reads
KINDS: dict[str, BlockKind] = {k.name: k for k in (*EXISTING_KINDS, *docs_real.KINDS, *docs_bench.KINDS)}


def docs(manifest: str | Path, out: Path | None = None) -> Path:
    """docs/grpo.md (the manifest's `out`, or `out`): its blocks in order, figures beside it in figures/."""
    return write_page(manifest, KINDS, out)

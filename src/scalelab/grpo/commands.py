"""`scalelab grpo <verb>`: train, eval, seeds, staleness, hacking, report, docs, config."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalelab.core.config import add_config_args, format_description
from scalelab.grpo.capabilities import capabilities
from scalelab.grpo.config import GrpoConfig, load_grpo_config
from scalelab.grpo.report import DeadZoneRule, build_report


def _config_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p, "grpo", "rollout.staleness=2")


def _study_args(p: argparse.ArgumentParser, heldout: bool = True) -> None:
    _config_args(p)
    p.add_argument("--isolate", choices=("auto", "yes", "no"), default="auto",
                   help="each run in its own process; auto = yes for an engine whose GPU memory is not fully "
                        "handed back in-process (rollout.engine=vllm_colocated)")
    p.add_argument("--jobs", type=int, default=1, help="isolated runs at once (small models share one GPU well)")
    if heldout:
        p.add_argument("--no-heldout", action="store_true", help="skip the held-out pass@1 of each run")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)

    p = verbs.add_parser("train", help="predict, then run GRPO (rollout -> reward -> update -> weight sync), "
                                       "each phase timed into metrics.jsonl; resumes from the run's checkpoint. "
                                       "Data parallel on N GPUs: torchrun --nproc-per-node N -m scalelab.cli "
                                       "grpo train --config ...")
    _config_args(p)
    p.set_defaults(func=_train)

    p = verbs.add_parser("eval", help="held-out pass@1 of the base and the trained policy of a run folder, per "
                                      "example, with the paired bootstrap CI of the difference (eval/summary.json)")
    p.add_argument("run_dir", help="run folder with config.toml and checkpoint.json")
    p.add_argument("--force", action="store_true", help="re-score even when eval/base.json, trained.json exist")
    p.add_argument("--rescore", action="store_true",
                   help="no model, no GPU: score the kept generations (eval/base.json, trained.json) again, "
                        "recompute the comparison and check it against eval/summary.json (exit 1 if it differs)")
    p.add_argument("--drop-texts", nargs="?", const="base,trained", default=None, metavar="POLICIES",
                   help="no model, no GPU: rewrite eval/base.json and trained.json (or only the comma-separated "
                        "POLICIES named) keeping each problem's verdicts (lenient, strict) and token count but not "
                        "its text, for an ablation's committed run (refused unless the verdicts alone give "
                        "eval/summary.json; eval/texts.json says what went)")
    p.set_defaults(func=_eval)

    p = verbs.add_parser("export", help="a run's checkpointed policy as a plain HF folder (LoRA merged), for any "
                                        "engine to serve (e.g. `scalelab evals battery --model <folder>`)")
    p.add_argument("run_dir", help="run folder with config.toml and checkpoint.json")
    p.add_argument("out", help="the folder to write")
    p.set_defaults(func=_export)

    p = verbs.add_parser("seeds", help="the config trained once per seed; held-out pass@1 gain per seed and "
                                       "across seeds with CIs (<out_dir>/<name>/seeds.md)")
    _study_args(p, heldout=False)
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--goal-points", type=float, default=5.0, help="pass@1 gain the study aims at (points)")
    p.set_defaults(func=_seeds)

    p = verbs.add_parser("staleness", help="one run per staleness k (same seed and data), resumable; curves side "
                                           "by side and final held-out pass@1 per k (<out_dir>/<name>/staleness.md)")
    _study_args(p)
    p.add_argument("--k", type=_ints, default=[0, 1, 2, 4, 8], help="comma-separated staleness values")
    p.add_argument("--is-correction", action="store_true",
                   help="also run every k > 0 with the truncated importance-sampling correction (loss.is_correction)")
    p.add_argument("--is-k", type=_ints, default=None,
                   help="comma-separated k that also run with the correction (instead of every k > 0)")
    p.set_defaults(func=_staleness)

    p = verbs.add_parser("hacking", help="train on a deliberately exploitable reward and on the defended one; "
                                         "monitor flags, length histograms, verdict (<out_dir>/<name>/hacking.md)")
    _study_args(p)
    p.add_argument("--exploit", choices=("length", "format"), default="length", help="what the bad reward pays for")
    p.add_argument("--target-chars", type=int, default=0,
                   help="length_aware target; 0 = 2 x rollout.max_new_tokens (pay saturates near the budget)")
    p.add_argument("--exploit-weight", type=float, default=1.0, help="weight of the exploit term")
    p.set_defaults(func=_hacking)

    p = verbs.add_parser("report", help="REPORT.md and figures/*.png from a run folder alone: step-time breakdown, "
                                        "rewards, KL, lengths, GPU dead zones, predicted vs measured, hacking flags")
    p.add_argument("run_dir", help="run folder (config.toml, metrics.jsonl, predictions.json)")
    p.add_argument("--dead-util-pct", type=float, default=10.0, help="GPU utilization counted as idle (%%)")
    p.add_argument("--dead-min-s", type=float, default=1.0, help="shortest idle interval reported as a dead zone")
    p.set_defaults(func=_report)

    p = verbs.add_parser("docs", help="the rollout-infrastructure write-up from a results folder alone")
    p.add_argument("results_dir", nargs="?", default="docs/grpo.toml",
                   help="a docs manifest (.toml; default docs/grpo.toml), or a folder holding rollout_bench.json, "
                        "seeds.json, staleness.json, hacking.json and/or run folders (searched recursively)")
    p.add_argument("--out", default=None, help="Markdown file (default: the manifest's `out`, else docs/grpo.md); "
                                               "figures go to figures/ beside it")
    p.set_defaults(func=_docs)

    p = verbs.add_parser("signal", help="no GPU: the share of groups with no learning signal (all answers right or "
                                        "all wrong) in a run's steps, and its forecast at other group sizes from "
                                        "a beta-binomial fit of the per-group correct counts")
    p.add_argument("run_dir", help="run folder with metrics.jsonl and config.toml")
    p.add_argument("--group-sizes", default="4,8,16,32", help="G values to forecast, same sequences per step")
    p.add_argument("--steps", default=None, metavar="A:B", help="the steps to fit on, as a Python slice of the "
                                                                "logged steps (default all; e.g. -40: the last 40)")
    p.set_defaults(func=_signal)

    p = verbs.add_parser("config", help="list every config field with its type, default and help")
    p.set_defaults(func=_describe)


# The verbs below import their job when they run (imports inside functions): the CLI builds every job's
# parser at start, and the job's modules load torch and transformers on import.
def _train(args: argparse.Namespace) -> int:
    from scalelab.grpo.distributed import env_rank
    from scalelab.grpo.train import train
    cfg = load_grpo_config(args.config, args.set)
    results = train(cfg)
    if env_rank() != 0:  # under torchrun rank 0 alone reports
        return 0
    print(f"run folder: {cfg.run_dir}\nreward: first quarter {results.get('reward_first_quarter', float('nan')):.3f}"
          f" -> last quarter {results.get('reward_last_quarter', float('nan')):.3f}")
    print(f"report: {build_report(cfg.run_dir)}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    if args.rescore:
        return _rescore(args.run_dir)
    if args.drop_texts:
        from scalelab.grpo.textdrop import drop_texts
        for d in drop_texts(args.run_dir, tuple(x.strip() for x in args.drop_texts.split(",") if x.strip())):
            print(f"{d.policy}: {d.texts} of {d.rows} texts dropped (was sha256 {d.sha256[:16]})")
        return 0
    from scalelab.grpo.heldout import eval_run, headline
    print(headline(eval_run(args.run_dir, force=args.force)))
    return 0


def _rescore(run_dir: str) -> int:
    from scalelab.grpo.heldout import headline
    from scalelab.grpo.rescore import rescore_run
    r = rescore_run(run_dir)
    print(f"re-scored from the kept generations: {headline(r.summary)}")
    for policy, n in r.from_texts.items():
        rows = r.summary["n_examples"]
        if n < rows:
            print(f"{policy}: {n:,} of {rows:,} problems graded again from a kept text; the rest keep their recorded "
                  "verdicts (texts dropped: eval/texts.json)")
    if r.recorded is None:
        print("no eval/summary.json to check against")
        return 1
    for policy, n in r.changed.items():
        if n:
            print(f"{policy}: {n} problem(s) scored differently from the recorded verdict")
    print("\n".join(r.differences) if r.differences else "differences from eval/summary.json: none")
    return 0 if r.reproduces else 1


def _export(args: argparse.Namespace) -> int:
    from scalelab.grpo.export import export_run
    rec = export_run(args.run_dir, args.out)
    print(f"wrote {args.out}: step {rec.weights_version} of {rec.base_model}, sha256 {rec.safetensors_sha256[:16]}")
    return 0


def _isolate(args: argparse.Namespace) -> bool:
    if args.isolate != "auto":
        return args.isolate == "yes"
    return capabilities(load_grpo_config(args.config, args.set).rollout.engine).isolate_runs


def _seeds(args: argparse.Namespace) -> int:
    from scalelab.grpo.seeds import seeds_study
    out = seeds_study(args.config, args.set, args.seeds, isolate=_isolate(args), goal_points=args.goal_points,
                      jobs=args.jobs)
    print(out.read_text())
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def _staleness(args: argparse.Namespace) -> int:
    from scalelab.grpo.stalestudy import staleness_study
    corrected = args.is_k if args.is_k is not None else args.is_correction
    out = staleness_study(args.config, args.set, args.k, corrected, heldout=not args.no_heldout,
                          isolate=_isolate(args), jobs=args.jobs)
    print(out.read_text())
    print(f"wrote {out}, {out.with_suffix('.json')} and {out.parent / 'figures'}/staleness_*.png")
    return 0


def _hacking(args: argparse.Namespace) -> int:
    from scalelab.grpo.hacking import hacking_study
    out = hacking_study(args.config, args.set, args.exploit, args.target_chars, args.exploit_weight,
                        heldout=not args.no_heldout, isolate=_isolate(args), jobs=args.jobs)
    print(out.read_text())
    print(f"wrote {out}, {out.with_suffix('.json')} and {out.parent / 'figures'}/hacking_lengths.png")
    return 0


def _report(args: argparse.Namespace) -> int:
    path = build_report(args.run_dir, DeadZoneRule(args.dead_util_pct, args.dead_min_s))
    print(f"wrote {path} and {path.parent / 'figures'}/*.png")
    return 0


def _signal(args: argparse.Namespace) -> int:
    from scalelab.core.jsonio import iter_jsonl
    from scalelab.grpo.config import load_grpo_config
    from scalelab.grpo.groupsignal import correct_counts, fit_beta_binomial, forecast
    cfg = load_grpo_config(Path(args.run_dir) / "config.toml")
    steps = [r for r in iter_jsonl(Path(args.run_dir) / "metrics.jsonl") if r.get("event") == "grpo_step"]
    if args.steps:
        a, _, b = args.steps.partition(":")  # "-40" alone reads as "-40:"
        steps = steps[slice(int(a) if a else None, int(b) if b else None)]
    g = cfg.rollout.group_size
    k = correct_counts(steps, g)
    a, b = fit_beta_binomial(k, g)
    logged = sum(s["zero_signal_frac"] for s in steps) / len(steps)
    print(f"{len(steps)} steps, {k.size:,} groups of {g}: counted no-signal share {((k == 0) | (k == g)).mean():.3f} "
          f"(logged zero_signal_frac {logged:.3f}); pass rates ~ Beta({a:.2f}, {b:.2f})")
    sequences = cfg.data.prompts_per_step * g
    print(f"| G | prompts | no-signal share | prompts with signal | sequences with signal (of {sequences}) |")
    print("|---:|---:|---:|---:|---:|")
    for f in forecast(a, b, [int(x) for x in args.group_sizes.split(",")], sequences):
        print(f"| {f.group_size} | {f.prompts} | {f.zero_signal:.3f} | {f.prompts_with_signal:.1f} | "
              f"{f.rows_with_signal:.0f} |")
    return 0


def _docs(args: argparse.Namespace) -> int:
    from scalelab.core.sections import ManifestError
    from scalelab.grpo.docs import docs, write_docs
    try:
        if args.results_dir.endswith(".toml"):
            print(f"wrote {docs(args.results_dir, Path(args.out) if args.out else None)}")
        else:
            print(f"wrote {write_docs(args.results_dir, args.out or 'docs/grpo.md')}")
    except (ManifestError, FileNotFoundError) as e:
        print(f"scalelab: {e}", file=sys.stderr)
        return 2
    return 0


def _describe(args: argparse.Namespace) -> int:
    print(format_description(GrpoConfig))
    return 0

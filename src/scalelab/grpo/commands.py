"""`scalelab grpo <verb>`: train, report, config."""
from __future__ import annotations

import argparse

from scalelab.core.config import add_config_args


def _config_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p, "grpo", "rollout.staleness=2")


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)

    p = verbs.add_parser("train", help="predict, then run GRPO (rollout -> reward -> update -> weight sync), "
                                       "each phase timed into metrics.jsonl; resumes from the run's checkpoint")
    _config_args(p)
    p.set_defaults(func=_train)

    p = verbs.add_parser("report", help="REPORT.md and figures/*.png from a run folder alone: step-time breakdown, "
                                        "rewards, KL, lengths, GPU dead zones, predicted vs measured, hacking flags")
    p.add_argument("run_dir", help="run folder (config.toml, metrics.jsonl, predictions.json)")
    p.add_argument("--dead-util-pct", type=float, default=10.0, help="GPU utilization counted as idle (%%)")
    p.add_argument("--dead-min-s", type=float, default=1.0, help="shortest idle interval reported as a dead zone")
    p.set_defaults(func=_report)

    p = verbs.add_parser("config", help="list every config field with its type, default and help")
    p.set_defaults(func=_describe)


def _train(args: argparse.Namespace) -> int:
    from scalelab.grpo.config import load_grpo_config
    from scalelab.grpo.report import build_report
    from scalelab.grpo.train import train
    cfg = load_grpo_config(args.config, args.set)
    results = train(cfg)
    print(f"run folder: {cfg.run_dir}\nreward: first quarter {results.get('reward_first_quarter', float('nan')):.3f}"
          f" -> last quarter {results.get('reward_last_quarter', float('nan')):.3f}")
    print(f"report: {build_report(cfg.run_dir)}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from scalelab.grpo.report import DeadZoneRule, build_report
    path = build_report(args.run_dir, DeadZoneRule(args.dead_util_pct, args.dead_min_s))
    print(f"wrote {path} and {path.parent / 'figures'}/*.png")
    return 0


def _describe(args: argparse.Namespace) -> int:
    from scalelab.core.config import describe
    from scalelab.grpo.config import GrpoConfig
    for name, tp, default, help_text in describe(GrpoConfig):
        print(f"{name:34s} {tp:34s} default={default!r}\n{'':34s} {help_text}")
    return 0

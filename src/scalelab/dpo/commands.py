"""`scalelab dpo <verb>`: train, sweep, select, battery, judge-check, report, docs, data, merge, config."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scalelab.core.config import add_config_args, format_description
from scalelab.dpo.config import DpoConfig, load_dpo_config
from scalelab.core.sections import ManifestError
from scalelab.dpo.docs import docs, write_docs
from scalelab.dpo.report import write_report


def _config_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p, "dpo", "train.beta=0.3")


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _losses(text: str) -> list[str]:
    from scalelab.dpo.train import LOSSES  # lazy: imports transformers' Trainer stack (peft with it)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in LOSSES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown loss {bad[0]!r}; known: {', '.join(LOSSES)}")
    return names


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)

    p = verbs.add_parser("train", help="data -> predictions -> LoRA DPO/IPO/ORPO with margin tracking -> adapter")
    _config_args(p)
    p.set_defaults(func=_train)

    p = verbs.add_parser("sweep", help="one run per (loss, beta) into <out_dir>/<name>/, one shared preference set; "
                                       "without --beta and --loss, the runs of the config's [sweep] table")
    _config_args(p)
    p.add_argument("--beta", type=_floats, default=None, help="comma-separated betas (default 0.05,0.1,0.3 when "
                                                              "--loss is given)")
    p.add_argument("--loss", type=_losses, default=None, help="comma-separated losses (default: train.loss when "
                                                              "--beta is given)")
    p.add_argument("--name", default="sweep", help="sweep folder name under run.out_dir")
    p.add_argument("--skip-trained", action="store_true",
                   help="leave runs that already finished (results.json and adapter) as they are")
    p.add_argument("--only", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=None,
                   help="comma-separated run names of the sweep to run now, e.g. dpo-beta0.1,ipo-beta1")
    p.set_defaults(func=_sweep)

    p = verbs.add_parser("select", help="the run a sweep chooses by its [selection] rule -> <sweep>/selection.json")
    p.add_argument("path", help="a sweep folder")
    p.add_argument("--name-only", action="store_true", help="print only the chosen run's folder name (scripts)")
    p.set_defaults(func=_select)

    p = verbs.add_parser("battery", help="base vs base+adapter on MMLU, TruthfulQA, own tasks, the target task "
                                         "and MT-Bench -> <run>/battery/battery.json + REPORT.md")
    p.add_argument("path", help="a run folder, or a sweep folder (every run in it; the base is evaluated once)")
    p.add_argument("--config", help="TOML file whose [battery] table overrides the run's "
                                    "(e.g. configs/dpo/tiny-cpu.toml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the run's config, e.g. --set battery.mmlu_limit=2 (repeatable)")
    p.add_argument("--side", choices=["both", "base", "tuned"], default="both",
                   help="base: only the base model's records (no adapter needed; can run while the runs train); "
                        "tuned: only base + adapter; both (default): both, then battery.json and REPORT.md. "
                        "Processes over one sweep may run at once (one per GPU): a shared record is measured once")
    p.set_defaults(func=_battery)

    p = verbs.add_parser("judge-check", help="can the judge rate GPT-4's MT-Bench reference answers above the base "
                                             "model's? -> <out>/judge_check.json (battery.judge_check reads it)")
    _config_args(p)
    p.add_argument("--judge-url", required=True, help="OpenAI-compatible base URL of the judge")
    p.add_argument("--judge-model", required=True, help="the judge's served model name")
    p.add_argument("--answer-url", default="", help="server of the base model's answers (default: the judge's)")
    p.add_argument("--answer-model", default="", help="its served name (default: the judge's, for a judge that "
                                                      "is the base model itself)")
    p.add_argument("--out", required=True, help="folder for the answers, ratings and judge_check.json")
    p.set_defaults(func=_judge_check)

    p = verbs.add_parser("report", help="REPORT.md (+ figures) of a run or sweep folder, from its files alone")
    p.add_argument("path", help="a run folder or a sweep folder")
    p.set_defaults(func=_report)

    p = verbs.add_parser("docs", help="the write-up (docs/dpo.md + figures) generated from the results a docs "
                                      "manifest names, or from a sweep folder")
    p.add_argument("path", nargs="?", default="docs/dpo.toml",
                   help="a docs manifest (.toml; default docs/dpo.toml), or a sweep folder (or one run folder)")
    p.add_argument("--out", default=None, help="Markdown file (default: the manifest's `out`, else docs/dpo.md); "
                                               "figures go to figures/ beside it")
    p.set_defaults(func=_docs)

    p = verbs.add_parser("data", help="build (verifier set) or load the preference pairs and show a summary")
    _config_args(p)
    p.add_argument("--show", type=int, default=2, help="print this many pairs")
    p.set_defaults(func=_data)

    p = verbs.add_parser("merge", help="base + LoRA adapter -> merged HF folder (safetensors + tokenizer)")
    p.add_argument("adapter", help="adapter folder (a run's adapter/) or a run folder")
    p.add_argument("--base", help="base model (default: the one recorded beside the adapter)")
    p.add_argument("--out", help="output folder (default: <run>/merged)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.set_defaults(func=_merge)

    p = verbs.add_parser("config", help="list every config field with its type, default and help")
    p.set_defaults(func=_describe)


# The verbs below import their job when they run (imports inside functions): the CLI builds every job's
# parser at start, and the job's modules load torch, transformers and trl on import.
def _train(args: argparse.Namespace) -> int:
    from scalelab.dpo.run import run_dpo
    run_dpo(load_dpo_config(args.config, args.set))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from scalelab.dpo.run import planned_configs, run_configs, sweep_configs
    cfg = load_dpo_config(args.config, args.set)
    if args.beta is None and args.loss is None:
        configs = planned_configs(cfg, args.name)
    else:
        configs = sweep_configs(cfg, args.beta or [0.05, 0.1, 0.3], args.loss or [cfg.train.loss], args.name)
    if args.only is not None:
        names = [c.run.name for c in configs]
        unknown = [n for n in args.only if n not in names]
        if unknown:
            print(f"scalelab: --only {unknown[0]!r}: not a run of this sweep; its runs: {', '.join(names)}",
                  file=sys.stderr)
            return 2
        configs = [c for c in configs if c.run.name in args.only]
    rows = run_configs(cfg, configs, args.name, args.skip_trained)
    for r in rows:
        print(f"{r['run']:18s} loss {r['loss_first']} -> {r['loss_last']}  "
              f"held-out acc {r['heldout_reward_accuracy_last']}")
    return 0


def _select(args: argparse.Namespace) -> int:
    from scalelab.dpo.selection import select_runs, write_selection
    from scalelab.dpo.sweep_report import find_runs, load_run
    sel = select_runs([load_run(p) for p in find_runs(Path(args.path))])
    where = write_selection(Path(args.path), sel)
    if args.name_only:
        if sel.chosen is None:
            print(f"scalelab: {sel.reason}", file=sys.stderr)
            return 1
        print(sel.chosen.run)
        return 0
    print(f"rule: {sel.rule}\nchosen: {sel.chosen.run if sel.chosen else 'none'} ({sel.reason})\n{where}")
    return 0


def _judge_check(args: argparse.Namespace) -> int:
    from scalelab.dpo.battery import data_root
    from scalelab.dpo.judge_check import run_judge_check
    from scalelab.evals.judge import JudgeConfig
    cfg = load_dpo_config(args.config, args.set)
    b = cfg.battery
    judge = JudgeConfig(url=args.judge_url, model=args.judge_model, api_key_env=b.judge_api_key_env)
    answerer = JudgeConfig(url=args.answer_url or args.judge_url, model=args.answer_model or args.judge_model,
                           api_key_env=b.judge_api_key_env, max_tokens=b.mtbench_max_new_tokens)
    check = run_judge_check(judge, answerer, data_root(cfg) / "mt_bench", args.out, b.bootstrap_resamples, b.seed)
    print(f"judge {args.judge_model}: {check['status']}: {check['reason']}")
    return 0


def _battery(args: argparse.Namespace) -> int:
    from scalelab.dpo.battery import summary_line
    from scalelab.dpo.battery_folders import battery_folder
    for run, battery in battery_folder(Path(args.path), args.config, args.set, args.side):
        print(f"{run.name}: {summary_line(battery) if battery else args.side + ' side measured'}")
    return 0


def _report(args: argparse.Namespace) -> int:
    print(write_report(Path(args.path)))
    return 0


def _docs(args: argparse.Namespace) -> int:
    try:
        if args.path.endswith(".toml"):
            print(docs(Path(args.path), Path(args.out) if args.out else None))
        else:
            print(write_docs(Path(args.path), Path(args.out or "docs/dpo.md")))
    except ManifestError as e:
        print(f"scalelab: {e}", file=sys.stderr)
        return 2
    return 0


def _data(args: argparse.Namespace) -> int:
    from scalelab.core.hfmodel import load_causal_lm
    from scalelab.dpo.run import prepare_data, prepare_run_dir
    cfg = load_dpo_config(args.config, args.set)
    rd = prepare_run_dir(cfg)
    m = cfg.model
    data = prepare_data(cfg, rd, lambda: load_causal_lm(m.name, m.dtype, m.device, m.cache_dir or None,
                                                        m.trust_remote_code))
    print(json.dumps(data.info, indent=2))
    for p in data.train[:args.show]:
        print(json.dumps(p.to_record(), indent=2, ensure_ascii=False))
    return 0


def _merge(args: argparse.Namespace) -> int:
    from scalelab.dpo.export import base_of, merge_adapter
    adapter = Path(args.adapter)
    if (adapter / "adapter").is_dir():
        adapter = adapter / "adapter"
    out = Path(args.out) if args.out else adapter.parent / "merged"
    print(merge_adapter(args.base or base_of(adapter), adapter, out, dtype=args.dtype))
    return 0


def _describe(args: argparse.Namespace) -> int:
    print(format_description(DpoConfig))
    return 0

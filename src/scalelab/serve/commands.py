"""`scalelab serve <verb>`: sweep, search, table, report, slim, docs, config."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalelab.core.config import add_config_args, format_description
from scalelab.core.rundir import RunDir
from scalelab.serve.config import ServeConfig, load_serve_config


def _config_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p, "serve", "sweep.repeats=5")


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)

    p = verbs.add_parser("sweep", help="predict, then launch each (engine, TP), load-test every batch, and write "
                                       "the scaling table, figures and REPORT.md (resumes a partial run folder)")
    _config_args(p)
    p.set_defaults(func=_sweep)

    p = verbs.add_parser("search", help="highest open-loop request rate meeting the SLO for one (engine, TP)")
    _config_args(p)
    p.add_argument("--engine", default="", help="engine to search (default: the first of engine.names)")
    p.add_argument("--tp", type=int, default=0, help="tensor-parallel size (default: the sweep's first TP)")
    p.set_defaults(func=_search)

    p = verbs.add_parser("table", help="re-render table.md/.csv/.json and figures from a run folder's rows.jsonl")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=_table)

    p = verbs.add_parser("report", help="regenerate REPORT.md (predicted vs measured) from a run folder alone")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=_report)

    p = verbs.add_parser("slim", help="store a run folder's per-request records small enough to commit: each gap "
                                      "list becomes its count and judged gap (requests-slim/)")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=_slim)

    p = verbs.add_parser("docs", help="write docs/serve.md from one or more run folders alone (predicted vs "
                                      "measured, where TP scaling breaks, SLOs, cost, what was not measured)")
    p.add_argument("runs", nargs="*", default=["docs/serve.toml"],
                   help="a docs manifest (.toml; default docs/serve.toml) listing the sweep folders, or the sweep "
                        "folders themselves")
    p.add_argument("--out", default=None, help="the Markdown file to write (default: the manifest's `out`, else "
                                               "docs/serve.md)")
    p.set_defaults(func=_docs)

    p = verbs.add_parser("config", help="list every config field with its type, default and help")
    p.set_defaults(func=_describe)


# The verbs below import their job when they run (imports inside functions): the CLI builds every job's
# parser at start, and the job's modules load scipy and the GPT-2 tokenizer on import.
def _slim(args: argparse.Namespace) -> int:
    import tomllib
    from scalelab.serve.slim import slim_run
    cfg = Path(args.run) / "config.toml"
    slo = tomllib.loads(cfg.read_text()).get("slo", {}) if cfg.is_file() else {}
    print(slim_run(args.run, float(slo.get("itl_quantile", 0.99))))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from scalelab.serve.sweep import run_sweep
    run = run_sweep(load_serve_config(args.config, args.set))
    print(f"run folder: {run}\n" + (run / "table.md").read_text())
    return 0


def _search(args: argparse.Namespace) -> int:
    from scalelab.serve.openloop import search_sentence
    from scalelab.serve.sweep import run_search
    print(search_sentence(run_search(load_serve_config(args.config, args.set), args.engine, args.tp)))
    return 0


def _table(args: argparse.Namespace) -> int:
    from scalelab.serve.sweep import render
    try:
        paths = render(RunDir(args.run))
    except (FileNotFoundError, KeyError) as e:
        print(f"scalelab: {args.run} is not a serving sweep folder (needs provenance.json from `serve sweep` "
              f"and rows.jsonl): {e}", file=sys.stderr)
        return 2
    print(paths["md"].read_text() + "\n" + "\n".join(str(p) for p in paths.values()))
    return 0


def _report(args: argparse.Namespace) -> int:
    from scalelab.serve.report import write_report
    print(write_report(Path(args.run)))
    return 0


def _docs(args: argparse.Namespace) -> int:
    from scalelab.core.sections import ManifestError
    from scalelab.serve.docs import docs, render_docs
    from scalelab.serve.sweepdata import ReportInputError
    try:
        if len(args.runs) == 1 and args.runs[0].endswith(".toml"):
            print(docs(args.runs[0], Path(args.out) if args.out else None))
        else:
            print(render_docs(args.runs, args.out or "docs/serve.md"))
    except (ReportInputError, ManifestError) as e:
        print(f"scalelab: {e}", file=sys.stderr)
        return 2
    return 0


def _describe(args: argparse.Namespace) -> int:
    print(format_description(ServeConfig))
    return 0

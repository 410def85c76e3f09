"""Helpers of bench/gpu_serve_open_loop.sh: the open-loop ladder's predicted knee without a server, one engine
launched from a config's own engine section (so every run folder pointed at it by engine.url measures the server
that config describes), and the knee a measured ladder found.

    python bench/serve_open_loop.py plan CONFIG [--set k=v ...] [--out FILE]
    python bench/serve_open_loop.py server CONFIG --port P --dir DIR [--set k=v ...] [--dry-run]
    python bench/serve_open_loop.py knee RUN_DIR
    python bench/serve_open_loop.py bracket RUN_DIR LO HI
    python bench/serve_open_loop.py sharegpt-head OUT --count N [--config CONFIG]   (N = 0: all that pass)

`plan` predicts exactly what `scalelab serve sweep` writes to predictions.json (sweep.predict_rows on the same
seeded request pool and send times), so the ladder's rates can be chosen around the predicted knee before any GPU
time is spent. `server` writes DIR/server.json (the command, its environment additions, the engine's version)
and then becomes the engine process (exec). `knee` prints the lowest measured rate whose goodput share is below
slo.attainment; when every rate meets it, the highest rate (and says so on stderr); with no measured rate
row, the predicted knee from predictions.json. `bracket` prints the rate search's "lo hi" from a measured ladder:
the highest rate meeting the SLO below the knee and the knee itself (the search then re-measures both ends and
bisects between them); LO or HI (the config's) where the ladder has no such rate, 1.5 x its top rate as HI when
every rate meets the SLO. `sharegpt-head` writes the first N conversations of the packaged
ShareGPT file whose first exchange passes the config's length filter, that exchange alone (the sweep reads nothing
else): a file small enough to carry to a machine without the package, on which sampling needs no long scan.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from scalelab.core.config import read_toml
from scalelab.core.engines import build_command
from scalelab.core.hardware import resolve_hardware
from scalelab.core.jsonio import is_stored, read_json, write_json
from scalelab.core.provenance import git_sha
from scalelab.core.readers import JsonArrayReader, packaged_sharegpt
from scalelab.core.rundir import RunDir
from scalelab.serve.config import ServeConfig, load_serve_config
from scalelab.serve.metrics import SLO
from scalelab.serve.openloop import knee_of
from scalelab.serve.sweep import (
    Setup, engine_spec, engine_version, model_folder, plan_points, pool_size, predict_rows, predicted_knees,
    requests_per_repeat, resolve_cost, resolve_spec, sample_pool, split_pool, warmup_requests,
)
from scalelab.serve.table import TableHeader, latest_rows, rate_rps, read_rows
from scalelab.serve.workload import LengthFilter, count_tokens, default_tokenizer, first_exchange


def light_setup(cfg: ServeConfig, folder: Path) -> Setup:
    """What prediction and the engine command need, without creating a run folder or asking for versions."""
    cfg = resolve_cost(cfg)
    spec, hw = resolve_spec(cfg), resolve_hardware(cfg.cost.hardware)
    header = TableHeader(hw.key, hw.name, spec.name, cfg.cost.usd_per_gpu_hour, cfg.slo.ttft_s, cfg.slo.itl_s)
    rd = RunDir(folder)
    slo = SLO(cfg.slo.ttft_s, cfg.slo.itl_s, attainment=cfg.slo.attainment)
    return Setup(cfg, rd, spec, model_folder(cfg, rd, spec) if folder.name else "", header, slo)


def plan(cfg: ServeConfig) -> dict:
    points = plan_points(cfg)
    pool = sample_pool(cfg, pool_size(cfg, points, cfg.sweep.repeats))
    requests = {p: split_pool(pool, warmup_requests(cfg, p), requests_per_repeat(cfg, p), cfg.sweep.repeats)
                for p in points}
    rows = [r.to_dict() for r in predict_rows(light_setup(cfg, Path("")), points, requests)]
    return {"knees": predicted_knees(rows, cfg.slo.attainment),
            "rows": [{"load": r["provenance"].get("load"), "status": r["status"], "figures": r["figures"]}
                     for r in rows]}


def _plan(args: argparse.Namespace) -> int:
    out = plan(load_serve_config(args.config, args.set))
    for r in out["rows"]:
        f = r["figures"]
        print(f"{json.dumps(r['load'])}: {r['status']} goodput {f['goodput_share']:.0%}, TTFT p99 "
              f"{f['ttft_p99_ms']:.0f} ms, ITL p99 {f['itl_p99_ms']:.1f} ms, {f['throughput_tok_s']:.0f} tok/s")
    for k in out["knees"]:
        print(f"predicted knee {k['engine']} TP={k['tp']}: {k['knee_rps']} req/s "
              f"(highest meeting the SLO below it: {k['max_rate_meeting_slo_rps']})")
    if args.out:
        write_json(args.out, out)
    return 0


def _server(args: argparse.Namespace) -> int:
    cfg = load_serve_config(args.config, args.set)
    folder = Path(args.dir).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    setup = light_setup(cfg, folder)
    engine, tp = cfg.engine.names[0], cfg.sweep.plans()[0].tp
    spec = dataclasses.replace(engine_spec(setup, engine, tp), port=args.port)
    command = build_command(spec)
    record = {"command": command, "env": dict(spec.env), "engine": engine, "tp": tp, "model": setup.model_path,
              "config": str(args.config), "overrides": list(args.set), "url": spec.url,
              "engine_version": engine_version(spec.python, engine, spec.env), "git_sha": git_sha()}
    write_json(folder / "server.json", record)
    print(" ".join(command), flush=True)
    if args.dry_run:
        return 0
    os.execvpe(command[0], command, {**os.environ, **spec.env})


def measured_ladder(run_dir: Path) -> tuple[float, list[tuple[float, float]], float | None]:
    """(slo.attainment, [(rate, goodput share)] ascending of the folder's ok rate rows, the lowest rate below
    attainment or None)."""
    attainment = float(read_toml(run_dir / "config.toml").get("slo", {}).get("attainment", 0.9))
    ladder = sorted((rate_rps(r), r.figures.goodput_share) for r in latest_rows(read_rows(run_dir / "rows.jsonl"))
                    if r.status == "ok" and rate_rps(r) is not None)
    return attainment, ladder, knee_of(ladder, attainment).knee_rps


def knee(run_dir: Path) -> float | None:
    """The measured knee of a ladder folder (see the module docstring for the fallbacks)."""
    _, ladder, found = measured_ladder(run_dir)
    if ladder:
        if found is None:
            print(f"{run_dir}: every measured rate meets the SLO; the highest stands in", file=sys.stderr)
        return found if found is not None else ladder[-1][0]
    if is_stored(run_dir / "predictions.json"):
        print(f"{run_dir}: no measured rate row; the predicted knee stands in", file=sys.stderr)
        knees = read_json(run_dir / "predictions.json").get("knees", [])
        return next((k["knee_rps"] or k["max_rate_meeting_slo_rps"] for k in knees), None)
    return None


def bracket(run_dir: Path, lo: float, hi: float) -> tuple[float, float]:
    attainment, ladder, found = measured_ladder(run_dir)
    if not ladder:
        return lo, hi
    meets = [x for x, share in ladder if share >= attainment and (found is None or x < found)]
    top = found if found is not None else 1.5 * ladder[-1][0]
    bottom = max(meets, default=lo)
    return (bottom, top) if bottom < top else (lo, hi)


def _knee(args: argparse.Namespace) -> int:
    found = knee(Path(args.run))
    if found is None:
        print(f"{args.run}: no ladder rows and no predictions", file=sys.stderr)
        return 1
    print(f"{found:g}")
    return 0


def sharegpt_head(out: Path, count: int, cfg: ServeConfig) -> int:
    w = cfg.workload
    lengths = LengthFilter(w.prompt_min, w.prompt_max, w.output_min, w.output_max)
    tok, kept, seen = default_tokenizer(), [], 0
    for _, record in JsonArrayReader(Path(w.path) if w.path else packaged_sharegpt()):
        seen += 1
        pair = first_exchange(record)
        if pair and lengths.accepts(count_tokens(tok, pair[0]), count_tokens(tok, pair[1])):
            kept.append({"id": record.get("id", str(seen)), "conversations": [
                {"from": "human", "value": pair[0]}, {"from": "gpt", "value": pair[1]}]})
            if len(kept) == count:
                break
    out.write_text(json.dumps(kept))
    print(f"{out}: {len(kept)} conversations passing {lengths} among the first {seen}")
    return 0 if kept and (count == 0 or len(kept) == count) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True)
    for name, func in (("plan", _plan), ("server", _server)):
        v = verbs.add_parser(name)
        v.add_argument("config")
        v.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        v.set_defaults(func=func)
        if name == "plan":
            v.add_argument("--out", default="")
        else:
            v.add_argument("--port", type=int, required=True)
            v.add_argument("--dir", required=True, help="where server.json goes ({run_dir} in engine.env)")
            v.add_argument("--dry-run", action="store_true", help="write server.json, print the command, stop")
    v = verbs.add_parser("sharegpt-head")
    v.add_argument("out")
    v.add_argument("--count", type=int, required=True, help="0 = every passing conversation")
    v.add_argument("--config", default=None, help="its [workload] length filter (default: the serve defaults)")
    v.set_defaults(func=lambda a: sharegpt_head(Path(a.out), a.count, load_serve_config(a.config)))
    v = verbs.add_parser("bracket")
    v.add_argument("run")
    v.add_argument("lo", type=float)
    v.add_argument("hi", type=float)
    v.set_defaults(func=lambda a: print("%g %g" % bracket(Path(a.run), a.lo, a.hi)) or 0)
    v = verbs.add_parser("knee")
    v.add_argument("run")
    v.set_defaults(func=_knee)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

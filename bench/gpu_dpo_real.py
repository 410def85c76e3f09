"""The serving and bookkeeping half of bench/gpu_dpo_real.sh.

    python3 bench/gpu_dpo_real.py serve MODEL --served NAME --log LOG [--port P] [--gpu-memory-utilization F]
        [--max-model-len N] [--ready-timeout S] -- COMMAND ...
        start a vLLM OpenAI server of MODEL (a registry name, HF folder or hub id; the registry's GGUF is
        dequantized once into the cache) under the served name NAME, wait until /health answers, run COMMAND
        with SERVER_URL set to the server's base URL, stop the server (its whole process group) whatever the
        command did, and exit with the command's status. vLLM's own sampling defaults are used, not the folder's
        generation_config.json (Qwen's ship top_k 20 and repetition_penalty 1.05, which would change the
        distribution the verifier set is sampled from and make the judge's replies non-greedy).

    python3 bench/gpu_dpo_real.py plan CONFIG
        the run folder names of CONFIG's [sweep] table (dpo.sweep_plan), one per line: what "every run has
        trained" means before the battery starts.

    python3 bench/gpu_dpo_real.py base-config CONFIG FOLDER [--set K=V ...]
        FOLDER/config.toml: the first planned run's resolved config, which the base battery side reads (the model
        and battery settings every run of the sweep shares) before any run's folder exists. FOLDER is a hidden
        folder of the sweep (.base), so the base records land in the sweep's battery-base/ and no report takes
        it for a run.

    python3 bench/gpu_dpo_real.py status RUNS
        one line per part (pairs, each sweep run, the choice, the judge check, the HH run) from the files alone,
        also written to RUNS/status.json: what a cut-off window finished and what the next one will do.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalelab.core.engines import EngineSpec, RunningServer  # noqa: E402

SWEEP, HH = "gsm8k", "hh"      # folder names under RUNS, as the shell script lays them out

# ---------------------------------------------------------------------------------------------
# serve


def server_spec(model_dir: str, served: str, port: int, gpu_memory_utilization: float, max_model_len: int,
                python: str = sys.executable, launcher: tuple[str, ...] = (),
                max_num_seqs: int | None = None) -> EngineSpec:
    """The vLLM server of one model under one served name, greedy-able and seeded. max_num_seqs: the most
    sequences decoded at once (None: vLLM's default, 1,024 on an H200, where a 1.5B's sampling left the KV cache
    under 9% used with as many sequences waiting)."""
    flags = {"served-model-name": served, "gpu-memory-utilization": gpu_memory_utilization,
             "generation-config": "vllm", "seed": 0}
    if max_num_seqs is not None:
        flags["max-num-seqs"] = max_num_seqs
    env = {"VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", "/tmp/vllm-cache")}
    return EngineSpec("vllm", model_dir, port=port, dtype="bfloat16", max_model_len=max_model_len, python=python,
                      extra_flags=flags, env=env, launcher=launcher)


def model_dir(model: str) -> str:
    """A local HF folder for MODEL (core.models: the cached GGUF conversion of a registry name)."""
    from scalelab.core.hfmodel import materialize  # lazy: only `serve` needs the model registry
    return materialize(model)


def serve(spec: EngineSpec, log: Path, command: list[str], ready_timeout_s: float) -> int:
    """Run `command` while the server of `spec` answers; the server is stopped before returning."""
    if not command:
        raise SystemExit("serve: no command after '--'")
    with RunningServer(spec, log, ready_timeout_s=ready_timeout_s) as server:
        print(f"serve: {spec.extra_flags['served-model-name']} ready at {server.url}", flush=True)
        return subprocess.run(command, env={**os.environ, "SERVER_URL": server.url}).returncode

def write_base_config(config: Path, folder: Path, sets: list[str]) -> Path:
    from scalelab.core.rundir import RunDir  # lazy: only `base-config` loads the dpo job
    from scalelab.dpo.config import load_dpo_config
    from scalelab.dpo.run import planned_configs
    cfg = planned_configs(load_dpo_config(config, sets), SWEEP)[0]
    rd = RunDir(folder).create(cfg)
    rd.log_event("base_config", source=str(config), run=cfg.run.name)  # `dpo battery` takes a folder with
    return rd.config_path                                               # config and metrics for one run


def plan_names(config: Path) -> list[str]:
    from scalelab.dpo.config import load_dpo_config  # lazy: only `plan` reads a config
    from scalelab.dpo.sweep_plan import planned_runs
    return [r.name for r in planned_runs(load_dpo_config(config))]

# ---------------------------------------------------------------------------------------------
# status


@dataclass(frozen=True)
class PartStatus:
    part: str
    done: bool
    detail: str


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _run_status(run: Path, runs: Path) -> PartStatus:
    """Done once trained and its tuned battery side is stored (the sweep part's marker) or its battery.json is
    written; its weights need not be here (they stay on the machine that trained them unless shipped)."""
    results, battery = _json(run / "results.json"), _json(run / "battery" / "battery.json")
    if results is None:
        return PartStatus(f"run {run.name}", False, "not trained")
    acc = results.get("heldout_reward_accuracy_last")
    detail = f"{results.get('steps')} steps, held-out reward acc {acc if acc is None else round(acc, 3)}"
    if not (run / "adapter" / "adapter_model.safetensors").is_file():
        detail += ", weights not here"
    side = (runs / f".done-tuned-{run.name}").is_file()
    detail += ", tuned side stored" if side else ", tuned side not stored"
    if battery:
        mmlu = battery.get("comparisons", {}).get("mmlu", {})
        detail += f", battery {battery['evidence']['verdict']} (MMLU n {mmlu.get('n', '-')})"
    return PartStatus(f"run {run.name}", side or battery is not None, detail)


def sampled_so_far(side: Path) -> str:
    """How far an unfinished set's side file (dpo.sample_log) got: batches and questions in its whole lines."""
    if not side.is_file():
        return "not built"
    lines = [x for x in side.read_text(errors="replace").split("\n")[:-1] if x.strip()]  # the last: torn or ""
    try:
        questions = sum(len(json.loads(x)["prompts"]) for x in lines)
    except (ValueError, KeyError, TypeError):
        return f"not built; {side.name} unreadable"
    return f"not built; {len(lines)} batches ({questions} questions) sampled in {side.name}"


def status(runs: Path) -> list[PartStatus]:
    sweep = runs / SWEEP
    manifest = _json(sweep / "preferences.manifest.json")
    m = (manifest or {}).get("summary", {})
    pending = sampled_so_far(sweep / "preferences.samples.jsonl")
    out = [PartStatus("pairs", manifest is not None, pending if manifest is None else
                      f"{m.get('n_pairs')} pairs of {m.get('n_prompts')} questions (per-sample accuracy "
                      f"{m.get('sample_accuracy', float('nan')):.3f}; {m.get('prompts_all_correct')} all right, "
                      f"{m.get('prompts_all_wrong')} all wrong)")]
    out += [_run_status(r, runs) for r in sorted(sweep.iterdir())
            if (r / "config.toml").is_file() and not r.name.startswith(".")] \
        if sweep.is_dir() else []
    chosen = (_json(sweep / "selection.json") or {}).get("chosen")
    out.append(PartStatus("selection", chosen is not None, chosen["run"] if chosen else "no run chosen yet"))
    check = _json(sweep / "judge-check" / "judge_check.json")
    out.append(PartStatus("judge", check is not None, f"{check['status']}: {check['reason']}" if check
                          else "not checked"))
    hh = next(iter(sorted((runs / HH).glob("*/results.json"))), None) if (runs / HH).is_dir() else None
    r = _json(hh) if hh else None
    out.append(PartStatus("hh", r is not None, "not trained" if r is None else
                          f"held-out reward acc {r.get('heldout_reward_accuracy_last')}, margin "
                          f"{r.get('heldout_margin_mean_last')}"))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        argv, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--served", required=True)
    s.add_argument("--log", required=True, type=Path)
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    s.add_argument("--max-model-len", type=int, default=4096)
    s.add_argument("--ready-timeout", type=float, default=900.0)
    s.add_argument("--max-num-seqs", type=int, default=None, help="vLLM's --max-num-seqs (default: vLLM's own)")
    st = verbs.add_parser("status")
    st.add_argument("runs", type=Path)
    pl = verbs.add_parser("plan")
    pl.add_argument("config", type=Path)
    bc = verbs.add_parser("base-config")
    bc.add_argument("config", type=Path)
    bc.add_argument("folder", type=Path)
    bc.add_argument("--set", action="append", default=[], help="a config override, as `dpo sweep --set`")
    args = p.parse_args(argv)
    if args.verb == "plan":
        print("\n".join(plan_names(args.config)))
        return 0
    if args.verb == "base-config":
        print(write_base_config(args.config, args.folder, args.set))
        return 0
    if args.verb == "serve":
        spec = server_spec(model_dir(args.model), args.served, args.port, args.gpu_memory_utilization,
                           args.max_model_len, max_num_seqs=args.max_num_seqs)
        return serve(spec, args.log, command, args.ready_timeout)
    rows = status(args.runs)
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "status.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    for r in rows:
        print(f"{'done' if r.done else 'todo':4s}  {r.part:22s} {r.detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

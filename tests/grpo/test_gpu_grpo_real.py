"""bench/gpu_grpo_real.sh's recipe part with a stand-in python3: one `grpo train` per learning rate, rollout
temperature and seed, each named after them, with the recipe's temperature when TEMPS is not set; then its evaluation,
export and battery calls."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# records its argv, one line per call, and succeeds
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
"""


def _work(tmp_path: Path, **env: str) -> list[list[str]]:
    bindir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bindir.mkdir(exist_ok=True)
    (bindir / "python3").write_text(STAND_IN)
    (bindir / "python3").chmod(0o755)
    calls.unlink(missing_ok=True)
    run_env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(calls), "PARTS": "recipe",
               "RUNS": str(tmp_path / "runs"), "OUT": str(tmp_path / "out"), "WORK_S": "1000", "STAGGER_S": "0",
               **env}
    run = subprocess.run(["bash", "bench/gpu_grpo_real.sh", "work"], cwd=REPO, env=run_env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return [shlex.split(line) for line in calls.read_text().splitlines()]


def _trains(calls: list[list[str]]) -> dict[str, list[str]]:
    return {_run_name(argv): argv for argv in calls if argv[:4] == ["-m", "scalelab.cli", "grpo", "train"]}


def _run_name(argv: list[str]) -> str:
    (name,) = [a.split("=", 1)[1].strip('"') for a in argv if a.startswith("run.name=")]
    return name


@pytest.mark.slow
def test_one_run_per_learning_rate_and_temperature(tmp_path):
    calls = _work(tmp_path, LRS="5e-5 1e-4", TEMPS="1.0 0.7")
    trains = _trains(calls)
    assert sorted(trains) == ["recipe-lr1e-4-t0.7-s0", "recipe-lr1e-4-t1.0-s0", "recipe-lr5e-5-t0.7-s0",
                              "recipe-lr5e-5-t1.0-s0"]
    argv = trains["recipe-lr5e-5-t0.7-s0"]
    assert "optim.lr=5e-5" in argv and "rollout.temperature=0.7" in argv and "train.seed=0" in argv
    for name in trains:  # each run is then scored, exported and given its out-of-domain battery
        assert any(a[:4] == ["-m", "scalelab.cli", "grpo", "eval"] and a[4].endswith(name) for a in calls)
        assert any(a[:4] == ["-m", "scalelab.cli", "evals", "battery"] and f"/tmp/exports/{name}" in a
                   for a in calls)


@pytest.mark.slow
def test_without_temps_the_recipe_keeps_its_own_temperature(tmp_path):
    trains = _trains(_work(tmp_path, LRS="5e-5"))
    assert list(trains) == ["recipe-lr5e-5-s0"]
    assert not any(a.startswith("rollout.temperature=") for a in trains["recipe-lr5e-5-s0"])


@pytest.mark.slow
def test_seeds_give_one_run_each_named_and_seeded_after_it(tmp_path):
    trains = _trains(_work(tmp_path, LRS="5e-5", SEEDS="0 1"))
    assert sorted(trains) == ["recipe-lr5e-5-s0", "recipe-lr5e-5-s1"]
    assert "train.seed=1" in trains["recipe-lr5e-5-s1"] and "train.seed=0" in trains["recipe-lr5e-5-s0"]
    # without SEEDS the one run takes SEED
    assert list(_trains(_work(tmp_path, LRS="5e-5", SEED="3"))) == ["recipe-lr5e-5-s3"]


@pytest.mark.slow
@pytest.mark.parametrize("mib, jobs", [("81559", "2"), ("143771", "3"), ("", "1")])
def test_staleness_runs_as_many_side_by_side_as_the_gpu_memory_holds(tmp_path, mib, jobs):
    """One run per 32 GiB (a recipe run peaks at ~30 GB): an H100 takes 2, an H200 3 (the cap), no GPU found 1; the
    40-step runs skip the layers' compile (~60 s to save ~0.5 s a step) unless STALE_COMPILE says otherwise."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\n[ -n '{mib}' ] && echo {mib}\n")
    (bindir / "nvidia-smi").chmod(0o755)
    calls = _work(tmp_path, PARTS="staleness", STALE_K1="")
    (argv,) = [a for a in calls if a[:4] == ["-m", "scalelab.cli", "grpo", "staleness"]]
    assert argv[argv.index("--jobs") + 1] == jobs
    assert "optim.compile_layers=false" in argv and argv[argv.index("--k") + 1] == "0,1,2,4,8"
    calls = _work(tmp_path, PARTS="staleness", STALE_K1="", STALE_JOBS="1", STALE_COMPILE="true")
    (argv,) = [a for a in calls if a[:4] == ["-m", "scalelab.cli", "grpo", "staleness"]]
    assert argv[argv.index("--jobs") + 1] == "1" and "optim.compile_layers=true" in argv


def test_restore_unpacks_an_earlier_windows_runs(tmp_path):
    """`restore TGZ` puts a window's packed run folders back under RUNS (where a study skips its finished variants)
    and clears the old window's work.done, so the next `poll` waits for the new window."""
    import tarfile
    src = tmp_path / "src"
    (src / "staleness-s0" / "k0" / "eval").mkdir(parents=True)
    (src / "staleness-s0" / "k0" / "results.json").write_text('{"steps": 40}')
    (src / "work.done").write_text("work done after 900 s")
    tgz = tmp_path / "runs.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(src, arcname=".")
    runs = tmp_path / "runs"
    env = {**os.environ, "RUNS": str(runs), "OUT": str(tmp_path / "out")}
    run = subprocess.run(["bash", "bench/gpu_grpo_real.sh", "restore", str(tgz)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (runs / "staleness-s0" / "k0" / "results.json").read_text() == '{"steps": 40}'
    assert not (runs / "work.done").exists() and "staleness-s0" in run.stdout


@pytest.mark.slow
def test_a_run_tag_names_a_variant_of_the_recipe(tmp_path):
    trains = _trains(_work(tmp_path, LRS="5e-5", SEEDS="1", RUN_TAG="os1.5", RECIPE_SETS="--set data.oversample=1.5"))
    assert list(trains) == ["recipe-lr5e-5-os1.5-s1"]
    assert "data.oversample=1.5" in trains["recipe-lr5e-5-os1.5-s1"]


# records `timeout`'s limit, then runs the command it was given
TIMEOUT_STAND_IN = """#!/usr/bin/env bash
echo "timeout $*" >> "$CALLS"
shift 3
exec "$@"
"""


def test_rollout_bench_engine_cases_get_time_per_engine_and_their_extra_flags(tmp_path):
    """RB_CASES k2/k4: each case's limit is RB_S plus 60 s per engine beyond the first (engines start one after
    another); every fixed-length case traces its steps; RB_K_EXTRA reaches the k cases, named with RB_K_TAG; an
    empty PARTS runs no part beside them (an unset one runs the default parts)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "timeout").write_text(TIMEOUT_STAND_IN)
    (bindir / "timeout").chmod(0o755)
    calls = _work(tmp_path, PARTS="", SOLO_PARTS="rollout_bench", RB_CASES="k2 k4", RB_S="300",
                  RB_K_EXTRA="--switch-interval-ms 0.5", RB_K_TAG="-si0.5")
    limits = [int(argv[3]) for argv in calls
              if argv[:3] == ["timeout", "-s", "INT"] and argv[5:6] == ["bench/grpo_rollout_bench.py"]]
    benches = [argv for argv in calls if argv[:1] == ["bench/grpo_rollout_bench.py"]]
    assert limits == [360, 480] and len(benches) == 2
    for k, argv in zip((2, 4), benches):
        assert argv[argv.index("--vllm-engines") + 1] == str(k) and "--trace-steps" in argv
        assert argv[argv.index("--switch-interval-ms") + 1] == "0.5"
        assert argv[argv.index("--out") + 1].endswith(f"/rollout-bench/fixed1024-colocated-k{k}-si0.5.json")
        assert argv[argv.index("--cudagraph-max", argv.index("--cudagraph-max") + 1) + 1] == str(1024 // k)
    assert any(argv[:1] == ["bench/rollout_bench_table.py"] for argv in calls)
    assert not _trains(calls) and not any("battery" in argv for argv in calls)  # PARTS="": nothing beside it

"""bench/gpu_dpo_real.py, the serving and bookkeeping half of bench/gpu_dpo_real.sh: the vLLM server's command
line, a stand-in server up for exactly the command's life, the plan's run names and the status of a hand-made
runs folder; and the shell script parses."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalelab.core.engines import build_command
from scalelab.core.net import free_port
from tests.bench_script import load_bench

REPO = Path(__file__).resolve().parents[2]
real = load_bench("gpu_dpo_real")

# answers 200 on /health at the --port of its argv, as a vLLM server does once it has loaded
STAND_IN = textwrap.dedent("""
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_command_uses_vllm_sampling_defaults_and_one_served_name():
    cmd = build_command(real.server_spec("/m/qwen", "base", 8000, 0.5, 2048, python="/py"))
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(cmd)
    for want in ("--model /m/qwen", "--port 8000", "--max-model-len 2048", "--dtype bfloat16",
                 "--served-model-name base", "--gpu-memory-utilization 0.5", "--generation-config vllm",
                 "--seed 0"):
        assert want in flags
    assert "--max-num-seqs" not in flags   # vLLM's own default unless asked
    more = build_command(real.server_spec("/m/qwen", "base", 8000, 0.5, 2048, python="/py", max_num_seqs=2048))
    assert more[more.index("--max-num-seqs") + 1] == "2048"


def test_serve_runs_the_command_while_the_server_answers_then_stops_it(tmp_path):
    script, port = tmp_path / "stand_in.py", free_port()
    script.write_text(STAND_IN)
    spec = real.server_spec("/m", "judge", port, 0.3, 4096, launcher=(str(script),))
    probe = [sys.executable, "-c", "import os, sys, urllib.request; "
             "urllib.request.urlopen(os.environ['SERVER_URL'] + '/health', timeout=5); "
             f"open({str(tmp_path / 'seen')!r}, 'w').write(os.environ['SERVER_URL']); sys.exit(7)"]
    assert real.serve(spec, tmp_path / "vllm.log", probe, ready_timeout_s=30) == 7   # the command's status
    assert (tmp_path / "seen").read_text() == f"http://127.0.0.1:{port}"
    assert not _listening(port)                                                     # stopped after


def test_plan_names_are_the_config_sweep():
    assert real.plan_names(REPO / "configs" / "dpo" / "qwen2.5-coder-1.5b-gsm8k-h200.toml") == [
        "dpo-beta0.05", "dpo-beta0.1", "dpo-beta0.3", "ipo-beta1", "orpo-beta0.1"]


def _write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_status_of_a_hand_made_runs_folder(tmp_path):
    sweep = tmp_path / "gsm8k"
    _write(sweep / "preferences.manifest.json", {"summary": {"n_pairs": 5400, "n_prompts": 7473,
                                                             "sample_accuracy": 0.61, "prompts_all_correct": 1500,
                                                             "prompts_all_wrong": 400}})
    done = sweep / "dpo-beta0.1"
    (done / "adapter").mkdir(parents=True)
    (done / "config.toml").write_text("")
    (done / "adapter" / "adapter_model.safetensors").write_bytes(b"x")
    _write(done / "results.json", {"steps": 310, "heldout_reward_accuracy_last": 0.8712})
    _write(done / "battery" / "battery.json", {"evidence": {"verdict": "PASS"}, "comparisons": {"mmlu": {"n": 2000}}})
    restored = sweep / "dpo-beta0.3"                     # results came back, the weights did not
    restored.mkdir()
    (restored / "config.toml").write_text("")
    _write(restored / "results.json", {"steps": 310, "heldout_reward_accuracy_last": 0.8})
    _write(sweep / "selection.json", {"chosen": {"run": "dpo-beta0.1"}})
    rows = {r.part: r for r in real.status(tmp_path)}
    assert rows["pairs"].done and rows["pairs"].detail.startswith("5400 pairs of 7473 questions")
    assert rows["run dpo-beta0.1"].done and "battery PASS (MMLU n 2000)" in rows["run dpo-beta0.1"].detail
    assert not rows["run dpo-beta0.3"].done and "weights not here, tuned side not stored" in rows[
        "run dpo-beta0.3"].detail
    (tmp_path / ".done-tuned-dpo-beta0.3").write_text("")    # its side was measured in the window it trained in
    rows = {r.part: r for r in real.status(tmp_path)}
    assert rows["run dpo-beta0.3"].done and "tuned side stored" in rows["run dpo-beta0.3"].detail
    assert rows["selection"].detail == "dpo-beta0.1"
    assert not rows["judge"].done and not rows["hh"].done
    assert real.main(["status", str(tmp_path)]) == 0 and (tmp_path / "status.json").is_file()


def test_status_of_a_set_cut_mid_sampling_counts_its_whole_batches(tmp_path):
    side = tmp_path / "gsm8k" / "preferences.samples.jsonl"
    side.parent.mkdir(parents=True)
    batch = json.dumps({"start": 0, "prompts": [{"id": "a"}, {"id": "b"}]})
    side.write_text(batch + "\n" + batch.replace('{"id": "b"}', '{"id": "c"}, {"id": "d"}') + "\n" + batch[:20])
    pairs = {r.part: r for r in real.status(tmp_path)}["pairs"]
    assert not pairs.done and pairs.detail == "not built; 2 batches (5 questions) sampled in preferences.samples.jsonl"


def test_the_script_parses_and_names_its_verbs(tmp_path):
    assert subprocess.run(["bash", "-n", "bench/gpu_dpo_real.sh"], cwd=REPO).returncode == 0
    env = {**os.environ, "OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs"), "SCALELAB_GIT_SHA": "0" * 40}
    done = subprocess.run(["bash", "bench/gpu_dpo_real.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "prep [CHUNK_DIR [SEED_TGZ]] | bundle | setup CHUNK_DIR | launch" in done.stderr


SLOW_PART = """#!/usr/bin/env bash
# a part as the script runs them: a python under `timeout -s INT` that stops cleanly on SIGINT
pwd > "$MARKS/cwd"
timeout -s INT 120 python3 -c '
import pathlib, sys, time
marks = pathlib.Path(sys.argv[1])
(marks / "started").write_text("")
try:
    time.sleep(120)
except KeyboardInterrupt:
    (marks / "interrupted").write_text("")
    sys.exit(130)
' "$MARKS"
"""


def test_stop_ends_the_running_part_cleanly_and_starts_no_other(tmp_path):
    bin_dir, marks, runs = tmp_path / "bin", tmp_path / "marks", tmp_path / "runs"
    bin_dir.mkdir(), marks.mkdir()
    (bin_dir / "slow_part").write_text(SLOW_PART)
    (bin_dir / "next_part").write_text(f"#!/usr/bin/env bash\ntouch {marks}/next_started\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MARKS": str(marks), "RUNS": str(runs),
           "OUT": str(tmp_path / "out"), "SCALELAB_GIT_SHA": "0" * 40, "PARTS": "slow_part next_part",
           "TREE": str(tmp_path / "tree")}

    def script(*args):
        return subprocess.run(["bash", "bench/gpu_dpo_real.sh", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)

    assert script("launch").returncode == 0
    for _ in range(100):
        if (marks / "started").exists():
            break
        subprocess.run(["sleep", "0.1"])
    assert (marks / "started").exists()
    # work runs from its own copy of the tree, which later calls' copies of the working tree do not touch
    assert (marks / "cwd").read_text().strip() == str(tmp_path / "tree")
    assert (tmp_path / "tree" / "bench" / "gpu_dpo_real.sh").is_file()
    again = script("launch")
    assert again.returncode == 1 and "already running" in again.stderr
    stopped = script("stop", "20")
    sid = (runs / "work.pid").read_text().strip()
    assert "stop: work" in stopped.stdout and "killed" not in stopped.stdout
    assert (marks / "interrupted").exists()                     # SIGINT reached the part, once, and it cleaned up
    assert not (marks / "next_started").exists()                # no later part started
    assert subprocess.run(["pgrep", "-s", sid], capture_output=True).returncode == 1   # nothing of it is left
    assert (runs / "work.done").read_text().startswith("work stopped by `stop`")
    assert "no work running" in script("stop").stdout


def test_each_window_records_the_baseline_knobs_it_ran_with(tmp_path):
    """A window's provenance names what its `launch` line needs to be run again: the baseline's tasks and lm-eval
    batch (the batch decides whether MMLU fits the GPU) beside PARTS and WORK_S; a part that does not fit the
    window is not started."""
    runs = tmp_path / "runs"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "RUNS": str(runs), "SCALELAB_GIT_SHA": "ab" * 20,
           "PARTS": "baseline", "WORK_S": "100", "BASELINE_TASKS": "mc", "LM_EVAL_BS": "8"}
    done = subprocess.run(["bash", "bench/gpu_dpo_real.sh", "work"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (prov,) = [json.loads(p.read_text()) for p in runs.glob("provenance-window-*.json")]
    assert prov["command"] == (f"SCALELAB_GIT_SHA={'ab' * 20} PARTS='baseline' WORK_S=100 BASELINE_TASKS=mc "
                               "LM_EVAL_BS=8 bash bench/gpu_dpo_real.sh launch")
    assert (prov["parts"], prov["work_s"], prov["baseline_tasks"], prov["lm_eval_batch_size"]) == (
        ["baseline"], 100, "mc", 8)
    assert "baseline: not started, " in (runs / "logs" / "work.log").read_text()


# a python3 stand-in for the sweep's and battery's calls: records its argv, "trains" the run of `--only` (its
# results and weights appear), names run b as the chosen one; a script on stdin runs in the real python
SWEEP_STAND_IN = """#!/usr/bin/env bash
[ "$1" != - ] || exec "$REAL_PYTHON" "$@"    # the window's provenance record, a script on stdin
echo "$*" >> "$CALLS"
case "$*" in
  "bench/gpu_dpo_real.py plan"*) echo "a b c" ;;
  *"dpo sweep"*) run=$(echo "$*" | sed -E 's/.*--only ([^ ]+).*/\\1/'); mkdir -p "$RUNS/gsm8k/$run/adapter"
                 : > "$RUNS/gsm8k/$run/adapter/adapter_model.safetensors"; : > "$RUNS/gsm8k/$run/config.toml"
                 echo '{}' > "$RUNS/gsm8k/$run/results.json" ;;
  *"dpo select"*) echo b ;;
  "bench/gpu_dpo_real.py base-config"*) mkdir -p "$RUNS/gsm8k/.base"; : > "$RUNS/gsm8k/.base/config.toml" ;;
  *"--side tuned"*) sleep "${SIDE_S:-0}"; echo "ended: $*" >> "$CALLS" ;;
esac
"""


def _dpo_work(tmp_path: Path, parts: str, **env: str) -> list[str]:
    bindir, calls, runs = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "runs"
    bindir.mkdir(exist_ok=True)
    (bindir / "python3").write_text(SWEEP_STAND_IN)
    (bindir / "python3").chmod(0o755)
    calls.unlink(missing_ok=True)
    run_env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(calls), "RUNS": str(runs),
               "OUT": str(tmp_path / "out"), "SCALELAB_GIT_SHA": "0" * 40, "PARTS": parts, "WORK_S": "3000",
               "REAL_PYTHON": sys.executable, **env}
    done = subprocess.run(["bash", "bench/gpu_dpo_real.sh", "work"], cwd=REPO, env=run_env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line for line in calls.read_text().splitlines() if ("dpo sweep" in line or "dpo battery" in line
            or "dpo select" in line) and not line.startswith("ended: ")]


def _short(line: str) -> str:
    """'train a', 'battery gsm8k/a tuned', 'battery gsm8k both', 'battery gsm8k/b both subset0', 'select'."""
    words = line.split()
    if "sweep" in words:
        return f"train {words[words.index('--only') + 1]}"
    if "select" in words:
        return "select"
    target = "/".join(Path(words[words.index("battery") + 1]).parts[-2:]).replace("runs/", "")
    side = words[words.index("--side") + 1]
    return f"battery {target} {side}" + (" subset0" if "battery.mmlu_subset=0" in words else "")


def test_each_run_trains_then_measures_its_tuned_side_in_the_same_window(tmp_path):
    """No run's weights must outlive the window it trained in: its tuned side follows its training; a run whose
    side is stored is skipped even without weights (they did not travel), one without it is trained again."""
    runs = tmp_path / "runs"
    (runs / "gsm8k" / "b").mkdir(parents=True)
    (runs / "gsm8k" / "b" / "results.json").write_text("{}")    # came back: trained, side stored, no weights
    for part in ("pairs", "tuned-b"):
        (runs / f".done-{part}").write_text("")
    calls = [_short(c) for c in _dpo_work(tmp_path, "sweep")]
    assert sorted(calls) == sorted(["battery gsm8k/.base base", "train a", "battery gsm8k/a tuned", "train c",
                                    "battery gsm8k/c tuned"])
    assert calls.index("train a") < calls.index("battery gsm8k/a tuned") and calls.index("train a") < calls.index(
        "train c") < calls.index("battery gsm8k/c tuned")
    assert all((runs / f".done-{m}").is_file() for m in ("base-side", "tuned-a", "tuned-c"))
    assert _dpo_work(tmp_path, "sweep") == []          # all stored: nothing is trained or measured again


@pytest.mark.parametrize("beside", ["1", "0"])
def test_a_side_runs_beside_the_next_training_unless_side_beside_is_off(tmp_path, beside):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / ".done-pairs").write_text("")
    _dpo_work(tmp_path, "sweep", SIDE_BESIDE=beside, SIDE_S="1", RUN_MIN_S="600", SWEEP_ONLY="a,b")
    lines = (tmp_path / "calls.txt").read_text().splitlines()
    a_ended = next(i for i, line in enumerate(lines) if line.startswith("ended: ") and "gsm8k/a" in line)
    b_trains = next(i for i, line in enumerate(lines) if "dpo sweep" in line and "--only b" in line)
    assert (a_ended < b_trains) == (beside == "0")
    assert not any("--only c" in line for line in lines)            # SWEEP_ONLY: a and b only
    (prov,) = [json.loads(p.read_text()) for p in runs.glob("provenance-window-*.json")]
    assert prov["command"] == (f"SCALELAB_GIT_SHA={'0' * 40} PARTS='sweep' WORK_S=3000 SWEEP_ONLY=a,b RUN_MIN_S=600"
                               + (" SIDE_BESIDE=0" if beside == "0" else "") + " bash bench/gpu_dpo_real.sh launch")


def test_no_run_starts_without_the_time_for_its_training_and_side(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / ".done-pairs").write_text("")
    calls = [_short(c) for c in _dpo_work(tmp_path, "sweep", WORK_S="900", RUN_MIN_S="1080")]
    assert calls == ["battery gsm8k/.base base"]          # the base side needs no run's folder
    assert "sweep a: not started, " in (runs / "logs" / "work.log").read_text()
    (prov,) = [json.loads(p.read_text()) for p in runs.glob("provenance-window-*.json")]
    assert prov["command"] == f"SCALELAB_GIT_SHA={'0' * 40} PARTS='sweep' WORK_S=900 bash bench/gpu_dpo_real.sh launch"
    assert (prov["run_min_s"], prov["side_beside"]) == (1080, True)


def test_the_battery_assembles_from_records_then_gets_the_chosen_runs_weights_back(tmp_path):
    runs = tmp_path / "runs"
    (runs / "gsm8k").mkdir(parents=True)
    for part in ("pairs", "base-side", "tuned-a", "tuned-b"):
        (runs / f".done-{part}").write_text("")
    assert _dpo_work(tmp_path, "battery") == []        # c's side is not stored: nothing runs
    assert "battery: tuned-c not stored yet" in (runs / "logs" / "work.log").read_text()
    (runs / ".done-tuned-c").write_text("")
    calls = [_short(c) for c in _dpo_work(tmp_path, "battery")]
    assert calls == ["battery gsm8k both", "select", "train b", "battery gsm8k/b both subset0"]
    assert (runs / ".done-battery").is_file()


def test_ship_brings_an_adapter_home_in_calls_of_four_chunks(tmp_path):
    """`ship RUN K` puts the K-th four 15 MiB chunks of the run's adapter folder and the manifest in $OUT/adapter;
    the calls' folders join back into the same folder here, also after the run was trained again."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    adapter = runs / "gsm8k" / "b" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 16}')
    env = {**os.environ, "RUNS": str(runs), "OUT": str(out), "SCALELAB_GIT_SHA": "0" * 40,
           "PYTHONPATH": str(REPO / "src")}
    for version in ("first", "retrained"):
        weights = os.urandom(70 * 2**20)
        (adapter / "adapter_model.safetensors").write_bytes(weights)
        home = tmp_path / "home" / version
        for k, expected in ((0, "4"), (1, "1")):
            done = subprocess.run(["bash", "bench/gpu_dpo_real.sh", "ship", "b", str(k)], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and done.stdout.split()[-1] == expected, done.stderr
            assert all(f.stat().st_size <= 15 * 2**20 for f in (out / "adapter").iterdir())
            (home / str(k)).mkdir(parents=True)
            for f in (out / "adapter").iterdir():
                (home / str(k) / f.name).write_bytes(f.read_bytes())
        back = tmp_path / "back" / version
        joined = subprocess.run([sys.executable, "-m", "scalelab.core.chunks", "join", str(back), str(home / "0"),
                                 str(home / "1")], env=env, capture_output=True, text=True)
        assert joined.returncode == 0, joined.stderr
        assert (back / "adapter_model.safetensors").read_bytes() == weights
    missing = subprocess.run(["bash", "bench/gpu_dpo_real.sh", "ship", "a", "0"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "ship: a has no weights here" in missing.stderr


def test_the_base_side_reads_the_first_planned_runs_config_from_a_hidden_folder(tmp_path):
    """`base-config` writes what `dpo battery --side base` reads: the first planned run's model and battery
    settings, in a folder whose base records are the sweep's battery-base and which no report takes for a run."""
    from scalelab.dpo.battery import base_cache_dir, request_cache_dir
    from scalelab.dpo.battery_folders import run_config
    from scalelab.dpo.config import load_dpo_config
    from scalelab.dpo.report import is_run_dir
    from scalelab.dpo.sweep_report import find_runs
    config = REPO / "configs" / "dpo" / "qwen2.5-coder-1.5b-gsm8k-h200.toml"
    sweep = tmp_path / "runs" / "gsm8k"
    sets = [f"run.out_dir='{tmp_path / 'runs'}'", "battery.data_dir='/data'"]
    written = real.write_base_config(config, sweep / ".base", sets)
    assert written == sweep / ".base" / "config.toml" and is_run_dir(sweep / ".base")
    base = run_config(sweep / ".base")
    source = load_dpo_config(config, sets)
    assert (base.model, base.battery) == (source.model, source.battery) and base.battery.data_dir == "/data"
    assert base.run.name == real.plan_names(config)[0]
    assert base_cache_dir(base, sweep / ".base").parent == sweep / "battery-base"
    assert request_cache_dir(base, sweep / ".base") == sweep / "battery-base" / "lm-eval-requests"
    (sweep / "dpo-beta0.1").mkdir()
    for f in ("config.toml", "metrics.jsonl"):
        (sweep / "dpo-beta0.1" / f).write_text("")
    assert find_runs(sweep) == [sweep / "dpo-beta0.1"]
    assert [r.part for r in real.status(tmp_path / "runs") if r.part.startswith("run ")] == ["run dpo-beta0.1"]

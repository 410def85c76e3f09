"""Single-file GPT-2 trainer: model and loop together, in the tradition of nanoGPT / llm.c train_gpt2.py.

    python train_gpt.py --config configs/pretrain/tiny-cpu.toml [--set train.max_steps=50 ...]
    torchrun --nproc_per_node 8 train_gpt.py --config configs/pretrain/gpt2-124m-fineweb-edu.toml

It imports nothing of scalelab but the shard reader and its device prefetch (device_batches.py), the config loader,
core/cpualloc.py (CPU runs) and optional parts in their own files (fp8.py with its Triton kernels fp8_kernels.py,
muon.py, chunked_ce.py with ce_kernel.py), so it can be read (and copied to a cluster) with them alone.
Sections, in order: model / data / optimizer + schedule / checkpoint / loop / main.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from scalelab.core.cpualloc import keep_freed_memory
from scalelab.pretrain.chunked_ce import chunked_cross_entropy
from scalelab.pretrain.config import ModelConfig, PretrainConfig, load_pretrain_config, peak_flops, save_config
from scalelab.pretrain.device_batches import DeviceBatches, to_device
from scalelab.pretrain.fp8 import FP8Linear, require_fp8, row_mlp, use_fp8
from scalelab.pretrain.muon import build_muon_adamw
from scalelab.pretrain.shards import StreamPosition, TokenStream, ValWindows, list_shards, manifest_hash

# ------------------------------------------------------------------------------------------------
# model: GPT-2 (Radford et al. 2019), parameter names as in HF GPT2LMHeadModel so export is a rename-free copy


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scale = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scale = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self.c_fc, "gelu_kernel", False):  # train.fp8_gelu_kernel: GELU fused with its FP8 casts
            return row_mlp(x, self.c_fc, self.c_proj)
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2 uses the tanh approximation


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(normed(self.ln_1, x)))  # pre-norm residual (GPT-2 sec. 2.3)
        return x + self.drop(self.mlp(normed(self.ln_2, x)))


def normed(ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm in fp32 math, out in x's dtype: a bf16 residual stream (train.residual_dtype) stays bf16 (llm.c)."""
    return ln(x.float()).to(x.dtype) if x.dtype in (torch.bfloat16, torch.float16) else ln(x)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, loss_chunks: int = 0, loss_kernel: str = "torch",
                 residual_dtype: torch.dtype | None = None):  # train.residual_dtype='compute': bf16 between blocks
        super().__init__()
        self.cfg, self.loss_chunks = cfg, loss_chunks  # loss_chunks > 0: chunked head + loss (chunked_ce.py)
        self.loss_kernel, self.residual_dtype = loss_kernel, residual_dtype  # 'triton'*: ce_kernel.py's chunks
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd), wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout), h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying (Press & Wolf 2017), as GPT-2
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_scale", False):
                std *= (2 * self.cfg.n_layer) ** -0.5  # GPT-2 sec. 2.3: scale residual projections by 1/sqrt(N)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.size(1)
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size={self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        x = x if self.residual_dtype is None else x.to(self.residual_dtype)  # fp32 embeddings: autocast's stream
        for block in self.transformer.h:
            x = block(x)
        return self.head(x, targets)

    def head(self, x: torch.Tensor, targets: torch.Tensor | None):
        # Padded vocab rows exist only for matmul shape; they are excluded from the softmax, so this
        # model and its exported 50257-row HF twin compute the same distribution.
        if targets is not None and self.loss_chunks:  # loss only: the (B*T, V) logits are never built
            fp8 = isinstance(self.lm_head, FP8Linear)  # train.fp8 'lm_head'/'all': the chunks' matmuls in FP8
            return None, chunked_cross_entropy(normed(self.transformer.ln_f, x), self.lm_head.weight, targets,
                                               self.loss_chunks, self.cfg.vocab_size, fp8,
                                               getattr(self.lm_head, "fast_accum", False), self.loss_kernel)
        logits = self.lm_head(normed(self.transformer.ln_f, x))[..., : self.cfg.vocab_size]
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def flops_per_token(model_cfg: ModelConfig, n_params: int) -> float:
    """Training FLOPs per token: 6N for the matmuls (Kaplan et al. 2020, sec. 2.1) plus the attention
    score/value term 12·L·d·T (PaLM, Chowdhery et al. 2022, appendix B). N excludes the position table."""
    n = n_params - model_cfg.block_size * model_cfg.n_embd
    return 6 * n + 12 * model_cfg.n_layer * model_cfg.n_embd * model_cfg.block_size


# ------------------------------------------------------------------------------------------------
# distributed setup and data


def setup_distributed(cfg: PretrainConfig) -> tuple[int, int, torch.device]:
    """(rank, world, device). Under torchrun, one process per device; NCCL on GPU, gloo on CPU."""
    use_cuda = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if use_cuda else "cpu")
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return rank, world, torch.device(f"cuda:{local}" if use_cuda else "cpu")


def make_stream(cfg: PretrainConfig, split: str, rank: int, world: int, pos: StreamPosition | None = None):
    files = list_shards(cfg.data.dir, split)
    seed = cfg.train.seed if (split == "train" and cfg.data.shuffle) else None  # val: always the same windows
    return TokenStream(files, cfg.train.micro_batch_size, cfg.model.block_size, rank, world, pos, seed)


def val_windows(cfg: PretrainConfig) -> ValWindows:
    """The val tokens every evaluation scores: the first data.val_tokens of the split (all of it when 0)."""
    return ValWindows(list_shards(cfg.data.dir, "val"), cfg.model.block_size, cfg.data.val_tokens)


@torch.no_grad()
def evaluate(model, cfg: PretrainConfig, rank: int, world: int, device: torch.device, autocast) -> float:
    """Mean loss per token over val_windows, the same tokens for any micro-batch size or world size. A short last
    batch is compiled once more for its shape, statically like every other graph here, not as a dynamic-shape one."""
    model.eval()
    total = torch.zeros(2, device=device, dtype=torch.float64)  # (sum of batch means x windows, windows)
    for x, y, windows in val_windows(cfg).batches(cfg.train.micro_batch_size, rank, world):
        x, y = to_device(x, y, device)
        torch._dynamo.mark_static(x, 0)
        with autocast:
            total[0] += model(x, y)[1].double() * windows
        total[1] += windows
    if world > 1:
        dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


# ------------------------------------------------------------------------------------------------
# optimizer and schedule


def make_optimizer(model: nn.Module, cfg: PretrainConfig, device: torch.device):
    """The optimizer named by train.optimizer (OPTIMIZERS)."""
    return OPTIMIZERS[cfg.train.optimizer](model, cfg, device.type == "cuda")


def make_adamw(model: nn.Module, cfg: PretrainConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); decay only 2-D weights (matmuls, embeddings), not biases or norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay, no_decay = [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    o = cfg.optim
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused)


OPTIMIZERS = {"adamw": make_adamw, "muon": build_muon_adamw}  # Muon: hidden matrices; AdamW: the rest (muon.py)


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Linear warmup, then cosine (Loshchilov & Hutter 2017) or warmup-stable-decay (Hu et al. 2024, MiniCPM)."""
    peak, floor, s = cfg.optim.lr, cfg.optim.lr * cfg.optim.min_lr_ratio, cfg.schedule
    total = cfg.train.max_steps
    if step < s.warmup_steps:
        return peak * (step + 1) / s.warmup_steps
    if s.kind == "constant":
        return peak
    if s.kind == "cosine":
        progress = (step - s.warmup_steps) / max(1, total - s.warmup_steps)
        return floor + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (peak - floor)
    decay_start = int(total * (1.0 - s.cooldown_frac))
    if step < decay_start:
        return peak
    return peak + (floor - peak) * (step - decay_start + 1) / max(1, total - decay_start)


# ------------------------------------------------------------------------------------------------
# checkpoint: full (unsharded) state, written atomically by rank 0, loadable at any world size


def _state_dicts(model, optimizer, world: int) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # lazy: heavy, only here
    if world == 1:
        return get_state_dict(model, optimizer)
    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_checkpoint(path: Path, model, optimizer, step: int, stream: DeviceBatches, cfg: PretrainConfig,
                    data_sha: str, rank: int, world: int) -> None:
    msd, osd = _state_dicts(model, optimizer, world)  # collective under FSDP2: every rank calls it
    if rank != 0:
        return
    state = {"model": msd, "optimizer": osd, "step": step, "data": stream.state(), "manifest_sha256": data_sha,
             "model_config": asdict(cfg.model), "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}
    if torch.cuda.is_available():
        state["rng"]["cuda"] = torch.cuda.get_rng_state()
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact


def load_checkpoint(path: Path, model, optimizer, cfg: PretrainConfig, data_sha: str, world: int) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict  # lazy: heavy, only here
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["manifest_sha256"] != data_sha:
        raise RuntimeError(f"refusing to resume {path}: it was trained on data manifest {state['manifest_sha256'][:12]} "
                           f"but {cfg.data.dir}/manifest.json hashes to {data_sha[:12]}; use a new run name")
    if state["model_config"] != asdict(cfg.model):
        raise RuntimeError(f"refusing to resume {path}: model config differs from the checkpoint's "
                           f"{state['model_config']}")
    opts = StateDictOptions(full_state_dict=world > 1, broadcast_from_rank0=False)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=opts)
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["rng"]["cuda"])
    return state


# ------------------------------------------------------------------------------------------------
# the loop


class MetricsLog:
    """Rank 0 appends one JSON object per event to <run>/metrics.jsonl (fsynced: a kill loses nothing)."""

    def __init__(self, run_dir: Path, rank: int):
        self.path, self.on = run_dir / "metrics.jsonl", rank == 0

    def __call__(self, event: str, **fields) -> None:
        if self.on:
            with open(self.path, "a") as f:
                f.write(json.dumps({"event": event, "time_unix": time.time(), **fields}) + "\n")
                f.flush()
                os.fsync(f.fileno())


def wrap_model(model: nn.Module, cfg: PretrainConfig, world: int, device: torch.device, dtype) -> nn.Module:
    """FSDP2 shards each block then the root (Zhao et al. 2023); DDP replicates (Li et al. 2020). compile_scope
    'blocks' compiles each block and the head apart (torchtitan), keeping FSDP2's all-gather hooks out of the graphs."""
    mode = None if cfg.train.compile_mode == "default" else cfg.train.compile_mode
    if cfg.train.compile and cfg.train.compile_multi_kernel:  # no on-disk graph caches: a cached multi-kernel
        import torch._functorch.config as functorch_config  # graph fails to reload (torch 2.11, TypeError in
        import torch._inductor.config as inductor_config    # MultiKernelCall.load_cache)
        inductor_config.triton.multi_kernel, inductor_config.fx_graph_cache = 1, False
        functorch_config.enable_autograd_cache = False
    if cfg.train.compile and cfg.train.compile_tune_kernels:
        import torch._inductor.config as inductor_config
        inductor_config.coordinate_descent_tuning = True
    if cfg.train.compile and cfg.train.compile_scope == "blocks":
        for i, block in enumerate(model.transformer.h):
            model.transformer.h[i] = torch.compile(block, mode=mode)  # checkpoint keys stay clean: DCP strips _orig_mod
        model.head = torch.compile(model.head, mode=mode)
    if world > 1 and cfg.train.parallel == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # bf16 params for compute and all-gathers (half the bytes), fp32 gradient reduce-scatter
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    if cfg.train.compile and cfg.train.compile_scope == "model":
        model = torch.compile(model, mode=mode)
    if world > 1 and cfg.train.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def set_grad_sync(model: nn.Module, cfg: PretrainConfig, world: int, sync: bool) -> None:
    """Skip the gradient collective on all but the last micro-step of an accumulation."""
    if world == 1:
        return
    if cfg.train.parallel == "ddp":
        model.require_backward_grad_sync = sync
    else:
        getattr(model, "_orig_mod", model).set_requires_gradient_sync(sync)


def nonfinite_diagnostic(model: nn.Module, step: int, loss: float, lr: float, last_norm: float) -> dict:
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()][:10]
    return {"step": step, "loss": loss, "lr": lr, "last_grad_norm": last_norm, "params_with_nonfinite_grad": bad,
            "hint": "lower optim.lr, raise schedule.warmup_steps, or check the data for corrupt tokens"}


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # peak RSS (KiB on Linux)


def train_step(model, optimizer, stream, cfg, world, device, autocast, accum, fixed_batch):
    """One optimizer step over `accum` micro-batches; returns (mean loss, grad norm before clipping)."""
    loss_sum = torch.zeros((), device=device)
    for micro in range(accum):
        x, y = fixed_batch if fixed_batch is not None else stream.next_batch()
        set_grad_sync(model, cfg, world, micro == accum - 1)
        with autocast:
            loss = model(x, y)[1]  # drop the logits now: holding them through backward costs B*T*V memory
        (loss / accum).backward()  # mean over micro-batches == loss of the whole batch
        if fixed_batch is None:
            stream.prefetch()  # cut and queue the next batch while the GPU runs this one's kernels
        loss_sum += loss.detach()
    if world > 1:
        dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return loss_sum.item() / accum, norm.item()


def build(cfg: PretrainConfig, world: int, device: torch.device):
    """(model, optimizer, autocast context, parameter count, compute dtype) as cfg describes them: FP8 swap, SDPA
    kernel choice, compile and data-parallel wrapping. Seed first: the init draws from the global generator."""
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
             "float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.train.dtype]
    model = GPT(cfg.model, cfg.train.loss_chunks, cfg.train.loss_kernel,
                dtype if cfg.train.residual_dtype == "compute" else None).to(device)
    if cfg.train.fp8 != "none":
        require_fp8(device)
        use_fp8(model, cfg.train.fp8, cfg.train.fp8_fast_accum, cfg.train.fp8_scaling == "row",
                cfg.train.fp8_gelu_kernel)
    if device.type == "cuda" and cfg.train.attention != "auto":  # keep only the chosen SDPA kernel
        for kind in ("cudnn", "flash", "mem_efficient", "math"):
            getattr(torch.backends.cuda, f"enable_{kind}_sdp")(kind.endswith(cfg.train.attention))
    n_params = sum(p.numel() for p in model.parameters())
    model = wrap_model(model, cfg, world, device, dtype)
    optimizer = make_optimizer(model, cfg, device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    return model, optimizer, autocast, n_params, dtype


def train(cfg: PretrainConfig) -> dict:
    """Run (or resume) training in cfg.run_dir; return the summary also written to results.json."""
    rank, world, device = setup_distributed(cfg)
    keep_freed_memory(device.type)   # on CPU a step's activations are reused, not mapped again (core/cpualloc.py)
    run_dir = cfg.run_dir
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.toml")
    log, data_sha, accum = MetricsLog(run_dir, rank), manifest_hash(cfg.data.dir), cfg.grad_accum(world)
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model, optimizer, autocast, n_params, dtype = build(cfg, world, device)
    ckpt, step, pos, state = run_dir / "checkpoint.pt", 0, None, None
    if cfg.train.resume and ckpt.is_file():
        state = load_checkpoint(ckpt, model, optimizer, cfg, data_sha, world)
        step, pos = state["step"], StreamPosition(**state["data"])
    if step >= cfg.train.max_steps:  # a finished run: keep its summary rather than overwrite it
        return json.loads((run_dir / "train_summary.json").read_text())
    stream = DeviceBatches(make_stream(cfg, "train", rank, world, pos), device, cfg.train.batch_prefetch)
    fixed = stream.next_batch() if cfg.train.overfit_batch else None
    tok_per_step = cfg.train.micro_batch_size * cfg.model.block_size * world * accum
    fpt, peak = flops_per_token(cfg.model, n_params), peak_flops(device, cfg.run.gpu) * world
    pred_sha = _sha_or_none(run_dir / "predictions.json")
    log("run_start", step=step, n_params=n_params, world_size=world, grad_accum=accum, tokens_per_step=tok_per_step,
        device=str(device), dtype=str(dtype), torch=torch.__version__, manifest_sha256=data_sha,
        predictions_sha256=pred_sha, flops_per_token=fpt,
        val_tokens_scored=val_windows(cfg).count * cfg.model.block_size)
    if state is not None:
        log("resume", step=step, data=state["data"])
    return _loop(model, optimizer, stream, cfg, rank, world, device, autocast, accum, fixed, step, log,
                 tok_per_step, fpt, peak, data_sha, n_params)


def _loop(model, optimizer, stream, cfg, rank, world, device, autocast, accum, fixed, step, log,
          tok_per_step, fpt, peak, data_sha, n_params) -> dict:
    t_cfg, run_dir, last_norm, val_loss, times = cfg.train, cfg.run_dir, float("nan"), None, []
    ckpt, train_loss, t_start = run_dir / "checkpoint.pt", float("nan"), time.perf_counter()
    while step < t_cfg.max_steps:
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_ratio", 1.0)  # Muon's groups peak at optim.muon_lr, not optim.lr
        t0 = time.perf_counter()
        train_loss, norm = train_step(model, optimizer, stream, cfg, world, device, autocast, accum, fixed)
        if not (math.isfinite(train_loss) and math.isfinite(norm)):
            diag = nonfinite_diagnostic(model, step, train_loss, lr, last_norm)
            log("nonfinite_stop", **diag)
            raise FloatingPointError(f"non-finite loss/grad at step {step}: {json.dumps(diag)}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt, step, last_norm = time.perf_counter() - t0, step + 1, norm
        times.append(dt)
        tps = tok_per_step / dt
        mfu = fpt * tps / peak if peak > 0 else float("nan")
        log("train", step=step, loss=train_loss, lr=lr, grad_norm=norm, step_ms=1000 * dt, tokens_per_s=tps,
            mfu=mfu, memory_gib=memory_gib(device), tokens=step * tok_per_step)
        if rank == 0 and step % t_cfg.log_every == 0:
            print(f"step {step:5d}/{t_cfg.max_steps} | loss {train_loss:.4f} | lr {lr:.2e} | norm {norm:.3f} | "
                  f"{1000 * dt:.1f} ms | {tps:,.0f} tok/s | MFU {100 * mfu:.1f}% | mem {memory_gib(device):.2f} GiB",
                  flush=True)
        last = step == t_cfg.max_steps or (t_cfg.token_budget and step * tok_per_step >= t_cfg.token_budget)
        if (t_cfg.val_every and step % t_cfg.val_every == 0) or last:
            val_loss = evaluate(model, cfg, rank, world, device, autocast)
            log("val", step=step, val_loss=val_loss, tokens=step * tok_per_step)
            if rank == 0:
                print(f"step {step:5d} | val loss {val_loss:.4f}", flush=True)
            last = last or val_loss <= t_cfg.target_val_loss  # time-to-target run: stop (and checkpoint) here
        if (t_cfg.checkpoint_every and step % t_cfg.checkpoint_every == 0) or last:
            save_checkpoint(ckpt, model, optimizer, step, stream, cfg, data_sha, rank, world)
            log("checkpoint", step=step, path=str(ckpt))
        if last:
            break
    return _finish(cfg, log, rank, world, step, tok_per_step, train_loss, val_loss, times, n_params, device,
                   time.perf_counter() - t_start)


def _finish(cfg, log, rank, world, step, tok_per_step, train_loss, val_loss, times, n_params, device, wall_s):
    steady = sorted(times[min(len(times) - 1, 3):]) if times else [float("nan")]  # skip warm-up/compile steps
    median_s = steady[len(steady) // 2]
    summary = {"steps": step, "tokens": step * tok_per_step, "final_train_loss": train_loss,
               "final_val_loss": val_loss, "n_params": n_params, "world_size": world,
               "median_step_ms": 1000 * median_s, "tokens_per_s": tok_per_step / median_s,
               "tokens_per_s_per_gpu": tok_per_step / median_s / world, "peak_memory_gib": memory_gib(device),
               "wall_s_this_session": wall_s, "device": str(device)}
    log("run_end", **summary)
    if rank == 0:
        (cfg.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def _sha_or_none(path: Path) -> str | None:
    return __import__("hashlib").sha256(path.read_bytes()).hexdigest() if path.is_file() else None


# ------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train a GPT-2 on llm.c token shards (single file; torchrun-able).")
    parser.add_argument("--config", help="TOML config (see configs/pretrain/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    args = parser.parse_args(argv)
    cfg = load_pretrain_config(args.config, args.set)
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GRPO update alone on one GPU, beside the bf16 matmul rate measured in the same process: a Qwen2.5-0.5B-shaped
model (random weights: only the shapes set the time) with LoRA r=32 on every linear layer, one step's batch with
the real run's sequence lengths, the reference pass (adapters off) and one optimizer step, timed per variant:
  fixed8-full     8 rows per pass in rollout order, the whole frame's fp32 logits (the update before this bench)
  fixed8-chunked  the same passes, the LM head on completion tokens only, in chunks recomputed in the backward
  budget-chunked-fp32lora  passes sorted by length under a 12,288-token budget, chunked head, the adapters'
                  matmuls in fp32 as peft runs them on a bf16 base
  budget-chunked-eager  the same with the forward under bf16 autocast (optim.bf16_autocast)
  budget-chunked  and the head's elementwise passes through torch.compile (optim.compile_head): the recipe's
  budget-chunked-layers  and each decoder layer through torch.compile (optim.compile_layers); GPU only, skipped
                  (and listed under "skipped") on the CPU
The first three run with the adapters in fp32 and none of them compiles the head.
MFU counts 6N FLOPs per trained token and 2N per reference-pass token, non-pad tokens only, N = every linear
weight of the model (untied LM head included; the embedding lookup is not a matmul), against the measured rate.

  python bench/grpo_update_bench.py --metrics RUN/metrics.jsonl [--step 0] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch

from scalelab.core.config import load_config
from scalelab.core.jsonio import open_text
from scalelab.grpo.batch import collate, frozen_logprobs, micro_batches
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.layercompile import compile_layers, eager_layers
from scalelab.grpo.train import optimizer_step

QWEN05 = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, vocab_size=151_936, max_position_embeddings=32768, rope_theta=1_000_000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=False)  # Qwen2.5-0.5B-Instruct's config.json, untied as the GGUF
TINY = dict(QWEN05, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512)  # --shape tiny: a CPU check of the bench itself


class Variant(NamedTuple):
    rows: int
    tokens: int | None  # None = --budget-tokens
    chunked: bool  # the LM head on completion tokens, in chunks
    autocast: bool
    compiled_head: bool
    compiled_layers: bool = False


VARIANTS = {
    "fixed8-full": Variant(8, 0, False, False, False), "fixed8-chunked": Variant(8, 0, True, False, False),
    "budget-chunked-fp32lora": Variant(64, None, True, False, False),
    "budget-chunked-eager": Variant(64, None, True, True, False), "budget-chunked": Variant(64, None, True, True, True),
    "budget-chunked-layers": Variant(64, None, True, True, True, True)}
CPU_SKIP = ("torch.compile of the decoder layers is a GPU option (optim.compile_layers); Inductor's first compile "
            "on the CPU would dominate the run")


class LogitsOnly(torch.nn.Module):
    """The policy without its decoder/head split, so batch.frame_logprobs_entropy takes the full-logits path."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, **kw):
        return self.inner(**kw)

    def disable_adapter(self):
        return self.inner.disable_adapter()


def step_lengths(path: Path, step: int) -> tuple[list[int], int]:
    """(completion lengths, total prompt tokens) of one logged step; the log plain, or committed .gz or .xz
    (core.jsonio finds it by its plain name)."""
    with open_text(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") == "grpo_step" and rec["step"] == step:
                lengths = rec["completion_lengths"]
                return lengths, int(rec["update_tokens"]) - sum(lengths)
    raise SystemExit(f"{path}: no grpo_step record for step {step}")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul_tflops(n: int, reps: int = 20) -> float:
    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def launch_us(n: int = 2000) -> float:
    """Host cost of one small kernel launch (µs): a LoRA update launches thousands of small kernels, so a host whose
    launches are slow (e.g. a sandboxed kernel that intercepts the driver's ioctls) is launch-bound where another
    is GPU-bound, and the same change can speed one up and not the other."""
    x = torch.zeros(1)
    for _ in range(50):
        x.add_(1)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def make_policy(shape: dict):
    import peft
    from transformers import Qwen2Config, Qwen2ForCausalLM
    model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16)
    n_linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    lora = peft.LoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"], task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora), n_linear


def fake_batch(lengths: list[int], prompt_tokens: int, vocab: int, group: int = 8):
    g = torch.Generator().manual_seed(0)
    n_prompts = len(lengths) // group
    mean = prompt_tokens // len(lengths)
    # drawn on the CPU generator even when the default device is the GPU (main sets it)
    plens = [max(8, mean + int(d)) for d in torch.randint(-30, 31, (n_prompts,), generator=g, device="cpu")]
    prompts = [tuple(torch.randint(0, vocab, (p,), generator=g, device="cpu").tolist()) for p in plens]
    comps = [tuple(torch.randint(0, vocab, (max(n, 1),), generator=g, device="cpu").tolist()) for n in lengths]
    return SimpleNamespace(prompt_ids=[prompts[i // group] for i in range(len(lengths))], completion_ids=comps,
                           logprobs=[tuple([-1.0] * len(c)) for c in comps])


def time_variant(policy, t, v: Variant, tokens: int, reps: int) -> dict:
    """`v` timed with `tokens` per pass; compiled layers are undone afterwards, so later variants run eagerly."""
    if v.compiled_layers:
        compile_layers(policy)
    try:
        return _time_variant(policy, t, v.rows, tokens, v.chunked, v.autocast, v.compiled_head, reps)
    finally:
        if v.compiled_layers:
            eager_layers(policy)


def _time_variant(policy, t, rows: int, tokens: int, chunked: bool, autocast: bool, compiled: bool,
                  reps: int) -> dict:
    cfg = load_config(GrpoConfig, None, [f"optim.micro_batch_size={rows}", f"optim.micro_batch_tokens={tokens}",
                                         "optim.grad_clip=1.0", f"optim.bf16_autocast={str(autocast).lower()}",
                                         f"optim.compile_head={str(compiled).lower()}"])
    model = policy if chunked else LogitsOnly(policy)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    micros = micro_batches(t, rows, tokens)
    times, ref_times = [], []
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for i in range(reps + 1):  # the first is warm-up
        sync()
        t0 = time.perf_counter()
        ref = frozen_logprobs(model, t, 1.0, micros, adapters_off=True, autocast=autocast, compile_head=compiled)
        sync()
        t1 = time.perf_counter()
        optimizer_step(model, t, opt, cfg, None, ref, first=True, micros=micros)
        sync()
        t2 = time.perf_counter()
        if i:
            ref_times.append(t1 - t0)
            times.append(t2 - t1)
    padded = sum(len(m.rows) * m.length for m in micros)
    return {"passes": len(micros), "padded_tokens": padded, "update_s": sorted(times)[len(times) // 2],
            "reference_s": sorted(ref_times)[len(ref_times) // 2], "update_s_all": times,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", type=Path, required=True)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shape", choices=["qwen2.5-0.5b", "tiny"], default="qwen2.5-0.5b")
    ap.add_argument("--budget-tokens", type=int, default=12288, help="budget-chunked's padded tokens per pass")
    ap.add_argument("--profile", type=Path, help="profile one pass of the last variant; its table to this file")
    a = ap.parse_args(argv)
    shape = QWEN05 if a.shape == "qwen2.5-0.5b" else TINY
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_default_device(device)
    lengths, prompt_tokens = step_lengths(a.metrics, a.step)
    peak = matmul_tflops(8192 if device.type == "cuda" else 256)
    host = {"kernel_release": platform.release(), "launch_us": launch_us()}
    policy, n_linear = make_policy(shape)
    t = collate(fake_batch(lengths, prompt_tokens, shape["vocab_size"]), torch.randn(len(lengths)), 0, device)
    seq_tokens = int(t.attention_mask.sum())
    out = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "shape": a.shape,
           "torch": torch.__version__, "matmul_bf16_tflops": peak, "host": host,
           "n_linear_params": n_linear, "sequences": t.n, "tokens": seq_tokens,
           "completion_tokens": int(t.mask.sum()), "metrics": str(a.metrics), "step": a.step, "variants": {}}
    print(f"bf16 matmul {peak:.0f} TFLOP/s; {t.n} sequences, {seq_tokens} tokens, N = {n_linear / 1e6:.0f}M; "
          f"kernel {host['kernel_release']}, {host['launch_us']:.1f} µs per small kernel launch")
    for name in a.variants.split(","):
        v = VARIANTS[name]
        if v.compiled_layers and device.type != "cuda":
            out.setdefault("skipped", {})[name] = CPU_SKIP
            print(f"{name}: skipped on the CPU: {CPU_SKIP}", flush=True)
            continue
        r = time_variant(policy, t, v, a.budget_tokens if v.tokens is None else v.tokens, a.reps)
        flops = 6 * n_linear * seq_tokens + 2 * n_linear * seq_tokens  # update + reference pass
        r["mfu"] = flops / (r["update_s"] + r["reference_s"]) / (peak * 1e12)
        r["update_mfu"] = 6 * n_linear * seq_tokens / r["update_s"] / (peak * 1e12)
        out["variants"][name] = r
        print(f"{name:15s} passes {r['passes']:3d} padded {r['padded_tokens']:7d} update {r['update_s']:.2f} s "
              f"ref {r['reference_s']:.2f} s  update MFU {r['update_mfu']:.1%}  with ref {r['mfu']:.1%}  "
              f"peak mem {r['peak_mem_gib']:.1f} GiB", flush=True)
    if a.profile and out["variants"]:  # the last variant that ran
        out["profile"] = profile_variant(policy, t, list(out["variants"])[-1], a.budget_tokens, a.profile)
    out["provenance"] = provenance()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1))
    return 0


def provenance() -> dict:
    import sys

    import peft
    import transformers

    from scalelab.core.provenance import git_sha
    return {"git_sha": git_sha(), "command": " ".join(["python", *sys.argv]), "unix_time": time.time(),
            "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}


def profile_variant(policy, t, name: str, budget_tokens: int, path: Path) -> str:
    """Two more reference passes + updates of variant `name` (time_variant with one repeat) under torch.profiler:
    the operators by device time (the table written to `path`), to see where the update's time goes beside the
    matmuls that MFU counts."""
    from torch.profiler import ProfilerActivity, profile
    v = VARIANTS[name]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        time_variant(policy, t, v, budget_tokens if v.tokens is None else v.tokens, 1)
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=60)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table)
    print(table[:6000], flush=True)
    return str(path)


if __name__ == "__main__":
    raise SystemExit(main())

"""The single-file trainer's invariants at toy scale on CPU: overfit, resume == uninterrupted,
grad-accum == big batch, DDP / FSDP2 (2 gloo processes) == 1 process, manifest and NaN guards."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab.core.config import ConfigError, dump_toml
from scalelab.core.jsonio import iter_jsonl
from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import PretrainConfig, load_pretrain_config
from scalelab.pretrain.fp8 import FP8Linear
from scalelab.pretrain.shards import read_shard, write_shard

VOCAB = 256
TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
        f"model.vocab_size={VOCAB}", f"model.padded_vocab_size={VOCAB}", "train.micro_batch_size=4",
        "train.val_every=0", "train.checkpoint_every=0", "schedule.warmup_steps=2", "optim.lr=3e-3",
        "train.device=cpu"]


def markov_tokens(n: int, seed: int) -> np.ndarray:
    """A sparse first-order Markov chain: learnable structure, so losses move and differ per step."""
    rng = np.random.default_rng(seed)
    nxt = rng.integers(0, VOCAB, size=(VOCAB, 3))
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    choice = rng.integers(0, 3, size=n)
    for i in range(1, n):
        out[i] = nxt[out[i - 1], choice[i]]
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("shards")
    write_shard(d / "train_000000.bin", markov_tokens(20_000, 1))
    write_shard(d / "val_000000.bin", markov_tokens(2_000, 2))
    (d / "manifest.json").write_text(json.dumps({"source": "markov", "seed": 1}))
    return d


def make_cfg(data_dir: Path, run_dir: Path, *extra: str) -> PretrainConfig:
    return load_pretrain_config(None, [*TINY, f"data.dir={json.dumps(str(data_dir))}",
                                       f"run.out_dir={json.dumps(str(run_dir.parent))}",
                                       f"run.name={json.dumps(run_dir.name)}", *extra])


def losses(run_dir: Path, event: str = "train", key: str = "loss") -> dict[int, float]:
    """Last record per step (a resumed run repeats the steps after its checkpoint)."""
    return {r["step"]: r[key] for r in iter_jsonl(run_dir / "metrics.jsonl") if r["event"] == event}


def run_script(cfg: PretrainConfig, nproc: int = 1) -> subprocess.Popen:
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    dump_toml(cfg, cfg.run_dir / "launch.toml")
    script = [train_gpt.__file__, "--config", str(cfg.run_dir / "launch.toml")]
    cmd = [sys.executable, *script] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *script]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("scope", ["model", "blocks"])
@pytest.mark.parametrize("mode,expected", [("default", None), ("max-autotune", "max-autotune")])
def test_compile_mode_reaches_every_compiled_module(monkeypatch, data_dir, tmp_path, scope, mode, expected):
    """train.compile_mode is what torch.compile is called with, for the whole model or each block and the head
    ('default' = torch's own default, no mode argument value)."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda m, mode=None: seen.append(mode) or m)
    cfg = make_cfg(data_dir, tmp_path / "run", "train.compile=true", f'train.compile_scope="{scope}"',
                   f'train.compile_mode="{mode}"')
    model = train_gpt.GPT(cfg.model)
    train_gpt.wrap_model(model, cfg, 1, torch.device("cpu"), torch.float32)
    assert seen == [expected] * (1 if scope == "model" else cfg.model.n_layer + 1)


def test_lr_schedule_hand_computed():
    cfg = load_pretrain_config(None, ["optim.lr=1.0", "optim.min_lr_ratio=0.1", "schedule.warmup_steps=10",
                                      "train.max_steps=110"])
    assert train_gpt.lr_at(0, cfg) == pytest.approx(0.1)       # (0+1)/10
    assert train_gpt.lr_at(9, cfg) == pytest.approx(1.0)
    assert train_gpt.lr_at(60, cfg) == pytest.approx(0.55)     # cosine midpoint: 0.1 + 0.5*(1+cos(pi/2))*0.9
    assert train_gpt.lr_at(110, cfg) == pytest.approx(0.1)
    wsd = load_pretrain_config(None, ["optim.lr=1.0", "optim.min_lr_ratio=0.0", "schedule.kind=wsd",
                                      "schedule.warmup_steps=10", "schedule.cooldown_frac=0.2",
                                      "train.max_steps=100"])
    assert train_gpt.lr_at(79, wsd) == 1.0                     # stable until 80 = 100*(1-0.2)
    assert train_gpt.lr_at(89, wsd) == pytest.approx(0.5)      # 1 + (0-1)*(89-80+1)/20
    assert train_gpt.lr_at(99, wsd) == pytest.approx(0.0)


def test_flops_per_token_gpt2_124m():
    cfg = load_pretrain_config(None, ["model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                      "model.block_size=1024"]).model
    n_params = sum(p.numel() for p in train_gpt.GPT(cfg).parameters())
    assert n_params == 124_475_904  # 124,439,808 with the 50257-row embedding, +47 padded rows x 768
    # 6 * (124,475,904 - 1024*768) + 12 * 12 * 768 * 1024
    assert train_gpt.flops_per_token(cfg, n_params) == 6 * (124_475_904 - 786_432) + 113_246_208


def test_overfit_one_batch(data_dir, tmp_path):
    cfg = make_cfg(data_dir, tmp_path / "overfit", "train.overfit_batch=true", "train.max_steps=80",
                   "schedule.kind=constant", "optim.weight_decay=0.0")
    summary = train_gpt.train(cfg)
    first = losses(cfg.run_dir)[1]
    assert first == pytest.approx(math.log(VOCAB), abs=0.3)
    start = next(r for r in iter_jsonl(cfg.run_dir / "metrics.jsonl") if r["event"] == "run_start")
    assert start["val_tokens_scored"] == (2_000 - 1) // 16 * 16  # the whole 2,000-token val split, in windows
    assert summary["final_train_loss"] < 0.05 * first


def kill_and_resume(data_dir, tmp_path, *overrides: str):
    """(uninterrupted config, killed-then-resumed config): the second run is SIGKILLed after its step-8
    checkpoint, then trained again in process (resuming from the checkpoint); both have run 24 steps."""
    extra = [*overrides, "train.max_steps=24", "train.checkpoint_every=4", "train.val_every=8"]
    full = make_cfg(data_dir, tmp_path / "full", *extra)
    train_gpt.train(full)
    killed = make_cfg(data_dir, tmp_path / "killed", *extra)
    proc = run_script(killed)
    deadline = time.time() + 120
    while time.time() < deadline and not any(r["event"] == "checkpoint" and r["step"] >= 8
                                             for r in iter_jsonl(killed.run_dir / "metrics.jsonl")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = losses(killed.run_dir)
    assert 8 <= max(done) < 24, "the kill must land mid-run"
    train_gpt.train(killed)  # resumes from the last checkpoint
    assert any(r["event"] == "resume" for r in iter_jsonl(killed.run_dir / "metrics.jsonl"))
    return full, killed


def test_resume_after_kill_equals_uninterrupted(data_dir, tmp_path):
    full, killed = kill_and_resume(data_dir, tmp_path)
    assert losses(killed.run_dir) == losses(full.run_dir)
    assert losses(killed.run_dir, "val", "val_loss") == losses(full.run_dir, "val", "val_loss")


def test_grad_accum_equals_big_batch(data_dir, tmp_path):
    big = make_cfg(data_dir, tmp_path / "big", "train.micro_batch_size=8", "train.max_steps=5")
    acc = make_cfg(data_dir, tmp_path / "acc", "train.micro_batch_size=2", "train.total_batch_tokens=128",
                   "train.max_steps=5")  # 128 = 8 * 16: grad_accum 4
    assert acc.grad_accum(1) == 4
    train_gpt.train(big)
    train_gpt.train(acc)
    a, b = losses(big.run_dir), losses(acc.run_dir)
    assert a.keys() == b.keys() and len(a) == 5
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5)
    assert losses(acc.run_dir, "train", "grad_norm")[5] == pytest.approx(losses(big.run_dir, "train", "grad_norm")[5],
                                                                        rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_process_equals_one(data_dir, tmp_path, parallel, optimizer):
    # Muon's Newton-Schulz runs in bf16: the same inputs give the same update on every rank, but the inputs
    # (all-reduced vs accumulated gradients) differ in rounding, which bf16 amplifies to ~1e-4
    rel = 1e-5 if optimizer == "adamw" else 1e-4
    common = ["train.max_steps=4", "train.micro_batch_size=2", "train.val_every=2", f"train.optimizer={optimizer}"]
    one = make_cfg(data_dir, tmp_path / "one", *common, "train.total_batch_tokens=64")  # 1 proc, accum 2
    two = make_cfg(data_dir, tmp_path / parallel, *common, f"train.parallel={parallel}")  # 2 procs x 2 seqs
    train_gpt.train(one)
    proc = run_script(two, nproc=2)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    a, b = losses(one.run_dir), losses(two.run_dir)
    assert len(a) == 4 and a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=rel)
    va, vb = losses(one.run_dir, "val", "val_loss"), losses(two.run_dir, "val", "val_loss")
    assert vb[4] == pytest.approx(va[4], rel=rel)


def test_resume_with_other_manifest_is_refused(data_dir, tmp_path):
    other = tmp_path / "other-data"
    other.mkdir()
    for name in ("train_000000.bin", "val_000000.bin"):
        (other / name).write_bytes((data_dir / name).read_bytes())
    (other / "manifest.json").write_text(json.dumps({"source": "markov", "seed": 1}))
    train_gpt.train(make_cfg(other, tmp_path / "run", "train.max_steps=2"))
    (other / "manifest.json").write_text(json.dumps({"source": "markov", "seed": 2}))
    with pytest.raises(RuntimeError, match="refusing to resume .* data manifest"):
        train_gpt.train(make_cfg(other, tmp_path / "run", "train.max_steps=4"))


def test_resume_with_other_model_is_refused(data_dir, tmp_path):
    train_gpt.train(make_cfg(data_dir, tmp_path / "run", "train.max_steps=2"))
    with pytest.raises(RuntimeError, match="model config differs"):
        train_gpt.train(make_cfg(data_dir, tmp_path / "run", "train.max_steps=4", "model.n_layer=3"))


def test_nonfinite_loss_stops_with_diagnostic(data_dir, tmp_path):
    cfg = make_cfg(data_dir, tmp_path / "nan", "optim.lr=1e30", "schedule.warmup_steps=0", "train.max_steps=20",
                   "optim.grad_clip=0.0")
    with pytest.raises(FloatingPointError, match="non-finite loss/grad at step"):
        train_gpt.train(cfg)
    stops = [r for r in iter_jsonl(cfg.run_dir / "metrics.jsonl") if r["event"] == "nonfinite_stop"]
    assert len(stops) == 1 and stops[0]["step"] < 20 and "hint" in stops[0]


def test_token_budget_dry_run(data_dir, tmp_path):
    cfg = make_cfg(data_dir, tmp_path / "budget", "train.max_steps=100", "train.token_budget=200")
    summary = train_gpt.train(cfg)  # 64 tokens per step: the budget is crossed at step 4
    assert summary["steps"] == 4 and summary["tokens"] == 256
    assert (cfg.run_dir / "checkpoint.pt").is_file()
    state = torch.load(cfg.run_dir / "checkpoint.pt", weights_only=True)
    assert state["step"] == 4 and state["data"] == {"shard": 0, "offset": 4 * 4, "epoch": 0}  # 4 windows/step


def test_sequence_longer_than_block_is_refused():
    model = train_gpt.GPT(load_pretrain_config(None, TINY).model)
    with pytest.raises(ValueError, match="exceeds model.block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_fp8_linear_matches_float_linear_within_fp8_error():
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 48)
    fp8 = torch.nn.Linear(64, 48)
    fp8.load_state_dict(ref.state_dict())
    fp8.__class__ = FP8Linear
    x = torch.randn(4, 8, 64)
    (y_ref, y8) = ref(x), fp8(x)
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    # e4m3 keeps 3 mantissa bits (relative step 2^-4 per element); errors average down over K=64 products
    assert y8.shape == y_ref.shape and rel(y8.float(), y_ref) < 0.05
    g = torch.randn_like(y_ref)
    (y_ref * g).sum().backward()
    (y8.float() * g).sum().backward()
    assert rel(fp8.weight.grad, ref.weight.grad) < 0.1 and rel(fp8.bias.grad, ref.bias.grad) < 1e-2  # bf16 output
    assert fp8.weight.grad.dtype == torch.float32
    assert rel(fp8.weight.grad, torch.zeros_like(ref.weight.grad) + 1) > 0.5  # not a trivially small gradient


def test_fp8_training_tracks_float_and_can_overfit(data_dir, tmp_path):
    extra = ["train.max_steps=30", "train.val_every=0", "train.checkpoint_every=0"]
    base = train_gpt.train(make_cfg(data_dir, tmp_path / "fp32", *extra))
    fp8 = train_gpt.train(make_cfg(data_dir, tmp_path / "fp8", *extra, 'train.fp8="all"'))
    assert abs(fp8["final_val_loss"] - base["final_val_loss"]) < 0.02
    rows = train_gpt.train(make_cfg(data_dir, tmp_path / "rows", *extra, 'train.fp8="all"', 'train.fp8_scaling="row"'))
    assert abs(rows["final_val_loss"] - base["final_val_loss"]) < 0.02 and rows["final_val_loss"] != fp8["final_val_loss"]
    over = make_cfg(data_dir, tmp_path / "overfit8", "train.overfit_batch=true", "train.max_steps=80",
                    "schedule.kind=constant", "optim.weight_decay=0.0", 'train.fp8="all"')
    summary = train_gpt.train(over)
    assert summary["final_train_loss"] < 0.1 * losses(over.run_dir)[1]  # gradients through FP8 still fit a batch


def _fp8_pair(rowwise: bool) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    ref, fp8 = torch.nn.Linear(64, 48), torch.nn.Linear(64, 48)
    fp8.load_state_dict(ref.state_dict())
    fp8.__class__ = FP8Linear
    fp8.rowwise = rowwise
    return ref, fp8


def test_rowwise_fp8_linear_matches_float_and_keeps_the_weight_gradient_in_bf16():
    ref, fp8 = _fp8_pair(rowwise=True)
    x = torch.randn(32, 64, requires_grad=True)
    x8 = x.detach().clone().requires_grad_()
    y_ref, y8 = ref(x), fp8(x8)
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert y8.dtype == torch.bfloat16 and rel(y8.float(), y_ref) < 0.05
    g = torch.randn_like(y_ref)
    (y_ref * g).sum().backward()
    (y8.float() * g).sum().backward()
    assert x8.grad.dtype == torch.float32 and rel(x8.grad, x.grad) < 0.1  # e5m2 gradient: 2 mantissa bits
    # the weight gradient is a bf16 GEMM (8 mantissa bits): an order of magnitude closer than any FP8 operand allows
    assert fp8.weight.grad.dtype == torch.float32 and rel(fp8.weight.grad, ref.weight.grad) < 0.01
    assert rel(fp8.bias.grad, ref.bias.grad) < 1e-2


def test_row_scales_keep_a_small_row_that_one_tensor_scale_flushes_to_zero():
    x = torch.randn(2, 64)
    x[0] *= 1e4   # an outlier token sets the whole tensor's scale ...
    x[1] *= 1e-3  # ... and this token, scaled by 448/amax, falls under e4m3's smallest subnormal (2^-9)
    errors = {}
    for rowwise in (False, True):
        ref, fp8 = _fp8_pair(rowwise)
        with torch.no_grad():
            ref.bias.zero_(), fp8.bias.zero_()  # a bias would swamp row 1's tiny outputs in bf16
            y_ref, y8 = ref(x), fp8(x).float()
        errors[rowwise] = ((y8[1] - y_ref[1]).norm() / y_ref[1].norm()).item()
    assert errors[False] > 0.9 and errors[True] < 0.1  # tensor scale: row 1 became 0; row scale: e4m3 error only


def test_rowwise_fp8_calls_two_scaled_gemms_with_row_and_column_scales(monkeypatch):
    from scalelab.pretrain.fp8 import use_fp8
    calls, real = [], torch._scaled_mm

    def spy(a, b, **kwargs):
        calls.append((tuple(kwargs["scale_a"].shape), tuple(kwargs["scale_b"].shape), kwargs["use_fast_accum"]))
        return real(a, b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    use_fp8(model, "all", fast_accum=True, rowwise=True)
    model(torch.randn(8, 32)).sum().backward()
    # forward: per token x per output feature; input gradient: per token x per input feature; no FP8 weight gradient
    assert calls == [((8, 1), (1, 16), True), ((8, 1), (1, 32), False)]


@pytest.mark.parametrize("sets", [['train.fp8="none"'], ['train.fp8="lm_head"', "train.loss_chunks=4"]])
def test_row_scaling_without_an_fp8_linear_is_refused(sets):
    with pytest.raises(ConfigError, match="train.fp8_scaling"):
        load_pretrain_config(None, [*TINY, *sets, 'train.fp8_scaling="row"'])


@pytest.mark.parametrize("which, fp8_names", [
    ("lm_head", "lm_head only"),
    ("blocks", "all but lm_head"),
    ("all", "all"),
])
def test_use_fp8_swaps_the_chosen_linears(which, fp8_names):
    from scalelab.pretrain.fp8 import use_fp8
    model = train_gpt.GPT(load_pretrain_config(None, TINY).model)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    use_fp8(model, which)
    swapped = {n for n, m in model.named_modules() if type(m) is FP8Linear}
    want = {"all": linears, "all but lm_head": linears - {"lm_head"}, "lm_head only": {"lm_head"}}[fp8_names]
    assert "lm_head" in linears and len(linears) > 2 and swapped == want


def _one_step(residual_dtype, fp8: bool, loss_chunks: int = 0) -> tuple[dict, float, dict]:
    """(input dtype of every block, attn and mlp; loss; parameter gradients) of one tiny forward/backward under
    CPU bf16 autocast, from the same init for any residual dtype."""
    from scalelab.pretrain.fp8 import use_fp8
    torch.manual_seed(0)
    model = train_gpt.GPT(load_pretrain_config(None, TINY).model, loss_chunks, "torch", residual_dtype)
    if fp8:
        use_fp8(model, "all", rowwise=True)
    seen = {}
    for name, module in model.named_modules():
        if name.endswith((".attn", ".mlp")) or name.count(".") == 2 and name.startswith("transformer.h."):
            module.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(name, args[0].dtype))
    idx = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, idx.roll(-1, 1))[1]
    loss.backward()
    return seen, loss.item(), {n: p.grad for n, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_bf16_residual_stream_stays_bf16_and_tracks_the_fp32_stream():
    seen32, loss32, grads32 = _one_step(None, fp8=False)
    seen16, loss16, grads16 = _one_step(torch.bfloat16, fp8=False)
    assert len(seen32) == 6 and set(seen32.values()) == {torch.float32}  # 2 blocks, their attn and mlp
    assert seen16.keys() == seen32.keys() and set(seen16.values()) == {torch.bfloat16}
    # one bf16 rounding (relative 2^-9) per add and per LayerNorm output: the loss moves, by far less than 1e-2,
    # and every gradient stays within 2% (measured 0.1-0.7%)
    assert loss16 != loss32 and abs(loss16 - loss32) < 1e-2
    for name, g in grads32.items():
        assert grads16[name].dtype == torch.float32 and _rel(grads16[name], g) < 0.02, name


def test_bf16_residual_stream_under_row_fp8_moves_gradients_less_than_fp8_does():
    _, _, grads_float = _one_step(None, fp8=False)
    seen32, loss32, grads32 = _one_step(None, fp8=True)
    seen16, loss16, grads16 = _one_step(torch.bfloat16, fp8=True)
    assert set(seen32.values()) == {torch.float32} and set(seen16.values()) == {torch.bfloat16}
    assert loss16 != loss32 and abs(loss16 - loss32) < 1e-2
    for name, g in grads32.items():  # e5m2 gradients carry 2 mantissa bits: the residual's bf16 is the smaller error
        assert grads16[name].dtype == torch.float32 and _rel(grads16[name], g) < _rel(g, grads_float[name]), name


def test_bf16_residual_stream_through_the_chunked_head_equals_the_plain_head():
    _, loss, grads = _one_step(torch.bfloat16, fp8=False)
    _, loss_chunked, grads_chunked = _one_step(torch.bfloat16, fp8=False, loss_chunks=4)
    assert loss_chunked == pytest.approx(loss, abs=1e-4)
    for name, g in grads.items():
        assert _rel(grads_chunked[name], g) < 1e-2, name


def test_residual_dtype_reaches_the_model_and_trains_like_fp32(data_dir, tmp_path):
    extra = ["train.max_steps=30", 'train.dtype="bfloat16"']
    cfg = make_cfg(data_dir, tmp_path / "bf16res", *extra, 'train.residual_dtype="compute"')
    assert train_gpt.build(cfg, 1, torch.device("cpu"))[0].residual_dtype == torch.bfloat16
    base = train_gpt.train(make_cfg(data_dir, tmp_path / "fp32res", *extra))
    res = train_gpt.train(cfg)
    assert res["final_val_loss"] != base["final_val_loss"] and abs(res["final_val_loss"] - base["final_val_loss"]) < 0.02


def test_a_compute_dtype_residual_without_one_is_refused():
    with pytest.raises(ConfigError, match="train.residual_dtype"):
        load_pretrain_config(None, [*TINY, 'train.dtype="float32"', 'train.residual_dtype="compute"'])


def test_fp8_blocks_combine_with_the_chunked_loss():
    cfg = load_pretrain_config(None, [*TINY, 'train.fp8="blocks"', "train.loss_chunks=4"])  # accepted: head in bf16
    assert cfg.train.fp8 == "blocks" and cfg.train.loss_chunks == 4


def test_fp8_fast_accumulation_reaches_the_forward_gemm_only(monkeypatch):
    from scalelab.pretrain.fp8 import use_fp8
    calls, real = [], torch._scaled_mm

    def spy(*args, **kwargs):
        calls.append(kwargs.get("use_fast_accum", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    use_fp8(model, "all", fast_accum=True)
    model(torch.randn(8, 32)).sum().backward()
    assert calls == [True, False, False]   # forward fast; grad-input and grad-weight precise


def test_compile_multi_kernel_reaches_inductor():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    # config.patch restores what the trainer sets (monkeypatch would delete the config modules' entries on undo)
    with inductor_config.patch({"triton.multi_kernel": 0, "fx_graph_cache": True}), \
            functorch_config.patch(enable_autograd_cache=True):
        for flag, want in ((False, 0), (True, 1)):
            cfg = load_pretrain_config(None, [*TINY, "train.compile=true",
                                              f"train.compile_multi_kernel={str(flag).lower()}"])
            train_gpt.wrap_model(train_gpt.GPT(cfg.model), cfg, 1, torch.device("cpu"), torch.float32)
            caches = (inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache)
            assert inductor_config.triton.multi_kernel == want and caches == (not flag, not flag)


def test_compile_tune_kernels_reaches_inductor():
    import torch._inductor.config as inductor_config
    with inductor_config.patch({"coordinate_descent_tuning": False}):
        for flag in (False, True):
            cfg = load_pretrain_config(None, [*TINY, "train.compile=true",
                                              f"train.compile_tune_kernels={str(flag).lower()}"])
            train_gpt.wrap_model(train_gpt.GPT(cfg.model), cfg, 1, torch.device("cpu"), torch.float32)
            assert inductor_config.coordinate_descent_tuning is flag


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_before_building(monkeypatch):
    from scalelab.pretrain.fp8 import require_fp8
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match=r"A100-SXM4-80GB is sm_80, FP8 matmuls need compute capability 8\.9"):
        require_fp8(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    require_fp8(torch.device("cuda", 0))   # Hopper passes
    require_fp8(torch.device("cpu"))       # CPU: torch._scaled_mm's reference kernels (the tests)


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_val_loss_scores_the_same_tokens_for_any_micro_batch(data_dir, tmp_path, batch):
    """val_tokens=200 at T=16: the first 12 windows (targets val[1:193]) at any B; a B*T stride would score
    7 windows at B=7 and 9 at B=3."""
    import contextlib
    cfg = make_cfg(data_dir, tmp_path / "r", "data.val_tokens=200", f"train.micro_batch_size={batch}")
    torch.manual_seed(0)
    model = train_gpt.GPT(cfg.model)
    got = train_gpt.evaluate(model, cfg, 0, 1, torch.device("cpu"), contextlib.nullcontext())
    val = torch.from_numpy(np.asarray(read_shard(data_dir / "val_000000.bin")[:193], dtype=np.int64))
    windows = torch.stack([val[i * 16:i * 16 + 17] for i in range(12)])
    with torch.no_grad():
        logits, _ = model(windows[:, :-1])
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1))
    assert got == pytest.approx(expected.item(), rel=1e-5)
    assert model.training  # evaluate hands the model back in train mode


@pytest.mark.slow
def test_compiled_val_with_a_short_last_batch_equals_eager(data_dir, tmp_path):
    """B=7 over 12 windows: a full batch, then a short one of 5, which the compiled model takes as a second
    static shape; the loss equals the eager model's at B=1 on the same weights."""
    import contextlib
    got = {}
    for batch, compiled in ((1, False), (7, True)):
        cfg = make_cfg(data_dir, tmp_path / f"b{batch}", "data.val_tokens=200", f"train.micro_batch_size={batch}",
                       f"train.compile={str(compiled).lower()}")
        torch.manual_seed(0)
        model = train_gpt.wrap_model(train_gpt.GPT(cfg.model), cfg, 1, torch.device("cpu"), torch.float32)
        got[batch] = train_gpt.evaluate(model, cfg, 0, 1, torch.device("cpu"), contextlib.nullcontext())
    assert got[7] == pytest.approx(got[1], rel=1e-5)

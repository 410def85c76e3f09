"""optim.compile_layers (grpo.layercompile) on a tiny Qwen2 with LoRA on every linear layer: compiled layers give
the eager per-token log-probs and LoRA gradients, with adapters on and off, with autocast on and off and at two
pass shapes (one graph), generation stays eager, and a compiler failure warns and runs eagerly.

Most tests compile with dynamo + AOTAutograd and no code generation (backend "aot_eager" behind a counter):
what could go stale (a graph reused with adapters toggled, or under another autocast state) is decided by
dynamo's guards, the same for every backend, and it takes seconds instead of Inductor's C++ compiles. One test
(slow) runs Inductor itself, the backend of optim.compile_layers on a GPU.

Tolerances. TOL = 1e-4 on log-probs (magnitude ~5) in fp32: compiled code may fuse and reorder fp32 sums (RMSNorm's
mean, the softmax in attention), which moves results by a few 1e-6 (float32 eps 1.2e-7 times a few hundred
terms); the differences the tests must catch (adapters on vs off, autocast on vs off) are each asserted to be at
least 10 x TOL. Gradients: relative to each tensor's largest entry, the same reasoning. aot_eager runs eager's
aten ops, so TOL holds under bf16 autocast too; Inductor there keeps fused intermediates in fp32 where eager
rounds each op's output to bf16, so it is held to BF16_TOL: about one bf16 step of a log-prob of magnitude 4 to 8
(2^-6 = 0.016)."""
from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from scalelab.core.config import load_config
from scalelab.grpo import layercompile, train
from scalelab.grpo.batch import collate, frame_logprobs, frozen_logprobs, micro_batches
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.layercompile import compile_layers, decoder_layers, eager_layers, is_compiled

TOL = 1e-4
BF16_TOL = 2e-2
VOCAB = 128


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    """Each test starts from no compiled graphs (dynamo's cache per code object is process-wide, and a full one
    would run later tests eagerly, passing them for the wrong reason), an empty backend registry, and dynamo's
    recompile limit put back after (compile_layers raises it)."""
    torch.compiler.reset()
    monkeypatch.setattr(layercompile, "_COMPILED", {})
    limit = torch._dynamo.config.recompile_limit
    yield
    torch.compiler.reset()
    torch._dynamo.config.recompile_limit = limit


def tiny_qwen2_lora(seed: int = 0):
    """2 layers, hidden 64, LoRA r=4 on every linear of a block; B drawn at random (peft starts it at 0, which
    would make adapters on and off the same model)."""
    import peft
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "up_proj", "down_proj"], task_type="CAUSAL_LM")
    model = peft.get_peft_model(Qwen2ForCausalLM(cfg), lora)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    return model


def step_tensors(seed: int = 1):
    """Two prompts x 4 completions of uneven length, collated as the trainer does (right-padded)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [tuple(torch.randint(2, VOCAB, (n,), generator=g).tolist()) for n in (7, 11)]
    lengths = [3, 14, 6, 9, 1, 12, 5, 8]
    comps = [tuple(torch.randint(2, VOCAB, (n,), generator=g).tolist()) for n in lengths]
    batch = SimpleNamespace(prompt_ids=[prompts[i // 4] for i in range(8)], completion_ids=comps,
                            logprobs=[tuple([-1.0] * len(c)) for c in comps])
    return collate(batch, torch.randn(8, generator=g), 0, torch.device("cpu"))


def logprobs(model, t, micros, adapters_off: bool = False) -> torch.Tensor:
    return frozen_logprobs(model, t, 1.0, micros, adapters_off=adapters_off, autocast=False)


def train_logprobs(model, t, micros) -> torch.Tensor:
    """Log-probs of the passes as the update computes them (train mode, grad on), without stepping."""
    model.train()
    out = torch.zeros(t.mask.shape)
    for m in micros:
        out[m.rows, :m.width] = frame_logprobs(model, t, m, 1.0).detach()
    return out


def grads(model, t, micros) -> dict[str, torch.Tensor]:
    """LoRA gradients of the sum of every completion token's log-prob, over the passes (the update's path)."""
    model.train()
    model.zero_grad(set_to_none=True)
    for m in micros:
        frame_logprobs(model, t, m, 1.0).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_grads_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and len(want) == 2 * 7 * 2  # A and B of 7 linears in 2 layers
    for name, g in want.items():
        assert g.abs().max() > 0, name
        assert (got[name] - g).abs().max() <= TOL * g.abs().max(), name


def test_compiled_layers_match_eager_with_adapters_on_and_off_and_at_two_shapes():
    model, t = tiny_qwen2_lora(), step_tensors()
    micros = micro_batches(t, 8, 60)  # length-sorted passes under a token budget: different rows x lengths
    assert len({(len(m.rows), m.length) for m in micros if len(m.rows) > 1}) >= 2
    on, off, g = logprobs(model, t, micros), logprobs(model, t, micros, adapters_off=True), grads(model, t, micros)
    assert (on - off).abs().max() > 100 * TOL  # the adapters matter, so a stale graph would show

    counter = CompileCounterWithBackend("aot_eager")
    assert compile_layers(model, counter) == 2
    torch.testing.assert_close(logprobs(model, t, micros), on, atol=TOL, rtol=0)
    torch.testing.assert_close(logprobs(model, t, micros, adapters_off=True), off, atol=TOL, rtol=0)
    torch.testing.assert_close(logprobs(model, t, micros), on, atol=TOL, rtol=0)  # on again, after off
    assert_grads_close(grads(model, t, micros), g)
    frames = counter.frame_count
    assert frames > 0

    # a new pass shape reuses the graphs (dynamic): no recompile, and still eager's numbers
    wider = micro_batches(t, 8, 0)  # the whole step in one pass
    assert (len(wider[0].rows), wider[0].length) not in {(len(m.rows), m.length) for m in micros}
    eager = logprobs(_eager_copy(model), t, wider)
    torch.testing.assert_close(logprobs(model, t, wider), eager, atol=TOL, rtol=0)
    assert counter.frame_count == frames


def _eager_copy(model):
    """A deep copy with its layers back to eager (the copy's forwards are bound to the copy's layers)."""
    other = copy.deepcopy(model)
    assert all(is_compiled(x) and x.forward.__self__ is x for x in decoder_layers(other))
    assert eager_layers(other) == 2
    return other


def test_autocast_state_selects_its_own_graph():
    model, t = tiny_qwen2_lora(), step_tensors()
    micros = micro_batches(t, 8, 60)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    fp32 = logprobs(model, t, micros)
    with bf16:
        mixed = logprobs(model, t, micros)
    assert (fp32 - mixed).abs().max() > 10 * TOL  # bf16 matmuls change the result

    compile_layers(model, CompileCounterWithBackend("aot_eager"))
    with bf16:
        torch.testing.assert_close(logprobs(model, t, micros), mixed, atol=TOL, rtol=0)
    torch.testing.assert_close(logprobs(model, t, micros), fp32, atol=TOL, rtol=0)  # not the bf16 graph
    with bf16:
        torch.testing.assert_close(logprobs(model, t, micros), mixed, atol=TOL, rtol=0)  # not the fp32 one


def test_generation_with_a_kv_cache_runs_eagerly():
    model = tiny_qwen2_lora().eval()
    ids = torch.randint(2, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids, **kw)
    counter = CompileCounterWithBackend("aot_eager")
    compile_layers(model, counter)
    assert torch.equal(model.generate(input_ids=ids, **kw), want)
    assert counter.frame_count == 0  # every call carried the cache


def test_compiling_twice_is_a_no_op_and_eager_layers_undo_it():
    model = tiny_qwen2_lora()
    torch._dynamo.config.recompile_limit = 8
    assert compile_layers(model, "aot_eager") == 2
    assert torch._dynamo.config.recompile_limit == layercompile.RECOMPILE_LIMIT  # every layer shares one cache
    bound = [x.forward for x in decoder_layers(model)]
    assert compile_layers(model, "aot_eager") == 0
    assert [x.forward for x in decoder_layers(model)] == bound
    assert eager_layers(model) == 2 and not any(is_compiled(x) for x in decoder_layers(model))
    assert eager_layers(model) == 0


def _refused(*args, **kwargs):
    raise RuntimeError("no compiler here")


def _failing_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


@pytest.mark.parametrize("where", ["torch.compile", "backend"])
def test_a_compiler_failure_warns_and_runs_eagerly(monkeypatch, where):
    model, t = tiny_qwen2_lora(), step_tensors()
    micros = micro_batches(t, 8, 60)
    want = logprobs(model, t, micros)
    if where == "torch.compile":
        monkeypatch.setattr(torch, "compile", _refused)
    compile_layers(model, _failing_backend if where == "backend" else "inductor")
    with pytest.warns(RuntimeWarning, match="optim.compile_layers: torch.compile of the decoder layers failed"):
        got = logprobs(model, t, micros)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    with warnings.catch_warnings():  # warned once: later passes run eagerly without a word
        warnings.simplefilter("error", RuntimeWarning)
        torch.testing.assert_close(logprobs(model, t, micros), want, atol=TOL, rtol=0)


def test_a_model_without_decoder_layers_warns_and_stays_eager():
    with pytest.warns(RuntimeWarning, match="no decoder layers found"):
        assert compile_layers(torch.nn.Linear(2, 2)) == 0


def test_the_trainer_compiles_the_policy_only_when_asked_and_on_cuda(monkeypatch):
    on = load_config(GrpoConfig, None, ["optim.compile_layers=true"])
    assert not load_config(GrpoConfig, None, []).optim.compile_layers  # off by default
    model = tiny_qwen2_lora()
    assert train.compile_policy_layers(on, model) == 0  # CPU: eager unless a test forces it
    assert not any(is_compiled(x) for x in decoder_layers(model))
    monkeypatch.setattr(train, "_LAYERS_BACKEND_OFF_CUDA", "aot_eager")
    assert train.compile_policy_layers(load_config(GrpoConfig, None, []), model) == 0
    assert train.compile_policy_layers(on, model) == 2
    assert all(x._compile_layers_backend == "aot_eager" for x in decoder_layers(model))


def test_a_training_run_with_compiled_layers_logs_the_eager_run(tmp_path, monkeypatch):
    """Two LoRA steps with the KL logged (reference pass with adapters off) and the HF engine sharing the policy
    module (generation through the compiled layers' eager path): the same records as the eager run."""
    from tests.grpo.test_train import make, steps
    monkeypatch.setattr(train, "_LAYERS_BACKEND_OFF_CUDA", "aot_eager")
    records = []
    for flag in ("false", "true"):
        cfg, parts = make(tmp_path, f"c{flag}", "model.lora.r=4", "optim.lr=5e-2", "train.max_steps=2",
                          "loss.log_kl=true", "optim.micro_batch_tokens=60", f"optim.compile_layers={flag}")
        train.train(cfg, parts, log=lambda s: None)
        assert all(is_compiled(x) for x in decoder_layers(parts.policy)) == (flag == "true")
        records.append(steps(tmp_path, f"c{flag}"))
    for eager, compiled in zip(*records):
        assert compiled["completion_lengths"] == eager["completion_lengths"]
        for key in ("loss", "kl_mean", "grad_norm", "entropy_mean"):
            assert compiled[key] == pytest.approx(eager[key], abs=TOL, rel=TOL), key


@pytest.mark.slow
def test_inductor_layers_match_eager():
    """The GPU's backend, here on the CPU (C++ code generation; ~40 s of it on a cold cache, so three graphs
    only): the update's log-probs and LoRA gradients in fp32, and the reference pass (adapters off, no grad)
    under bf16 autocast."""
    model, t = tiny_qwen2_lora(), step_tensors()
    micros = micro_batches(t, 8, 60)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    on, g = train_logprobs(model, t, micros), grads(model, t, micros)
    with bf16:
        off = logprobs(model, t, micros, adapters_off=True)
    counter = CompileCounterWithBackend("inductor")
    compile_layers(model, counter)
    torch.testing.assert_close(train_logprobs(model, t, micros), on, atol=TOL, rtol=0)
    assert_grads_close(grads(model, t, micros), g)
    with bf16:
        torch.testing.assert_close(logprobs(model, t, micros, adapters_off=True), off, atol=BF16_TOL, rtol=0)
    assert counter.frame_count > 0

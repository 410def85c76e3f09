"""bf16 autocast for a bf16 base with fp32 LoRA adapters (grpo.precision): applied only there, the adapters then see
bf16 inputs instead of fp32 copies, their weights and gradients stay fp32, and log-probs and gradients agree with
the fp32-adapter computation to bf16 precision. The chunked head computes each chunk's statistics (entropy
included) once, and only the gradient in the backward."""
from __future__ import annotations

import pytest
import torch

from scalelab.core.config import load_config
from scalelab.grpo import head as head_mod
from scalelab.grpo.batch import collate, frozen_logprobs, micro_batches
from scalelab.grpo.head import head_logprobs
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.precision import compute_autocast, wants_autocast
from scalelab.grpo.train import optimizer_step
from scalelab.grpo.types import RolloutBatch

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, max_position_embeddings=256, tie_word_embeddings=False)


def _policy(dtype, lora=True):
    import peft
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).to(dtype)
    if not lora:
        return model
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
                          task_type="CAUSAL_LM")
    policy = peft.get_peft_model(model, cfg)
    with torch.no_grad():  # B = 0 at init would make every adapter a no-op: give them a real delta
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return policy


def _tensors():
    g = torch.Generator().manual_seed(1)
    prompts = [tuple(torch.randint(0, 300, (n,), generator=g).tolist()) for n in (6, 6, 9, 9)]
    comps = [tuple(torch.randint(0, 300, (n,), generator=g).tolist()) for n in (5, 12, 3, 8)]
    b = RolloutBatch(prompt_ids=prompts, completion_ids=comps, logprobs=[tuple([-1.0] * len(c)) for c in comps],
                     texts=("x",) * 4, finished=(True,) * 4, generation_ms=1.0, weights_version=0, engine="test")
    return collate(b, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, torch.device("cpu"))


def test_applies_only_to_a_bf16_base_with_fp32_trained_weights():
    assert wants_autocast(_policy(torch.bfloat16))
    assert not wants_autocast(_policy(torch.float32))  # CPU runs: fp32 throughout
    assert not wants_autocast(_policy(torch.bfloat16, lora=False))  # a full bf16 fine-tune: nothing to cast
    assert isinstance(compute_autocast(_policy(torch.float32)), type(compute_autocast(_policy(torch.bfloat16), False)))


def test_adapters_see_bf16_inputs_under_the_context_and_fp32_copies_without(tmp_path):
    policy, seen = _policy(torch.bfloat16), []
    lora_a = next(m for n, m in policy.named_modules() if n.endswith("lora_A.default"))
    lora_a.register_forward_hook(lambda mod, args, out: seen.append((args[0].dtype, out.dtype)))
    ids = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        policy(input_ids=ids)
        with compute_autocast(policy):
            policy(input_ids=ids)
        policy(input_ids=ids)  # the context restores peft's casting
    assert seen == [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]


def _step(policy, t, autocast):
    cfg = load_config(GrpoConfig, None, ["optim.grad_clip=0", "optim.micro_batch_size=2",
                                         f"optim.bf16_autocast={str(autocast).lower()}"])
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.0)
    ref = frozen_logprobs(policy, t, 1.0, micro_batches(t, 2), adapters_off=False, autocast=autocast)
    optimizer_step(policy, t, opt, cfg, None, None, first=True)
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    return ref, grads


def test_autocast_gives_the_fp32_adapter_results_to_bf16_precision():
    t = _tensors()
    policy = _policy(torch.bfloat16)
    want_lp, want_grads = _step(policy, t, autocast=False)
    got_lp, got_grads = _step(policy, t, autocast=True)
    mask = t.mask.bool()
    assert (want_lp[mask] != got_lp[mask]).any()  # the adapters really ran in another precision
    torch.testing.assert_close(got_lp[mask], want_lp[mask], atol=0.05, rtol=0.02)
    for name, want in want_grads.items():
        got = got_grads[name]
        assert got.dtype == torch.float32  # fp32 master weights keep fp32 gradients
        assert float((got - want).norm() / want.norm()) < 0.05, name


def test_the_head_computes_each_chunk_statistics_once_and_only_the_gradient_in_the_backward():
    from scalelab.grpo.head import EAGER, HeadOps
    calls = []
    ops = HeadOps(False)
    ops.stats = lambda *a: calls.append("stats") or EAGER.stats(*a)
    ops.grad = lambda *a: calls.append("grad") or EAGER.grad(*a)
    head = torch.nn.Linear(16, 50, bias=False)
    h = torch.randn(10, 16, requires_grad=True)
    targets = torch.randint(0, 50, (10,))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(head_mod, "head_ops", lambda compiled: ops)
        logp, ent = head_logprobs(head, h, targets, 1.0, 4, entropy=True)
        logp.sum().backward()
    assert calls == ["stats"] * 3 + ["grad"] * 3  # 3 chunks: statistics forward, the gradient backward
    logits = head(h.detach()).float()
    want = -(torch.log_softmax(logits, -1).exp() * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(ent, want)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1))


@pytest.mark.slow
def test_compiled_head_passes_equal_the_eager_ones_at_any_row_count():
    """torch.compile (Inductor on the CPU here) of the two passes: the same statistics and gradient as eager, for
    chunks of different row counts through one dynamic graph, bf16 logits as the GPU gives them."""
    from scalelab.grpo.head import EAGER, HeadOps
    compiled = HeadOps(True)
    g = torch.Generator().manual_seed(3)
    for rows in (7, 5):
        logits = (3 * torch.randn(rows, 300, generator=g)).to(torch.bfloat16)
        targets = torch.randint(0, 300, (rows,), generator=g)
        for inv_t in (1.0, 1 / 0.7):
            want = EAGER.stats(logits, targets, inv_t, True)
            got = compiled.stats(logits, targets, inv_t, True)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            dlogp = torch.randn(rows, generator=g)
            torch.testing.assert_close(compiled.grad(logits, targets, want[0], dlogp, inv_t),
                                       EAGER.grad(logits, targets, want[0], dlogp, inv_t), atol=1e-2, rtol=1e-2)


def test_a_compiler_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    from scalelab.grpo import head

    def broken(fn, dynamic):
        def call(*args):
            raise RuntimeError("no compiler here")
        return call

    monkeypatch.setattr(head.torch, "compile", broken)
    ops = head.HeadOps(True)
    logits, targets = torch.randn(3, 20), torch.randint(0, 20, (3,))
    with pytest.warns(RuntimeWarning, match="torch.compile of row_stats failed .*no compiler here"):
        got = ops.stats(logits, targets, 1.0, True)
    for a, b in zip(got, head.EAGER.stats(logits, targets, 1.0, True)):
        torch.testing.assert_close(a, b)

"""Parameter counts: hand arithmetic for GPT-2 124M, published totals for every preset, transformers' own count."""
from __future__ import annotations

import dataclasses

import pytest

from scalelab.calc.models import attention_shape, count_params, mlp_params
from scalelab.calc.presets import PRESETS, get_model

# Totals as transformers counts them for each published config.json (and as the model cards round them).
PUBLISHED = {
    "gpt2-124m": 124_439_808, "gpt2-350m": 354_823_168, "gpt2-774m": 774_030_080, "gpt2-1.5b": 1_557_611_200,
    "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496, "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800, "qwen2.5-7b": 7_615_616_512, "qwen2.5-72b": 72_706_203_648,
    "deepseek-v3": 671_026_404_352,     # "671B total"; the 14B MTP module excluded
}


def test_gpt2_124m_by_hand():
    # wte 50257*768 = 38,597,376; wpe 1024*768 = 786,432; per block: ln 2*1536, c_attn 768*2304+2304,
    # c_proj 768*768+768, c_fc 768*3072+3072, c_proj 3072*768+768 -> 7,087,872; x12 = 85,054,464; ln_f 1536
    p = count_params(get_model("gpt2-124m"))
    assert p.embedding == 38_597_376 and p.position == 786_432 and p.lm_head == 0
    assert p.attention == 12 * (1_771_776 + 590_592)
    assert p.dense_mlp == 12 * (2_362_368 + 2_360_064)
    assert p.norms == 25 * 1536
    assert p.total == 124_439_808


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_totals(name):
    assert count_params(PRESETS[name]).total == PUBLISHED[name]


def test_llama3_8b_shapes_and_gqa():
    m = get_model("llama-3-8b")
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.vocab_size) == (32, 4096, 32, 8, 14336, 128256)
    a = attention_shape(m)
    # q 4096x4096 + k,v 4096x1024 each + o 4096x4096 = 41,943,040
    assert a.params == 4096 * 4096 * 2 + 2 * 4096 * 1024 == 41_943_040
    assert mlp_params(m, m.d_ff) == 3 * 4096 * 14336


def test_qwen_qkv_bias_counted():
    m = get_model("qwen2.5-7b")
    no_bias = dataclasses.replace(m, bias="none")
    # q 3584 + k,v 512 each per layer, 28 layers
    assert count_params(m).total - count_params(no_bias).total == 28 * (3584 + 2 * 512)


def test_deepseek_v3_moe_and_mla():
    m = get_model("deepseek-v3")
    p = count_params(m)
    assert m.n_moe_layers == 58
    assert p.routed_experts == 58 * 256 * 3 * 7168 * 2048
    assert p.shared_experts == 58 * 1 * 3 * 7168 * 2048
    assert p.router == 58 * 256 * 7168
    # active: published "37B activated"; 8 of 256 routed experts per token
    assert 37.0e9 < p.active < 38.0e9
    assert p.active == pytest.approx(p.total - p.routed_experts * (1 - 8 / 256))
    # MLA caches the 512-wide latent plus the 64-wide RoPE key per layer (DeepSeek-V2 eq. 45-46)
    assert attention_shape(m).kv_cache_elems == 576


def test_flops_params_kaplan_convention():
    # N for 2N/token: everything but the input embedding, position table and norms; the tied head counts once
    p = count_params(get_model("gpt2-124m"))
    assert p.flops_params == 124_439_808 - 786_432 - 25 * 1536 == 123_614_976


def test_with_layers_keeps_per_layer_shape():
    m = get_model("llama-3-8b")
    p32, p8 = count_params(m), count_params(m.with_layers(8))
    assert p32.attention / 32 == p8.attention / 8
    assert p8.embedding == p32.embedding


def test_unknown_preset_names_the_choices():
    with pytest.raises(KeyError, match="llama-3-70b"):
        get_model("llama-9")


def test_matches_transformers_modules():
    """Our counts equal transformers' own modules for small configs of each architecture family."""
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    cases = [
        (tr.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=1000),
         dataclasses.replace(get_model("gpt2-124m"), n_layers=2, d_model=64, n_heads=4, n_kv_heads=4, d_ff=256,
                             vocab_size=1000, learned_pos_len=128)),
        (tr.Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False),
         dataclasses.replace(get_model("qwen2.5-7b"), n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=160,
                             vocab_size=1000)),
        (tr.DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                             first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                             n_group=2, topk_group=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                             kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, vocab_size=1000),
         dataclasses.replace(get_model("deepseek-v3"), n_layers=3, d_model=64, n_heads=4, n_kv_heads=4, d_ff=128,
                             vocab_size=1000, n_experts=8, top_k=2, d_ff_expert=32, n_dense_layers=1, q_lora_rank=16,
                             kv_lora_rank=8, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8)),
    ]
    for config, spec in cases:
        with torch.device("meta"):
            model = tr.AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == count_params(spec).total, spec.name

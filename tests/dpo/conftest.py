"""A tiny random Llama with a ChatML byte-level BPE tokenizer, saved as an HF folder, and hand-made pairs."""
from __future__ import annotations

import pytest
import torch

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"What is {a} + {b}? The answer is {a + b}." for a in range(0, 60, 7) for b in range(3, 50, 9)]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus + ["user assistant system"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def make_tiny_model(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Folder with a 2-layer, 32-wide random Llama (safetensors) and its ChatML tokenizer."""
    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = _tokenizer()
    make_tiny_model(tokenizer).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def arithmetic_pairs(n: int, wrong_offset: int = 1):
    from scalelab.dpo.data import PreferencePair
    pairs = []
    for i in range(n):
        a, b = 3 + 7 * i, 11 + 5 * i
        prompt = [{"role": "user", "content": f"What is {a} + {b}?"}]
        pairs.append(PreferencePair(prompt, [{"role": "assistant", "content": f"The answer is {a + b}."}],
                                    [{"role": "assistant", "content": f"The answer is {a + b + wrong_offset}."}],
                                    "test", f"t{i}"))
    return pairs


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core CPU OpenMP spin-waits make
    each forward ~20x slower; restore the process setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

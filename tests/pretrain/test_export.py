"""Export: a hand-made run folder in the trainer's checkpoint format -> HF GPT-2 folder that transformers
loads, tokenizes and generates with, matching our model; inexpressible architectures are refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalelab.core.config import dump_toml
from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import PretrainConfig, load_pretrain_config
from scalelab.pretrain.export import PROMPT_IDS, export_run, greedy_decode
from scalelab.pretrain.weights_map import GPT2MappingError

SMALL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.block_size=32", "train.device=cpu"]


class _Stream:
    """Stands in for TokenStream: save_checkpoint only asks it for its position."""

    def state(self) -> dict:
        return {"shard": 0, "offset": 0}


def make_run(run_dir: Path, *extra: str, seed: int = 0) -> tuple[PretrainConfig, train_gpt.GPT]:
    """A run folder as train_gpt writes it: config.toml + checkpoint.pt via the trainer's own save_checkpoint."""
    cfg = load_pretrain_config(None, [*SMALL, *extra])
    run_dir.mkdir(parents=True)
    dump_toml(cfg, run_dir / "config.toml")
    torch.manual_seed(seed)
    model = train_gpt.GPT(cfg.model)
    opt = train_gpt.make_optimizer(model, cfg, torch.device("cpu"))
    train_gpt.save_checkpoint(run_dir / "checkpoint.pt", model, opt, 7, _Stream(), cfg, "0" * 64, rank=0, world=1)
    return cfg, model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    cfg, model = make_run(root / "run")
    return export_run(root / "run", root / "hf"), cfg, model


def test_folder_loads_in_transformers_and_matches_our_logits(exported):
    from transformers import AutoTokenizer, GPT2LMHeadModel
    result, cfg, ours = exported
    hf = GPT2LMHeadModel.from_pretrained(result.out_dir).eval()
    tok = AutoTokenizer.from_pretrained(result.out_dir)
    assert tok("Hello world, this is a test.")["input_ids"] == list(PROMPT_IDS)
    assert tok.model_max_length == cfg.model.block_size
    x = torch.randint(0, 50257, (2, cfg.model.block_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (hf(x).logits - ours(x)[0]).abs().max().item()
    assert diff < 1e-4
    assert torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
    assert result.max_abs_logits_diff < result.logits_tolerance and result.step == 7


def test_greedy_generate_equals_our_greedy_decode(exported):
    from transformers import GPT2LMHeadModel
    result, _, ours = exported
    hf = GPT2LMHeadModel.from_pretrained(result.out_dir).eval()
    prompt = [464, 3290, 286, 4881]
    gen = hf.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, pad_token_id=50256)
    ref = greedy_decode(ours, prompt, 5)
    assert len(ref) == 5 and gen[0, len(prompt):].tolist() == ref
    assert result.generation_matches and len(result.generated_token_ids) == 5


def test_files_are_what_gpt2_loaders_expect(exported):
    from safetensors import safe_open
    result, cfg, _ = exported
    out = Path(result.out_dir)
    conf = json.loads((out / "config.json").read_text())
    assert conf["model_type"] == "gpt2" and conf["architectures"] == ["GPT2LMHeadModel"]
    assert conf["n_positions"] == conf["n_ctx"] == cfg.model.block_size
    assert (conf["bos_token_id"], conf["eos_token_id"], conf["torch_dtype"]) == (50256, 50256, "float32")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys  # tied: HF rebuilds it from wte
        assert f.get_slice("transformer.wte.weight").get_shape() == [50257, 64]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 50256
    assert {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"} <= set(result.files)


@pytest.mark.parametrize("extra,needle", [(("model.bias=false",), "model.bias"),
                                          (("model.vocab_size=1000", "model.padded_vocab_size=1024"),
                                           "model.vocab_size")])
def test_inexpressible_run_is_refused_naming_the_field(tmp_path, extra, needle):
    make_run(tmp_path / "run", *extra)
    with pytest.raises(GPT2MappingError, match=needle):
        export_run(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()  # refused before anything is written


def test_missing_checkpoint_names_the_file(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoint.pt"):
        export_run(tmp_path / "run", tmp_path / "hf")


def test_a_failed_export_leaves_no_folder_and_keeps_the_last_good_one(tmp_path):
    # the tokenizer is written after the weights: when it fails (its package missing), no folder may be left that
    # looks like a fresh export (weights newer than the checkpoint, no tokenizer) for `eval` to load
    make_run(tmp_path / "run")
    with pytest.raises(Exception, match="no-such-tokenizer"):
        export_run(tmp_path / "run", tmp_path / "hf", tokenizer_dir=tmp_path / "no-such-tokenizer")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()
    good = export_run(tmp_path / "run", tmp_path / "hf")
    assert {"model.safetensors", "tokenizer_config.json", "vocab.json", "merges.txt"} <= set(good.files)
    with pytest.raises(Exception, match="no-such-tokenizer"):
        export_run(tmp_path / "run", tmp_path / "hf", tokenizer_dir=tmp_path / "no-such-tokenizer")
    assert set(p.name for p in (tmp_path / "hf").iterdir()) == set(good.files)   # the earlier export stands


def test_export_refuses_to_replace_a_folder_that_is_not_an_export(tmp_path):
    make_run(tmp_path / "run")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an earlier export"):
        export_run(tmp_path / "run", tmp_path / "notes")
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_eval_re_exports_a_run_whose_folder_lacks_the_tokenizer(tmp_path):
    from scalelab.pretrain.commands import _eval_model_dir
    make_run(tmp_path / "run")
    export_run(tmp_path / "run", tmp_path / "run" / "hf")
    (tmp_path / "run" / "hf" / "tokenizer_config.json").unlink()   # as an older export left it
    hf, run = _eval_model_dir(tmp_path / "run")
    assert run == tmp_path / "run" and (hf / "tokenizer_config.json").is_file()

"""`scalelab pretrain heldout`: a run's checkpoint scored on a held-out token shard equals cross-entropy computed by
hand; bad paths and files that are not token shards of the model's vocabulary are refused, naming the file."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab import cli
from scalelab.pretrain import heldout, train_gpt
from scalelab.core.config import load_config
from scalelab.pretrain.config import GPT2_VOCAB, load_pretrain_config, save_config
from scalelab.pretrain.heldout_record import HeldoutError, read_records
from scalelab.pretrain.prepare import PrepareConfig, prepare
from scalelab.pretrain.shards import HEADER_BYTES, write_shard

REPO = Path(__file__).resolve().parents[2]
WIKITEXT2 = REPO.parent / "shared" / "data" / "corpora" / "wikitext2_tokenized"
V, T = 64, 8
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", f"model.block_size={T}", f"model.vocab_size={V}",
        f"model.padded_vocab_size={V + 8}", "train.micro_batch_size=4", "train.device=cpu"]


def fake_run(folder: Path, weights=None, step: int = 7) -> Path:
    """A run folder as the trainer leaves it: config.toml and a checkpoint of a (seeded or given) tiny GPT."""
    cfg = load_pretrain_config(None, [*TINY, f"run.out_dir={json.dumps(str(folder.parent))}",
                                      f"run.name={json.dumps(folder.name)}"])
    folder.mkdir(parents=True)
    save_config(cfg, folder / "config.toml")
    torch.manual_seed(0)
    model = train_gpt.GPT(cfg.model)
    if weights is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(weights)
    torch.save({"model": model.state_dict(), "model_config": asdict(cfg.model), "step": step}, folder / "checkpoint.pt")
    return folder


@pytest.fixture
def tokens(tmp_path) -> Path:
    path = tmp_path / "held" / "held_000000.bin"
    path.parent.mkdir()
    write_shard(path, np.random.default_rng(3).integers(0, V, 45))  # 5 windows of 9 at stride 8; 4 tokens left over
    return path


def by_hand(run: Path, shard: Path) -> tuple[float, int]:
    """Mean -log softmax(logits)[target] over the non-overlapping windows, in plain torch, float64."""
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    model = train_gpt.GPT(load_pretrain_config(run / "config.toml").model)
    model.load_state_dict(state["model"])
    ids = torch.from_numpy(np.fromfile(shard, dtype="<u2", offset=HEADER_BYTES).astype(np.int64))
    n = (len(ids) - 1) // T
    x = torch.stack([ids[w * T:w * T + T] for w in range(n)])
    y = torch.stack([ids[w * T + 1:w * T + T + 1] for w in range(n)])
    with torch.no_grad():
        logp = torch.log_softmax(model(x)[0].double(), dim=-1)
    return -logp.gather(-1, y.unsqueeze(-1)).mean().item(), y.numel()


@pytest.mark.parametrize("batch", [1, 2, 4, 0])  # 0: the run's micro-batch; 2 leaves a short last batch
def test_loss_equals_cross_entropy_by_hand(tmp_path, tokens, batch):
    run = fake_run(tmp_path / "run")
    result = heldout.score_run(run, tokens, "tiny", batch=batch, device="cpu")
    loss, n = by_hand(run, tokens)
    assert result.tokens == n == 40 and result.windows == 5 and result.step == 7 and result.block_size == T
    assert result.loss == pytest.approx(loss, rel=1e-6)
    assert 0 < result.loss < 2 * math.log(V)


def test_zero_weights_score_the_uniform_distribution(tmp_path, tokens):
    # every logit 0 over the 64 real vocabulary rows (the 8 padding rows are not in the softmax): ln 64 per token,
    # up to float32 rounding
    result = heldout.score_run(fake_run(tmp_path / "run", weights=0.0), tokens.parent, device="cpu")
    assert result.loss == pytest.approx(math.log(V), rel=1e-6) and result.name == "held"


def test_cli_records_each_set_beside_the_others(tmp_path, tokens, capsys):
    run = fake_run(tmp_path / "run")
    assert cli.main(["pretrain", "heldout", str(run), "--data", str(tokens), "--name", "wikitext2",
                     "--device", "cpu"]) == 0
    assert cli.main(["pretrain", "heldout", str(run), "--data", str(tokens.parent), "--device", "cpu"]) == 0
    records = read_records(run)
    assert set(records) == {"wikitext2", "held"}
    assert records["wikitext2"]["loss"] == pytest.approx(by_hand(run, tokens)[0], rel=1e-6)
    assert records["wikitext2"]["tokens"] == 40 and "wikitext2: " in capsys.readouterr().out


def test_bad_paths_and_formats_name_the_file(tmp_path, tokens, capsys):
    run = fake_run(tmp_path / "run")
    text = tmp_path / "valid.txt"
    text.write_text(" = Homarus gammarus = \n" * 200)
    truncated = tmp_path / "cut.bin"
    truncated.write_bytes(tokens.read_bytes()[:-6])
    wide = tmp_path / "wide.bin"
    write_shard(wide, np.array([1, 2, V, 3] * 5))       # id 64 is past the model's 64-token vocabulary
    short = tmp_path / "short.bin"
    write_shard(short, np.arange(T))                     # fewer than one window of T+1 tokens
    (tmp_path / "empty").mkdir()
    cases = {tmp_path / "missing.bin": "no such file", text: "bad magic", truncated: "truncated",
             wide: "token id 64 >= the model's vocab_size 64", short: "holds no window",
             tmp_path / "empty": r"no \*\.bin"}
    for path, why in cases.items():
        with pytest.raises(HeldoutError, match=why) as e:
            heldout.score_run(run, path, device="cpu")
        assert str(path) in str(e.value)
    assert cli.main(["pretrain", "heldout", str(run), "--data", str(text), "--device", "cpu"]) == 2
    assert f"{text}: bad magic" in capsys.readouterr().err
    with pytest.raises(HeldoutError, match=f"{tmp_path / 'nowhere' / 'config.toml'}: not found"):
        heldout.score_run(tmp_path / "nowhere", tokens, device="cpu")


@pytest.mark.skipif(not WIKITEXT2.is_dir(), reason="../shared/data/corpora/wikitext2_tokenized not present")
def test_wikitext2_config_prepares_a_gpt2_shard_the_scorer_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's path is relative to the repository root
    prep = load_config(PrepareConfig, "configs/pretrain/prepare-wikitext2-heldout.toml",
                       [f"out_dir={json.dumps(str(tmp_path / 'wt2'))}", "workers=1", "progress=false"])
    manifest = prepare(prep)
    assert manifest.tokenizer["name"] == "gpt2" and manifest.documents == {"train": 1, "val": 0}
    files = heldout.heldout_files(tmp_path / "wt2")
    assert [f.name for f in files] == ["train_000000.bin"]
    windows = heldout.heldout_windows(files, 1024, GPT2_VOCAB)
    assert windows.count == (manifest.tokens["train"] - 1) // 1024 > 200
    with pytest.raises(HeldoutError, match=f"{files[0]}: token id .* >= the model's vocab_size 256"):
        heldout.heldout_windows(files, 1024, 256)

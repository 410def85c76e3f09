"""`scalelab pretrain heldout`: a trained run scored on a token set kept out of its corpus, as mean cross-entropy
per target token (nats) and the number of tokens it is the mean over, recorded in <run>/heldout.json
(heldout_record.py).

The time-to-target corpus leaves WikiText-2 out on purpose (configs/pretrain/prepare-sharegpt-corpora.toml): the
speedrun's rules time every run against one fixed val set, and a second set that no run trained on or was tuned
against checks that a recipe which reaches the val target sooner is not just fitting that corpus. A held-out set is
scored the way the trainer scores val (shards.ValWindows): windows of block_size+1 tokens at stride block_size, each
a fresh context, the tail shorter than one window left out, the same tokens for any batch size; in float32, whatever
dtype the run trained and evaluated in.

WikiText-2 here (../shared/data/corpora/wikitext2_tokenized/valid.txt) is text in the word-level form of Merity et al.
2016, not token ids: rare words already replaced by "<unk>", punctuation split off by spaces, "@-@", "@,@" and "@.@"
inside numbers. Its raw form is not in the shared data, so configs/pretrain/prepare-wikitext2-heldout.toml encodes
this text as it is with GPT-2's BPE. The loss per GPT-2 token compares runs with each other (each scores the same
tokens), not with published WikiText-2 perplexities, which are per word and on other preprocessing.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from scalelab.pretrain.config import PretrainConfig, load_pretrain_config
from scalelab.pretrain.heldout_record import HeldoutError, HeldoutLoss
from scalelab.pretrain.shards import ShardError, ValWindows, read_shard
from scalelab.pretrain.train_gpt import GPT
from scalelab.pretrain.weights_map import TIED_KEY, strip_wrappers

PREPARE_HINT = ("token shards are made from text by `scalelab pretrain prepare` "
                "(WikiText-2: --config configs/pretrain/prepare-wikitext2-heldout.toml)")


def heldout_files(path: str | Path) -> list[Path]:
    """The shards of a held-out set: the file itself, or every *.bin of a folder in name order."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.bin"))
        if not files:
            raise HeldoutError(f"{p}: no *.bin token shards in this folder; {PREPARE_HINT}")
        return files
    if not p.is_file():
        raise HeldoutError(f"held-out set {p}: no such file or folder")
    return [p]


def heldout_windows(files: list[Path], block_size: int, vocab_size: int) -> ValWindows:
    """Every window of the shards, after checking each is a token shard of ids the model has."""
    try:
        for f in files:
            tokens = read_shard(f)
            top = int(tokens.max()) if tokens.size else -1
            if top >= vocab_size:
                raise HeldoutError(f"{f}: token id {top} >= the model's vocab_size {vocab_size}; the shard was "
                                   "made with another tokenizer")
        return ValWindows(files, block_size)
    except ShardError as e:
        raise HeldoutError(f"{e}; {PREPARE_HINT}") from e


def shards_sha256(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


@torch.no_grad()
def mean_cross_entropy(model: GPT, windows: ValWindows, batch: int, device: torch.device) -> tuple[float, int]:
    """(mean cross-entropy per target token, target tokens) of `model` over every window, summed in float64 so
    the mean does not depend on the batch size."""
    model.eval()
    total, tokens = torch.zeros((), dtype=torch.float64, device=device), 0
    for x, y, _ in windows.batches(batch):
        logits, _ = model(torch.from_numpy(x).to(device))
        targets = torch.from_numpy(y).to(device)
        total += F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum").double()
        tokens += targets.numel()
    return (total / tokens).item(), tokens


def load_run_model(run_dir: Path, device: torch.device) -> tuple[GPT, PretrainConfig, int]:
    """(model with the checkpoint's weights, the run's config, the checkpoint's step) from a run folder."""
    ckpt, cfg_path = run_dir / "checkpoint.pt", run_dir / "config.toml"
    for path in (cfg_path, ckpt):
        if not path.is_file():
            raise HeldoutError(f"{path}: not found (scoring a run needs its folder's config.toml and checkpoint.pt)")
    cfg = load_pretrain_config(cfg_path)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    if state["model_config"] != asdict(cfg.model):
        raise HeldoutError(f"{ckpt}: model_config {state['model_config']} differs from {cfg_path} [model]; the "
                           "folder does not describe these weights")
    model = GPT(cfg.model)
    missing, unexpected = model.load_state_dict(strip_wrappers(state["model"]), strict=False)
    missing = [k for k in missing if k != TIED_KEY]  # the tied head is wte itself
    if missing or unexpected:
        raise HeldoutError(f"{ckpt}: weights do not fit the GPT of {cfg_path}: missing {missing}, unexpected "
                           f"{unexpected}")
    return model.to(device), cfg, int(state["step"])


def score_run(run_dir: str | Path, data: str | Path, name: str = "", batch: int = 0,
              device: str = "auto") -> HeldoutLoss:
    """The run's checkpoint scored on the held-out set at `data` (batch 0: the run's train.micro_batch_size)."""
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    files = heldout_files(data)
    model, cfg, step = load_run_model(Path(run_dir), dev)
    windows = heldout_windows(files, cfg.model.block_size, cfg.model.vocab_size)
    loss, tokens = mean_cross_entropy(model, windows, batch or cfg.train.micro_batch_size, dev)
    return HeldoutLoss(name or Path(data).stem, str(data), shards_sha256(files), loss, tokens, windows.count,
                       cfg.model.block_size, step)

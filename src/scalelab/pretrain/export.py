"""Export a run's checkpoint as an HF GPT-2 folder that transformers loads and vLLM serves, then check it.

    <out>/model.safetensors        HF names and layouts, 50257 vocab rows, no lm_head (tied to wte)
    <out>/config.json              model_type gpt2, architectures ["GPT2LMHeadModel"] (vLLM picks its loader by it)
    <out>/generation_config.json   bos/eos 50256
    <out>/vocab.json, merges.txt   GPT-2's BPE: encoder.json and vocab.bpe under HF's file names
    <out>/tokenizer_config.json, special_tokens_map.json

The self-check reloads the folder with `from_pretrained` (the path a user or vLLM takes), compares its
logits with our GPT's on a prompt, and checks greedy `generate` against our own greedy decode.
"""
from __future__ import annotations

import json
import os
import shutil
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from scalelab.core import errors
from scalelab.core.gpt2bpe import EOT
from scalelab.core.hfio import write_generation_config, write_tokenizer, write_weights
from scalelab.pretrain.config import ModelConfig
from scalelab.pretrain.parity import TOLERANCES
from scalelab.pretrain.train_gpt import GPT
from scalelab.pretrain.weights_map import (TIED_KEY, GPT2MappingError, check_gpt2_expressible, gpt2_config,
                                           strip_wrappers, to_hf_state_dict)

# A fixed GPT-2 tokenizer test vector: the exported tokenizer must reproduce it exactly.
PROMPT = "Hello world, this is a test."
PROMPT_IDS = (15496, 995, 11, 428, 318, 257, 1332, 13)
GENERATE_TOKENS = 5


class ExportCheckError(errors.ModelError, RuntimeError):
    """The exported folder loads but does not reproduce our model; the files are left for inspection."""


@dataclass(frozen=True)
class ExportResult:
    run_dir: str
    out_dir: str
    step: int
    n_params: int                          # of the HF model: 50257 vocab rows, lm_head tied to wte
    files: tuple[str, ...]
    prompt_token_ids: tuple[int, ...]
    max_abs_logits_diff: float             # HF-loaded folder vs our GPT on the prompt, float32
    logits_tolerance: float
    generated_token_ids: tuple[int, ...]   # HF generate, greedy
    ours_greedy_token_ids: tuple[int, ...]

    @property
    def generation_matches(self) -> bool:
        return self.generated_token_ids == self.ours_greedy_token_ids


# ---------------------------------------------------------------------------------------------
# reading the run


def read_run_checkpoint(run_dir: Path) -> tuple[dict, ModelConfig, int]:
    """(our state dict, model config, step) from <run>/checkpoint.pt, cross-checked against <run>/config.toml."""
    ckpt, cfg_path = run_dir / "checkpoint.pt", run_dir / "config.toml"
    for path in (ckpt, cfg_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (export needs a run folder with a checkpoint)")
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    model_config = state["model_config"]
    check_gpt2_expressible(model_config)  # before ModelConfig(**...), so an unknown key is named clearly
    toml_model = tomllib.loads(cfg_path.read_text()).get("model", {})
    if toml_model != model_config:
        raise GPT2MappingError(f"{cfg_path} [model] {toml_model} differs from {ckpt}'s model_config "
                               f"{model_config}: the folder does not describe these weights")
    return state["model"], ModelConfig(**model_config), int(state["step"])


def our_model(state_dict: dict, model_cfg: ModelConfig) -> GPT:
    model = GPT(model_cfg)
    missing, unexpected = model.load_state_dict(strip_wrappers(state_dict), strict=False)
    missing = [k for k in missing if k != TIED_KEY]  # a deduplicated state dict stores the tie once
    if missing or unexpected:
        raise GPT2MappingError(f"checkpoint weights do not fit the model config: missing {missing}, "
                               f"unexpected {unexpected}")
    return model.eval()


# ---------------------------------------------------------------------------------------------
# writing the folder


def write_model_config(model_cfg: ModelConfig, dtype: torch.dtype, out: Path) -> None:
    cfg = gpt2_config(model_cfg, architectures=["GPT2LMHeadModel"], dtype=str(dtype).removeprefix("torch."))
    cfg.save_pretrained(out)
    path = out / "config.json"
    data = json.loads(path.read_text())
    # n_ctx: the context length under the name older GPT-2 loaders read; torch_dtype: the pre-v5 name of
    # `dtype`, still what many serving stacks read from config.json.
    data.update(n_ctx=model_cfg.block_size, torch_dtype=data.get("dtype"))
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# checking the folder


@torch.no_grad()
def greedy_decode(model: GPT, ids: list[int], n_new: int) -> list[int]:
    """Argmax continuation by our own model, stopping after <|endoftext|> as HF generate does."""
    seq, new = torch.tensor([ids]), []
    for _ in range(n_new):
        logits, _ = model(seq[:, -model.cfg.block_size:])
        new.append(int(logits[0, -1].argmax()))
        seq = torch.cat([seq, torch.tensor([[new[-1]]])], dim=1)
        if new[-1] == EOT:
            break
    return new


@torch.no_grad()
def self_check(out: Path, ours: GPT) -> tuple[tuple[int, ...], float, tuple[int, ...], tuple[int, ...]]:
    """(prompt ids, max |Δlogits|, HF greedy tokens, our greedy tokens) for the folder as HF loads it."""
    from transformers import AutoTokenizer, GPT2LMHeadModel  # lazy: transformers takes seconds to import
    hf, info = GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise ExportCheckError(f"{out}: from_pretrained reported {bad}")
    if not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight):
        raise ExportCheckError(f"{out}: loaded lm_head is not tied to wte")
    ids = tuple(AutoTokenizer.from_pretrained(out)(PROMPT)["input_ids"])
    if ids != PROMPT_IDS:
        raise ExportCheckError(f"{out}: tokenizer encodes {PROMPT!r} as {list(ids)}, GPT-2's is {list(PROMPT_IDS)}")
    x = torch.tensor([ids])
    diff = (hf.eval()(x).logits - ours(x)[0]).abs().max().item()
    gen = hf.generate(x, max_new_tokens=GENERATE_TOKENS, do_sample=False, pad_token_id=EOT)[0, len(ids):].tolist()
    return ids, diff, tuple(gen), tuple(greedy_decode(ours, list(ids), GENERATE_TOKENS))


def write_and_check(stage: Path, hf_sd: dict, model_cfg: ModelConfig, ours: GPT,
                    tokenizer_dir: str | Path | None) -> tuple[tuple[int, ...], float, tuple, tuple, float]:
    """The HF folder written into `stage` and self-checked: (prompt ids, max |dlogits|, HF greedy, ours, tol)."""
    stage.mkdir(parents=True)
    write_weights(hf_sd, stage)
    write_model_config(model_cfg, ours.transformer.wte.weight.dtype, stage)
    write_generation_config(stage)
    write_tokenizer(stage, model_cfg.block_size, tokenizer_dir)
    ids, diff, gen, ref = self_check(stage, ours)
    tol = TOLERANCES["float32"][0]
    if diff > tol:
        raise ExportCheckError(f"{stage}: HF logits differ from ours by {diff:.3e} > {tol:.0e}")
    if gen != ref:
        raise ExportCheckError(f"{stage}: HF greedy generate {list(gen)} != our greedy decode {list(ref)}")
    return ids, diff, gen, ref, tol


def export_run(run_dir: str | Path, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> ExportResult:
    """Checkpoint -> HF GPT-2 folder, refusing what GPT-2 cannot express, then the self-check."""
    run_dir, out = Path(run_dir), Path(out_dir)
    state_dict, model_cfg, step = read_run_checkpoint(run_dir)
    ours = our_model(state_dict, model_cfg)
    hf_sd = to_hf_state_dict(ours, model_cfg)
    # Written into a staging folder that replaces `out` only once the self-check passed: a folder left with weights
    # but no tokenizer (a missing tokenizer package) would look fresh to the next `eval`, and transformers then
    # loads an empty-vocabulary tokenizer from it that encodes every text as no tokens.
    if out.is_dir() and any(out.iterdir()) and not (out / "model.safetensors").is_file():
        raise FileExistsError(f"{out}: exists and is not an earlier export (no model.safetensors); not replacing it")
    stage = out.with_name(out.name + ".partial")
    shutil.rmtree(stage, ignore_errors=True)
    try:
        ids, diff, gen, ref, tol = write_and_check(stage, hf_sd, model_cfg, ours, tokenizer_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.replace(stage, out)
    return ExportResult(run_dir=str(run_dir), out_dir=str(out), step=step,
                        n_params=sum(t.numel() for t in hf_sd.values()),
                        files=tuple(sorted(p.name for p in out.iterdir() if p.is_file())), prompt_token_ids=ids,
                        max_abs_logits_diff=diff, logits_tolerance=tol, generated_token_ids=gen,
                        ours_greedy_token_ids=ref)


def format_export(r: ExportResult) -> str:
    return (f"exported {r.run_dir} (step {r.step}, {r.n_params:,} params) -> {r.out_dir}\n"
            f"  files: {', '.join(r.files)}\n"
            f"  self-check: max |dlogits| {r.max_abs_logits_diff:.3e} (tol {r.logits_tolerance:.0e}); "
            f"greedy {list(r.generated_token_ids)} == ours {list(r.ours_greedy_token_ids)}: {r.generation_matches}")


def result_dict(r: ExportResult) -> dict:
    return {**asdict(r), "generation_matches": r.generation_matches}

"""Files of a Hugging Face model folder that every job writes the same way: the safetensors weights, the
generation config and GPT-2's tokenizer under HF's file names. The pretrain job's export and the serve job's
dummy-weight folders both use them (jobs share code through core)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.core.gpt2bpe import ENCODER_JSON, EOT, EOT_TEXT, VOCAB_BPE, tokenizer_files

if TYPE_CHECKING:
    import torch


def write_weights(hf_state_dict: dict[str, "torch.Tensor"], out: Path) -> None:
    from safetensors.torch import save_file  # lazy: safetensors.torch imports torch
    path = out / "model.safetensors"
    save_file(hf_state_dict, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates it owner-only; a server running as another user must read it


def write_generation_config(out: Path) -> None:
    from transformers import GenerationConfig  # lazy: transformers takes seconds to import
    GenerationConfig(bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT).save_pretrained(out)


def write_tokenizer(out: Path, block_size: int, tokenizer_dir: str | Path | None) -> None:
    """GPT-2's byte-level BPE under HF's names; tokenizer_files checks the bytes are GPT-2's (sha256)."""
    src = tokenizer_files(tokenizer_dir)
    shutil.copyfile(src[ENCODER_JSON], out / "vocab.json")
    shutil.copyfile(src[VOCAB_BPE], out / "merges.txt")
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    tok_cfg = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": block_size, "add_prefix_space": False,
               "add_bos_token": False, "clean_up_tokenization_spaces": False, **special}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")

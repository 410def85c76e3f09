"""Preference tuning with TRL + peft LoRA: one `loss` field picks DPO, IPO or ORPO through a registry.

    dpo   -log sigmoid(beta * (log-ratio_chosen - log-ratio_rejected))       Rafailov et al. 2023, eq. 7
    ipo   (h - 1/(2 tau))^2 on length-normalised log-ratio differences h     Azar et al. 2023, eq. 17
    orpo  NLL(chosen) - lambda * log sigmoid(log odds ratio), no reference    Hong et al. 2024, eq. 6-7

DPO and IPO run TRL's DPOTrainer (loss_type "sigmoid" / "ipo"); ORPO runs TRL's ORPOTrainer, which in
trl 1.x lives under `trl.experimental.orpo`. Two choices of TRL 1.16 that change what beta means: its IPO
divides each log-ratio by the response's token count, and its ORPO takes the NLL term over prompt and
response tokens (the paper's L_SFT is over the response). The policy is the base model plus a LoRA adapter (Hu et al.
2021); the reference is the same network with the adapter disabled, so no second copy is held in memory.

DPO and IPO run through a DPOTrainer subclass with two throughput options that leave the loss unchanged:
train.packing (scalelab.dpo.packing: no compute on pad tokens, optionally the prompt run once per pair) and
train.precompute_ref_logprobs (the reference forward done once per pair before training instead of every step).
"""
from __future__ import annotations

import functools
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DataLoader
from transformers import PrinterCallback, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from scalelab.core.rundir import RunDir
from scalelab.dpo.config import DpoConfig
from scalelab.dpo.packing import enable_packing

GIB = 2**30


@dataclass(frozen=True)
class LossSpec:
    name: str
    build: Callable[..., object]      # (TrainerInputs) -> a transformers.Trainer subclass
    uses_reference: bool
    paper: str


@dataclass(frozen=True)
class TrainerInputs:
    model: object                     # base causal LM (the trainer wraps it with the LoRA adapter)
    tokenizer: object
    train_rows: list[dict]            # {"prompt", "chosen", "rejected"} message lists
    cfg: DpoConfig
    output_dir: Path                  # checkpoints for resume
    callbacks: tuple = ()


def lora_config(cfg: DpoConfig):
    from peft import LoraConfig  # lazy: peft is optional (the tune extra)
    return LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=list(cfg.lora.target_modules), bias="none", task_type="CAUSAL_LM")


def _on_cuda(model) -> bool:
    return next(model.parameters()).device.type == "cuda"


def common_args(inp: TrainerInputs) -> dict:
    """TrainingArguments shared by every loss (both TRL configs subclass TrainingArguments)."""
    t, cuda = inp.cfg.train, _on_cuda(inp.model)
    return dict(
        output_dir=str(inp.output_dir), per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.grad_accum, learning_rate=t.learning_rate, lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_steps, max_steps=t.max_steps or -1, num_train_epochs=t.num_epochs,
        logging_steps=t.logging_steps, save_strategy="steps" if t.save_steps else "no",
        save_steps=t.save_steps or 500, seed=t.seed, data_seed=t.seed, report_to=[], use_cpu=not cuda,
        bf16=cuda and next(inp.model.parameters()).dtype == torch.bfloat16, fp16=False,
        gradient_checkpointing=t.gradient_checkpointing, dataloader_num_workers=0, disable_tqdm=True,
        max_length=t.max_length, beta=t.beta, disable_dropout=True)


def _dataset(rows: list[dict]):
    from datasets import Dataset  # lazy: datasets is optional (the hub extra; trl brings it)
    return Dataset.from_list(rows)


def precompute_reference(trainer, dataset, batch_size: int):
    """`dataset` with columns ref_chosen_logps / ref_rejected_logps: the reference's summed completion log-probs,
    from TRL's own `compute_ref_log_probs` (adapter disabled), one pass in dataset order. TRL's
    precompute_ref_log_probs does the same after a sha256 of a float32 CPU copy of every weight (the key of its
    disk cache), which sends a 7B model's 15 GB through the host on every run."""
    from datasets import Value  # lazy: datasets is optional (the hub extra; trl brings it)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=trainer.data_collator, shuffle=False)
    device = trainer.accelerator.device
    chosen, rejected = [], []
    for batch in loader:
        c, r = trainer.compute_ref_log_probs(trainer.model, {k: v.to(device) for k, v in batch.items()})
        chosen += c.float().tolist()
        rejected += r.float().tolist()
    return (dataset.add_column("ref_chosen_logps", chosen, feature=Value("float32"))
            .add_column("ref_rejected_logps", rejected, feature=Value("float32")))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.cache
def dpo_trainer_class():
    """TRL's DPOTrainer with train.packing (scalelab.dpo.packing) and an in-memory reference precompute whose
    wall time is kept in `ref_precompute_s`. Built on first use so that importing this module stays light."""
    from accelerate.utils import is_peft_model  # lazy: accelerate is optional (the tune extra)
    from trl import DPOTrainer  # lazy: trl is optional (the tune extra)

    class ScalelabDPOTrainer(DPOTrainer):
        def __init__(self, *args, packing: str = "none", precompute_ref: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.ref_precompute_s = 0.0
            if packing != "none":
                base = self.model.get_base_model() if is_peft_model(self.model) else self.model
                for m in (base, self.ref_model):
                    if m is not None:
                        enable_packing(m, share_prompt=packing == "shared_prompt")
            if precompute_ref:
                if self.eval_dataset is not None:
                    raise ValueError("precompute_ref covers the train split only; pass no eval_dataset")
                _sync(self.accelerator.device)
                t0 = time.perf_counter()
                self.train_dataset = precompute_reference(self, self.train_dataset,
                                                          self.args.per_device_train_batch_size)
                _sync(self.accelerator.device)
                self.ref_precompute_s = time.perf_counter() - t0
                self.precompute_ref_logps = True  # TRL's _compute_loss then reads the columns, no reference forward

    return ScalelabDPOTrainer


def _dpo_family(loss_type: str) -> Callable[[TrainerInputs], object]:
    def build(inp: TrainerInputs):
        from trl import DPOConfig  # lazy: trl is optional (the tune extra)
        t = inp.cfg.train
        args = DPOConfig(**common_args(inp), loss_type=[loss_type])
        return dpo_trainer_class()(model=inp.model, args=args, train_dataset=_dataset(inp.train_rows),
                                   processing_class=inp.tokenizer, callbacks=list(inp.callbacks),
                                   peft_config=lora_config(inp.cfg), packing=t.packing,
                                   precompute_ref=t.precompute_ref_logprobs)
    return build


def _orpo(inp: TrainerInputs):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer  # lazy: trl is optional (the tune extra)
    args = ORPOConfig(**common_args(inp))
    return ORPOTrainer(model=inp.model, args=args, train_dataset=_dataset(inp.train_rows),
                       processing_class=inp.tokenizer, callbacks=list(inp.callbacks),
                       peft_config=lora_config(inp.cfg))


LOSSES: dict[str, LossSpec] = {s.name: s for s in [
    LossSpec("dpo", _dpo_family("sigmoid"), True, "Rafailov et al. 2023, Direct Preference Optimization"),
    LossSpec("ipo", _dpo_family("ipo"), True, "Azar et al. 2023, A General Theoretical Paradigm (IPO)"),
    LossSpec("orpo", _orpo, False, "Hong et al. 2024, ORPO: Monolithic Preference Optimization"),
]}


def build_trainer(inp: TrainerInputs):
    """The trainer for cfg.train.loss, without transformers' per-log dict printer (RunLogCallback prints)."""
    if inp.cfg.train.loss not in LOSSES:
        raise KeyError(f"unknown loss {inp.cfg.train.loss!r}; known: {', '.join(LOSSES)}")
    trainer = LOSSES[inp.cfg.train.loss].build(inp)
    trainer.remove_callback(PrinterCallback)
    return trainer


# ---------------------------------------------------------------------------------------------
# logging into the run folder


def reset_peak_memory(device_type: str) -> None:
    """Start a new peak: CUDA allocator stats, or Linux's resident high-water mark (clear_refs 5)."""
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux: the peak then covers the whole process (model loading, sampling)


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def memory_in_use_bytes(device_type: str) -> int:
    """CUDA: bytes allocated by tensors now; CPU: resident set now (0 where /proc is unavailable)."""
    if device_type == "cuda":
        return torch.cuda.memory_allocated()
    return (_proc_status_kib("VmRSS") or 0) * 1024


def peak_memory_gib(device_type: str) -> float:
    """CUDA: peak bytes allocated by tensors; CPU: peak resident set (VmHWM) since the last reset."""
    if device_type == "cuda":
        return torch.cuda.max_memory_allocated() / GIB
    hwm = _proc_status_kib("VmHWM")
    kib = hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return kib * 1024 / GIB


class RunLogCallback(TrainerCallback):
    """Wall time of each optimizer step -> event 'step'; trainer logs -> event 'train' and one printed line."""

    def __init__(self, rd: RunDir, device_type: str):
        self.rd, self.device_type = rd, device_type
        self._t0: float | None = None
        self._step_s = float("nan")

    def on_train_begin(self, args, state, control, **kwargs):
        reset_peak_memory(self.device_type)

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._t0 is not None:
            self._step_s = time.perf_counter() - self._t0
            self.rd.log_event("step", step=state.global_step, step_s=self._step_s,
                              peak_memory_gib=peak_memory_gib(self.device_type))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        record = {k.replace("/", "_"): v for k, v in logs.items()}
        self.rd.log_event("train", step=state.global_step, **record)
        if "loss" in record:
            print(format_step(state.global_step, state.max_steps, record, self._step_s), flush=True)


def format_step(step: int, max_steps: int, logs: dict, step_s: float) -> str:
    acc, margin = logs.get("rewards_accuracies"), logs.get("rewards_margins")
    extra = "" if acc is None else f" | reward acc {acc:.2f} | margin {margin:+.4f}"
    return f"step {step}/{max_steps} | loss {logs['loss']:.4f}{extra} | {step_s:.2f} s"


# ---------------------------------------------------------------------------------------------
# running and saving


def last_checkpoint(output_dir: Path) -> str | None:
    return get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None


def resume_point(output_dir: Path, resume: bool) -> str | None:
    """The checkpoint a run continues from: the last one under output_dir when resume is on, else None."""
    return last_checkpoint(output_dir) if resume else None


def train(trainer, checkpoint: str | None) -> None:
    trainer.train(resume_from_checkpoint=checkpoint)


def save_adapter(trainer, out: Path) -> int:
    """LoRA weights as adapter_model.safetensors + adapter_config.json; returns the bytes written."""
    trainer.model.save_pretrained(str(out), safe_serialization=True)
    return sum(p.stat().st_size for p in out.iterdir() if p.is_file())

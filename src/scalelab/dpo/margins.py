"""Implicit-reward margins on a fixed validation subset, tracked while a preference run trains.

DPO's policy defines a reward r(x, y) = beta * (log pi(y|x) - log pi_ref(y|x)) (Rafailov et al. 2023, eq. 5).
Every N steps we compute it for the chosen and rejected responses of the same held-out pairs and log to
metrics.jsonl (event "margins"): the histogram of margins m = r_chosen - r_rejected (bin edges + counts),
their mean and std, the reward accuracy (share with m > 0) and the drift from the reference
(mean |log pi - log pi_ref| over chosen responses). figures/margins.png shows how the distribution moves.

With LoRA the reference is the same network with the adapter disabled (Hu et al. 2021: the base weights
are frozen), so it costs no extra memory; its log-probs are computed once, at the start.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import TrainerCallback

from scalelab.core.pngsave import save_png

# ---------------------------------------------------------------------------------------------
# tokenization: prompt ids + response ids, as TRL's preference trainers build them


@dataclass(frozen=True)
class TokenizedPair:
    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


def _chat_ids(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tokenize_pair(tokenizer, pair: dict) -> TokenizedPair:
    """Prompt = the tokens the rendered prompt shares with both rendered conversations; the rest is the response."""
    prompt = _chat_ids(tokenizer, pair["prompt"], generation_prompt=True)
    chosen = _chat_ids(tokenizer, pair["prompt"] + pair["chosen"], generation_prompt=False)
    rejected = _chat_ids(tokenizer, pair["prompt"] + pair["rejected"], generation_prompt=False)
    n = min(_common_prefix(prompt, chosen), _common_prefix(prompt, rejected))
    return TokenizedPair(tuple(prompt[:n]), tuple(chosen[n:]), tuple(rejected[n:]))


def pair_batch(pairs: list[TokenizedPair], pad_id: int, max_length: int) -> dict[str, torch.Tensor]:
    """Rows [chosen_1..chosen_B, rejected_1..rejected_B], right-padded, cut to max_length at the end.

    input_ids, attention_mask, completion_mask: (2B, T) with completion_mask = 1 on response tokens.
    """
    seqs, masks = [], []
    for side in ("chosen_ids", "rejected_ids"):
        for p in pairs:
            ids = (list(p.prompt_ids) + list(getattr(p, side)))[:max_length]
            seqs.append(ids)
            masks.append(([0] * len(p.prompt_ids) + [1] * len(getattr(p, side)))[:max_length])
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    completion = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        input_ids[i, :len(s)], attention[i, :len(s)], completion[i, :len(m)] = torch.tensor(s), 1, torch.tensor(m)
    return {"input_ids": input_ids, "attention_mask": attention, "completion_mask": completion}


# ---------------------------------------------------------------------------------------------
# log-probabilities and rewards


@torch.no_grad()
def sequence_logps(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log p(y_t | x, y_<t) over response tokens, response token count), each (2B,), float32."""
    device = next(model.parameters()).device
    ids = batch["input_ids"].to(device)
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"].to(device)).logits  # (2B, T, V)
    mask = batch["completion_mask"][:, 1:].to(device).float()                                  # target t+1 is response
    sums = torch.empty(ids.shape[0], device=device)
    for i in range(ids.shape[0]):  # one row at a time: the float32 log-softmax of a row is T x V, not 2B x T x V
        logp = F.log_softmax(logits[i, :-1].float(), dim=-1)                                   # (T-1, V)
        sums[i] = (logp.gather(-1, ids[i, 1:, None]).squeeze(-1) * mask[i]).sum()
    return sums.cpu(), mask.sum(-1).cpu()


def reference_context(model):
    """The reference policy: a peft model with its adapters disabled (LoRA leaves base weights frozen)."""
    if hasattr(model, "disable_adapter"):
        return model.disable_adapter()
    raise TypeError(f"{type(model).__name__} has no adapter to disable; margins need a LoRA (peft) model")


@contextlib.contextmanager
def eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def all_logps(model, batches: list[dict], reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated (logps, token counts) over batches: (2B,) per batch -> chosen and rejected halves kept."""
    ctx = reference_context(model) if reference else contextlib.nullcontext()
    out, counts = [], []
    with eval_mode(model), ctx:
        for b in batches:
            lp, n = sequence_logps(model, b)
            out.append(lp)
            counts.append(n)
    return torch.cat(out), torch.cat(counts)


def split_sides(values: torch.Tensor, batch_sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Undo the per-batch [chosen; rejected] stacking: (chosen (N,), rejected (N,))."""
    chosen, rejected, start = [], [], 0
    for b in batch_sizes:
        chosen.append(values[start:start + b])
        rejected.append(values[start + b:start + 2 * b])
        start += 2 * b
    return torch.cat(chosen).numpy(), torch.cat(rejected).numpy()


@dataclass(frozen=True)
class MarginStats:
    step: int
    n_pairs: int
    beta: float
    margin_mean: float                       # mean of r_chosen - r_rejected (reward units: beta * nats)
    margin_std: float
    reward_accuracy: float                   # share of pairs with margin > 0
    chosen_reward_mean: float
    rejected_reward_mean: float
    drift_abs_logratio_chosen_nats: float    # mean |log pi(y_c|x) - log pi_ref(y_c|x)| per sequence
    drift_abs_logratio_chosen_nats_per_token: float
    hist_edges: list[float]
    hist_counts: list[int]


def margin_stats(step: int, beta: float, policy: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray],
                 chosen_tokens: np.ndarray, bins: int) -> MarginStats:
    """policy / ref = (chosen logps (N,), rejected logps (N,)) summed over response tokens."""
    r_chosen = beta * (policy[0] - ref[0])     # Rafailov et al. 2023, eq. 5 (log Z(x) cancels in the margin)
    r_rejected = beta * (policy[1] - ref[1])
    margins = r_chosen - r_rejected
    counts, edges = np.histogram(margins, bins=bins)
    drift = np.abs(policy[0] - ref[0])
    return MarginStats(step, len(margins), beta, float(margins.mean()), float(margins.std()),
                       float((margins > 0).mean()), float(r_chosen.mean()), float(r_rejected.mean()),
                       float(drift.mean()), float((drift / np.maximum(chosen_tokens, 1)).mean()),
                       [float(e) for e in edges], [int(c) for c in counts])


# ---------------------------------------------------------------------------------------------
# the callback


class MarginCallback(TrainerCallback):
    """Every `every_steps` optimizer steps (and at the start and end): margins on fixed pairs -> log(record)."""

    def __init__(self, pairs: list[dict], tokenizer, beta: float, log: Callable[..., dict], every_steps: int = 4,
                 bins: int = 20, batch_pairs: int = 8, max_length: int = 512):
        tokenized = [tokenize_pair(tokenizer, p) for p in pairs]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        chunks = [tokenized[i:i + batch_pairs] for i in range(0, len(tokenized), batch_pairs)]
        self.batches = [pair_batch(c, pad, max_length) for c in chunks]
        self.batch_sizes = [len(c) for c in chunks]
        self.beta, self.log, self.every, self.bins = beta, log, every_steps, bins
        self.ref: tuple[np.ndarray, np.ndarray] | None = None
        self.history: list[MarginStats] = []

    def evaluate(self, model, step: int) -> MarginStats:
        if self.ref is None:
            ref, _ = all_logps(model, self.batches, reference=True)
            self.ref = split_sides(ref, self.batch_sizes)
        policy, counts = all_logps(model, self.batches)
        stats = margin_stats(step, self.beta, split_sides(policy, self.batch_sizes), self.ref,
                             split_sides(counts, self.batch_sizes)[0], self.bins)
        self.history.append(stats)
        self.log("margins", **asdict(stats))
        return stats

    def _due(self, step: int) -> bool:
        return not self.history or self.history[-1].step != step

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._due(state.global_step):
            self.evaluate(model, state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 and self._due(state.global_step):
            self.evaluate(model, state.global_step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self._due(state.global_step):
            self.evaluate(model, state.global_step)


# ---------------------------------------------------------------------------------------------
# figure (from metrics.jsonl records alone, so a report can redraw it)


def _ridges(ax, records: list[dict]) -> None:
    """One histogram per evaluation, stacked bottom (first) to top (last), each scaled to its own peak."""
    for i, r in enumerate(records):
        edges, counts = np.asarray(r["hist_edges"]), np.asarray(r["hist_counts"], dtype=float)
        height = counts / max(counts.max(), 1.0) * 0.9
        ax.stairs(height + i, edges, baseline=i, fill=True, alpha=0.6, color=f"C{i % 10}")
    ax.set_yticks(range(len(records)), [f"step {r['step']}" for r in records])
    ax.axvline(0.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="margin r_chosen - r_rejected (beta x nats)", title="margin distribution per evaluation")


def plot_margins(records: list[dict], out: str | Path) -> Path | None:
    """Left: margin histograms over training. Right: mean +- std margin and reward accuracy per step."""
    if not records:
        return None
    import matplotlib  # lazy: matplotlib only when a figure is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_h, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    _ridges(ax_h, records)
    steps = [r["step"] for r in records]
    mean, std = np.array([r["margin_mean"] for r in records]), np.array([r["margin_std"] for r in records])
    lines = ax_t.plot(steps, mean, "o-", label="mean margin")
    ax_t.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax_a = ax_t.twinx()
    lines += ax_a.plot(steps, [r["reward_accuracy"] for r in records], "s--", color="C1",
                       label="reward accuracy (margin > 0)")
    ax_a.set_ylim(-0.02, 1.02)
    ax_a.set_ylabel("reward accuracy")
    ax_t.set(xlabel="step", ylabel="margin", title=f"held-out pairs (n={records[-1]['n_pairs']})")
    ax_t.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    save_png(fig, out, dpi=110)
    plt.close(fig)
    return out

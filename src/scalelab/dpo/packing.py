"""Padding-free and shared-prompt forwards for TRL's DPOTrainer, on plain sdpa (no flash-attn package).

TRL's collator pads a micro-batch of B pairs to one (2B, L) tensor: rows 0..B-1 are prompt+chosen, rows B..2B-1
prompt+rejected, right-padded to the longest row (trl DataCollatorForPreference). Every pad token costs a full
forward and backward. Here the rows are packed into one (1, T) row of real tokens and attention runs block by block
(one causal sdpa call per sequence), so no compute goes to padding; RoPE positions restart per sequence.

With `share_prompt`, the tokens that a pair's chosen and rejected rows have in common (the prompt) are run once:
the rejected row keeps only its last shared token and its own tail, and attends to the chosen row's copy of the
shared prefix (prefix sharing, Wang & Hegde 2024, "Accelerating Direct Preference Optimization with Prefix
Sharing", arXiv:2410.20305). The last shared token is kept in both branches so that each packed position predicts
exactly one next token.

Per-token outputs come back in TRL's padded (2B, L-1) layout, so TRL's loss code runs unchanged and the loss is
the same function of the same log-probabilities.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_NAME = "scalelab_packed"
PACK_KWARG = "scalelab_pack"


@dataclass(frozen=True)
class Block:
    """Queries [start, end) of the packed row attend causally to keys [prefix_start, prefix_end) + [start, end)."""
    start: int
    end: int
    prefix_start: int = 0
    prefix_end: int = 0

    @property
    def has_prefix(self) -> bool:
        return self.prefix_end > self.prefix_start


@dataclass(frozen=True)
class PackPlan:
    token_index: torch.Tensor     # (T,) index into the flattened (2B*L) padded input_ids
    position_ids: torch.Tensor    # (T,) RoPE position of each packed token within its own sequence
    label_index: torch.Tensor     # (T,) flattened (2B*L) index of the token each packed position predicts; -1 none
    gather_index: torch.Tensor    # (2B, L-1) packed position whose prediction fills the padded slot; -1 none
    blocks: tuple[Block, ...]

    @property
    def n_tokens(self) -> int:
        return int(self.token_index.numel())


def plan_rows(lengths: list[int], row_len: int, shared: list[int] | None = None) -> PackPlan:
    """Packing plan for 2B right-padded rows of real lengths `lengths` and padded width `row_len`.

    shared: per pair i, the number of leading tokens rows i and B+i have in common (tokens and labels), or None
    for plain padding-free packing. A pair shares its first P-1 tokens when P >= 2 and both rows go past P.
    """
    n_rows = len(lengths)
    pairs = n_rows // 2
    tokens, positions, labels = [], [], []
    gather = torch.full((n_rows, max(row_len - 1, 0)), -1, dtype=torch.long)
    blocks: list[Block] = []
    offset = 0

    def put(row: int, first: int, start: int) -> int:
        """Row `row` from token `first` on, packed at `start`; returns the packed end."""
        n = lengths[row] - first
        base = row * row_len + first
        tokens.append(torch.arange(base, base + n))
        positions.append(torch.arange(first, first + n))
        labels.append(torch.cat([torch.arange(base + 1, base + n), torch.tensor([-1])]))
        cols = torch.arange(first, lengths[row] - 1)
        gather[row, cols] = start + cols - first
        return start + n

    order = [r for i in range(pairs) for r in (i, pairs + i)] if shared is not None else list(range(n_rows))
    for row in order:
        p = 0
        if shared is not None and row >= pairs:  # a rejected row: its chosen row is row - pairs
            p = min(shared[row - pairs], lengths[row - pairs] - 1, lengths[row] - 1)
        if p >= 2:
            chosen_start = blocks[-1].start  # the pair's chosen row was packed just before
            end = put(row, p - 1, offset)
            gather[row, : p - 1] = chosen_start + torch.arange(p - 1)  # same context and label as the chosen row
            blocks.append(Block(offset, end, chosen_start, chosen_start + p - 1))
        else:
            end = put(row, 0, offset)
            blocks.append(Block(offset, end))
        offset = end
    return PackPlan(torch.cat(tokens), torch.cat(positions), torch.cat(labels), gather, tuple(blocks))


def batch_plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
               share_prompt: bool) -> PackPlan | None:
    """The plan for one padded micro-batch, or None (run it padded) when a row is empty or not right-padded."""
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    right_padded = (mask.long().cumprod(1).sum(1) == lengths).all().reshape(1)
    stats = [lengths, right_padded.long()]
    if share_prompt and input_ids.shape[0] % 2 == 0:
        half = input_ids.shape[0] // 2
        same = (input_ids[:half] == input_ids[half:]) & (labels[:half] == labels[half:]) & mask[:half] & mask[half:]
        stats.append(same.long().cumprod(1).sum(1))
    host = torch.cat(stats).tolist()  # one device-to-host sync per forward
    n = input_ids.shape[0]
    if not host[n] or min(host[:n]) < 1:
        return None
    shared = host[n + 1:] if len(stats) == 3 else None
    return plan_rows(host[:n], input_ids.shape[1], shared)


# ---------------------------------------------------------------------------------------------
# attention


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(1, H_kv, S, D) -> (1, H_kv * n_rep, S, D): query head h reads kv head h // n_rep (GQA, Ainslie et al. 2023)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def packed_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention interface: block-wise causal sdpa over a packed row, plain sdpa otherwise.

    query (1, H, T, D); key, value (1, H_kv, T, D); returns ((1, T, H, D), None) like sdpa_attention_forward.
    """
    blocks = kwargs.pop(PACK_KWARG, None)
    if blocks is None:
        # lazy: transformers takes seconds to import
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("packed DPO forward: sliding-window attention layers are not supported")
    # lazy: torch takes seconds to import, and this module is used without it
    from torch.nn.attention.bias import causal_lower_right
    n_rep = query.shape[1] // key.shape[1]
    outs = []
    for b in blocks:
        q, k, v = query[:, :, b.start:b.end], key[:, :, b.start:b.end], value[:, :, b.start:b.end]
        if b.has_prefix:
            # the rejected branch: its queries see the whole shared prefix and, causally, their own branch, which
            # is causal attention aligned to the bottom-right corner of the (Lq, Lk) score matrix
            k = _repeat_kv(torch.cat([key[:, :, b.prefix_start:b.prefix_end], k], dim=2), n_rep)
            v = _repeat_kv(torch.cat([value[:, :, b.prefix_start:b.prefix_end], v], dim=2), n_rep)
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                                       dropout_p=dropout, scale=scaling))
        else:
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scaling,
                                                       enable_gqa=n_rep > 1))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make ATTN_NAME a transformers attention implementation whose masks are sdpa's."""
    from transformers import AttentionInterface  # lazy: transformers takes seconds to import
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(ATTN_NAME, packed_sdpa_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


# ---------------------------------------------------------------------------------------------
# the forward wrapper around TRL's fused LM head


def _unpack(outputs, gather: torch.Tensor, n_packed: int):
    """Per-token fields (1, T) of TRL's FusedCausalLMOutput -> the padded (2B, L-1) layout, zero where unused."""
    valid = gather >= 0
    index = gather.clamp(min=0)
    for name, value in list(outputs.items()):
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == (1, n_packed):
            outputs[name] = value[0][index].masked_fill(~valid, 0)
    return outputs


def _packed_call(inner, share_prompt: bool, labels: torch.Tensor, kwargs: dict):
    input_ids, attention_mask = kwargs.pop("input_ids"), kwargs.pop("attention_mask")
    plan = batch_plan(input_ids, attention_mask, labels, share_prompt)
    if plan is None:
        return inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True, **kwargs)
    device = input_ids.device
    token_index, label_index = plan.token_index.to(device), plan.label_index.to(device)
    packed_ids = input_ids.reshape(-1)[token_index][None]
    shift_labels = torch.where(label_index >= 0, labels.reshape(-1)[label_index.clamp(min=0)], -100)[None]
    kwargs.pop("position_ids", None)
    outputs = inner(input_ids=packed_ids, attention_mask=torch.ones_like(packed_ids),
                    position_ids=plan.position_ids.to(device)[None], shift_labels=shift_labels, fused_lm_head=True,
                    **{PACK_KWARG: plan.blocks}, **kwargs)
    return _unpack(outputs, plan.gather_index.to(device), plan.n_tokens)


def enable_packing(model, share_prompt: bool) -> None:
    """Route `model(..., labels=, fused_lm_head=True)` calls (TRL's policy, reference and precompute forwards)
    through a packed row. `model` is the causal LM that TRL gave a fused LM head (for PEFT: the base model).
    Other calls (generation, margin evaluation) keep the model's own forward and sdpa attention."""
    if getattr(model, "_scalelab_packing", None) is not None:
        model._scalelab_packing = share_prompt
        return
    register_attention()
    model.set_attn_implementation(ATTN_NAME)
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args, fused_lm_head=False, labels=None, **kwargs):
        plain = (args or not fused_lm_head or labels is None or kwargs.get("input_ids") is None
                 or kwargs.get("attention_mask") is None or kwargs.get("shift_labels") is not None
                 or kwargs.get("inputs_embeds") is not None)
        if plain:
            return inner(*args, fused_lm_head=fused_lm_head, labels=labels, **kwargs)
        return _packed_call(inner, model._scalelab_packing, labels, kwargs)

    model.forward = forward
    model._scalelab_packing = share_prompt

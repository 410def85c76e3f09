"""Where a rollout batch's time goes, from rollout-bench files alone: milliseconds per decode step of each
engine against the GPU's floor for that step.

A decode step of an N-parameter dense model over B running sequences needs at least 2 N B FLOPs and one read
of the 2 N bytes of bf16 weights (KV reads add little at these lengths), so its floor on the GPU is
max(2 N B / peak FLOP/s, 2 N / HBM bandwidth): the roofline (Williams et al. 2009, CACM 52(4)). A measured
step far above that floor is paid on the host (scheduling, sampling bookkeeping, kernel launches), which a
faster rollout engine only removes if its own host work per step is smaller.

No engine's step is below that floor, so HF's step over the floor bounds what any engine can gain over HF at
that batch: where HF is already within a few times the floor (large models), no rollout engine is many times
faster at fixed lengths.

Only fixed-length benches are used: every sequence runs to max_new_tokens, so a batch is exactly that many
steps for both engines.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from scalelab.core.hardware import Hardware, get_hardware


@dataclass(frozen=True)
class StepCost:
    label: str               # the bench file
    model: str               # the bench's model name
    n_params: int
    sequences: int
    engine_core: str         # vLLM's: inprocess | subprocess ('-' when not recorded)
    hf_ms: float             # HF generate, ms per decode step
    vllm_ms: float | None    # vLLM colocated, ms per decode step (None: not measured in this file)
    floor_ms: float          # the GPU's roofline floor for one step of this batch
    options: tuple = ()      # vLLM's other effective options (flat logprobs, CUDA graph size): like for like

    @property
    def ceiling(self) -> float:
        """The most any engine could gain over HF at this batch: HF's step over the floor."""
        return self.hf_ms / self.floor_ms


def gpu_floor_ms(n_params: int, sequences: int, hw: Hardware, bytes_per_param: int = 2) -> float:
    compute_s = 2.0 * n_params * sequences / hw.bf16_flops
    weights_s = bytes_per_param * n_params / hw.hbm_bytes_s
    return 1e3 * max(compute_s, weights_s)


def step_cost(label: str, bench: dict, hw: Hardware) -> StepCost | None:
    """Per-step costs of one bench file; None unless its lengths were fixed (each batch = max_new_tokens steps)."""
    if (bench.get("lengths") or {}).get("emulated"):
        return None
    steps, engines = bench["batch"]["max_new_tokens"], bench["engines"]
    v = engines.get("vllm_colocated")
    eff = (bench.get("vllm_options") or {}).get("effective") or {}
    return StepCost(label, bench["model"].get("name", "-"), int(bench["model"]["n_params"]), bench["batch"]["sequences"],
                    eff.get("engine_core", "inprocess") if v else "-",
                    engines["hf"]["median_ms"] / steps, v["median_ms"] / steps if v else None,
                    gpu_floor_ms(bench["model"]["n_params"], bench["batch"]["sequences"], hw),
                    (eff.get("flat_logprobs"), eff.get("max_cudagraph_capture_size")))


def step_costs(benches: Sequence[tuple[str, dict]], hardware: str = "h200") -> list[StepCost]:
    hw = get_hardware(hardware)
    return sorted((c for label, b in benches if (c := step_cost(label, b, hw)) is not None),
                  key=lambda c: (c.model, c.sequences, c.label))


def step_cost_lines(costs: Sequence[StepCost]) -> list[str]:
    """A Markdown table and what it says: how far each engine's step is above the GPU's floor."""
    if not costs:
        return []
    rows = [f"| {c.label} | {c.model} | {c.sequences:,} | {c.hf_ms:.1f} | "
            f"{'-' if c.vllm_ms is None else f'{c.vllm_ms:.1f}'} | {c.engine_core} | {c.floor_ms:.2f} | "
            f"{'-' if c.vllm_ms is None else f'{c.vllm_ms / c.floor_ms:.1f}x'} | {c.ceiling:.1f}x |" for c in costs]
    out = ["Per decode step (fixed-length files: a batch is max_new_tokens steps for both engines), against the "
           "GPU's floor for that step, max(2 N B FLOPs / dense bf16 peak, 2 N bytes of weights / HBM bandwidth) "
           "for N parameters and B sequences (an H200's datasheet peaks). HF / floor is the most any engine could "
           "gain over HF at that batch:", "",
           "| file | model | sequences | HF ms/step | vLLM ms/step | vLLM engine core | GPU floor ms/step | "
           "vLLM / floor | HF / floor |", "|---|---|---:|---:|---:|---|---:|---:|---:|", *rows, ""]
    return out + _reading(costs)


def _reading(costs: Sequence[StepCost]) -> list[str]:
    """The sentences the table supports, per model: vLLM's step growth with the batch and its distance from the
    floor, then the ceiling HF's step puts on any engine's gain."""
    texts = []
    for model in sorted({c.model for c in costs}):
        mine = [c for c in costs if c.model == model]
        v = [c for c in mine if c.vllm_ms is not None]
        said = [x for x in (_growth(model, v), _hf_spread(mine), _core_split(v)) if x]
        texts += [" ".join(said)] if said else []
    return [t for x in texts + [_across_models(costs), _ceilings(costs)] if x for t in (x, "")]


def _growth(model: str, v: Sequence[StepCost]) -> str:
    if len({c.sequences for c in v}) < 2:
        return ""
    top = max(c.sequences for c in v)
    small = min(v, key=lambda c: (c.sequences, c.vllm_ms))
    large = min((c for c in v if c.sequences == top), key=lambda c: c.vllm_ms)
    per_seq_us = 1e3 * (large.vllm_ms - small.vllm_ms) / (large.sequences - small.sequences)
    return (f"{model}: vLLM's fastest step grows from {small.vllm_ms:.1f} ms at {small.sequences:,} sequences to "
            f"{large.vllm_ms:.1f} ms at {large.sequences:,} (~{per_seq_us:.0f} us per extra running sequence), "
            f"{large.vllm_ms / large.floor_ms:.0f}x the GPU's floor there: at this model size the step is paid on "
            "the host, not the GPU, so the ratio to HF is set by the two engines' host work per step.")


def _across_models(costs: Sequence[StepCost]) -> str:
    """At one batch size, vLLM's fastest step of the smallest and the largest model: a step that barely grows
    with the parameter count is paid on the host."""
    for n in sorted({c.sequences for c in costs}):
        v = [c for c in costs if c.sequences == n and c.vllm_ms is not None]
        best = {m: min((c for c in v if c.model == m), key=lambda c: c.vllm_ms) for m in {c.model for c in v}}
        if len(best) > 1:
            lo, hi = min(best.values(), key=lambda c: c.n_params), max(best.values(), key=lambda c: c.n_params)
            return (f"At {n:,} sequences vLLM's fastest step is {lo.vllm_ms:.1f} ms for {lo.model} and "
                    f"{hi.vllm_ms:.1f} ms for {hi.model}, {hi.n_params / lo.n_params:.1f}x the parameters: "
                    f"the step took {hi.vllm_ms / lo.vllm_ms:.2f}x as long, so at the smaller size it is not the "
                    "model's arithmetic that sets it.")
    return ""


def _ceilings(costs: Sequence[StepCost]) -> str:
    """Per model and batch, the tightest ceiling (the fastest HF step over the floor) beside vLLM's best ratio."""
    parts = []
    for model, n in sorted({(c.model, c.sequences) for c in costs}):
        same = [c for c in costs if (c.model, c.sequences) == (model, n)]
        tight = min(same, key=lambda c: c.ceiling)
        got = [c.hf_ms / c.vllm_ms for c in same if c.vllm_ms]
        parts.append(f"{model} at {n:,} sequences {tight.ceiling:.1f}x"
                     + (f" (vLLM reached {max(got):.2f}x)" if got else ""))
    return ("Ceiling on any engine's speedup over HF at fixed lengths (HF's fastest step over the floor): "
            + "; ".join(parts) + ".")


def _hf_spread(costs: Sequence[StepCost]) -> str:
    """Files from different machines or sessions: HF's step at one batch size of one model, when it varies by
    > 20%."""
    for n in sorted({c.sequences for c in costs}):
        hf = [c.hf_ms for c in costs if c.sequences == n]
        if len(hf) > 1 and max(hf) > 1.2 * min(hf):
            return (f"Absolute step times vary between files (HF's step at {n:,} sequences: {min(hf):.1f} to "
                    f"{max(hf):.1f} ms), as host-bound steps do with the host's speed and load, so engines are "
                    "compared within a file, as each file's ratio does.")
    return ""


def _core_split(v: Sequence[StepCost]) -> str:
    """What moving vLLM's engine core to its own process did, at equal batch size and other options, each step
    relative to HF's step in its own file (the files may come from different machines)."""
    for n, opts in sorted({(c.sequences, c.options) for c in v}, key=lambda k: -k[0]):
        same = [c for c in v if (c.sequences, c.options) == (n, opts)]
        inproc = [c.vllm_ms / c.hf_ms for c in same if c.engine_core == "inprocess"]
        sub = [c.vllm_ms / c.hf_ms for c in same if c.engine_core == "subprocess"]
        if inproc and sub:
            a, b = min(inproc), min(sub)
            return (f"With vLLM's engine core in its own process its step at {n:,} sequences was {b:.2f}x HF's "
                    f"step in the same run, against {a:.2f}x in process: that split moves vLLM's output handling "
                    "off the caller's thread, so "
                    + ("the host cost sits in the engine core's own loop (scheduling and input preparation)."
                       if b > 0.85 * a else "the output handling was a large part of the host cost."))
    return ""

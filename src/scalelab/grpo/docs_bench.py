"""The real-model GRPO benches as docs blocks (docs_blocks.BlockKind), from the files the bench scripts write:

    update_bench (folder)   bench/grpo_update_bench.py's files: one row per file and variant, the update and the
                            reference pass timed alone on one GPU, their MFU against the matmul rate measured there
    rollout_real (folder)   bench/grpo_rollout_bench.py's files of a real model (not random weights): each engine's
                            useful tokens/s beside HF generate's in the same process, and a colocated vLLM engine
                            as a share of the standalone one on the same batch

Any other file in the folder (provenance, predictions, logs) is not a bench output and is passed over.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from scalelab.core.jsonio import find_stored, read_json
from scalelab.core.numfmt import DASH, pct
from scalelab.grpo.docs_blocks import NOT_MEASURED, BlockKind, Inputs


@dataclass(frozen=True)
class BenchFile:
    name: str                   # relative to the block's folder: the row label
    data: Mapping[str, Any]


def bench_files(folder: Path, is_bench: Callable[[Mapping], bool]) -> list[BenchFile]:
    """The JSON files directly in `folder` (plain or compressed) that is_bench(data) accepts, by name."""
    out = []
    for path in find_stored(folder, "*.json"):
        if path.parent != folder:
            continue
        try:
            data = read_json(path)
        except ValueError:  # not JSON: not a bench output
            continue
        if isinstance(data, dict) and is_bench(data):
            out.append(BenchFile(path.name, data))
    return out


def _none_there(heading: str, inp: Inputs, what: str) -> list[str]:
    return [heading, "", f"{NOT_MEASURED}: no {what} in `{inp.label('folder')}`."]


# ---------------------------------------------------------------------------------------------
# update_bench


def is_update_bench(data: Mapping) -> bool:
    return "variants" in data and "matmul_bf16_tflops" in data


def _update_rows(f: BenchFile) -> list[str]:
    d = f.data
    return [f"| {f.name} | {name} | {d['gpu']} | {v['passes']} | {d['tokens']:,} ({v['padded_tokens']:,}) | "
            f"{v['update_s']:.2f} | {v['reference_s']:.2f} | {pct(v['update_mfu'])} | {pct(v['mfu'])} | "
            f"{v['peak_mem_gib']:.1f} | {d['matmul_bf16_tflops']:.0f} |" for name, v in d["variants"].items()]


def _update_bench(inp: Inputs) -> list[str]:
    files = bench_files(inp.path("folder"), is_update_bench)
    if not files:
        return _none_there(UPDATE_BENCH.heading, inp, "bench/grpo_update_bench.py file")
    n = sorted({f"{f.data['n_linear_params'] / 1e6:,.0f}M" for f in files})
    return [UPDATE_BENCH.heading, "",
            "| file | variant | GPU | passes | tokens (padded) | update s | reference s | update MFU | MFU with "
            "reference | peak GiB | bf16 matmul TFLOP/s |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|", *(r for f in files for r in _update_rows(f)), "",
            f"Files in `{inp.label('folder')}`, each one process on one GPU: its rows compare with each other, rows "
            "of two files come from two processes. Update s and reference s: the median of the bench's repeats. MFU "
            "counts 6N FLOPs per token for the update and 2N for the reference pass, non-pad tokens only, N = "
            f"{' / '.join(n)} linear weights, against the bf16 matmul rate the same process measured (last column)."]


UPDATE_BENCH = BlockKind("update_bench", "### The update alone", ("folder",), _update_bench)


# ---------------------------------------------------------------------------------------------
# rollout_real

VLLM = ("vllm_colocated", "vllm_standalone")


def is_real_rollout_bench(data: Mapping) -> bool:
    return "engines" in data and "batch" in data and not data.get("model", {}).get("random_weights")


def _vllm(data: Mapping) -> str | None:
    return next((k for k in VLLM if k in data["engines"]), None)


def _same_batch(data: Mapping) -> tuple:
    """What makes two bench files the same batch on the same vLLM memory share."""
    b, asked = data["batch"], (data.get("vllm_options") or {}).get("requested") or {}
    return (data["model"]["name"], data.get("task"), b["prompts"], b["group_size"], b["max_new_tokens"],
            b["temperature"], b["top_p"], asked.get("gpu_memory_utilization"))


def ceiling_share(f: BenchFile, files: list[BenchFile]) -> tuple[float, str] | None:
    """A colocated file's vLLM tokens/s as a share of a standalone file's on the same batch, and that file."""
    if _vllm(f.data) != "vllm_colocated":
        return None
    for s in files:
        if _vllm(s.data) == "vllm_standalone" and _same_batch(s.data) == _same_batch(f.data):
            mine, ceiling = f.data["engines"]["vllm_colocated"], s.data["engines"]["vllm_standalone"]
            return mine["tokens_per_s"] / ceiling["tokens_per_s"], s.name
    return None


def _rollout_row(f: BenchFile, files: list[BenchFile]) -> str:
    d, vllm = f.data, _vllm(f.data)
    b, lengths = d["batch"], d.get("answer_lengths") or {}
    answers = DASH if not lengths else f"{lengths['mean']:.0f} ({pct(lengths['at_cap_frac'])})"
    share = ceiling_share(f, files)
    ratio = d.get("ratio_vllm_over_hf")
    return (f"| {f.name} | {d['model']['name']} | {b['sequences']:,} x {b['max_new_tokens']} | {answers} | "
            f"{d['engines']['hf']['tokens_per_s']:,.0f} | {vllm or DASH} | "
            f"{DASH if vllm is None else format(d['engines'][vllm]['tokens_per_s'], ',.0f')} | "
            f"{DASH if ratio is None else f'{ratio:.2f}x'} | "
            f"{DASH if share is None else f'{pct(share[0], 0)} of {share[1]}'} |")


def _rollout_real(inp: Inputs) -> list[str]:
    files = bench_files(inp.path("folder"), is_real_rollout_bench)
    if not files:
        return _none_there(ROLLOUT_REAL.heading, inp, "bench/grpo_rollout_bench.py file of a real model")
    return [ROLLOUT_REAL.heading, "",
            "| file | model | sequences x new tokens | answer tokens mean (at the cap) | HF tok/s | vLLM engine | "
            "vLLM tok/s | vLLM / HF | colocated / standalone |",
            "|---|---|---:|---:|---:|---|---:|---:|---|", *(_rollout_row(f, files) for f in files), "",
            f"Files in `{inp.label('folder')}`. Tokens/s count useful tokens (each answer up to its own stop) over "
            "the generate call's wall-clock; each file measures HF `generate` first on the same batch, its "
            "baseline. Colocated / standalone compares two processes: the colocated engine in the trainer's "
            "process against a standalone vLLM on the same batch and memory share."]


ROLLOUT_REAL = BlockKind("rollout_real", "### Rollouts of the real model: vLLM vs HF generate", ("folder",),
                         _rollout_real)

KINDS = (UPDATE_BENCH, ROLLOUT_REAL)

"""Weight syncs into a vLLM server on its own GPU, from bench/grpo_nccl_sync_bench.py files alone: NCCL broadcast
against the file reload, each one's correctness check, and the sync's share of a GRPO step of the same model.

A check perturbs every weight, syncs, and compares the server's logprobs with the trainer's HF forward of the same
weights (within the file's tol), then syncs the original weights back (the original tokens again). In a deep bf16
model the HF comparison can miss its tolerance with correct weights, so the reading rests on the direct evidence
where the file has it: the server's output after each method against its output after the file reload (vLLM's
own loader) on the same perturbed weights. Files without it: when every method misses the tolerance by the same
error while the restore is exact, the server held the same weights after each method, and the reading says so
rather than calling the sync wrong or the check passed.
"""
from __future__ import annotations

from typing import Sequence

SAME_ERR = 1e-6       # errors this close are one error
RESTORE_TOL = 1e-3    # the bench's own bound on the restored logprobs


def _shape_of(data: dict) -> str:
    return data["model"]["shape"]


def _check_text(c: dict, tol: float) -> str:
    restored = "exact" if c["restored_tokens_equal"] and c["max_restored_logprob_diff"] <= RESTORE_TOL else "NO"
    return (f"{c['max_hf_logprob_err']:.3f} (tol {tol:g}) | {'yes' if c['changed'] else 'NO'} | {restored} | "
            f"{'ok' if c['ok'] else 'FAILED'}")


def _rows(path: str, data: dict) -> list[str]:
    checks = {c["method"]: c for c in data["checks"]}
    rows = []
    for t in data["timings"]:
        check = checks.get(t["method"])
        rows.append(f"| {path} | {_shape_of(data)} | {t['method']} | {t['median_ms']:,.1f} | {t['first_ms']:,.0f} | "
                    f"{t['bytes'] / 1e9:.2f} | {t['gb_per_s']:.1f} | "
                    + (_check_text(check, data["tol"]) if check else "- | - | - | not checked") + " |")
    return rows


def _step_ms(shape: str, benches: Sequence[tuple[str, dict]]) -> tuple[str, float] | None:
    """(file, rollout + update ms) of the rollout bench of the same model shape that timed an update: the
    step a sync would sit in (the fastest engine's rollout, as the in-process sync table uses)."""
    for path, b in benches:
        if b["model"].get("name", "").removeprefix("random:") == shape and b.get("update_ms"):
            rollout = min(e["median_ms"] for e in b["engines"].values())
            return path, rollout + b["update_ms"]
    return None


def _reading(path: str, data: dict, benches: Sequence[tuple[str, dict]]) -> str:
    ms = {t["method"]: t["median_ms"] for t in data["timings"]}
    said = []
    if "nccl" in ms and "safetensors" in ms:
        said.append(f"{_shape_of(data)}: NCCL {ms['nccl']:,.0f} ms against {ms['safetensors']:,.0f} ms for the file "
                    f"reload, {ms['safetensors'] / ms['nccl']:.1f}x faster.")
    step = _step_ms(_shape_of(data), benches)
    if step and "nccl" in ms:
        said.append(f"In the step of {step[0]} (rollout + update {step[1]:,.0f} ms) an NCCL sync is "
                    f"{ms['nccl'] / (step[1] + ms['nccl']):.1%} of the step.")
    said += _agreement_text(data)
    said += [] if data.get("agreement") else _same_error_text(data)
    return " ".join(said)


def _agreement_text(data: dict) -> list[str]:
    """The direct evidence, where the file has it: each method's server output against the file reload's."""
    out = []
    for a in data.get("agreement") or []:
        if a["ok"]:
            out.append(f"On the same perturbed weights the server's greedy output after {a['method']} equals its "
                       f"output after the {a['reference']} reload (same tokens, logprobs within "
                       f"{a['max_logprob_diff']:.1e}): {a['method']} delivered the weights vLLM's own loader reads.")
        else:
            out.append(f"After {a['method']} the server's output DIFFERS from its output after the {a['reference']} "
                       f"reload (same tokens: {a['tokens_equal']}, max logprob diff {a['max_logprob_diff']:.3g}): "
                       "the sync did not deliver the same weights.")
    checks = data["checks"]
    if out and not all(c["ok"] for c in checks):
        agreed = all(a["ok"] for a in data["agreement"])
        out.append(f"The HF check's miss of its tolerance ({data['tol']:g}) is then the two engines' bf16 forwards, "
                   "not the sync." if agreed and _changed_and_restored(checks) else "The check FAILED: see the table.")
    return out


def _changed_and_restored(checks: Sequence[dict]) -> bool:
    """Every method moved the server's output with the perturbed weights and brought the original back exactly."""
    return all(c["changed"] and c["restored_tokens_equal"] and c["max_restored_logprob_diff"] <= RESTORE_TOL
               for c in checks)


def _same_error_text(data: dict) -> list[str]:
    """Without the agreement record: an equal miss of the tolerance by every method, with an exact restore."""
    said, checks = [], data["checks"]
    errs = [c["max_hf_logprob_err"] for c in checks]
    if checks and not all(c["ok"] for c in checks):
        if len(checks) > 1 and max(errs) - min(errs) <= SAME_ERR and _changed_and_restored(checks):
            said.append(f"The check missed its tolerance ({data['tol']:g}) with the same error, {errs[0]:.3f}, after "
                        "every method, and the original weights came back exactly: the server held the same weights "
                        "whichever way they came, so the gap is HF's bf16 forward against vLLM's at this depth, not "
                        "the sync.")
        else:
            said.append("The check FAILED: see the table.")
    return said


def server_sync_lines(files: Sequence[tuple[str, dict]], benches: Sequence[tuple[str, dict]]) -> list[str]:
    """The section's Markdown: one row per file and method, then what each file says."""
    if not files:
        return []
    rows = [r for path, data in files for r in _rows(path, data)]
    readings = [x for path, data in files if (x := _reading(path, data, benches))]
    return ["### Into a vLLM server on its own GPU: NCCL broadcast vs a file reload", "",
            "The trainer on one GPU, vLLM's OpenAI server in its own process on another. Per method one untimed sync "
            "(NCCL forms its group there: 'first'), then timed syncs of the same weights. Check: every weight "
            "perturbed and synced, the server's logprobs against the trainer's HF forward of those weights (max "
            "error), then the original weights synced back.", "",
            "| file | model | method | median ms | first ms | GB moved | GB/s | max logprob err vs HF | changed | "
            "restored | check |", "|---|---|---|---:|---:|---:|---:|---:|---|---|---|", *rows, "",
            *[t for x in readings for t in (x, "")]]

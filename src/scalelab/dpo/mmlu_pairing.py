"""Which MMLU items a base-vs-tuned comparison pairs on, when the two sides were measured on different item sets.

The base model is measured once per sweep on all 14,042 items, while most tuned rows run the fixed stratified
subset (evals.mmlu_subset). A paired test (McNemar 1947; the paired bootstrap) needs the same items on both
sides, so the full side is restricted to the subset's items through the subset record's row map, and the
comparison states n, the items actually paired. Likewise a per-subject limit (lm-eval's first N rows of each
subject) pairs with a full run on those rows, whose keys are the same. Two sets of which neither contains the
other (two different subsets, a subset against a limited run) have no common item set to pair on and are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from scalelab.evals.mmlu_subset import restrict

SIDES = ("base", "tuned")


@dataclass(frozen=True)
class MmluPairing:
    base: dict[str, float]          # per-item values keyed alike on both sides, the items paired
    tuned: dict[str, float]
    n_base_measured: int            # items each side was measured on
    n_tuned_measured: int
    restricted: str                 # "" | "base" | "tuned": the side cut down to the other's items
    detail: str                     # one line for the comparison row

    @property
    def n(self) -> int:
        return len(self.base)

    def row_fields(self) -> dict:
        return {"paired_on": self.detail, "restricted": self.restricted,
                "n_base_measured": self.n_base_measured, "n_tuned_measured": self.n_tuned_measured}


class MmluPairingError(ValueError):
    """The base and tuned MMLU records share no item set that both were measured on in full."""


def _refuse(why: str, base: Mapping, tuned: Mapping) -> MmluPairingError:
    return MmluPairingError(f"battery part mmlu: cannot pair base ({len(base)} items) with tuned ({len(tuned)} "
                            f"items): {why}; measure both sides on the same items (battery.mmlu_subset, "
                            "battery.mmlu_limit) or one side on all of MMLU")


def _restricted(full: Mapping[str, float], subset: Mapping, full_side: str, other: Mapping) -> dict[str, float]:
    try:
        out = restrict(full, subset)
    except ValueError as e:
        raise _refuse(f"the {full_side} side is not a full run of the subset's source ({e})",
                      full if full_side == "base" else other, other if full_side == "base" else full) from None
    if set(out) != set(other):
        raise _refuse(f"the subset side's items are not the {subset.get('n', '?')}-item subset its record names",
                      full if full_side == "base" else other, other if full_side == "base" else full)
    return out


def _by_subset(base: Mapping[str, float], tuned: Mapping[str, float], base_subset: Mapping | None,
               tuned_subset: Mapping | None) -> MmluPairing:
    """At least one side ran a subset: the other is its full source (restricted) or the same subset."""
    nb, nt = len(base), len(tuned)
    if base_subset is not None and tuned_subset is not None:
        if base_subset["full_index"] != tuned_subset["full_index"]:
            raise _refuse("the two sides ran different subsets (their full-file rows differ)", base, tuned)
        return MmluPairing(dict(base), dict(tuned), nb, nt, "", f"the same {nb}-item subset on both sides")
    if tuned_subset is not None:
        paired = _restricted(base, tuned_subset, "base", tuned)
        return MmluPairing(paired, dict(tuned), nb, nt, "base",
                           f"the tuned side's {nt}-item subset; the base's {nb}-item run restricted to it")
    assert base_subset is not None
    paired = _restricted(tuned, base_subset, "tuned", base)
    return MmluPairing(dict(base), paired, nb, nt, "tuned",
                       f"the base side's {nb}-item subset; the tuned {nt}-item run restricted to it")


def _by_keys(base: Mapping[str, float], tuned: Mapping[str, float]) -> MmluPairing:
    """No subset: same keys, or one key set inside the other (a per-subject limit against a full run)."""
    kb, kt = set(base), set(tuned)
    nb, nt = len(base), len(tuned)
    if kb == kt:
        return MmluPairing(dict(base), dict(tuned), nb, nt, "", f"the same {nb} items on both sides")
    if kb < kt:
        return MmluPairing(dict(base), {k: tuned[k] for k in base}, nb, nt, "tuned",
                           f"the base side's {nb} items; the tuned {nt}-item run restricted to them")
    if kt < kb:
        return MmluPairing({k: base[k] for k in tuned}, dict(tuned), nb, nt, "base",
                           f"the tuned side's {nt} items; the base's {nb}-item run restricted to them")
    only = sorted(kb ^ kt)
    raise _refuse(f"neither item set contains the other (e.g. {', '.join(only[:3])})", base, tuned)


def pair_mmlu(base: Mapping[str, float], tuned: Mapping[str, float], base_subset: Mapping | None = None,
              tuned_subset: Mapping | None = None) -> MmluPairing:
    """The items to pair on. base_subset / tuned_subset: the subset record (evals.mmlu_subset's subset.json:
    full_index = subject -> kept rows of the full file) of a side that ran a subset, else None."""
    if base_subset is None and tuned_subset is None:
        return _by_keys(base, tuned)
    return _by_subset(base, tuned, base_subset, tuned_subset)

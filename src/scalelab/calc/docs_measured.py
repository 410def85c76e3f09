"""The measured side of docs/calc.md, rendered from the committed result documents alone: the alpha-beta fit and
the predicted-vs-measured steps of bench/calc_vs_measured.py, and the point-by-point collective scores of
bench/calc_collectives_score.py. The bench scripts print these same lines, so the page and the script agree."""
from __future__ import annotations

from scalelab.core import numfmt
from scalelab.core.tables import table

MS = "{:.2f} ms"    # milliseconds, no thousands separator: the 1-GPU steps print as the prose quotes them


def fit_table(cvm: dict) -> list[str]:
    """One row per collective of the document's `nccl_fit`."""
    rows = [(c, f"{f['alpha_us']:.1f}", f"{f['busbw_gb_s']:.0f}", numfmt.pct(f["max_rel_err"], 0), f["n_points"])
            for c, f in cvm["nccl_fit"].items()]
    return table(("collective", "alpha (µs)", "bus bandwidth (GB/s)", "max rel. error", "points"), rows)


def case_table(cvm: dict) -> list[str]:
    """One row per case: what the efficiency was fitted on, the predicted and measured step and communication."""
    rows = [(f"{c['name']}{'' if c['scored'] else ' (not scored)'}",
             f"{c['base_run']} {numfmt.num(1e3 * c['base_step_s'], MS)} -> eff {c['compute_eff']:.3f}",
             *(numfmt.num(1e3 * c[k], MS) for k in ("predicted_step_s", "measured_step_s")),
             f"{c['error_pct']:+.1f}%",
             *(numfmt.num(1e3 * c[k], MS) for k in ("predicted_exposed_comm_s", "measured_comm_s")),
             "yes" if c["within_15pct"] else "NO") for c in cvm["cases"]]
    return table(("case", "compute fitted on", "predicted step", "measured step", "error", "predicted exposed comm",
                  "measured comm", "within ±15%"), rows)


def calibration_lines(cvm: dict, ranks: int) -> list[str]:
    """The fit, the cases and the score, as bench/calc_vs_measured.py prints them."""
    source = next(iter(cvm["nccl_fit"].values()))["source"]
    s = cvm["summary"]
    return [f"NCCL alpha-beta fit ({source}, {ranks} ranks):", "", *fit_table(cvm), "", *case_table(cvm), "",
            f"{s['within_15pct']}/{s['scored']} scored cases within ±15% "
            f"(worst {s['max_abs_error_pct_scored']:.1f}%)"]


def collectives_lines(scored: dict) -> list[str]:
    """Each model's score per message-size regime, then the bound on the DDP step's communication."""
    rows = [(s["method"], s["regime"], s["n"], s["within_15pct"], numfmt.pct(s["median_abs_err"]),
             f"{numfmt.pct(s['worst_abs_err'])} ({s['worst_point']})") for s in scored["summary"]]
    b = scored["ddp_bound"]
    return [*table(("model", "sizes", "points", "within ±15%", "median abs err", "worst (point)"), rows), "",
            f"The DDP step's gradient all-reduces, none overlapped: {numfmt.ms(b['all_reduce_total_s'], 2)}; "
            f"step residual {numfmt.ms(b['step_residual_s'], 2)}, so at least "
            f"{numfmt.ms(b['residual_not_communication_s'], 2)} of it is not communication."]

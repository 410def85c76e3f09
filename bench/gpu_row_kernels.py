"""The trainer's Triton row kernels timed alone at the 124M recipe's shapes, beside what torch.compile makes of the
same work in the same run:
  gelu       GELU + per-row e4m3 cast (train.fp8_gelu_kernel's forward), (M, 3072) bf16 in; a, a8, 1/scale out
  gelu_grad  da * GELU'(h) + per-row e5m2 cast (its backward); da, h in; gh, gh8, 1/scale out
  loss_e5m2  one 16k x 50k chunk of the FP8 head's loss: train.loss_kernel='triton-e5m2' (e5m2 gradient in both
             layouts) against 'triton' followed by what it replaces (the static e5m2 cast and its transposed copy)
Each kernel at several launch shapes (warps; the loss tile, rounding in integers or by the "hw" cast), its ms
(median of --repeats after warm-up), the bytes it must move over that time, and its outputs checked against the
reference (bf16 values, FP8 codes one apart at most). The reference is compiled as the trainer's step is
(torch.compile, default mode). CUDA only.

    PYTHONPATH=src python3 bench/gpu_row_kernels.py --out $OUT/row_kernels.json
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from gpu_fp8_gemm import kernel_bench_args, time_ms  # bench/ is the script's folder, first on sys.path
from scalelab.core.provenance import collect
from scalelab.pretrain.ce_kernel import cross_entropy_rows_, cross_entropy_rows_e5m2
from scalelab.pretrain.fp8 import E4M3, E5M2, quantize, quantize_rows
from scalelab.pretrain.fp8_kernels import gelu_grad_rows, gelu_rows

BF16 = torch.bfloat16


def _gelu_ref(h):
    a = F.gelu(h.float(), approximate="tanh").to(BF16)
    return (a, *quantize_rows(a, E4M3))


def _gelu_grad_ref(da, h):
    gh = torch.ops.aten.gelu_backward(da.float(), h.float(), approximate="tanh").to(BF16)
    return (gh, *quantize_rows(gh, E5M2))


def _static_cast(grad):
    """The chunked FP8 head's cast of the bf16 logit gradient (static scale, bound 1 here) and its transposed copy."""
    g8, _ = quantize(grad, E5M2, 1.0)
    return g8, g8.t().contiguous()


def agreement(ours: tuple, ref: tuple) -> dict:
    """Largest gaps of (values bf16, FP8 codes, 1/scales) between our kernel's outputs and the reference's. Codes
    are compared where both have the same sign; where the signs differ (values that round to either side of 0,
    as near GELU's turning point) the gap is the dequantized values' distance as a fraction of the row's max."""
    o8, r8 = ours[1].view(torch.uint8).int(), ref[1].view(torch.uint8).int()
    same_sign = (o8 >> 7) == (r8 >> 7)
    codes = (o8 - r8).abs()
    deq = lambda t: t[1].float() * t[2]  # noqa: E731  codes x the row's 1/scale
    row_max = deq(ref).abs().amax(dim=1, keepdim=True)
    flips = ~same_sign & ((o8 & 0x7F) + (r8 & 0x7F) > 0)
    flip_gap = ((deq(ours) - deq(ref)).abs() / row_max)[flips]
    return {"max_value_diff": (ours[0].float() - ref[0].float()).abs().max().item(),
            "max_code_diff": codes[same_sign].max().item(), "codes_equal": (codes == 0).float().mean().item(),
            "sign_flips": int(flips.sum()),
            "max_flip_gap_of_row_max": flip_gap.max().item() if flip_gap.numel() else 0.0,
            "max_scale_rel_diff": ((ours[2] - ref[2]).abs() / ref[2]).max().item()}


def gelu_rows_table(m: int, n: int, repeats: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    h = 2 * torch.randn(m, n, device="cuda", generator=g).to(BF16)
    da = 1e-3 * torch.randn(m, n, device="cuda", generator=g).to(BF16)
    fwd_ref, bwd_ref = torch.compile(_gelu_ref), torch.compile(_gelu_grad_ref)
    cases = {"gelu": (lambda w: gelu_rows(h, w), lambda: fwd_ref(h), m * n * (2 + 2 + 1) + 4 * m),
             "gelu_grad": (lambda w: gelu_grad_rows(da, h, w), lambda: bwd_ref(da, h), m * n * (2 + 2 + 2 + 1) + 4 * m)}
    out = {}
    for name, (ours, ref, nbytes) in cases.items():
        ref_ms = time_ms(ref, repeats)
        out[f"{name} compiled"] = {"ms": ref_ms, "tb_per_s": nbytes / ref_ms / 1e9}
        for warps in (4, 8, 16, 32):
            ms = time_ms(lambda: ours(warps), repeats)
            out[f"{name} triton w{warps}"] = {"ms": ms, "tb_per_s": nbytes / ms / 1e9, "vs_compiled": ref_ms / ms,
                                              **agreement(ours(warps), ref())}
    return out


def loss_table(rows: int, vocab: int, padded: int, repeats: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (3 * torch.randn(rows, padded, device="cuda", generator=g)).to(BF16)
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    cast, work = torch.compile(_static_cast), logits.clone()

    def bf16_then_cast():  # 'triton' writes the gradient (scale 1 here) over its logits; then cast and transpose
        work.copy_(logits)
        cross_entropy_rows_(work, targets, vocab, 1.0, True)
        return cast(work)

    copy_ms = time_ms(lambda: work.copy_(logits), repeats)  # restores the logits each repeat: not part of the path
    ref_ms = time_ms(bf16_then_cast, repeats) - copy_ms
    ref8 = bf16_then_cast()[0].view(torch.uint8).int()
    elems = rows * padded
    out = {"loss triton + cast": {"ms": ref_ms, "tb_per_s": elems * (2 + 2 + 2 + 2 + 1 + 1) / ref_ms / 1e9}}
    for tile, warps, hw in (((64, 128), 4, False), ((64, 128), 8, False), ((32, 128), 4, False),
                            ((32, 128), 8, False), ((16, 128), 4, False), ((32, 256), 4, False), ((32, 256), 8, False),
                            ((64, 64), 4, False), ((32, 128), 4, True), ((32, 128), 8, True), ((16, 128), 4, True)):
        run = lambda: cross_entropy_rows_e5m2(logits, targets, vocab, tile=tile, tile_warps=warps,  # noqa: E731
                                              hw_cast=hw)
        ms = time_ms(run, repeats)
        _, g8, g8t = run()
        codes = (g8.view(torch.uint8).int() - ref8).abs()  # direct rounding against bf16-then-e5m2: one code apart
        out[f"loss e5m2 tile {tile[0]}x{tile[1]} w{warps}{' hw' if hw else ''}"] = {
            "ms": ms, "tb_per_s": elems * (2 + 2 + 1 + 1) / ms / 1e9, "vs_bf16_path": ref_ms / ms,
            "max_code_diff": codes.max().item(), "transpose_exact": bool(torch.equal(g8t.t(), g8))}
    return out


def main(argv: list[str] | None = None) -> int:
    args = kernel_bench_args(__doc__, argv)  # --tokens: the MLP kernels' rows; the loss chunk is an eighth of them
    if args is None:
        return 2
    table = {**gelu_rows_table(args.tokens, 3072, args.repeats),
             **loss_table(args.tokens // 8, 50257, 50304, args.repeats)}  # the recipe's 8 loss chunks
    print(f"{'kernel':30s} {'ms':>7s} {'TB/s':>6s} {'x ref':>6s} {'max code diff':>13s}")
    for name, r in table.items():
        speed = r.get("vs_compiled", r.get("vs_bf16_path"))
        print(f"{name:30s} {r['ms']:7.3f} {r['tb_per_s']:6.2f} {speed or float('nan'):6.2f} "
              f"{r.get('max_code_diff', float('nan')):13}")
    meta = collect({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda})
    args.out.write_text(json.dumps({"tokens": args.tokens, "kernels": table, "provenance": meta,
                                    "git_sha": meta["git_sha"], "command": meta["command"]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 (E4M3) 3³ convolutions through cuDNN's graph API against PyTorch's bf16 convolutions.

    python scripts/probes/fp8_conv_probe.py --out fp8_convs.csv     # needs a CUDA GPU and nvidia-cudnn-frontend

For the U-Net's convolution shapes at 128³ and 64³ (bf16, NDHWC, batch 1), the median
milliseconds of PyTorch's bf16 convolution (cudnn.benchmark: the shape's best it offers) and of
every cuDNN execution plan of the FP8 graph ``medddpm.net.fp8.conv_graph`` builds (E4M3 input and
weight, fp32 accumulation, descaled per output channel, bf16 output), each replayed as a CUDA
graph. ``rel_err`` is the FP8 output's RMS error against an fp32 convolution of the unquantized
operands, over the RMS of that reference; ``rel_err_bf16`` the same for the bf16 convolution.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch
import torch.nn.functional as F

from medddpm.net import fp8
from medddpm.profiling.layers import _replay_ms

SHAPES = [(64, 64, 128), (128, 64, 128), (64, 64, 64), (128, 64, 64), (128, 128, 64), (128, 128, 32)]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def probe(cin: int, cout: int, side: int, reps: int) -> list[dict]:
    dev = torch.device("cuda")
    fmt = torch.channels_last_3d
    x = F.silu(torch.randn(1, cin, side, side, side, device=dev)).to(torch.bfloat16).contiguous(memory_format=fmt)
    w = (torch.randn(cout, cin, 3, 3, 3, device=dev) / (27 * cin) ** 0.5).to(torch.bfloat16)
    ref = F.conv3d(x.float(), w.float(), padding=1)
    flop = 2 * side ** 3 * cin * cout * 27
    rows = []
    bf16 = lambda: F.conv3d(x, w, padding=1)
    ms = _replay_ms(bf16, dev, reps)
    rows.append(dict(impl="torch bf16", plan="", ms=ms, rel_err=rel_err(bf16(), ref)))
    xq = fp8.quantize_activation(x)
    wq, descale = fp8.quantize_weight(w)
    try:
        conv = fp8.Fp8Conv(tuple(xq.shape), cout, padding=1, device=dev)
    except Exception as err:  # per-channel descale refused: per-tensor, with the weight's largest channel
        print(f"per-channel FP8 graph refused ({str(err)[:300]}); trying per-tensor", flush=True)
        conv = fp8.Fp8Conv(tuple(xq.shape), cout, padding=1, device=dev, per_channel=False)
        wq, descale = fp8.quantize_weight(w, per_channel=False)
    for index in range(conv.plan_count):
        conv.use_plan(index)
        call = lambda: conv(xq, wq, descale)
        try:
            ms = _replay_ms(call, dev, reps)
        except Exception as err:  # a plan that cannot run (or be captured) is listed, not fatal
            rows.append(dict(impl="cudnn fp8", plan=conv.plan_name(index), ms=float("nan"), rel_err=float("nan"),
                             error=str(err)[:200]))
            continue
        rows.append(dict(impl="cudnn fp8", plan=conv.plan_name(index), ms=ms, rel_err=rel_err(call(), ref)))
    quant = lambda: fp8.quantize_activation(x)
    rows.append(dict(impl="quantize input", plan="", ms=_replay_ms(quant, dev, reps), rel_err=float("nan")))
    ref_q = F.conv3d(xq.float(), fp8.dequantize_weight(wq, descale), padding=1)
    conv.use_plan(0)
    exact = rel_err(conv(xq, wq, descale), ref_q)
    for r in rows:
        r.update(cin=cin, cout=cout, side=side, tflops=flop / r["ms"] / 1e9 if r["ms"] == r["ms"] else float("nan"),
                 rel_err_vs_quantized_ref=exact if r["impl"] == "cudnn fp8" else float("nan"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the FP8 probe needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    rows = []
    for shape in SHAPES:
        rows += probe(*shape, args.reps)
        best = min((r for r in rows if r["impl"] == "cudnn fp8" and r["ms"] == r["ms"] and r["cin"] == shape[0]
                    and r["side"] == shape[2] and r["cout"] == shape[1]), key=lambda r: r["ms"], default=None)
        base = next(r for r in rows if r["impl"] == "torch bf16" and (r["cin"], r["cout"], r["side"]) == shape)
        print(shape, f"bf16 {base['ms']:.3f} ms", f"fp8 best {best['ms']:.3f} ms ({best['plan']})" if best else "no fp8 plan",
              flush=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

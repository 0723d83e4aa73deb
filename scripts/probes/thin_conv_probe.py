"""The thin 3³ convolutions (medddpm/net/kernels.py ``conv3d_thin``) against cuDNN, per pass, and the
trilinear ×2 upsampling kernel (``kernels.upsample2x``) against Inductor's kernels of its reference.

    python scripts/probes/thin_conv_probe.py --out thin_convs.csv        # needs a CUDA GPU

For the whole-head model's two thin convolutions at 128³ (the stem, 3→64, and the output
convolution, 64→1; bf16, NDHWC) and each pass a training step runs (forward, weight gradient, and
the output convolution's data gradient), the median milliseconds of cuDNN (autotuned: the shape's
best it offers PyTorch) and of the Triton kernels for each candidate ``Tiles``, each replayed as a
CUDA graph, with the bandwidth the pass's minimal bytes imply (its wide side read or written once).
The upsampling (64³ → 128³, 64 channels: the decoder's last) is timed for each ``UPSAMPLE_CANDIDATES``
against ``torch.compile(ndhwc.upsample2x)`` (impl "Inductor"); its minimal bytes are its input read
and its output written once.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import pandas as pd
import torch
import torch.nn.functional as F

from medddpm.net import kernels
from medddpm.profiling.layers import _replay_ms

SHAPES = [(3, 64), (64, 1)]  # (C_in, C_out) of the stem and of the output convolution
T = kernels.Tiles()
CANDIDATES = [
    T,
    dataclasses.replace(T, conv_tile=2048, wgrad_tile=2048),
    dataclasses.replace(T, conv_warps=8, wgrad_tile=8192, wgrad_programs_per_sm=8, stages=2),
    dataclasses.replace(T, conv_tile=2048, conv_warps=2, wgrad_warps=4, wgrad_programs_per_sm=8),
    dataclasses.replace(T, conv_tile=1024, conv_warps=2),
    dataclasses.replace(T, conv_tile=2048, conv_warps=4),
    dataclasses.replace(T, conv_tile=8192, conv_warps=8),
    *(dataclasses.replace(T, conv_programs_per_sm=k) for k in (0, 2, 4)),
    dataclasses.replace(T, conv_programs_per_sm=4, conv_tile=16384),
]
UPSAMPLE_CANDIDATES = [dataclasses.replace(T, upsample_tile=tile, upsample_warps=warps)
                       for tile in (1024, 2048, 4096, 8192) for warps in (2, 4, 8) if tile // warps >= 256]
FIELDS = [f.name for f in dataclasses.fields(kernels.Tiles)
          if f.name.startswith(("conv", "wgrad", "upsample")) or f.name == "stages"]


def passes(cin: int, cout: int, side: int, device: torch.device):
    """{pass: (cuDNN call, Triton call, minimal bytes)} of one thin convolution."""
    fmt = torch.channels_last_3d
    x = torch.randn(1, cin, side, side, side, device=device, dtype=torch.bfloat16).contiguous(memory_format=fmt)
    w = (0.1 * torch.randn(cout, cin, 3, 3, 3, device=device)).to(torch.bfloat16)
    b = torch.randn(cout, device=device, dtype=torch.bfloat16)
    dy = torch.randn(1, cout, side, side, side, device=device, dtype=torch.bfloat16).contiguous(memory_format=fmt)
    vox = side ** 3 * 2  # bytes per channel
    args = lambda mask: (dy, x, w, [cout], (1,) * 3, (1,) * 3, (1,) * 3, False, (0,) * 3, 1, mask)
    out = {"forward convolution": (lambda: F.conv3d(x, w, b, padding=1),
                                   lambda: torch.ops.medddpm.conv3d_thin(x, w, b), vox * (cin + cout)),
           "weight gradient": (lambda: torch.ops.aten.convolution_backward(*args((False, True, True))),
                               lambda: torch.ops.medddpm.conv3d_thin_backward(dy, x, w, True, False), vox * (cin + cout))}
    if cin > kernels.THIN:  # the stem's input needs no gradient
        out["data gradient"] = (lambda: torch.ops.aten.convolution_backward(*args((True, False, False))),
                                lambda: kernels._thin_pass(dy, w, None, dgrad=True), vox * (cin + cout))
    return out


def upsample_rows(side: int, device: torch.device, reps: int, channels: int = 64) -> list[dict]:
    """The decoder's last upsampling ((side/2)³ → side³, ``channels``, bf16, NDHWC): Inductor's
    kernels of the reference, then the Triton kernel under each ``UPSAMPLE_CANDIDATES``."""
    from medddpm.net import ndhwc

    half = side // 2
    x = torch.randn(1, channels, half, half, half, device=device, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    base = {"shape": f"{channels} ch {half}³→{side}³", "pass": "trilinear ×2",
            "min_mb": (half ** 3 + side ** 3) * channels * 2 / 1e6}
    reference = torch.compile(ndhwc.upsample2x)
    rows = [{**base, "impl": "Inductor", "candidate": -1, "ms": _replay_ms(lambda: reference(x), device, reps)}]
    for i, tiles in enumerate(UPSAMPLE_CANDIDATES):
        kernels.TILES = tiles
        rows.append({**base, "impl": "Triton", "candidate": i, "ms": _replay_ms(lambda: kernels.upsample2x(x), device, reps),
                     **{f: getattr(tiles, f) for f in FIELDS}})
    kernels.TILES = T
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    rows = []
    for cin, cout in SHAPES:
        for name, (cudnn, triton, nbytes) in passes(cin, cout, a.side, dev).items():
            base = {"shape": f"{cin}→{cout} k3 {a.side}³", "pass": name, "min_mb": nbytes / 1e6}
            rows.append({**base, "impl": "cuDNN", "candidate": -1, "ms": _replay_ms(cudnn, dev, a.reps)})
            for i, tiles in enumerate(CANDIDATES):
                kernels.TILES = tiles
                rows.append({**base, "impl": "Triton", "candidate": i, "ms": _replay_ms(triton, dev, a.reps),
                             **{f: getattr(tiles, f) for f in FIELDS}})
            kernels.TILES = T
    rows += upsample_rows(a.side, dev, a.reps)
    df = pd.DataFrame(rows)
    df["tb_s"] = df["min_mb"] / df["ms"] / 1e6 * 1e3
    df.to_csv(a.out, index=False)
    print(df[["shape", "pass", "impl", "candidate", "ms", "tb_s"]].round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Where ε's offset under cuDNN's bf16 thin convolutions comes from (issue 20, chapter 07).

    thin_offset_probe.py OUT.csv [--size 64]

For the stem (3 → 64) and the output convolution (64 → 1), NDHWC, seeded inputs and weights already
rounded to bf16: the signed mean and relative L2 of the error of cuDNN's bf16 convolution and of
``kernels.conv3d_thin`` against the same numbers convolved in float64, with and without a bias. An offset that a bias-free convolution also shows is the kernel's, not the bias's rounding.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch
import torch.nn.functional as F

from medddpm.net import kernels
from medddpm.core.io import append_csv
from medddpm.core.runtime import env_info

SHAPES = {"stem 3→64": (3, 64), "output 64→1": (64, 1)}


def probe(size: int, device: torch.device, seed: int = 0) -> pd.DataFrame:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for name, (cin, cout) in SHAPES.items():
        x = torch.randn(1, cin, size, size, size, generator=gen).to(device, torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last_3d)
        w = (torch.randn(cout, cin, 3, 3, 3, generator=gen) / (27 * cin) ** 0.5).to(device, torch.bfloat16)
        w = w.contiguous(memory_format=torch.channels_last_3d)
        b = torch.full((cout,), 0.3, device=device).to(torch.bfloat16)
        for bias in (None, b):
            ref = F.conv3d(x.double(), w.double(), None if bias is None else bias.double(), padding=1)
            for engine, y in (("cudnn", F.conv3d(x, w, bias, padding=1)),
                              ("triton", kernels.conv3d_thin(x, w, bias))):
                err = y.double() - ref
                rows.append({"conv": name, "size": size, "bias": bias is not None, "engine": engine,
                             "mean_err": float(err.mean()), "rel_l2": float(err.norm() / ref.norm()),
                             "ref_rms": float(ref.square().mean().sqrt())})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="CSV to append the rows to")
    p.add_argument("--size", type=int, default=64, help="side of the cubic volume (default 64)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("thin_offset_probe.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    df = probe(a.size, device)
    append_csv(a.out, df, env_info(device))
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

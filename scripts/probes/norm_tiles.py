"""Launch shapes of the Triton GroupNorm kernels (medddpm/net/kernels.py ``Tiles``), timed per kernel.

    python scripts/probes/norm_tiles.py --out norm_tiles.csv        # needs a CUDA GPU

For the model's large norm shapes (bf16, NDHWC, forward + backward) and each candidate ``Tiles``,
every kernel's mean GPU time from torch.profiler, with the bytes it must move (reads + writes of
tensor size) and the bandwidth that implies. The best candidate per kernel becomes ``kernels.TILES``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from medddpm.net import kernels

SHAPES = [(128, 128, False), (64, 128, True), (64, 64, True), (192, 64, False), (128, 32, True)]  # (C, side, +emb)
T = kernels.Tiles()
CANDIDATES = [
    T,
    kernels.Tiles(stages=1),
    kernels.Tiles(stages=4, programs_per_sm=4),
    kernels.Tiles(programs_per_sm=16, reduce_tile=1024),
    kernels.Tiles(stats_tile=8192, stats_warps=8, reduce_tile=4096, reduce_warps=8, dx_tile=1024, apply_tile=8192,
                  apply_warps=8),
    kernels.Tiles(stages=2, dx_tile=4096, dx_warps=8),
]
FIELDS = [f.name for f in dataclasses.fields(kernels.Tiles)]
TENSOR_PASSES = {"_stats_kernel": 1, "_apply_kernel": 2, "_bwd_reduce_kernel": 2, "_bwd_dx_kernel": 3}


def time_kernels(c: int, side: int, add: bool, tiles: kernels.Tiles, reps: int = 5) -> pd.DataFrame:
    kernels.TILES = tiles
    dev = torch.device("cuda")
    x = torch.randn(1, c, side, side, side, device=dev, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last_3d).requires_grad_(True)
    w = torch.randn(c, device=dev, requires_grad=True)
    b = torch.randn(c, device=dev, requires_grad=True)
    a = torch.randn(1, c, device=dev, dtype=torch.bfloat16, requires_grad=True) if add else None
    g = torch.randn_like(x)

    def call():
        kernels.group_norm_silu(x, 32, w, b, 1e-5, True, a).backward(g)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    rows = [{"kernel": e.name, "us": e.device_time} for e in prof.events() if e.device_time > 0]
    t = pd.DataFrame(rows).groupby("kernel", as_index=False)["us"].sum()
    t["us"] /= reps
    n_bytes = x.numel() * 2
    t["min_gb"] = [TENSOR_PASSES.get(k, 0) * n_bytes / 1e9 for k in t["kernel"]]
    t["tbs"] = t["min_gb"] / t["us"] * 1e3
    return t.assign(channels=c, side=side, add=add, **dataclasses.asdict(tiles))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("norm_tiles: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    frames = [time_kernels(c, side, add, tiles).assign(candidate=i)
              for c, side, add in SHAPES for i, tiles in enumerate(CANDIDATES)]
    t = pd.concat(frames, ignore_index=True)
    t.to_csv(a.out, index=False)
    key = ["channels", "side", "add", "kernel"]
    best = t.loc[t.groupby(key)["us"].idxmin()]
    print(t.pivot_table(index=key, columns="candidate", values="us").round(1).to_string())
    print(best[key + ["us", "tbs", *FIELDS]].round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())

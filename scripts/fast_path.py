#!/usr/bin/env python3
"""Measurements of the fast path (issue 9) that ``medddpm bench`` does not make, for one GPU:

    fast_path.py peaks --out DIR                       # bf16 matmul TFLOP/s, copy GB/s → peaks.json
    fast_path.py agree --out DIR --size 128 --configs fast,bf16   # ε vs FP32 baseline → agreement.csv
    fast_path.py loss  --out DIR --size 128 --configs fast --seeds 0 [--steps 50]  # → loss_parity.csv

All logic lives in ``medddpm.profiling.bench`` and ``medddpm.train.parity``; rows append (atomically) so several
calls build one table. Every file gets the environment of the run beside it (``*.env.json``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from medddpm.profiling.bench import measure_peaks
from medddpm.core.config import model_preset, run_config
from medddpm.core.io import append_csv, write_text_atomic
from medddpm.train.parity import denoiser_agreement, short_training
from medddpm.core.runtime import env_info, resolve_device


def _append(path: Path, df: pd.DataFrame) -> None:
    append_csv(path, df, env_info())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["peaks", "agree", "loss"], help="which measurement")
    p.add_argument("--out", required=True, help="results folder of this GPU")
    p.add_argument("--model", default="whole-head", help="model preset")
    p.add_argument("--size", type=int, default=128, help="side of the cubic volume")
    p.add_argument("--configs", default="fast", help="comma-separated configurations")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (loss)")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps (loss)")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    a = p.parse_args(argv)
    out = Path(a.out)
    device = resolve_device(a.device)
    cfg = model_preset(a.model)
    configs = [run_config(c).name for c in a.configs.split(",")]
    if a.what == "peaks":
        peaks = {**measure_peaks(device), "env": env_info(device)}
        write_text_atomic(out / "peaks.json", json.dumps(peaks, indent=2, default=str))
        print(f"bf16 matmul {peaks['bf16_matmul_tflops']:.0f} TFLOP/s, copy {peaks['copy_gbps']:.0f} GB/s")
    elif a.what == "agree":
        df = denoiser_agreement(cfg, configs, a.size, device)
        _append(out / "agreement.csv", df)
        print(df.groupby("config")[["rel_l2", "max_abs"]].max().to_string())
    else:
        for seed in (int(s) for s in a.seeds.split(",")):
            for name in configs:
                df = short_training(cfg, name, a.size, device, a.steps, seed)
                _append(out / "loss_parity.csv", df)
                ev = df[df["kind"] == "eval"]["loss"].iloc[0]
                print(f"{name} seed {seed}: train loss {df['loss'].iloc[-2]:.4f}, held-out {ev:.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

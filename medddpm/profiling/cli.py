"""Profiling verbs of the ``medddpm`` CLI."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError


def cmd_torch_kernels(a: argparse.Namespace) -> None:
    from ..config import model_preset, run_config
    from ..io import atomic_path, write_text_atomic
    from ..runtime import env_info, resolve_device
    from .torchprof import step_kernels, window_coverage

    cfg = model_preset(a.model)
    device = resolve_device("cuda")
    configs = [run_config(c) for c in a.configs.split(",")]
    out = Path(a.out)
    for knobs in configs:
        res = step_kernels(cfg, knobs, (a.size,) * 3, device, a.warmup)
        if res["step"].empty:
            raise InputError(f"{knobs.name}: the profiler recorded no kernels")
        cov = window_coverage(res["first"], res["step"])
        folder = out / knobs.name
        for name in ("first", "step"):
            with atomic_path(folder / f"torch_{name}_kernels.parquet", ".parquet") as tmp:
                res[name].to_parquet(tmp, index=False)
        meta = {"coverage": cov, "settings": res["settings"], "model": cfg.name, "size": a.size,
                "config": knobs.name, "env": env_info(device),
                "command": f"medddpm torch-kernels --model {a.model} --configs {knobs.name} --size {a.size}"}
        write_text_atomic(folder / "torch_kernels.json", json.dumps(meta, indent=2, default=str))
        print(f"{knobs.name}: {cov['step_kernels']} kernels in a step, {cov['step_kernel_us'] / 1e3:.1f} ms "
              f"of kernel time; the paper's 100-kernel window covers {100 * cov['coverage']:.1f} %")


def add_profiling_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("torch-kernels", help="every kernel of a steady-state step (torch.profiler)")
    s.add_argument("--model", default="whole-head")
    s.add_argument("--configs", default="baseline,opt1,opt2,opt12,pytorch-default")
    s.add_argument("--size", type=int, default=128)
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--out", required=True, help="results folder of one GPU, e.g. data/results/h200")
    s.set_defaults(func=cmd_torch_kernels)

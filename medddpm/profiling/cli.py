"""Profiling verbs of the ``medddpm`` CLI: profile (Nsight Compute), ncu-tidy, torch-kernels."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..core.errors import InputError


def _configs(text: str) -> list[str]:
    from ..core.config import run_config

    names = [c.strip() for c in text.split(",") if c.strip()]
    for n in names:
        run_config(n)  # validates
    if not names:
        raise InputError("--configs is empty")
    return names


def cmd_profile(a: argparse.Namespace) -> None:
    from ..core.config import model_preset
    from ..core.runtime import env_info, resolve_device
    from .ncu import find_ncu, ncu_version, profile_config
    from .store import check_one_setup, update_env

    configs = _configs(a.configs)
    model_preset(a.model).check_size((a.size,) * 3)
    out = Path(a.out)
    check_one_setup(out, a.model, a.size)
    ncu = find_ncu(a.ncu)
    device = resolve_device("cuda")
    out.mkdir(parents=True, exist_ok=True)
    env = env_info(device)
    update_env(out, gpu_label=a.gpu_label, gpu=env, ncu=ncu_version(ncu))
    for name in configs:
        t0 = time.time()
        meta = profile_config(ncu, a.mode, a.model, name, a.size, a.warmup, out, a.timeout, a.replay, a.step_set,
                             a.max_kernels)
        update_env(out, commands={f"{a.mode}/{name}": meta["command"]}, knobs={name: meta["settings"]})
        passes = f", {meta['passes_min']}–{meta['passes_max']} passes a kernel" if meta["passes_max"] else ""
        print(f"{name}: {meta['kernels']} kernels profiled ({a.mode} mode{passes}) in {time.time() - t0:.0f} s "
              f"→ {out / name}", flush=True)


def cmd_ncu_tidy(a: argparse.Namespace) -> None:
    from ..core.io import atomic_path
    from .tidy import tidy

    tables = tidy(a.raw, a.details, a.instances)
    out = Path(a.out)
    for name, df in tables.items():
        with atomic_path(out / f"{name}.parquet", ".parquet") as tmp:
            df.to_parquet(tmp, index=False)
        if a.csv:
            with atomic_path(out / f"{name}.csv") as tmp:
                df.to_csv(tmp, index=False)
    print(", ".join(f"{n}: {len(df)} rows" for n, df in tables.items()) + f" → {out}")


def cmd_torch_kernels(a: argparse.Namespace) -> None:
    from ..core.config import model_preset, run_config
    from ..core.io import atomic_path, write_text_atomic
    from ..core.runtime import env_info, resolve_device
    from .store import check_one_setup
    from .torchprof import step_kernels, window_coverage

    cfg = model_preset(a.model)
    cfg.check_size((a.size,) * 3)
    configs = [run_config(c) for c in _configs(a.configs)]
    out = Path(a.out)
    check_one_setup(out, cfg.name, a.size)
    device = resolve_device("cuda")
    for knobs in configs:
        res = step_kernels(cfg, knobs, (a.size,) * 3, device, a.warmup)
        if res["step"].empty:
            raise InputError(f"{knobs.name}: the profiler recorded no kernels")
        cov = window_coverage(res["first"], res["step"])
        folder = out / knobs.name
        for name in ("first", "step"):
            with atomic_path(folder / f"torch_{name}_kernels.parquet", ".parquet") as tmp:
                res[name].to_parquet(tmp, index=False)
        # coverage is derived from the two tables: printed here, recomputed by the book (tables.coverage)
        meta = {"settings": res["settings"], "model": cfg.name, "size": a.size,
                "config": knobs.name, "env": env_info(device),
                "command": f"medddpm torch-kernels --model {a.model} --configs {knobs.name} --size {a.size}"}
        write_text_atomic(folder / "torch_kernels.json", json.dumps(meta, indent=2, default=str))
        print(f"{knobs.name}: {cov['step_kernels']} kernels in a step, {cov['step_kernel_us'] / 1e3:.1f} ms "
              f"of kernel time; the paper's 100-kernel window covers {100 * cov['coverage']:.1f} %")


def add_profiling_commands(sub: argparse._SubParsersAction) -> None:
    from ..core.config import ALL_CONFIGS
    from .ncu import DEFAULT_STEP_SET, MODES, STEP_SETS

    s = sub.add_parser("profile", help="Nsight Compute profiles of the workload, reduced to tables")
    s.add_argument("--gpu-label", required=True, help="name recorded in env.json, e.g. h200")
    s.add_argument("--configs", default=ALL_CONFIGS, help="comma-separated configurations")
    s.add_argument("--out", required=True, help="results folder of this GPU, e.g. data/results/h200")
    s.add_argument("--size", type=int, default=128, help="side of the cubic volume")
    s.add_argument("--model", default="whole-head", help="model preset")
    s.add_argument("--mode", default="step", choices=list(MODES),
                   help="paper (the paper's ncu options), step (one whole step, --step-set metrics) or roofline "
                        "(one whole step: time, DRAM bytes and the FLOPs of the configuration's tensor or FP32 path)")
    s.add_argument("--warmup", type=int, default=2, help="step and roofline mode: steps before the profiled one")
    s.add_argument("--timeout", type=float, default=None, help="seconds per configuration before ncu is stopped")
    s.add_argument("--replay", default="kernel", choices=["kernel", "application"],
                   help="step and roofline mode: ncu replay mode")
    s.add_argument("--step-set", default=DEFAULT_STEP_SET, choices=sorted(STEP_SETS),
                   help="step mode: metric groups (lean: core+pipes; standard: +memory+stalls; full: +instruction classes)")
    s.add_argument("--max-kernels", type=int, help="step and roofline mode: profile only the first N kernels of the step")
    s.add_argument("--ncu", help="path to ncu (default: $NCU or ncu on PATH)")
    s.set_defaults(func=cmd_profile)

    s = sub.add_parser("ncu-tidy", help="ncu CSV exports → tidy kernel / rule / instruction tables")
    s.add_argument("--raw", required=True, help="ncu --import R --csv --page raw --print-units base")
    s.add_argument("--details", help="ncu --import R --csv --page details")
    s.add_argument("--instances", help="… --page raw --print-metric-instances details --metrics "
                                         "sass__inst_executed_per_opcode_category")
    s.add_argument("--out", required=True, help="folder for the parquet tables")
    s.add_argument("--csv", action="store_true", help="also write CSV copies")
    s.set_defaults(func=cmd_ncu_tidy)

    s = sub.add_parser("torch-kernels", help="every kernel of a steady-state step (torch.profiler)")
    s.add_argument("--model", default="whole-head", help="model preset")
    s.add_argument("--configs", default=ALL_CONFIGS, help="comma-separated configurations")
    s.add_argument("--size", type=int, default=128, help="side of the cubic volume")
    s.add_argument("--warmup", type=int, default=2, help="steps before the recorded one")
    s.add_argument("--out", required=True, help="results folder of one GPU, e.g. data/results/h200")
    s.set_defaults(func=cmd_torch_kernels)

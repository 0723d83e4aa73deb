"""Every GPU kernel of a steady-state training step, with its duration, from torch.profiler (no
ncu needed): the ground truth for the kernel mix and for how much of a step the paper's ncu
window (``--launch-skip 10 --launch-count 100`` from process start, §3.2) covers."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..core.config import Knobs, ModelConfig

if TYPE_CHECKING:  # the tables below are read by the book's chapters, which need not import torch
    import torch

PAPER_SKIP, PAPER_COUNT = 10, 100  # paper §3.2: --launch-skip 10 --launch-count 100
# A GPU-side user annotation such as "Optimizer.step#Adam.step" (PyTorch's optimizers wrap their
# step in record_function, and the profiler draws that range on the GPU track too): a span over
# kernels, not a kernel. Kernel names never look like this (demangled lambdas carry '#' but also
# parentheses or braces).
ANNOTATION = re.compile(r"^[\w.]+#[\w.]+$")


def kernels_only(df: pd.DataFrame) -> pd.DataFrame:
    """Drop user-annotation rows (see ``ANNOTATION``) from a kernel table and renumber ``launch``.
    Tables recorded before this filter existed carry one such row per optimizer step."""
    out = df[~df["name"].str.match(ANNOTATION)].reset_index(drop=True)
    out["launch"] = range(len(out))
    return out


def _kernels(prof) -> pd.DataFrame:
    import torch

    rows = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.name.startswith(("Memcpy", "Memset")):
            rows.append({"name": ev.name, "start_us": ev.time_range.start, "duration_us": ev.time_range.elapsed_us()})
    df = pd.DataFrame(rows, columns=["name", "start_us", "duration_us"])
    df = df.sort_values("start_us", kind="stable").reset_index(drop=True)
    return kernels_only(df)


def step_kernels(cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
                 warmup: int = 2) -> dict[str, Any]:
    """Kernels of the process's first step (launch order from process start, as ncu counts them)
    and of one steady-state step after ``warmup`` more steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .workload import Workload

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as first:
        work = Workload(cfg, knobs, size, device)
        work.step()
        torch.cuda.synchronize(device)
    for _ in range(warmup):
        work.step()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as steady:
        work.step()
        torch.cuda.synchronize(device)
    return {"first": _kernels(first), "step": _kernels(steady), "settings": work.settings()}


def window_coverage(first: pd.DataFrame, step: pd.DataFrame, skip: int = PAPER_SKIP,
                    count: int = PAPER_COUNT) -> dict[str, float]:
    """Share of a steady step's kernel time that the paper's ncu window would have seen."""
    window = first.iloc[skip: skip + count]
    total = float(step["duration_us"].sum())
    return {
        "window_kernels": int(len(window)), "step_kernels": int(len(step)),
        "window_us": float(window["duration_us"].sum()), "step_kernel_us": total,
        "coverage": float(window["duration_us"].sum()) / total if total else float("nan"),
    }

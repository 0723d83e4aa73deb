"""Timing one training step (forward + L1 loss + backward + Adam, batch 1) per configuration.

Step and forward times come from CUDA events after warm-up (wall clock on CPU); peak memory from
``torch.cuda.max_memory_allocated``. Rows append to a CSV whose columns are fixed (``COLUMNS``).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..core.config import Knobs, ModelConfig
from ..core.errors import InputError
from ..core.runtime import env_info, preserved_backend_flags, set_tf32
from ..run.engine import GRAPH_WARMUP
from .workload import Workload

COLUMNS = [
    "gpu", "config", "model", "size", "batch", "step_ms_median", "step_ms_min", "step_ms_max",
    "fwd_ms_median", "peak_mem_gib", "torch", "cuda", "cudnn", "tf32_conv", "tf32_matmul",
    "channels_last", "precision", "grad_accum",
]


class Timer:
    """Marks on a device timeline: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        if self.cuda:
            b.synchronize()
            return float(a.elapsed_time(b))
        return (b - a) * 1e3


def bench(model_cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
          steps: int = 10, warmup: int = 3, batch: int = 1, grad_accum: int = 1) -> dict[str, Any]:
    """Time ``warmup`` + ``steps`` training steps of ``grad_accum`` micro-batches of ``batch``
    volumes; one CSV row (``COLUMNS``) plus the raw per-step times, the effective settings and the
    environment. The forward time is NaN where the step is one CUDA graph (forward and backward
    are not separable there); a configuration with CUDA graphs needs ``warmup`` >
    ``engine.GRAPH_WARMUP`` to time replays."""
    if steps < 1 or warmup < 0 or batch < 1 or grad_accum < 1:
        raise InputError(f"--steps, --batch and --grad-accum must be >= 1 and --warmup >= 0, got {steps}, {batch}, "
                         f"{grad_accum} and {warmup}")
    work = Workload(model_cfg, knobs, size, device, batch, grad_accum)
    timer = Timer(device)
    graphed = work.engine.train_step.graphed
    if graphed and warmup <= GRAPH_WARMUP:
        raise InputError(f"{knobs.name} captures a CUDA graph after {GRAPH_WARMUP} steps: --warmup must be "
                         f"above {GRAPH_WARMUP} so that only replays are timed")
    # peak memory from the step that captures the graph (its memory stays reserved for replays),
    # else from the first timed step
    reset_at = GRAPH_WARMUP if graphed else warmup
    step_ms, fwd_ms = [], []
    for i in range(warmup + steps):
        if i == reset_at and device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        _, (t0, t1, t2) = work.step(timer.mark)
        if i >= warmup:
            step_ms.append(timer.ms(t0, t2))
            fwd_ms.append(float("nan") if t1 is None else timer.ms(t0, t1))
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    env = env_info(device)
    eff = work.settings()
    row = {
        "gpu": env["gpu"] or "cpu", "config": knobs.name, "model": model_cfg.name,
        "size": "x".join(map(str, size)), "batch": batch,
        "step_ms_median": round(statistics.median(step_ms), 3),
        "step_ms_min": round(min(step_ms), 3), "step_ms_max": round(max(step_ms), 3),
        "fwd_ms_median": round(statistics.median(fwd_ms), 3),
        "peak_mem_gib": round(peak, 3), "torch": env["torch"], "cuda": env["cuda"],
        "cudnn": env["cudnn"], "tf32_conv": eff["tf32_conv"], "tf32_matmul": eff["tf32_matmul"],
        "channels_last": eff["channels_last"], "precision": eff["precision"], "grad_accum": grad_accum,
    }
    del work
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"row": row, "raw": {"step_ms": step_ms, "fwd_ms": fwd_ms}, "settings": eff, "env": env,
            "steps": steps, "warmup": warmup}


def measure_peaks(device: torch.device, n: int = 8192, copy_gib: float = 2.0, reps: int = 10) -> dict[str, float]:
    """The GPU's own ceilings, measured now: dense n×n×n matmul TFLOP/s in bf16, TF32 and true FP32
    (the compute roofs of the rungs' precisions) and device-to-device copy bandwidth in GB/s (bytes
    read + written), each the median of ``reps`` after warm-up."""
    if device.type != "cuda":
        raise InputError("measuring the GPU's peaks needs a CUDA device")
    timer = Timer(device)

    def median_ms(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            a = timer.mark()
            fn()
            times.append(timer.ms(a, timer.mark()))
        return statistics.median(times)

    def matmul_tflops(dtype: torch.dtype, tf32: bool) -> float:
        lhs, rhs = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        with preserved_backend_flags():
            set_tf32(tf32)
            ms = median_ms(lambda: lhs @ rhs)
        return 2 * n**3 / (ms * 1e-3) / 1e12

    peaks = {"bf16_matmul_tflops": matmul_tflops(torch.bfloat16, False),
             "tf32_matmul_tflops": matmul_tflops(torch.float32, True),
             "fp32_matmul_tflops": matmul_tflops(torch.float32, False), "matmul_n": n}
    src = torch.empty(int(copy_gib * 2**30) // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    nbytes = 2 * src.numel() * 4
    return {**peaks, "copy_gbps": nbytes / (copy_ms * 1e-3) / 1e9, "copy_gib": copy_gib}

"""Timing the sampling of whole volumes (DDPM, DDIM or a few-step solver) per run configuration.

Seeded weights and phantom masks, so no checkpoint or data is needed. One untimed short run
(DDIM and DDPM, ``WARMUP_STEPS`` steps each) per shape compiles, autotunes and captures the denoiser's CUDA
graph; then every timed repeat samples the whole chain, timed with CUDA events (wall clock on a
CPU). Rows append to ``sample_bench.csv`` (``COLUMNS``).
"""
from __future__ import annotations

import contextlib
import statistics
from typing import Any, Iterator

import pandas as pd
import torch

from .bench import Timer
from ..core.config import DEFAULT_ETA, DiffusionConfig, Knobs, ModelConfig
from ..data.resample import resize
from ..diffusion.gaussian import GaussianDiffusion
from ..run.engine import autocast, inference
from ..core.errors import InputError
from ..train.parity import phantom_batch, seeded_weights
from ..core.runtime import env_info
from ..diffusion.solvers import DEFAULT_SPACING, SOLVERS, check_sampler, denoiser_calls, takes_eta

COLUMNS = [
    "gpu", "config", "model", "size", "batch", "sampler", "steps", "s_per_volume_median", "s_per_volume_min",
    "s_per_volume_max", "peak_mem_gib", "torch", "cuda", "cudnn", "eta", "spacing",
]
WARMUP_STEPS = 3  # DDIM steps of the untimed run: enough to compile and capture every call shape


def first_ddpm_steps(diffusion: GaussianDiffusion, masks: torch.Tensor, channels: int, gen: torch.Generator,
                     steps: int) -> None:
    """Run DDPM's first ``steps`` steps of a chain on ``masks`` (a warm-up, or a profiled window)."""
    for _ in zip(range(steps), diffusion.ddpm_steps(masks, channels, gen)):
        pass


@contextlib.contextmanager
def warm_sampler(model_cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
                 batch: int = 1, seed: int = 0, diffusion_cfg: DiffusionConfig = DiffusionConfig()
                 ) -> Iterator[tuple[GaussianDiffusion, torch.Tensor, torch.Generator]]:
    """Seeded weights under ``knobs`` and ``batch`` phantom masks at ``size``, after one untimed
    short run (compilation, autotuning, graph capture); the block runs in inference mode and the
    configuration's autocast and gets (diffusion, masks, generator)."""
    model_cfg.check_size(size)
    _, masks = phantom_batch(model_cfg, max(size), batch, seed)
    masks = torch.stack([resize(m, size, "nearest") for m in masks]).to(device)
    _, diffusion, eff = inference(model_cfg, knobs, device, diffusion_cfg, seeded_weights(model_cfg, seed))
    gen = torch.Generator(device).manual_seed(seed)
    with torch.inference_mode(), autocast(eff, device):
        steps = max(WARMUP_STEPS, eff.capture_after + 2)  # eager calls, the capture, a replay (Knobs.capture_after)
        diffusion.sample(masks, model_cfg.out_channels, "ddim", min(steps, diffusion_cfg.timesteps), 0.0, gen)
        first_ddpm_steps(diffusion, masks, model_cfg.out_channels, gen, steps)  # its update is not DDIM's
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        yield diffusion, masks, gen


def bench_sample(model_cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
                 sampler: str = "ddim", steps: int | None = 50, batch: int = 1, repeats: int = 3,
                 seed: int = 0, diffusion_cfg: DiffusionConfig = DiffusionConfig(),
                 eta: float = DEFAULT_ETA, spacing: str | None = None) -> dict[str, Any]:
    """Seconds per volume to sample ``batch`` volumes with ``sampler`` (``steps`` DDIM steps at
    ``eta``, all T for DDPM, whose η is 1, or a few-step solver's ``steps`` at ``spacing``),
    median/min/max over ``repeats`` warm runs after one untimed run of the same chain; one CSV
    row plus the raw times."""
    try:
        check_sampler(sampler, steps, spacing, diffusion_cfg.timesteps, eta)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if sampler in SOLVERS:
        spacing = spacing or DEFAULT_SPACING
    steps = denoiser_calls(sampler, steps, diffusion_cfg.timesteps)
    if batch < 1 or repeats < 1:
        raise InputError(f"--batch and --repeats must be >= 1; got {batch}, {repeats}")
    timer = Timer(device)
    times = []
    with warm_sampler(model_cfg, knobs, size, device, batch, seed, diffusion_cfg) as (diffusion, masks, gen):
        for _ in range(1 + knobs.capture_after) if sampler in SOLVERS else ():  # the chain itself, untimed until
            diffusion.sample(masks, model_cfg.out_channels, sampler, steps, eta, gen, spacing=spacing)  # it is captured
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(repeats):
            a = timer.mark()
            diffusion.sample(masks, model_cfg.out_channels, sampler, steps, eta, gen, spacing=spacing)
            times.append(timer.ms(a, timer.mark()) / 1e3 / batch)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    env = env_info(device)
    row = {
        "gpu": env["gpu"] or "cpu", "config": knobs.name, "model": model_cfg.name,
        "size": "x".join(map(str, size)), "batch": batch, "sampler": sampler, "steps": steps,
        "s_per_volume_median": round(statistics.median(times), 4), "s_per_volume_min": round(min(times), 4),
        "s_per_volume_max": round(max(times), 4), "peak_mem_gib": round(peak, 3),
        "torch": env["torch"], "cuda": env["cuda"], "cudnn": env["cudnn"],
        "eta": 1.0 if sampler == "ddpm" else (eta if takes_eta(sampler) else float("nan")),
        "spacing": spacing or ("time" if sampler == "ddim" else ""),
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"row": row, "raw": {"s_per_volume": times}, "env": env}


def denoise_kernels(model_cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
                    steps: int = 5, seed: int = 0, sampler: str = "ddim") -> pd.DataFrame:
    """Where one sampling step's time goes: every GPU kernel of ``steps`` warm DDIM (η = 0) or DDPM denoising steps
    (torch.profiler; kernels inside a replayed CUDA graph included), summed per kernel name with
    its category, as launches and milliseconds per step, and the GPU's idle milliseconds per step
    just before its launches (``idle_ms_before``: launch gaps, waits on the host)."""
    from torch.profiler import ProfilerActivity, profile

    from .categories import category, short_name
    from .torchprof import _kernels

    if sampler not in ("ddpm", "ddim"):
        raise InputError(f"sampler must be 'ddpm' or 'ddim', got {sampler!r}")

    with warm_sampler(model_cfg, knobs, size, device, 1, seed) as (diffusion, masks, gen):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            if sampler == "ddim":
                diffusion.sample(masks, model_cfg.out_channels, "ddim", steps, 0.0, gen)
            else:
                first_ddpm_steps(diffusion, masks, model_cfg.out_channels, gen, steps)
            torch.cuda.synchronize(device)
    k = _kernels(prof)
    ends = (k["start_us"] + k["duration_us"]).cummax().shift(1)  # the GPU's busy-until before each launch
    k = k.assign(short_name=k["name"].map(short_name), category=k["name"].map(category),
                 gap_us=(k["start_us"] - ends).clip(lower=0).fillna(0))
    per = k.groupby(["category", "short_name"]).agg(size=("duration_us", "size"), sum=("duration_us", "sum"),
                                                    gap=("gap_us", "sum")).reset_index()
    return pd.DataFrame({"category": per["category"], "short_name": per["short_name"],
                         "launches_per_step": per["size"] / steps, "ms_per_step": per["sum"] / steps / 1e3,
                         "config": knobs.name, "steps_profiled": steps, "idle_ms_before": per["gap"] / steps / 1e3}
                        ).sort_values("ms_per_step", ascending=False).reset_index(drop=True)

"""Sampling with a trained checkpoint: one NIfTI per mask, in the mask's space (paper §2.1).

The denoiser runs under a run configuration of its own (``--config``; the checkpoint's training
configuration does not matter): inference mode, bf16 autocast, ``torch.compile`` and one CUDA
graph per denoising step where the configuration says so, several masks per batch. Each mask's
noise comes from a generator seeded by (seed, file name), so a mask's sample does not depend on
the batch it is in, nor, under torchrun, on the rank that draws it: rank r of W takes the masks
r, r + W, … of the sorted list and writes only those.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import torch

from .config import CONFIGS, DEFAULT_ETA, run_config
from .data import MASK_LABELS, list_nifti, load_mask_tensor, strip_nifti_suffix, write_like_mask
from .distributed import World, draw_seed
from .engine import autocast, inference
from .errors import InputError
from .train import configs_from_checkpoint, load_checkpoint


SAMPLING_DEFAULT = "fast-w16-tnorm-tconv-fold-up-update"  # the fastest DDPM sampler measured (issue 20): fold-up's denoiser, whose DDPM 250 samples match the FP32 model's (quality/sampler_numerics.csv), with DDPM's update compiled, whose chain equals the eager update's within 1e-5 (tests/test_diffusion.py, on an H200); the faster-looking fast-w16-p8 runs the thin convolutions (padded) in cuDNN's bf16 kernels, whose bias offsets bf16-graphs's ε, and was not checked for it; the FP8 configurations (…-update-fp8skip, …-update-fp8: DDPM 250 under 4 s on an H200) are faster still, but their samples move away from the FP32 model's voxel for voxel (quality/precision_agreement.csv), so they are chosen with --config, never by default


def default_config(device: torch.device) -> str:
    """The fastest configuration that runs on ``device``: ``SAMPLING_DEFAULT`` on a GPU, FP32 on a
    CPU (where bf16 autocast is slower and compile and graphs fall back to eager anyway)."""
    return SAMPLING_DEFAULT if device.type == "cuda" else "baseline"


def mask_seed(seed: int, mask: Path) -> int:
    """The generator seed of one mask file: (run seed, file name)."""
    return draw_seed(seed, zlib.crc32(strip_nifti_suffix(mask.name).encode()))


def sample_masks(checkpoint: str | Path, masks: str | Path, out: str | Path, device: torch.device,
                 sampler: str = "ddpm", steps: int | None = None, eta: float = DEFAULT_ETA, seed: int = 0,
                 weights: str = "ema", progress: bool = True, config: str | None = None, batch: int = 1,
                 world: World = World(), clip: bool = True) -> list[Path]:
    """Generate one image per mask file (this rank's share); every input is checked before
    anything is written, and each file is written atomically. ``clip``: x̂₀ clipped to [−1, 1] at
    every step (as the reference implementation does; ``False`` is DDPM Alg. 2 as published)."""
    if weights not in ("ema", "model"):
        raise InputError(f"--weights must be 'ema' or 'model', got {weights!r}")
    if sampler not in ("ddpm", "ddim"):
        raise InputError(f"--sampler must be 'ddpm' or 'ddim', got {sampler!r}")
    config = config or default_config(device)
    if config not in CONFIGS:
        raise InputError(f"--config {config!r} is not a run configuration; choose one of {', '.join(CONFIGS)}")
    if batch < 1:
        raise InputError(f"--batch must be >= 1, got {batch}")
    if eta < 0:
        raise InputError(f"--eta must be >= 0, got {eta}")
    ckpt = load_checkpoint(checkpoint)
    model_cfg, diff_cfg, _, _ = configs_from_checkpoint(ckpt)
    size = tuple(ckpt["config"]["size"])
    if sampler == "ddpm" and steps not in (None, diff_cfg.timesteps):
        raise InputError(f"the ddpm sampler runs all {diff_cfg.timesteps} steps; use --sampler ddim for {steps}")
    if sampler == "ddim" and steps is not None and not 1 <= steps <= diff_cfg.timesteps:
        raise InputError(f"--steps must be in [1, {diff_cfg.timesteps}], got {steps}")
    files = list_nifti(masks, "masks")
    if batch > len(files):
        raise InputError(f"--batch {batch} is larger than the {len(files)} mask(s) in {masks}")
    out = Path(out)
    targets = [out / f"{strip_nifti_suffix(f.name)}.nii.gz" for f in files]
    existing = [t.name for t in targets if t.exists()]
    if existing:
        raise InputError(f"{out} already holds {', '.join(existing)}; choose another --out")
    if model_cfg.name not in MASK_LABELS:
        raise InputError(f"the checkpoint's model {model_cfg.name!r} has no mask labels defined")
    # read every mask first (every rank reads all): a bad one fails before any output is written
    conds = [load_mask_tensor(f, model_cfg.name, size) for f in files]
    mine = list(range(world.rank, len(files), world.size))
    _, diffusion, knobs = inference(model_cfg, run_config(config), device, diff_cfg, ckpt[weights])
    n_steps = diff_cfg.timesteps if sampler == "ddpm" or steps is None else steps
    from tqdm.auto import tqdm

    written = []
    with tqdm(total=len(mine) * n_steps, disable=not progress, desc="sample", unit="step") as bar:
        for start in range(0, len(mine), batch):
            chunk = mine[start:start + batch]
            gens = [torch.Generator(device).manual_seed(mask_seed(seed, files[i])) for i in chunk]
            cond = torch.stack([conds[i] for i in chunk]).to(device)
            with torch.inference_mode(), autocast(knobs, device):
                x = diffusion.sample(cond, model_cfg.out_channels, sampler, steps, eta, gens, clip,
                                     on_step=lambda: bar.update(len(chunk)))
            x = x.float().cpu().numpy()
            for j, i in enumerate(chunk):
                write_like_mask(x[j], files[i], targets[i])
                written.append(targets[i])
    return written

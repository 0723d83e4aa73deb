"""Sampling with a trained checkpoint: one NIfTI per mask, in the mask's space (paper §2.1)."""
from __future__ import annotations

from pathlib import Path

import torch

from .data import MASK_LABELS, list_nifti, load_mask_tensor, strip_nifti_suffix, write_like_mask
from .engine import autocast, inference
from .errors import InputError
from .train import configs_from_checkpoint, load_checkpoint


def sample_masks(checkpoint: str | Path, masks: str | Path, out: str | Path, device: torch.device,
                 sampler: str = "ddpm", steps: int | None = None, eta: float = 0.0, seed: int = 0,
                 weights: str = "ema", progress: bool = True) -> list[Path]:
    """Generate one image per mask file; every input is checked before anything is written."""
    if weights not in ("ema", "model"):
        raise InputError(f"--weights must be 'ema' or 'model', got {weights!r}")
    if sampler not in ("ddpm", "ddim"):
        raise InputError(f"--sampler must be 'ddpm' or 'ddim', got {sampler!r}")
    ckpt = load_checkpoint(checkpoint)
    model_cfg, diff_cfg, _, knobs = configs_from_checkpoint(ckpt)
    size = tuple(ckpt["config"]["size"])
    if sampler == "ddpm" and steps not in (None, diff_cfg.timesteps):
        raise InputError(f"the ddpm sampler runs all {diff_cfg.timesteps} steps; use --sampler ddim for {steps}")
    if sampler == "ddim" and steps is not None and not 1 <= steps <= diff_cfg.timesteps:
        raise InputError(f"--steps must be in [1, {diff_cfg.timesteps}], got {steps}")
    files = list_nifti(masks, "masks")
    out = Path(out)
    targets = [out / f"{strip_nifti_suffix(f.name)}.nii.gz" for f in files]
    existing = [t.name for t in targets if t.exists()]
    if existing:
        raise InputError(f"{out} already holds {', '.join(existing)}; choose another --out")
    # read every mask first: a bad one fails before any output is written
    if model_cfg.name not in MASK_LABELS:
        raise InputError(f"the checkpoint's model {model_cfg.name!r} has no mask labels defined")
    conds = [load_mask_tensor(f, model_cfg.name, size) for f in files]
    _, diffusion, knobs = inference(model_cfg, knobs, device, diff_cfg, ckpt[weights])
    gen = torch.Generator(device=device).manual_seed(seed)
    from tqdm.auto import tqdm

    written = []
    for f, cond, target in tqdm(list(zip(files, conds, targets)), disable=not progress, desc="sample"):
        with autocast(knobs, device):
            x = diffusion.sample(cond[None].to(device), model_cfg.out_channels, sampler, steps, eta, gen)
        write_like_mask(x[0].float().cpu().numpy(), f, target)
        written.append(target)
    return written

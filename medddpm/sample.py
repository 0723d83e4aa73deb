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

from .config import CONFIGS, DEFAULT_ETA, SAMPLING_ALIASES, sampling_config
from .data import MASK_LABELS, list_nifti, load_mask_tensor, strip_nifti_suffix, write_like_mask
from .distributed import World, draw_seed
from .engine import autocast, inference
from .errors import InputError
from .solvers import RECOMMENDED, check_sampler, denoiser_calls
from .train import configs_from_checkpoint, load_checkpoint




def default_config(device: torch.device) -> str:
    """The fastest configuration that runs on ``device``: ``fast`` (``SAMPLING_ALIASES``) on a GPU,
    FP32 on a CPU (where bf16 autocast is slower and compile and graphs fall back to eager anyway)."""
    return "fast" if device.type == "cuda" else "baseline"


def mask_seed(seed: int, mask: Path) -> int:
    """The generator seed of one mask file: (run seed, file name)."""
    return draw_seed(seed, zlib.crc32(strip_nifti_suffix(mask.name).encode()))


class MaskSampler:
    """A checkpoint's denoiser under one run configuration, built once (compiled, its graphs
    captured on first use), that samples masks with any sampler: ``medddpm sample`` makes one
    per call; the sampler gate (``sampler_gate``) one per configuration for all its runs."""

    def __init__(self, ckpt: dict, device: torch.device, config: str, weights: str = "ema") -> None:
        self.model_cfg, self.diff_cfg, _, _ = configs_from_checkpoint(ckpt)
        self.device = device
        _, self.diffusion, self.knobs = inference(self.model_cfg, sampling_config(config), device, self.diff_cfg,
                                                  ckpt[weights])

    def write(self, files: list[Path], conds: list[torch.Tensor], targets: list[Path], mine: list[int],
              sampler: str, steps: int | None, eta: float, seed: int, batch: int, clip: bool,
              spacing: str | None, progress: bool = False) -> list[Path]:
        """Sample masks ``mine`` (indices of ``files``/``conds``) ``batch`` at a time, each from its
        own generator (``mask_seed``), and write each to its target atomically."""
        from tqdm.auto import tqdm

        n_steps = denoiser_calls(sampler, steps, self.diff_cfg.timesteps)
        written = []
        with tqdm(total=len(mine) * n_steps, disable=not progress, desc="sample", unit="step") as bar:
            for start in range(0, len(mine), batch):
                chunk = mine[start:start + batch]
                gens = [torch.Generator(self.device).manual_seed(mask_seed(seed, files[i])) for i in chunk]
                cond = torch.stack([conds[i] for i in chunk]).to(self.device)
                with torch.inference_mode(), autocast(self.knobs, self.device):
                    x = self.diffusion.sample(cond, self.model_cfg.out_channels, sampler, steps, eta, gens, clip,
                                              on_step=lambda: bar.update(len(chunk)), spacing=spacing)
                x = x.float().cpu().numpy()
                for j, i in enumerate(chunk):
                    write_like_mask(x[j], files[i], targets[i])
                    written.append(targets[i])
        return written


def check_options(sampler: str, steps: int | None, spacing: str | None, config: str, weights: str, batch: int,
                  eta: float, timesteps: int | None = None) -> None:
    """Refuse a sampling option (InputError: one line) before anything is read or written; the
    step count against the schedule's ``timesteps`` once the checkpoint says how many it has
    (``solvers.check_sampler``)."""
    if weights not in ("ema", "model"):
        raise InputError(f"--weights must be 'ema' or 'model', got {weights!r}")
    if config not in CONFIGS and config not in SAMPLING_ALIASES:
        raise InputError(f"--config {config!r} is not a run configuration; choose one of "
                         f"{', '.join([*SAMPLING_ALIASES, *CONFIGS])}")
    if batch < 1:
        raise InputError(f"--batch must be >= 1, got {batch}")
    if eta < 0:
        raise InputError(f"--eta must be >= 0, got {eta}")
    try:
        check_sampler(sampler, steps, spacing, timesteps)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def read_masks(masks: str | Path, out: str | Path, model: str, size: tuple[int, ...],
               batch: int = 1) -> tuple[list[Path], list[torch.Tensor], list[Path]]:
    """The mask files of ``masks``, each read and encoded for the model, and their targets under
    ``out``; refuses a target that exists, an unknown model and any bad mask before anything is written."""
    files = list_nifti(masks, "masks")
    if batch > len(files):
        raise InputError(f"--batch {batch} is larger than the {len(files)} mask(s) in {masks}")
    out = Path(out)
    targets = [out / f"{strip_nifti_suffix(f.name)}.nii.gz" for f in files]
    existing = [t.name for t in targets if t.exists()]
    if existing:
        raise InputError(f"{out} already holds {', '.join(existing)}; choose another --out")
    if model not in MASK_LABELS:
        raise InputError(f"the checkpoint's model {model!r} has no mask labels defined")
    # read every mask first (every rank reads all): a bad one fails before any output is written
    return files, [load_mask_tensor(f, model, size) for f in files], targets


def sample_masks(checkpoint: str | Path, masks: str | Path, out: str | Path, device: torch.device,
                 sampler: str = RECOMMENDED.sampler, steps: int | None = None, eta: float = DEFAULT_ETA, seed: int = 0,
                 weights: str = "ema", progress: bool = True, config: str | None = None, batch: int = 1,
                 world: World = World(), clip: bool = True, spacing: str | None = None) -> list[Path]:
    """Generate one image per mask file (this rank's share); every input is checked before
    anything is written, and each file is written atomically. ``clip``: x̂₀ clipped to [−1, 1] at
    every step (as the reference implementation does; ``False`` is DDPM Alg. 2 as published).
    ``sampler``: one of ``solvers.SAMPLERS``; ``steps`` and ``spacing``: its chain."""
    config = config or default_config(device)
    check_options(sampler, steps, spacing, config, weights, batch, eta)
    ckpt = load_checkpoint(checkpoint)
    model_cfg, diff_cfg, _, _ = configs_from_checkpoint(ckpt)
    check_options(sampler, steps, spacing, config, weights, batch, eta, diff_cfg.timesteps)
    files, conds, targets = read_masks(masks, out, model_cfg.name, tuple(ckpt["config"]["size"]), batch)
    mine = list(range(world.rank, len(files), world.size))
    return MaskSampler(ckpt, device, config, weights).write(files, conds, targets, mine, sampler, steps, eta, seed,
                                                            batch, clip, spacing, progress)

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..core.config import CONFIGS, DEFAULT_ETA, SAMPLING_ALIASES, sampling_config
from ..data.nifti import MASK_LABELS, list_nifti, load_mask_tensor, strip_nifti_suffix, write_like_mask
from ..run.distributed import World, draw_seed
from ..run.engine import autocast, inference
from ..core.errors import InputError
from ..diffusion.solvers import RECOMMENDED, check_sampler, denoiser_calls
from ..train.trainer import configs_from_checkpoint, load_checkpoint


@dataclass(frozen=True)
class Job:
    """One volume to sample: the ``name`` that seeds its noise (``mask_seed``), its encoded mask
    ``cond`` (M, I, J, K), the ``target`` it is written to and ``save(volume, target)``, which
    writes a (C, I, J, K) sample there in the mask's space."""

    name: str
    cond: torch.Tensor
    target: Path
    save: Callable[[np.ndarray, Path], None]

    def write(self, volume: np.ndarray) -> Path:
        self.save(volume, self.target)
        return self.target

    def to(self, folder: Path) -> "Job":
        """The same job written under another folder."""
        return replace(self, target=Path(folder) / self.target.name)


def default_config(device: torch.device) -> str:
    """The fastest configuration that runs on ``device``: ``fast`` (``SAMPLING_ALIASES``) on a GPU,
    FP32 on a CPU (where bf16 autocast is slower and compile and graphs fall back to eager anyway)."""
    return "fast" if device.type == "cuda" else "baseline"


def mask_seed(seed: int, name: str) -> int:
    """The generator seed of one mask: (run seed, its name: the mask file's, less the suffix)."""
    return draw_seed(seed, zlib.crc32(name.encode()))


class MaskSampler:
    """A checkpoint's denoiser under one run configuration, built once (compiled, its graphs
    captured on first use), that samples masks with any sampler: ``medddpm sample`` makes one
    per call; the sampler gate (``sampler_gate``) one per configuration for all its runs."""

    def __init__(self, ckpt: dict, device: torch.device, config: str, weights: str = "ema") -> None:
        self.model_cfg, self.diff_cfg, _, _ = configs_from_checkpoint(ckpt)
        self.device = device
        _, self.diffusion, self.knobs = inference(self.model_cfg, sampling_config(config), device, self.diff_cfg,
                                                  ckpt[weights])

    def write(self, jobs: list[Job], mine: list[int], sampler: str, steps: int | None, eta: float, seed: int,
              batch: int, clip: bool, spacing: str | None, progress: bool = False) -> list[Path]:
        """Sample jobs ``mine`` (indices of ``jobs``) ``batch`` at a time, each from its own
        generator (``mask_seed``), and write each (``Job.write``: atomically)."""
        from tqdm.auto import tqdm

        n_steps = denoiser_calls(sampler, steps, self.diff_cfg.timesteps)
        written = []
        with tqdm(total=len(mine) * n_steps, disable=not progress, desc="sample", unit="step") as bar:
            for start in range(0, len(mine), batch):
                chunk = mine[start:start + batch]
                gens = [torch.Generator(self.device).manual_seed(mask_seed(seed, jobs[i].name)) for i in chunk]
                cond = torch.stack([jobs[i].cond for i in chunk]).to(self.device)
                with torch.inference_mode(), autocast(self.knobs, self.device):
                    x = self.diffusion.sample(cond, self.model_cfg.out_channels, sampler, steps, eta, gens, clip,
                                              on_step=lambda: bar.update(len(chunk)), spacing=spacing)
                x = x.float().cpu().numpy()
                for j, i in enumerate(chunk):
                    written.append(jobs[i].write(x[j]))
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


def read_masks(masks: str | Path, out: str | Path, model: str, size: tuple[int, ...], batch: int = 1,
               labels: str = "auto", one_file: bool = False, say: Callable[[str], None] | None = None) -> list[Job]:
    """A job per mask of ``masks``, each mask read and encoded for the model, its target under
    ``out``: a folder of mask files, or for a BraTS model a BraTS root (``brats.find_cases``; the
    subject's modalities, where there, give the healthy brain and the window; ``say`` hears which
    label rule applied). Refuses a target that exists, an unknown model and any bad mask before
    anything is written."""
    from ..data import brats

    if model not in MASK_LABELS:
        raise InputError(f"the checkpoint's model {model!r} has no mask labels defined")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; give a folder for the samples (it is made if missing)")
    what = ""
    if model in brats.BRATS_MODELS and brats.is_brats_root(masks):
        cases, what = brats.find_cases(masks, labels, need_images=False)
        jobs = []
        for case in cases:  # every case read first: a bad one fails before any output is written
            _, label_map, window = brats.prepare(case, brats.window_of(model))
            save = lambda volume, target, w=window, seg=case.mask: brats.write_case(volume, w, seg, target)
            jobs.append(Job(case.subject, brats.encode(label_map, size), brats.targets(out, case.subject, one_file), save))
    else:
        if labels != "auto" or one_file:
            raise InputError(f"--labels and --one-file apply to BraTS roots; {masks} is a folder of mask files"
                             if model in brats.BRATS_MODELS else f"--labels and --one-file apply to BraTS models, "
                             f"not {model!r}")
        files = list_nifti(masks, "masks")
        jobs = [Job(strip_nifti_suffix(f.name), load_mask_tensor(f, model, size),
                    out / f"{strip_nifti_suffix(f.name)}.nii.gz", lambda volume, target, f=f: write_like_mask(volume, f, target))
                for f in files]
    if batch > len(jobs):
        raise InputError(f"--batch {batch} is larger than the {len(jobs)} mask(s) in {masks}")
    existing = [j.target.name for j in jobs if j.target.exists()]
    if existing:
        raise InputError(f"{out} already holds {', '.join(existing)}; choose another --out")
    if what and say is not None:
        say(f"masks: {what}")  # which label rule applied, as train says it; once every check passed
    return jobs


def sample_masks(checkpoint: str | Path, masks: str | Path, out: str | Path, device: torch.device,
                 sampler: str = RECOMMENDED.sampler, steps: int | None = None, eta: float = DEFAULT_ETA, seed: int = 0,
                 weights: str = "ema", progress: bool = True, config: str | None = None, batch: int = 1,
                 world: World = World(), clip: bool = True, spacing: str | None = None, labels: str = "auto",
                 one_file: bool = False, say: Callable[[str], None] | None = None) -> list[Path]:
    """Generate one image per mask file (this rank's share); every input is checked before
    anything is written, and each file is written atomically. ``clip``: x̂₀ clipped to [−1, 1] at
    every step (as the reference implementation does; ``False`` is DDPM Alg. 2 as published).
    ``sampler``: one of ``solvers.SAMPLERS``; ``steps`` and ``spacing``: its chain; ``labels`` and
    ``one_file``: a BraTS root's label convention and output form (``read_masks``); ``say`` is
    told what the masks are (a BraTS root: its layout and the label rule that applied)."""
    config = config or default_config(device)
    check_options(sampler, steps, spacing, config, weights, batch, eta)
    ckpt = load_checkpoint(checkpoint)
    model_cfg, diff_cfg, _, _ = configs_from_checkpoint(ckpt)
    check_options(sampler, steps, spacing, config, weights, batch, eta, diff_cfg.timesteps)
    jobs = read_masks(masks, out, model_cfg.name, tuple(ckpt["config"]["size"]), batch, labels, one_file, say)
    mine = list(range(world.rank, len(jobs), world.size))
    return MaskSampler(ckpt, device, config, weights).write(jobs, mine, sampler, steps, eta, seed, batch, clip,
                                                            spacing, progress)

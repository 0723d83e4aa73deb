"""A training run's checkpoint (``checkpoint.pt``, ``best.pt``): reading it and the configurations
it was trained under. Kept apart from the trainer, so that a sampler starts without the training
loop's imports."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from ..core.config import DataConfig, DiffusionConfig, Knobs, ModelConfig, TrainConfig, from_dict
from ..core.errors import InputError

CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"  # the checkpoint whose EMA weights had the lowest held-out loss so far


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """``{step, model, ema, optimizer, config, rng, …}`` of a checkpoint file; one clear error for a
    missing, unreadable or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"checkpoint {str(path)!r} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save's format is a zip archive; a truncated one lost its directory
        raise InputError(f"{path} is not a whole checkpoint file ({path.stat().st_size:,} bytes: truncated, or another "
                         "kind of file)")
    try:
        # mapped, not read: a tensor's bytes come from the file when used (sampling reads the EMA
        # weights, not the optimizer's moments: a third of the file)
        ckpt = torch.load(path, map_location=map_location, weights_only=False, mmap=True)
    except Exception as exc:
        raise InputError(f"cannot read checkpoint {path}: {exc}") from None
    missing = {"step", "model", "ema", "optimizer", "config", "rng"} - set(ckpt)
    if missing:
        raise InputError(f"{path} is not a medddpm checkpoint (missing {sorted(missing)})")
    return ckpt


def data_config(ckpt: dict[str, Any]) -> DataConfig:
    """How the checkpoint's training read its files (the reference's, for checkpoints before it was kept)."""
    return from_dict(DataConfig, ckpt["config"].get("data_config", {}))


def configs_from_checkpoint(ckpt: dict[str, Any]) -> tuple[ModelConfig, DiffusionConfig, TrainConfig, Knobs]:
    """The model, diffusion, training and run configurations a checkpoint was trained under."""
    c = ckpt["config"]
    return (from_dict(ModelConfig, c["model"]), from_dict(DiffusionConfig, c["diffusion"]),
            from_dict(TrainConfig, c["train"]), from_dict(Knobs, c["knobs"]))

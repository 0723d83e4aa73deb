"""Resizing a (C, I, J, K) volume to the network's grid and back: trilinear for images, nearest-neighbour for label
maps (``nifti``'s conventions). PyTorch's interpolation, so that training, sampling and the files written agree."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F


def resize(volume: torch.Tensor, size: Sequence[int], mode: str) -> torch.Tensor:
    """Resize a (C, I, J, K) tensor; ``mode`` 'trilinear' for images, 'nearest' for labels."""
    if tuple(volume.shape[1:]) == tuple(size):
        return volume
    kwargs = {"align_corners": False} if mode == "trilinear" else {}
    return F.interpolate(volume[None].float(), size=tuple(size), mode=mode, **kwargs)[0].to(volume.dtype)


def resized(volume: np.ndarray, size: Sequence[int], mode: str) -> torch.Tensor:
    """``resize`` of a (C, I, J, K) array, as a tensor sharing its memory where the size is already ``size``."""
    return resize(torch.from_numpy(volume), size, mode)

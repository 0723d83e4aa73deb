"""Random cubic patches of the training volumes: a curriculum's first steps (Patch Diffusion, Wang et al.
2023, §3, without its coordinate channels: the mask already says where in the head a patch lies).

The network is fully convolutional, so it trains on a patch as on a smaller volume, at a fraction of a
whole volume's step time; the held-out judge keeps the whole volumes. Each draw's corners come from a
generator seeded by (run seed, draw) alone, so any split of draws over ranks, and any resume, crops alike.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

STREAM = 0x9A7C  # the corners' generator stream, apart from the draw's own (``distributed.draw_seed``)


def corners(seed: int, draw: int, n: int, size: Sequence[int], patch: int) -> np.ndarray:
    """The low corners (n × 3, voxels) of draw ``draw``'s ``n`` patches of edge ``patch`` in volumes of
    ``size``: uniform over every position where the patch fits whole."""
    if any(patch > s for s in size):
        raise ValueError(f"a patch of {patch} voxels does not fit volumes of {tuple(size)}")
    rng = np.random.default_rng([seed, draw, STREAM])
    return rng.integers(0, np.asarray(size) - patch + 1, size=(n, 3))


def crop(x: Tensor, low: np.ndarray, patch: int) -> Tensor:
    """Each volume ``x[i]`` (N × C × D × H × W) cut to the cube of edge ``patch`` from corner ``low[i]``."""
    if len(low) != x.shape[0]:
        raise ValueError(f"{len(low)} corners for a batch of {x.shape[0]} volumes")
    return torch.cat([x[i:i + 1, :, d:d + patch, h:h + patch, w:w + patch] for i, (d, h, w) in enumerate(low.tolist())])

"""The data set of image/mask pairs as the network's tensors, which the training loop and the held-out judge read
(a ``torch.utils.data.Dataset``); each pair's files are read by ``nifti`` (``Pair.load``) or ``brats``."""
from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import Dataset

from ..core.config import DataConfig
from ..core.errors import InputError
from .labels import MASK_LABELS
from .nifti import Pair


class VolumeDataset(Dataset):
    """Image/mask pairs as (image (C, I, J, K), mask (M, I, J, K)) tensors at ``size``: ``Pair``s,
    or ``brats.BratsCase``s read from a BraTS root (anything with ``subject`` and ``load``).

    With ``keep`` every pair is decoded once and kept (``validate`` then fills the memo), which is
    what a data cache (``Knobs.data_cache``) stacks onto the GPU or into pinned memory.
    """

    def __init__(self, pairs: list[Pair], preset: str, image_channels: int, size: Sequence[int],
                 keep: bool = False, source: str = "", data: DataConfig = DataConfig()) -> None:
        if not pairs:
            raise InputError("no image/mask pairs to train on")
        if preset not in MASK_LABELS:
            raise ValueError(f"no mask labels defined for preset {preset!r}")
        self.pairs, self.preset, self.channels, self.size = pairs, preset, image_channels, tuple(size)
        self.source = source  # what the data is (recorded in the checkpoint's config)
        self.data_config = data  # how files become tensors (recorded in the checkpoint's config)
        self._kept: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = {} if keep else None

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._kept is not None and i in self._kept:
            return self._kept[i]
        item = self._read(i)
        if self._kept is not None:
            self._kept[i] = item
        return item

    def _read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pairs[i].load(self.preset, self.channels, self.size, self.data_config)

    def validate(self) -> None:
        """Read every pair once so bad files fail before training starts."""
        for i in range(len(self)):
            self[i]

"""Segmentation utility, the Med-DDPM paper's own test of synthetic scans: a small 3D segmenter of
the conditioning label (brain extraction) trained on synthetic scans made from the training
masks, then tested on real held-out scans, against the same segmenter trained on the real
training scans. If the synthetic scans carry the anatomy their masks ask for, the two Dice scores
are close.

The segmenter is deliberately plain (three levels of 3³ convolutions, GroupNorm and SiLU, one
logit a voxel; Adam on binary cross-entropy plus soft Dice, random flips): it measures the data,
not the segmenter.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

SOURCES = ("real", "synthetic")  # what the segmenter is trained on


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                         nn.Conv3d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class Segmenter(nn.Module):
    """A three-level 3D U-Net of ``width``, 2× ``width`` and 4× ``width`` channels; one logit a voxel."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.enc = nn.ModuleList([_block(1, width), _block(width, 2 * width), _block(2 * width, 4 * width)])
        self.dec = nn.ModuleList([_block(6 * width, 2 * width), _block(3 * width, width)])
        self.out = nn.Conv3d(width, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        skips = []
        for i, block in enumerate(self.enc):
            x = block(x if i == 0 else F.max_pool3d(x, 2))
            skips.append(x)
        for block, skip in zip(self.dec, reversed(skips[:-1])):
            x = block(torch.cat([F.interpolate(x, size=skip.shape[2:], mode="trilinear", align_corners=False), skip], 1))
        return self.out(x)


def dice(pred: Tensor, target: Tensor) -> float:
    """2|A ∩ B| / (|A| + |B|) of two boolean volumes (1 where both are empty)."""
    inter, total = (pred & target).sum().item(), pred.sum().item() + target.sum().item()
    return 1.0 if total == 0 else 2 * inter / total


def train_segmenter(images: Tensor, labels: Tensor, steps: int, device: torch.device, seed: int = 0,
                    lr: float = 1e-3, batch: int = 2, width: int = 16) -> Segmenter:
    """A ``Segmenter`` trained for ``steps`` Adam steps on ``images`` (N, 1, I, J, K) in [−1, 1] and
    their boolean ``labels`` (N, 1, I, J, K), ``batch`` volumes a step, each flipped at random."""
    if len(images) != len(labels) or not len(images):
        raise ValueError(f"{len(images)} images for {len(labels)} label maps")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Segmenter(width).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        idx = torch.randint(len(images), (min(batch, len(images)),), generator=gen)
        x, y = images[idx].to(device), labels[idx].to(device).float()
        flips = [d for d in (2, 3, 4) if torch.rand((), generator=gen) < 0.5]
        if flips:
            x, y = x.flip(flips), y.flip(flips)
        logits = model(x)
        prob = torch.sigmoid(logits)
        soft_dice = 1 - (2 * (prob * y).sum() + 1) / (prob.sum() + y.sum() + 1)
        loss = F.binary_cross_entropy_with_logits(logits, y) + soft_dice
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def dice_scores(model: Segmenter, images: Tensor, labels: Tensor, device: torch.device) -> list[float]:
    """The segmenter's Dice against each label map (threshold 0.5)."""
    return [dice(model(images[i:i + 1].to(device))[0] > 0, labels[i].to(device).bool()) for i in range(len(images))]


def utility(real: Tensor, synthetic: Tensor, labels: Tensor, test_images: Tensor, test_labels: Tensor,
            subjects: Sequence[str], steps: int, device: torch.device, seeds: Sequence[int] = (0,)) -> pd.DataFrame:
    """One row per (training source, seed, held-out subject): the Dice on the real held-out scan of
    a segmenter trained on the ``real`` training scans or on the ``synthetic`` ones (the same
    ``labels``: the masks they were sampled from)."""
    if real.shape != synthetic.shape:
        raise ValueError(f"real scans {tuple(real.shape)} and synthetic ones {tuple(synthetic.shape)} differ")
    rows = []
    for source, images in zip(SOURCES, (real, synthetic)):
        for seed in seeds:
            model = train_segmenter(images, labels, steps, device, seed)
            for subject, d in zip(subjects, dice_scores(model, test_images, test_labels, device)):
                rows.append({"source": source, "seed": seed, "subject": subject, "dice": d, "steps": steps})
    return pd.DataFrame(rows)


def stack(volumes: Sequence[np.ndarray]) -> Tensor:
    """(N, 1, I, J, K) float32 from (I, J, K) arrays."""
    return torch.from_numpy(np.stack(volumes).astype(np.float32))[:, None]

"""Mask labels: which integer values of a label map feed which of the model's mask channels.

Each preset knows its own labels (``MASK_LABELS``). Masks from a parcellation (DLMUSE, FreeSurfer's
aseg, SynthSeg) carry other values; ``--mask-labels`` maps them onto the preset's channels by name
(``MASK_NAMES``)::

    brain=nonzero                 every nonzero label is brain
    brain=1-207,lesion=250        1 … 207 brain, 250 lesion; any other nonzero value is an error
    brain=nonzero,background=24   24 (say, CSF outside the brain) is background, every other nonzero brain

``VALUES`` is ``nonzero`` (every nonzero label no other name takes) or integers and inclusive
ranges joined by ``+`` (``4+11+23-30``). ``background`` maps values to 0.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError

# Label values → one-hot channel, per model preset.
MASK_LABELS: dict[str, tuple[tuple[int, ...], ...]] = {
    # whole-head: 1 = brain, 2 = lesion (Med-DDPM's BRAINAREA / TUMORAREA)
    "whole-head": ((1,), (2,)),
    # BraTS 2021 segmentations: 1 = necrotic core (NCR), 2 = peritumoral edema (ED),
    # 4 = enhancing tumour (ET; 3 in BraTS 2023). BraTS labels no healthy tissue, so the fourth
    # channel takes our own convention, label 5 = healthy brain (add it from a brain mask).
    "brats": ((1,), (2,), (3, 4), (5,)),
    "brats-tiny": ((1,), (2,), (3, 4), (5,)),
    "tiny": ((1,), (2,)),
}
# The names ``--mask-labels`` gives each preset's channels, in ``MASK_LABELS``' order.
MASK_NAMES: dict[str, tuple[str, ...]] = {
    "whole-head": ("brain", "lesion"), "tiny": ("brain", "lesion"),
    "brats": ("necrotic", "edema", "enhancing", "healthy"), "brats-tiny": ("necrotic", "edema", "enhancing", "healthy"),
}
BACKGROUND = "background"
NONZERO = "nonzero"
_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class LabelMap:
    """A parsed ``--mask-labels``: (low, high, target label) ranges, and the target of every
    other nonzero label (None: such a label is an error)."""

    spec: str  # canonical text, as stored in the checkpoint (DataConfig.mask_labels)
    ranges: tuple[tuple[int, int, int], ...]
    rest: int | None

    def apply(self, labels: np.ndarray, name: str) -> np.ndarray:
        """``labels`` (integers) as the preset's label values; a nonzero value no name covers is refused."""
        out = np.zeros(labels.shape, np.int64)
        covered = labels == 0
        for lo, hi, target in self.ranges:
            hit = (labels >= lo) & (labels <= hi)
            out[hit] = target
            covered |= hit
        if self.rest is not None:
            out[~covered] = self.rest
        elif not covered.all():
            left = np.unique(labels[~covered])
            shown = ", ".join(map(str, left[:8].tolist())) + (", …" if len(left) > 8 else "")
            raise InputError(f"{name}: --mask-labels {self.spec!r} leaves label values {shown} unmapped; "
                             f"name them, or map the rest with NAME=nonzero")
        return out


def _values(text: str, where: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split("+"):
        match = _ITEM.match(item.strip())
        if not match:
            raise InputError(f"--mask-labels {where}: {item.strip()!r} is not an integer, a range A-B or 'nonzero'")
        lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
        if hi < lo:
            raise InputError(f"--mask-labels {where}: the range {lo}-{hi} runs backwards")
        if lo == 0:
            raise InputError(f"--mask-labels {where}: label 0 is background already")
        out.append((lo, hi))
    return out


def parse(spec: str, preset: str) -> LabelMap:
    """``spec`` (``NAME=VALUES`` pairs, comma-separated) for ``preset``; one clear error for an
    unknown or repeated name, a malformed value, overlapping values or two ``nonzero``."""
    if preset not in MASK_NAMES:
        raise InputError(f"the model {preset!r} has no named mask channels")
    names = MASK_NAMES[preset]
    targets = {n: MASK_LABELS[preset][i][0] for i, n in enumerate(names)} | {BACKGROUND: 0}
    ranges: list[tuple[int, int, int]] = []
    seen: dict[str, str] = {}
    rest = None
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        name, eq, values = (s.strip() for s in pair.partition("="))
        if not eq or not values:
            raise InputError(f"--mask-labels: {pair!r} is not NAME=VALUES")
        if name not in targets:
            raise InputError(f"--mask-labels: unknown name {name!r}; the {preset} model's are "
                             f"{', '.join([*names, BACKGROUND])}")
        if name in seen:
            raise InputError(f"--mask-labels: {name!r} is given twice")
        if values == NONZERO:
            if rest is not None:
                raise InputError(f"--mask-labels: only one name can take '{NONZERO}'")
            rest, seen[name] = targets[name], NONZERO
            continue
        mine = sorted(_values(values, name))
        for lo, hi, target in ranges:
            for a, b in mine:
                if a <= hi and lo <= b:
                    other = next(n for n, t in targets.items() if t == target)
                    raise InputError(f"--mask-labels: {name} and {other} overlap at {max(a, lo)}-{min(b, hi)}")
        ranges += [(a, b, targets[name]) for a, b in mine]
        seen[name] = "+".join(f"{a}" if a == b else f"{a}-{b}" for a, b in mine)
    if not seen:
        raise InputError("--mask-labels is empty; give NAME=VALUES pairs, e.g. brain=nonzero")
    canonical = ",".join(f"{n}={v}" for n, v in seen.items())
    return LabelMap(canonical, tuple(ranges), rest)


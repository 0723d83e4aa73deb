"""IXI T1 scans with their DLMUSE parcellations (NiChart's test data) as image/mask pairs with a
fixed split, at any cubic size.

Source: the IXI data set (brain-development.org, CC BY-SA 3.0) as NiChart processed it
(CBICA/NiChart_Project, ``test_data/processed/IXI``): ``Nifti/T1/IXI<ID>-<site>-<n>_T1.nii.gz``
(whole head, 2 mm, 120 × 120 × 90) and ``DLMUSE/IXI<ID>-…_T1_DLMUSE.nii.gz`` (149 labels).

Split, by IXI ID (the number after ``IXI``):

* ``test``: IDs ≥ ``TEST_FROM`` (500). The external test set: never trained on, tuned on or used
  to choose anything; ``medddpm`` itself never reads it unless asked by path.
* ``val``: the last ``val`` IDs below 500, the validation subjects every choice is made on.
* ``train``: the other IDs below 500.

Folders: ``dev/`` holds train and val together, in ID order, so ``train --held-out VAL`` trains on
``train`` and evaluates the held-out loss on ``val`` (the last subjects); ``val/`` holds the
validation subjects again, to sample and measure; ``test/`` the external test set.

Each volume is padded to a cube around its centre (its affine follows), resampled to ``size``³
(images trilinear, labels nearest) and written as uint8: images with a scale factor in the
header, so they read back as the scan's intensities to 1/255 of its maximum; masks keep the
DLMUSE labels, to be mapped with ``--mask-labels brain=nonzero``.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from ..core.errors import InputError
from ..core.io import atomic_path, write_text_atomic
from .nifti import canonical, check_same_space, cube_grid, load_nifti, save_atomic
from .resample import resize

TEST_FROM = 500  # IXI IDs from here on are the external test set
SPLITS = ("train", "val", "test")
FOLDERS = {"train": ("dev",), "val": ("dev", "val"), "test": ("test",)}  # where each split's subjects are written
_ID = re.compile(r"IXI(\d+)")
MASK_LABELS = "brain=nonzero"  # the map that turns a DLMUSE parcellation into the whole-head model's brain


def find(root: str | Path) -> list[tuple[int, Path, Path]]:
    """(IXI ID, T1 file, DLMUSE file) of every subject under ``root`` (NiChart's ``IXI`` folder),
    in ID order; a T1 without its parcellation, or the reverse, is an error."""
    root = Path(root)
    t1_dir, seg_dir = root / "Nifti" / "T1", root / "DLMUSE"
    for d in (t1_dir, seg_dir):
        if not d.is_dir():
            raise InputError(f"{d} does not exist: give --root the IXI folder holding Nifti/T1 and DLMUSE "
                             "(test_data/processed/IXI of CBICA/NiChart_Project)")

    def by_id(folder: Path) -> dict[int, Path]:
        out = {}
        for f in sorted(folder.glob("IXI*.nii.gz")):
            out[int(_ID.match(f.name).group(1))] = f  # type: ignore[union-attr]
        return out

    t1, seg = by_id(t1_dir), by_id(seg_dir)
    lonely = sorted(set(t1) ^ set(seg))
    if lonely:
        raise InputError(f"IXI IDs without both a T1 and a DLMUSE file: {lonely[:10]}")
    if not t1:
        raise InputError(f"{t1_dir} holds no IXI*.nii.gz files")
    return [(i, t1[i], seg[i]) for i in sorted(t1)]


def split_of(ids: list[int], val: int) -> dict[int, str]:
    """Each ID's split: ``test`` from ``TEST_FROM``, the last ``val`` IDs below it ``val``, the rest ``train``."""
    below = [i for i in sorted(ids) if i < TEST_FROM]
    if not 0 <= val < len(below):
        raise InputError(f"--val must be in [0, {len(below) - 1}] for {len(below)} subjects below ID {TEST_FROM}, got {val}")
    held = set(below[len(below) - val:]) if val else set()
    return {i: "test" if i >= TEST_FROM else "val" if i in held else "train" for i in ids}


def cube(img: nib.Nifti1Image, size: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """A canonical volume padded to a centred cube and resampled to ``size``³, with its affine."""
    img = canonical(img)
    arr = np.asarray(img.dataobj) if mode == "nearest" else img.get_fdata(dtype=np.float32)
    pads, to_voxels = cube_grid(arr.shape, size)
    vol = torch.from_numpy(np.pad(arr, pads).astype(np.int64 if mode == "nearest" else np.float32))[None]
    return resize(vol, (size,) * 3, mode)[0].numpy(), img.affine @ to_voxels


def _save(arr: np.ndarray, affine: np.ndarray, path: Path, slope: float = 1.0) -> None:
    img = nib.Nifti1Image(arr.astype(np.uint8), affine)
    img.header.set_slope_inter(slope, 0.0)
    save_atomic(img, path)


def prepare(root: str | Path, out: str | Path, size: int = 64, val: int = 16) -> dict[str, int]:
    """Write ``out/{dev,val,test}/{images,masks}/IXI<ID>.nii.gz`` and ``out/split.csv`` (id, subject,
    source file, split); returns the number of subjects per split. Refuses an ``out`` that already
    holds data."""
    if size < 8 or size % 16:
        raise InputError(f"--size must be a multiple of 16 (the whole-head U-Net halves it 4 times), got {size}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already holds files; choose an empty --out folder")
    subjects = find(root)
    splits = split_of([i for i, _, _ in subjects], val)
    for i, t1, seg in subjects:  # every pair checked before anything is written
        check_same_space(t1, seg)
    rows = []
    for i, t1, seg in subjects:
        name, split = f"IXI{i:03d}", splits[i]
        image, affine = cube(load_nifti(t1), size, "trilinear")
        labels, _ = cube(load_nifti(seg), size, "nearest")
        if labels.max() > 255 or labels.min() < 0:
            raise InputError(f"{seg.name}: label values outside 0–255 cannot be stored as uint8")
        image = np.clip(image, 0, None)
        top = float(image.max()) or 1.0
        for folder in FOLDERS[split]:
            _save(np.round(image / top * 255), affine, out / folder / "images" / f"{name}.nii.gz", top / 255)
            _save(labels, affine, out / folder / "masks" / f"{name}.nii.gz")
        rows.append({"id": i, "subject": name, "source": t1.name, "split": split})
    with atomic_path(out / "split.csv", suffix=".csv") as tmp:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["id", "subject", "source", "split"], lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    write_text_atomic(out / "README.txt", f"IXI T1 (CC BY-SA 3.0, brain-development.org) with NiChart's DLMUSE "
                      f"parcellations, {size}^3, uint8; masks: --mask-labels {MASK_LABELS}. IDs >= {TEST_FROM} are "
                      f"the external test set (test/): never train, tune or select on them. dev/ = train + val "
                      f"(train with --held-out {val}: the val subjects are the last); val/ = the val subjects.\n")
    return {s: sum(r["split"] == s for r in rows) for s in SPLITS}

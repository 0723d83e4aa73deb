"""Sample agreement: one checkpoint sampled under several inference configurations, each sample
compared voxel by voxel with the FP32 one (PSNR, 3D SSIM, errors), intensity histograms inside the
brain, and the orthogonal slices of the paper's Fig. 1 made from our own model.

Volumes are read in canonical (RAS) orientation, as the model sees them: images scaled to
[-1, 1] like the training data, samples as written (the sampler clips x̂₀ to [-1, 1]).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .data import Pair, canonical, load_nifti, read_image, read_labels, strip_nifti_suffix
from .errors import InputError

DATA_RANGE = 2.0  # peak-to-peak of the model's intensity scale [-1, 1]: PSNR's and SSIM's data range
VIEWS = ("sagittal", "coronal", "axial")  # the slice normal: RAS axis 0 (x), 1 (y), 2 (z)
HIST_BINS = np.linspace(-1.0, 1.0, 81)  # histogram bin edges on [-1, 1], 0.025 wide
REAL = "real"  # the source name of the held-out subject's own image


def read_sample(path: Path) -> np.ndarray:
    """A sample NIfTI as a canonical float32 (I, J, K) array."""
    arr = np.asarray(canonical(load_nifti(path)).get_fdata(dtype=np.float32))
    if arr.ndim != 3:
        raise InputError(f"{path.name}: expected a 3-D sample, got shape {arr.shape}")
    return arr


def sample_volumes(folders: Mapping[str, Path], pairs: Sequence[Pair]) -> dict[str, dict[str, np.ndarray]]:
    """{source: {subject: volume}}: each subject's real image (``REAL``) and its sample from every
    configuration's folder (named after the mask file, as ``medddpm sample`` writes them)."""
    out: dict[str, dict[str, np.ndarray]] = {REAL: {p.subject: read_image(p.image)[0] for p in pairs}}
    for config, folder in folders.items():
        out[config] = {}
        for p in pairs:
            path = Path(folder) / f"{strip_nifti_suffix(p.mask.name)}.nii.gz"
            if not path.is_file():
                raise InputError(f"no sample of {p.subject} from {config}: {path} does not exist")
            out[config][p.subject] = read_sample(path)
            if out[config][p.subject].shape != out[REAL][p.subject].shape:
                raise InputError(f"{path.name} from {config} has shape {out[config][p.subject].shape}, "
                                 f"its subject's image {out[REAL][p.subject].shape}")
    return out


def brain_labels(pairs: Sequence[Pair], labels: tuple[tuple[int, ...], ...]) -> dict[str, np.ndarray]:
    """{subject: canonical label map} (0 background, 1 brain, 2 lesion for the whole-head model)."""
    return {p.subject: read_labels(p.mask, labels) for p in pairs}


def agreement_metrics(ref: np.ndarray, x: np.ndarray, brain: np.ndarray) -> dict[str, float]:
    """PSNR and 3D SSIM (scikit-image, data range ``DATA_RANGE``, 7³ window), mean and max absolute
    difference, relative L2, and the mean absolute difference inside the brain."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    diff = x.astype(np.float64) - ref.astype(np.float64)
    same = not diff.any()
    return {
        "psnr_db": np.inf if same else float(peak_signal_noise_ratio(ref, x, data_range=DATA_RANGE)),
        "ssim": float(structural_similarity(ref, x, data_range=DATA_RANGE)),
        "mae": float(np.abs(diff).mean()), "max_abs": float(np.abs(diff).max()),
        "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(ref)),
        "mae_brain": float(np.abs(diff[brain > 0]).mean()),
    }


def sample_agreement(volumes: Mapping[str, Mapping[str, np.ndarray]], labels: Mapping[str, np.ndarray],
                     reference: str = "baseline") -> pd.DataFrame:
    """One row per (configuration, subject): its sample against ``reference``'s sample of the same
    subject (same weights, same seed), and, for scale, the real image against the reference sample."""
    if reference not in volumes:
        raise InputError(f"no samples from the reference configuration {reference!r}")
    rows = []
    for source, subjects in volumes.items():
        for subject, x in subjects.items():
            rows.append({"source": source, "reference": reference, "subject": subject,
                         **agreement_metrics(volumes[reference][subject], x, labels[subject])})
    return pd.DataFrame(rows)


def brain_histograms(volumes: Mapping[str, Mapping[str, np.ndarray]], labels: Mapping[str, np.ndarray],
                     bins: np.ndarray = HIST_BINS) -> pd.DataFrame:
    """Intensity density inside the brain (label > 0) per (source, subject), on ``bins``; values
    outside the bins' range are counted in the end bins."""
    rows = []
    for source, subjects in volumes.items():
        for subject, x in subjects.items():
            values = np.clip(x[labels[subject] > 0], bins[0], bins[-1])
            density, _ = np.histogram(values, bins=bins, density=True)
            rows.append(pd.DataFrame({"source": source, "subject": subject, "bin_low": bins[:-1],
                                      "bin_high": bins[1:], "density": density}))
    return pd.concat(rows, ignore_index=True)


def slice_centre(labels: np.ndarray) -> tuple[int, int, int]:
    """The voxel the three slices go through: the centroid of the lesion (label 2) where there is
    one, else of the brain, else the volume's centre."""
    for keep in (labels == 2, labels > 0):
        if keep.any():
            return tuple(int(round(c)) for c in np.argwhere(keep).mean(axis=0))  # type: ignore[return-value]
    return tuple(s // 2 for s in labels.shape)  # type: ignore[return-value]


def orthogonal_slices(volumes: Mapping[str, Mapping[str, np.ndarray]], labels: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Tidy slices (source, subject, view, row, col, value) through ``slice_centre`` of each subject,
    for every source and for the label map itself (source ``mask``). Row/col are the slice's two
    remaining RAS axes in order (sagittal: y, z; coronal: x, z; axial: x, y)."""
    frames = []
    sources = {**volumes, "mask": labels}
    for subject, lab in labels.items():
        centre = slice_centre(lab)
        for source, subjects in sources.items():
            vol = subjects[subject] if source != "mask" else lab
            for axis, view in enumerate(VIEWS):
                plane = np.take(vol, centre[axis], axis=axis).astype(np.float32)
                r, c = np.indices(plane.shape)
                frames.append(pd.DataFrame({"source": source, "subject": subject, "view": view,
                                            "row": r.ravel(), "col": c.ravel(), "value": plane.ravel()}))
    return pd.concat(frames, ignore_index=True)


def slice_image(slices: pd.DataFrame, source: str, subject: str, view: str) -> np.ndarray:
    """One slice back as a 2-D array (rows × cols) from ``orthogonal_slices``' table."""
    part = slices[(slices["source"] == source) & (slices["subject"] == subject) & (slices["view"] == view)]
    if part.empty:
        raise KeyError(f"no {view} slice of {subject} from {source}")
    out = np.zeros((part["row"].max() + 1, part["col"].max() + 1), np.float32)
    out[part["row"].to_numpy(), part["col"].to_numpy()] = part["value"].to_numpy()
    return out

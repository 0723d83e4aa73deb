"""Sample agreement: one checkpoint sampled under several inference configurations, each sample
compared voxel by voxel with the FP32 one (PSNR, 3D SSIM, errors), intensity histograms inside the
brain, and the orthogonal slices of the paper's Fig. 1 made from our own model.

Volumes are read in canonical (RAS) orientation, as the model sees them: images scaled to
[-1, 1] like the training data, samples as written (the sampler clips x̂₀ to [-1, 1]).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..data.nifti import Pair, canonical, load_nifti, read_image, read_labels, strip_nifti_suffix
from ..core.errors import InputError
from ..data.brats import MODALITIES, BratsCase, full_volumes

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


# ---- samplers against the real image (issue 20: quality/samplers.csv) ---------------------------

@dataclass(frozen=True)
class SamplerRun:
    """One way of sampling a checkpoint: the sampler, its steps and η, whether x̂₀ is clipped, the
    seed, and the denoiser's configuration; ``name`` is its samples' folder."""

    sampler: str  # "ddpm" (all T steps) or "ddim"
    steps: int  # denoising steps
    eta: float  # DDIM η (0 deterministic, 1 ≈ DDPM); 1.0 for DDPM, whose noise is the posterior's
    config: str  # run configuration of the denoiser
    clip: bool = True  # x̂₀ clipped to [−1, 1] at every step (the reference implementation's default)
    seed: int = 0  # `medddpm sample --seed`: the initial noise and every step's noise

    @property
    def name(self) -> str:
        extra = ("" if self.clip else "-noclip") + (f"-s{self.seed}" if self.seed else "")
        return f"{self.sampler}{self.steps}-eta{self.eta:g}{extra}-{self.config}"

    @classmethod
    def parse(cls, name: str) -> "SamplerRun":
        """The inverse of ``name`` ('ddim50-eta0-fast-w16-p8', 'ddpm250-eta1-noclip-s2-fast'); η
        may be left out: DDPM's is 1, DDIM's 0 ('ddpm250-fast', 'ddim50-fast'); clipped and seed 0
        unless the name says otherwise."""
        m = re.fullmatch(r"(ddpm|ddim)(\d+)(?:-eta([0-9.]+))?(-noclip)?(?:-s(\d+))?-(.+)", name)
        if not m or int(m[2]) < 1:
            raise InputError(f"{name!r} is not a sampler run name like 'ddim50-eta0-fast' or 'ddpm250-noclip-s1-fast'")
        eta = float(m[3]) if m[3] is not None else (1.0 if m[1] == "ddpm" else 0.0)
        return cls(m[1], int(m[2]), eta, m[6], clip=m[4] is None, seed=int(m[5] or 0))


MATCH_BACKGROUND = 0.1  # a sampler matches DDPM 250 if its background mean lies within this of DDPM's
MATCH_CORRELATION = 0.05  # … and its in-brain correlation with the real image is at most this much lower


def fidelity_metrics(real: np.ndarray, x: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """A sample against its subject's real image: the background (label 0) mean and standard
    deviation, the Pearson correlation inside the brain (label > 0), and PSNR and 3D SSIM."""
    brain, background = labels > 0, labels == 0
    a, b = real[brain].astype(np.float64), x[brain].astype(np.float64)
    corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
    m = agreement_metrics(real, x, labels)
    return {"background_mean": float(x[background].mean()), "background_std": float(x[background].std()),
            "brain_corr": corr, "psnr_db": m["psnr_db"], "ssim": m["ssim"]}


RUN_KEYS = ["sampler", "steps", "eta", "clip", "config"]  # one sampler run, over its subjects and seeds


def sampler_table(volumes: Mapping[str, Mapping[str, np.ndarray]], labels: Mapping[str, np.ndarray],
                  reference: tuple[str, int, float, bool] = ("ddpm", 250, 1.0, True)) -> pd.DataFrame:
    """One row per (sampler run, seed, held-out subject) of ``volumes`` ({``SamplerRun.name`` or
    ``REAL``: {subject: volume}}) against the subject's real image, plus the real image's own row
    (its background, for scale), and whether each run matches the quality of the ``reference``
    (sampler, steps, η, clip) of the same configuration (``MATCH_BACKGROUND``,
    ``MATCH_CORRELATION``, on the means over subjects and seeds)."""
    if REAL not in volumes:
        raise InputError("the real images are needed (source 'real')")
    rows = []
    for source, subjects in volumes.items():
        run = None if source == REAL else SamplerRun.parse(source)
        key = ({"sampler": REAL, "steps": 0, "eta": float("nan"), "clip": True, "config": "", "seed": 0} if run is None
               else {k: getattr(run, k) for k in [*RUN_KEYS, "seed"]})
        for subject, x in subjects.items():
            rows.append({**key, "subject": subject, **fidelity_metrics(volumes[REAL][subject], x, labels[subject])})
    out = pd.DataFrame(rows)
    out["matches_reference"] = match_verdicts(out, reference)
    return out


def run_agreement(volumes: Mapping[str, Mapping[str, np.ndarray]], labels: Mapping[str, np.ndarray],
                  reference_config: str = "baseline") -> pd.DataFrame:
    """Voxel agreement of sampler runs with the same run (sampler, steps, η, clip, seed) of
    ``reference_config``: one row per (run, seed, subject) of another configuration, its sample
    against the reference's sample of that subject (``agreement_metrics``: PSNR, 3D SSIM, errors).
    The same noise drives both, so what differs is the denoiser's arithmetic (e.g. FP8 against FP32)."""
    rows = []
    for source, subjects in volumes.items():
        if source == REAL:
            continue
        run = SamplerRun.parse(source)
        if run.config == reference_config:
            continue
        ref = dataclasses.replace(run, config=reference_config).name
        if ref not in volumes:
            raise InputError(f"{source}: no samples of {ref!r} to compare with")
        for subject, x in subjects.items():
            rows.append({**{k: getattr(run, k) for k in [*RUN_KEYS, "seed"]}, "reference": reference_config,
                         "subject": subject, **agreement_metrics(volumes[ref][subject], x, labels[subject])})
    return pd.DataFrame(rows)


def match_verdicts(table: pd.DataFrame, reference: tuple[str, int, float, bool] = ("ddpm", 250, 1.0, True),
                   reference_config: str | None = None) -> pd.Series:
    """Per row of a ``sampler_table``: whether its run (``RUN_KEYS``) matches the ``reference``
    run of its configuration (or of ``reference_config``, e.g. the FP32 baseline's: the model's
    own samples) — background mean within ``MATCH_BACKGROUND`` and in-brain correlation at most
    ``MATCH_CORRELATION`` lower, on the means over subjects and seeds — as "yes", "no",
    "no reference", or "" for the real image's rows."""
    means = table.groupby(RUN_KEYS, dropna=False)[["background_mean", "brain_corr"]].mean()
    verdict = {}
    for key, m in means.iterrows():
        if key[0] == REAL:
            continue
        ref_key = (*reference, reference_config or key[-1])
        if ref_key not in means.index:
            verdict[key] = "no reference"
            continue
        r = means.loc[ref_key]
        ok = (abs(m["background_mean"] - r["background_mean"]) <= MATCH_BACKGROUND
              and m["brain_corr"] >= r["brain_corr"] - MATCH_CORRELATION)
        verdict[key] = "yes" if ok else "no"
    return pd.Series([verdict.get(k, "") for k in zip(*(table[c] for c in RUN_KEYS))], index=table.index)


# ---- the paper's Fig. 1 from a BraTS run (data.brats) -----------------------------------------

FIG1_MODALITIES = ("t1", "t2", "flair")  # the paper's Fig. 1 shows these three
FIG1_SIDE = 120  # slices of a larger grid are strided down to about this many voxels a side


def brats_fig1_slices(cases: Sequence[BratsCase], samples: str | Path) -> pd.DataFrame:
    """Orthogonal slices (``orthogonal_slices``: through the oedema's centroid) of
    each case's real and sampled T1, T2 and FLAIR (sources ``real_<m>`` and ``sample_<m>``, all
    in [−1, 1], canonical) and of its label map in the preset's values (source ``mask``).
    ``samples``: a ``medddpm sample`` output folder of these cases (``OUT/<subject>/…``). Grids
    over ``FIG1_SIDE`` voxels are strided down to about that side (a figure's resolution)."""
    volumes: dict[str, dict[str, np.ndarray]] = {}
    labels = {}
    for case in cases:
        images, label_map, _ = full_volumes(case)
        every = max(1, round(max(label_map.shape) / FIG1_SIDE))
        labels[case.subject] = label_map[::every, ::every, ::every]
        for m in FIG1_MODALITIES:
            sample = read_sample(Path(samples) / case.subject / f"{case.subject}_{m}.nii.gz")
            volumes.setdefault(f"real_{m}", {})[case.subject] = images[MODALITIES.index(m)][::every, ::every, ::every]
            volumes.setdefault(f"sample_{m}", {})[case.subject] = sample[::every, ::every, ::every]
    return orthogonal_slices(volumes, labels)

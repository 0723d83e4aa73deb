"""Quality on real anatomy (issue 47): samples of held-out real scans' masks against the scans.

Every volume is read as the model sees it: canonical RAS, the checkpoint's own intensity scaling
(``DataConfig``), the [−1, 1] scale. For each sample (one mask, one seed, one sampler run), against
its subject's real scan:

* paired: Pearson correlation inside the brain, 3D SSIM and PSNR over the volume (scikit-image);
* intensity: the background's (outside the brain) mean and standard deviation, the Wasserstein-1
  distance between the in-brain intensities (scipy), and the correlation over parcellation regions
  of their mean intensities (the masks' own labels, e.g. DLMUSE's 148 regions);
* diversity: 3D SSIM between two seeds of one mask.

The trivial baseline, ``TEMPLATE``, is the mean of the training scans (the same for every mask):
every measure is computed for it too.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..core.config import DataConfig
from ..core.errors import InputError
from ..data.labels import parse
from ..data.nifti import Pair, canonical, load_nifti, read_image, strip_nifti_suffix
from .quality import DATA_RANGE, read_sample

TEMPLATE = "template"  # the training scans' mean, the trivial baseline
REAL = "real"  # the subject's own scan (its background, for scale)
MEASURES = ["brain_corr", "ssim", "psnr_db", "background_mean", "background_std", "hist_w1", "region_corr"]


def region_labels(path: Path) -> np.ndarray:
    """The mask file's own integer labels (a parcellation), canonical, unmapped."""
    return np.asarray(canonical(load_nifti(path)).dataobj).astype(np.int64)


def region_means(x: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """Mean of ``x`` over each nonzero label of ``regions``, in label order."""
    flat = regions.ravel()
    keep = flat > 0
    sums = np.bincount(flat[keep], weights=x.ravel()[keep].astype(np.float64))
    counts = np.bincount(flat[keep])
    present = counts > 0
    return sums[present] / counts[present]


def brain_mask(pair: Pair, data: DataConfig, preset: str) -> np.ndarray:
    """The brain (boolean) of ``pair``'s mask file: its labels mapped as training read them."""
    regions = region_labels(pair.mask)
    return (parse(data.mask_labels, preset).apply(regions, pair.mask.name) if data.mask_labels else regions) > 0


def measures(real: np.ndarray, x: np.ndarray, brain: np.ndarray, regions: np.ndarray) -> dict[str, float]:
    """``MEASURES`` of one volume ``x`` against its subject's ``real`` scan."""
    from scipy.stats import wasserstein_distance
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    a, b = real[brain].astype(np.float64), x[brain].astype(np.float64)
    corr = lambda u, v: float(np.corrcoef(u, v)[0, 1]) if u.std() > 0 and v.std() > 0 else float("nan")  # noqa: E731
    return {
        "brain_corr": corr(a, b),
        "ssim": float(structural_similarity(real, x, data_range=DATA_RANGE)),
        "psnr_db": float(peak_signal_noise_ratio(real, x, data_range=DATA_RANGE)) if (real != x).any() else np.inf,
        "background_mean": float(x[~brain].mean()), "background_std": float(x[~brain].std()),
        "hist_w1": float(wasserstein_distance(a, b)),
        "region_corr": corr(region_means(real, regions), region_means(x, regions)),
    }


def template(pairs: Sequence[Pair], data: DataConfig) -> np.ndarray:
    """The mean of ``pairs``' scans (the training subjects), read as the model saw them."""
    if not pairs:
        raise InputError("no training scans to average into a template")
    return np.mean([read_image(p.image, 1, data)[0] for p in pairs], axis=0)


def _subject_rows(job: tuple) -> tuple[list[dict], list[dict]]:
    """One held-out subject's rows of ``anatomy_tables`` (a process pool's unit of work)."""
    from skimage.metrics import structural_similarity

    p, folders, data, preset, mean_scan, pairs, baselines = job
    real = read_image(p.image, 1, data)[0]
    regions, brain = region_labels(p.mask), brain_mask(p, data, preset)
    if mean_scan.shape != real.shape:
        raise InputError(f"the template has shape {mean_scan.shape}, {p.subject}'s scan {real.shape}")
    volumes = {}
    for run, seed in folders:
        path = Path(folders[run, seed]) / f"{strip_nifti_suffix(p.mask.name)}.nii.gz"
        if not path.is_file():
            raise InputError(f"no sample of {p.subject} from {run} seed {seed}: {path} does not exist")
        volumes[run, seed] = read_sample(path)
        if volumes[run, seed].shape != real.shape:
            raise InputError(f"{path} has shape {volumes[run, seed].shape}, its subject's scan {real.shape}")
    own = {(REAL, 0): real, (TEMPLATE, 0): mean_scan} if baselines else {}
    rows = [{"run": run, "seed": seed, "subject": p.subject, **measures(real, x, brain, regions)}
            for (run, seed), x in {**own, **volumes}.items()]
    div = []
    for run, group in itertools.groupby(sorted(folders), key=lambda k: k[0]):
        for a, b in seed_pairs([s for _, s in group], pairs):
            ssim = structural_similarity(volumes[run, a], volumes[run, b], data_range=DATA_RANGE)
            div.append({"run": run, "subject": p.subject, "seed_a": a, "seed_b": b, "ssim_between_seeds": float(ssim)})
    return rows, div


PAIRS = ("all", "adjacent")  # the seed pairs whose SSIM the diversity table holds (``seed_pairs``)


def seed_pairs(seeds: Sequence[int], pairs: str = "all") -> list[tuple[int, int]]:
    """Pairs of a run's ``seeds`` (sorted): every pair ("all", k(k − 1)/2 of them), or the disjoint
    neighbours (s0, s1), (s2, s3), … ("adjacent", k/2: many seeds at the cost of few SSIMs)."""
    s = sorted(seeds)
    if pairs == "all":
        return list(itertools.combinations(s, 2))
    if pairs == "adjacent":
        return list(zip(s[0::2], s[1::2]))
    raise InputError(f"pairs must be one of {', '.join(PAIRS)}, got {pairs!r}")


def anatomy_tables(folders: Mapping[tuple[str, int], Path], held: Sequence[Pair], data: DataConfig, preset: str,
                   mean_scan: np.ndarray, workers: int = 1, pairs: str = "all") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples, diversity): a row per (run, seed, subject) with ``MEASURES`` (plus the template's and
    the real scan's own rows, run ``TEMPLATE`` and ``REAL``), and a row per (run, subject, pair of
    seeds: ``seed_pairs``) with their 3D SSIM. ``folders``: {(run name, seed): folder of ``medddpm
    sample``'s files}; ``workers`` processes measure the subjects."""
    seed_pairs([], pairs)  # an unknown ``pairs`` fails before any volume is read
    runs = list(dict.fromkeys(run for run, _ in folders))
    # a job per subject, or per (subject, run) where there are more workers than subjects
    groups = [runs] if workers <= len(held) else [[r] for r in runs] or [[]]
    jobs = [(p, {k: f for k, f in folders.items() if k[0] in group}, data, preset, mean_scan, pairs, i == 0)
            for p in held for i, group in enumerate(groups)]
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            parts = list(pool.map(_subject_rows, jobs))
    else:
        parts = [_subject_rows(j) for j in jobs]
    rows = [r for part, _ in parts for r in part]
    div = [d for _, part in parts for d in part]
    return pd.DataFrame(rows), pd.DataFrame(div, columns=["run", "subject", "seed_a", "seed_b", "ssim_between_seeds"])


def summary(samples: pd.DataFrame, diversity: pd.DataFrame) -> pd.DataFrame:
    """One row per run: every measure's mean over subjects and seeds; the real scans' background
    mean and the gap to it; the background mean's spread between seeds of one mask (max − min,
    the mean and the largest over subjects); the SSIM between seeds."""
    real_bg = samples.query("run == @REAL").set_index("subject")["background_mean"]
    out = samples.groupby("run", sort=False)[MEASURES].mean()
    out["seeds"] = samples.groupby("run", sort=False)["seed"].nunique()
    out["real_background_mean"] = real_bg.mean()
    out["background_gap"] = out["background_mean"] - real_bg.mean()
    spread = samples.groupby(["run", "subject"])["background_mean"].agg(lambda v: v.max() - v.min())
    out["background_seed_spread"] = spread.groupby("run").mean()
    out["background_seed_spread_max"] = spread.groupby("run").max()
    if not diversity.empty:
        out["ssim_between_seeds"] = diversity.groupby("run")["ssim_between_seeds"].mean()
    return out.reset_index()


def split_pairs(data: str | Path, split: str = "val") -> tuple[list[Pair], list[Pair]]:
    """(``split``'s pairs, the training pairs) of a ``medddpm prepare-ixi`` folder: the training
    subjects are dev/'s less val/'s."""
    from ..data.nifti import pair_files

    data = Path(data)
    held = pair_files(data / split / "images", data / split / "masks")
    val = {p.subject for p in pair_files(data / "val" / "images", data / "val" / "masks")}
    return held, [p for p in pair_files(data / "dev" / "images", data / "dev" / "masks") if p.subject not in val]


def run_tags(ckpt: dict, name: str, split: str) -> dict:
    """The columns every measured row of one checkpoint carries: the run's name and split, the
    checkpoint's step and the recipe it was trained with."""
    from ..train.checkpoint import configs_from_checkpoint, data_config

    _, diff_cfg, train_cfg, knobs = configs_from_checkpoint(ckpt)
    dcfg = data_config(ckpt)
    return {"name": name, "split": split, "step": int(ckpt["step"]), "train_config": knobs.name,
            "intensity": dcfg.intensity, "prediction": diff_cfg.prediction, "offset_noise": diff_cfg.offset_noise,
            "train_seed": train_cfg.seed, "lr": train_cfg.lr}

"""The samplers' quality gate: a sampler passes only inside FP32 DDPM 250's band over seeds.

One converged checkpoint samples the held-out masks under several seeds: FP32 DDPM 250 (the
reference, ``REFERENCE``) and every candidate (sampler × steps × spacing × configuration). Per
sample against its subject's real image: the in-brain Pearson correlation, the background (label 0)
mean, and the Wasserstein-1 distance between the in-brain intensity distributions; per pair of
seeds of one mask: 3D SSIM (diversity). The reference's spread over seeds, per subject, is the
band; a candidate passes when, on every held-out subject, the mean over its seeds of

* in-brain correlation ≥ the band's lowest,
* background mean inside the band [lowest, highest],
* W1 ≤ the band's highest,
* SSIM between seeds ≤ the band's highest (fewer steps must not collapse the samples onto one).

Volumes are read as ``medddpm sample`` writes them (canonical RAS, the model's [−1, 1] scale).
"""
from __future__ import annotations

import itertools
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..data.nifti import Pair, strip_nifti_suffix
from ..core.errors import InputError
from .quality import DATA_RANGE, read_sample
from ..core.config import DEFAULT_ETA
from ..diffusion.solvers import SAMPLERS, SPACINGS, takes_eta

RUN_COLUMNS = ["sampler", "steps", "spacing", "config"]  # one sampler run, over its seeds and subjects
METRICS = ["brain_corr", "background_mean", "hist_w1"]  # a sample against its subject's real image


@dataclass(frozen=True)
class GateRun:
    """One way of sampling: sampler, denoiser calls, spacing ("" for DDPM and DDIM), the run
    configuration of the denoiser and the seed. DDIM runs at η = 1 (``medddpm sample``'s default)."""

    sampler: str  # one of solvers.SAMPLERS
    steps: int  # denoiser calls
    spacing: str  # one of solvers.SPACINGS for a few-step solver, "" for ddpm/ddim
    config: str  # run configuration (or a config.SAMPLING_ALIASES name)
    seed: int = 0  # `medddpm sample --seed`
    eta: float = DEFAULT_ETA  # `medddpm sample --eta`: DDIM's and the SDE solvers' noise scale (solvers.takes_eta)

    @property
    def spec(self) -> str:
        """'ddpm250', 'dpm2m-sde12-logsnr', and '-eta1.2' after it where η is not the default."""
        eta = f"-eta{self.eta:g}" if self.eta != DEFAULT_ETA else ""
        return f"{self.sampler}{self.steps}{'-' + self.spacing if self.spacing else ''}{eta}"

    @property
    def name(self) -> str:
        """Its samples' folder: spec, seed and configuration ('dpm2m-sde10-logsnr-s1-fast')."""
        return f"{self.spec}-s{self.seed}-{self.config}"

    @classmethod
    def parse(cls, spec: str, config: str, seed: int = 0) -> "GateRun":
        """From a spec 'ddpm250', 'ddim50' or '<solver><steps>-<spacing>' ('dpm2m-sde10-logsnr'),
        with '-eta<η>' after it for a sampler that takes one ('ddim12-eta1.5', 'dpm1-sde25-logsnr-eta0.8')."""
        names = "|".join(sorted(map(re.escape, SAMPLERS), key=len, reverse=True))
        m = re.fullmatch(rf"({names})(\d+)(?:-({'|'.join(SPACINGS)}))?(?:-eta(\d+(?:\.\d*)?))?", spec)
        if not m or int(m[2]) < 1:
            raise InputError(f"{spec!r} is not a run like 'ddpm250', 'ddim50', 'dpm2m-sde10-logsnr' or "
                             "'dpm2m-sde12-logsnr-eta1.2'")
        solver = m[1] not in ("ddpm", "ddim")
        if solver != (m[3] is not None):
            raise InputError(f"{spec!r}: a few-step solver names its spacing ('-logsnr'), ddpm and ddim none")
        eta = float(m[4]) if m[4] is not None else DEFAULT_ETA
        if m[4] is not None and not takes_eta(m[1]):
            raise InputError(f"{spec!r}: only ddim and the -sde solvers take an eta")
        return cls(m[1], int(m[2]), m[3] or "", config, seed, eta)

    def key(self) -> tuple:
        return (self.sampler, self.steps, self.spacing, self.config)


REFERENCE = ("ddpm", 250, "", "baseline")  # the band's run: FP32 DDPM 250 (RUN_COLUMNS)


def sample_runs(checkpoint: str | Path, masks: str | Path, work: str | Path, runs: Sequence[GateRun],
                device, batch: int = 2, deadline: float | None = None,
                seconds: dict[GateRun, float] | None = None) -> dict[GateRun, Path]:
    """Sample every run's masks into WORK/<run.name>/ (a complete folder from an earlier call is
    kept; a partial one is sampled again), building each configuration's denoiser once; returns the
    complete folders. With ``deadline`` (a ``time.time()``) no run starts after it; ``seconds`` gets
    each sampled run's seconds (the first of a configuration's runs includes building its denoiser)."""
    import time

    import torch

    from .sampler import Sampler, check_options, read_masks
    from ..train.checkpoint import configs_from_checkpoint, data_config, load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    _, diff_cfg, _, _ = configs_from_checkpoint(ckpt)
    for run in runs:
        check_options(run.sampler, run.steps, run.spacing or None, run.config, "ema", batch, run.eta, diff_cfg.timesteps)
    work = Path(work)
    jobs = read_masks(masks, work, ckpt["config"]["model"]["name"], tuple(ckpt["config"]["size"]),
                      mask_labels=data_config(ckpt).mask_labels)
    folders: dict[GateRun, Path] = {}
    for config in dict.fromkeys(r.config for r in runs):
        sampler = None
        for run in (r for r in runs if r.config == config):
            folder = work / run.name
            if folder.is_dir() and len(list(folder.glob("*.nii.gz"))) == len(jobs):
                folders[run] = folder
                continue
            if deadline is not None and time.time() > deadline:
                continue
            t0 = time.perf_counter()
            shutil.rmtree(folder, ignore_errors=True)
            sampler = sampler or Sampler(ckpt, torch.device(device), config)
            tmp = work / f".{run.name}.tmp"  # written whole, then renamed: a cut-off run leaves no folder
            shutil.rmtree(tmp, ignore_errors=True)
            sampler.write_jobs([j.to(tmp) for j in jobs], list(range(len(jobs))), run.sampler,
                          run.steps if run.sampler != "ddpm" else None, run.eta, run.seed, min(batch, len(jobs)), True,
                          run.spacing or None)
            tmp.rename(folder)
            folders[run] = folder
            took = time.perf_counter() - t0
            if seconds is not None:
                seconds[run] = took
            print(f"{run.name}: sampled {len(jobs)} masks in {took:.1f} s", flush=True)
        del sampler
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return folders


def sample_metrics(real: np.ndarray, x: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """A sample against its subject's real image: in-brain correlation, background mean, and the
    Wasserstein-1 distance between the in-brain intensities (scipy)."""
    from scipy.stats import wasserstein_distance

    brain = labels > 0
    a, b = real[brain].astype(np.float64), x[brain].astype(np.float64)
    corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
    return {"brain_corr": corr, "background_mean": float(x[labels == 0].mean()),
            "hist_w1": float(wasserstein_distance(a, b))}


def _ssim(pair: tuple[np.ndarray, np.ndarray]) -> float:
    from skimage.metrics import structural_similarity

    return float(structural_similarity(pair[0], pair[1], data_range=DATA_RANGE))


def gate_tables(folders: Mapping[GateRun, Path], pairs: Sequence[Pair], labels: Mapping[str, np.ndarray],
                real: Mapping[str, np.ndarray], workers: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples, diversity): one row per (run, seed, subject) with ``METRICS``, and one per (run,
    subject, pair of seeds) with their 3D SSIM."""
    if any(run.eta != DEFAULT_ETA for run in folders):
        raise InputError("the per-subject band keys runs without their eta: judge runs of another eta with "
                         "medddpm.sample.equivalence")
    rows, volumes = [], {}
    for run, folder in folders.items():
        for p in pairs:
            path = Path(folder) / f"{strip_nifti_suffix(p.mask.name)}.nii.gz"
            if not path.is_file():
                raise InputError(f"no sample of {p.subject} from {run.name}: {path} does not exist")
            x = volumes[run, p.subject] = read_sample(path)
            if x.shape != real[p.subject].shape:
                raise InputError(f"{path.name} from {run.name} has shape {x.shape}, its subject's image "
                                 f"{real[p.subject].shape}")
            rows.append({**dict(zip(RUN_COLUMNS, run.key())), "seed": run.seed, "subject": p.subject,
                         **sample_metrics(real[p.subject], x, labels[p.subject])})
    jobs = []
    for key, group in itertools.groupby(sorted(folders, key=lambda r: (r.key(), r.seed)), key=GateRun.key):
        seeds = [r.seed for r in group]
        for p in pairs:
            for a, b in itertools.combinations(seeds, 2):
                jobs.append(({**dict(zip(RUN_COLUMNS, key)), "subject": p.subject, "seed_a": a, "seed_b": b},
                             (volumes[GateRun(*key, a), p.subject], volumes[GateRun(*key, b), p.subject])))
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers) as pool:
            ssims = list(pool.map(_ssim, [j[1] for j in jobs]))
    else:
        ssims = [_ssim(j[1]) for j in jobs]
    diversity = pd.DataFrame([{**j[0], "ssim_between_seeds": s} for j, s in zip(jobs, ssims)],
                             columns=[*RUN_COLUMNS, "subject", "seed_a", "seed_b", "ssim_between_seeds"])
    return pd.DataFrame(rows), diversity


def verdicts(samples: pd.DataFrame, diversity: pd.DataFrame, reference: tuple = REFERENCE) -> pd.DataFrame:
    """Per (run, subject): the means over seeds, the reference's band and whether each lies inside
    (``ok_*``); ``verdict`` per run: "pass" when every subject is inside on every criterion,
    "fail: <criteria>" otherwise, "reference" for the band's own run."""
    for df, what in ((samples, "samples"), (diversity, "diversity")):
        if df.empty:
            raise InputError(f"the gate's {what} table is empty")
    ref = tuple(reference)
    key = lambda df: list(zip(*(df[c] for c in RUN_COLUMNS)))  # noqa: E731
    ref_rows, ref_div = samples[[k == ref for k in key(samples)]], diversity[[k == ref for k in key(diversity)]]
    if ref_rows.empty:
        raise InputError(f"no samples of the reference run {ref} to draw the band from")
    if ref_rows["seed"].nunique() < 2 or ref_div.empty:
        raise InputError("the reference run needs at least 2 seeds for a band")
    band = ref_rows.groupby("subject")[METRICS].agg(["min", "max"])
    div_band = ref_div.groupby("subject")["ssim_between_seeds"].max()
    means = samples.groupby([*RUN_COLUMNS, "subject"])[[*METRICS, "seed"]].agg(
        {**{m: "mean" for m in METRICS}, "seed": "nunique"}).rename(columns={"seed": "seeds"})
    div = diversity.groupby([*RUN_COLUMNS, "subject"])["ssim_between_seeds"].mean()
    out = means.join(div).reset_index()
    s = out["subject"]
    out["corr_low"] = s.map(band[("brain_corr", "min")])
    out["background_low"], out["background_high"] = s.map(band[("background_mean", "min")]), s.map(band[("background_mean", "max")])
    out["w1_high"] = s.map(band[("hist_w1", "max")])
    out["ssim_high"] = s.map(div_band)
    out["ok_corr"] = out["brain_corr"] >= out["corr_low"]
    out["ok_background"] = out["background_mean"].between(out["background_low"], out["background_high"])
    out["ok_w1"] = out["hist_w1"] <= out["w1_high"]
    out["ok_diversity"] = out["ssim_between_seeds"] <= out["ssim_high"]
    checks = ["ok_corr", "ok_background", "ok_w1", "ok_diversity"]
    verdict = {}
    for k, g in out.groupby(RUN_COLUMNS):
        failed = [c[3:] for c in checks if not g[c].all()]
        verdict[k] = "reference" if tuple(k) == ref else ("pass" if not failed else "fail: " + ", ".join(failed))
    out["verdict"] = [verdict[k] for k in key(out)]
    return out


def passing(verdict_table: pd.DataFrame) -> pd.DataFrame:
    """One row per run with its verdict and seeds, the passing ones first (then by steps)."""
    runs = verdict_table.groupby(RUN_COLUMNS, as_index=False).agg(verdict=("verdict", "first"), seeds=("seeds", "min"))
    return runs.sort_values(["verdict", "steps"], key=lambda c: c.ne("pass") if c.name == "verdict" else c,
                            kind="stable").reset_index(drop=True)

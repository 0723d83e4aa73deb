"""The tables of the quality and sampling chapters (09 quality; 10 sampling; 11 few-step samplers; 12
FP8 and Fig. 1): tidy DataFrames read from the results store, one function per table."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.config import DEFAULT_ETA
from ..train.timing import steady_intervals
from .tables import ordered, results_csv
from .wording import roles

FULL_SIZE = "128x128x128"  # the paper's whole-head volume, as bench tables write it
SAMPLING_TARGETS_S = {"ddim": 1.0, "ddpm": 4.0}  # issue 20: seconds per 128³ volume, batch 1, H200
SAMPLING_CONFIGS = ("baseline", "opt1", "bf16-graphs", "fast-w16", "fast-w16-p8", "fast-w16-p8-tnorm",
                    "fast-w16-tnorm-tconv", "fast-w16-tnorm-tconv-fold", "fast-w16-tnorm-tconv-fold-up")  # slow to
# fast; the fastest of these is chapter 10's "fastest sampler" (the levers measured beside it, each alone, and the FP8
# ones, judged in chapter 12, are not candidates)
SAMPLER_QUALITY_CONFIGS = ("bf16-graphs", "fast-w16-tnorm-tconv")  # the denoisers whose samples chapter 10 judged
# (and chapter 12's Fig. 1 shows)


def sample_bench(root: Path, gpus: list[str], size: str | None = FULL_SIZE, every_eta: bool = False) -> pd.DataFrame:
    """``<gpu>/sample_bench.csv`` rows (seconds per sampled volume) of DDPM and DDIM chains of
    volumes of ``size`` (None: every size); the newest row of each (GPU, configuration, size,
    sampler, steps, batch, η) wins, as in ``bench``, and of a DDIM chain timed at several η the one
    at ``DEFAULT_ETA`` (η costs no time: one noise draw a step; ``every_eta`` keeps each η). Rows
    written before the table had an ``eta`` column ran DDIM at η = 0."""
    sb = results_csv(root, gpus, "sample_bench")
    if size is not None and not sb.empty:
        sb = sb[sb["size"] == size]
    if not sb.empty:
        sb = sb[sb["sampler"].isin(["ddpm", "ddim"])]
    if sb.empty:
        return sb
    eta = sb["eta"] if "eta" in sb else pd.Series(np.nan, index=sb.index)
    sb = sb.assign(eta=eta.fillna(sb["sampler"].map({"ddpm": 1.0}).fillna(0.0)))
    keys = ["gpu_slug", "config", "model", "size", "sampler", "steps", "batch"]
    sb = sb.drop_duplicates([*keys, "eta"], keep="last")
    if every_eta:
        return ordered(sb.reset_index(drop=True), ["gpu_slug", "config"])
    sb = sb.assign(_pref=sb["eta"] != DEFAULT_ETA).sort_values("_pref", kind="stable").drop_duplicates(keys)
    return ordered(sb.drop(columns="_pref").sort_index().reset_index(drop=True), ["gpu_slug", "config"])


def denoise_categories(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Milliseconds per denoising step by kernel category (rows) and configuration (columns), from
    ``sampling/denoise_kernels.csv`` (``sample_bench.denoise_kernels``)."""
    dk = results_csv(root, gpus, "sampling/denoise_kernels")
    if dk.empty:
        return dk
    per = dk.pivot_table(index="category", columns="config", values="ms_per_step", aggfunc="sum").fillna(0)
    return per.sort_values(per.columns[0], ascending=False)


def quality_csv(root: Path, gpus: list[str], name: str) -> pd.DataFrame:
    """``<gpu>/quality/<name>.csv`` of every GPU that has one."""
    return results_csv(root, gpus, f"quality/{name}")


def prediction_band(values: pd.Series, level: float = 0.95) -> tuple[float, float]:
    """Where one more seed's value falls with probability ``level``, from ``values`` (one per
    seed, assumed normal): mean ± t_{(1+level)/2, n−1} · s · √(1 + 1/n)."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return float("nan"), float("nan")
    half = stats.t.ppf((1 + level) / 2, n - 1) * values.std(ddof=1) * (1 + 1 / n) ** 0.5
    return float(values.mean() - half), float(values.mean() + half)


def parity_curves(root: Path, gpus: list[str], name: str = "quality/parity_heldout") -> pd.DataFrame:
    """Held-out loss (mean over subjects and t) per (GPU, config, seed, step) of ``<gpu>/<name>.csv``
    (``scripts/quality.py parity``'s table)."""
    ho = results_csv(root, gpus, name)
    if ho.empty:
        return ho
    return ho.groupby(["gpu_slug", "config", "seed", "size", "step"], as_index=False)["loss"].mean()


def parity_verdict(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Per (GPU, config, seed): held-out loss before and after training, the baseline seeds' range
    and 95 % prediction band (``prediction_band``), and whether the loss lies inside the band."""
    curves = parity_curves(root, gpus)
    if curves.empty:
        return curves
    last = curves.groupby(["gpu_slug", "config", "seed"])["step"].transform("max")
    first = curves[curves["step"] == 0].set_index(["gpu_slug", "config", "seed"])["loss"].rename("loss_step0")
    end = curves[curves["step"] == last].rename(columns={"step": "steps"}).join(first, on=["gpu_slug", "config", "seed"])
    rows = []
    for g, d in end.groupby("gpu_slug"):
        base = d[d["config"] == "baseline"]["loss"]
        low, high = prediction_band(base)
        rows.append(d.assign(seeds_low=base.min(), seeds_high=base.max(), band_low=low, band_high=high,
                             band_seeds=len(base)))
    out = pd.concat(rows, ignore_index=True)
    out["inside_band"] = out["loss"].between(out["band_low"], out["band_high"])
    return ordered(out[["gpu_slug", "config", "seed", "size", "steps", "loss_step0", "loss", "seeds_low", "seeds_high",
                        "band_low", "band_high", "band_seeds", "inside_band"]], ["gpu_slug", "config", "seed"])


def steady_ms(root: Path, gpus: list[str], name: str) -> pd.Series:
    """Steady-state ms/step (median after the first read-back interval, ``train.timing.steady_intervals``)
    of the run timing ``<gpu>/<name>.csv``, per GPU."""
    t = results_csv(root, gpus, name)
    if t.empty:
        return pd.Series(dtype=float, name="ms_per_step")
    return pd.Series({g: steady_intervals(d).median() for g, d in t.groupby("gpu_slug")}, name="ms_per_step")


def sample_agreement(root: Path, gpu: str) -> pd.DataFrame:
    """Sample agreement of one GPU (``quality/sample_agreement.csv``), mean over the held-out
    subjects, one row per source (configuration, or ``real``) in the order written."""
    sa = quality_csv(root, [gpu], "sample_agreement")
    if sa.empty:
        return sa
    return sa.groupby("source", sort=False)[["psnr_db", "ssim", "mae", "max_abs", "mae_brain"]].mean()


def long_run(root: Path, gpu: str | None, tail: int = 500) -> pd.DataFrame:
    """The long training run of the quality study (``quality/long_log.csv``, ``long_timing.csv``), one row: steps
    trained, steady ms a step, the mean training loss of the last ``tail`` steps, and the seconds of one 64³ volume of
    ``bf16-graphs`` DDIM (``bench-sample``); no row without that run."""
    cols = ["gpu", "steps", "ms a step", f"training loss, last {tail} steps", "64³ volume, DDIM 50 (s)"]
    log = quality_csv(root, [gpu], "long_log") if gpu else pd.DataFrame()
    if log.empty:
        return pd.DataFrame(columns=cols)
    sb = sample_bench(root, [gpu], size="64x64x64")
    fig1 = sb[(sb["config"] == "bf16-graphs") & (sb["sampler"] == "ddim")] if not sb.empty else sb
    return pd.DataFrame([[gpu, int(log["step"].max()),
                          float(steady_ms(root, [gpu], "quality/long_timing").get(gpu, float("nan"))),
                          float(log["loss"].tail(tail).mean()),
                          float(fig1["s_per_volume_median"].iloc[-1]) if len(fig1) else None]], columns=cols)


def heldout_curve(root: Path, gpu: str, name: str = "converge_heldout") -> pd.DataFrame:
    """``quality/<name>.csv`` (the ``heldout.csv`` of ``medddpm train --held-out``): the held-out
    loss per step, mean over subjects and t, one column per weights (``model``, ``ema``)."""
    h = quality_csv(root, [gpu], name)
    if h.empty:
        return h
    return h.groupby(["step", "weights"])["loss"].mean().unstack("weights").rename_axis(columns=None).reset_index()


def plateau(curve: pd.DataFrame, weights: str = "ema", tol: float = 0.01) -> dict[str, float] | None:
    """Where a ``heldout_curve`` stopped falling: the step and value of its lowest point, its last
    step and value, the rise since (a fraction), and whether it stopped — evaluated after its lowest
    point and more than ``tol`` above it."""
    if curve.empty or weights not in curve:
        return None
    c = curve.set_index("step")[weights].dropna()
    best_step, best = int(c.idxmin()), float(c.min())
    last_step, last = int(c.index.max()), float(c.loc[c.index.max()])
    rise = last / best - 1
    return {"best_step": best_step, "best": best, "last_step": last_step, "last": last, "rise": rise,
            "stopped": last_step > best_step and rise > tol}


def _newest_checkpoint_runs(root: Path, gpu: str, name: str, reference_config: str | None = None) -> pd.DataFrame:
    """``<gpu>/quality/<name>.csv`` of the newest checkpoint sampled: the newest row of each (run,
    seed, subject), with ``matches_reference`` recomputed over all of them against DDPM 250 of each
    run's own configuration or of ``reference_config`` (``sample_quality.match_verdicts``; a later
    call may add seeds to a run)."""
    from ..sample.quality import RUN_KEYS, match_verdicts

    s = quality_csv(root, [gpu], name)
    if s.empty:
        return s
    s = s[s["checkpoint"] == s["checkpoint"].iloc[-1]].drop_duplicates([*RUN_KEYS, "seed", "subject"], keep="last")
    return s.assign(matches_reference=match_verdicts(s, reference_config=reference_config)).reset_index(drop=True)


def samplers(root: Path, gpu: str) -> pd.DataFrame:
    """``quality/samplers.csv``: every sampler run of the newest checkpoint, each judged against
    DDPM 250 of its own configuration."""
    return _newest_checkpoint_runs(root, gpu, "samplers")


NUMERICS_REFERENCE = "baseline"  # sampler_numerics: every run against this configuration's DDPM 250 (FP32)


def sampler_numerics(root: Path, gpu: str) -> pd.DataFrame:
    """``quality/sampler_numerics.csv``: sampler runs of one checkpoint under the FP32 baseline and
    the bf16 sampling configurations, each judged against the FP32 baseline's DDPM 250 (the
    model's own samples)."""
    return _newest_checkpoint_runs(root, gpu, "sampler_numerics", NUMERICS_REFERENCE)


PRECISION_REFERENCE = "baseline"  # precision: every run's voxels and quality against this configuration's same run (FP32)


def precision_runs(root: Path, gpu: str) -> pd.DataFrame:
    """``quality/precision.csv`` of the newest checkpoint: one row per sample (run, seed, subject),
    each run judged against the FP32 baseline's DDPM 250."""
    return _newest_checkpoint_runs(root, gpu, "precision", PRECISION_REFERENCE)


def precision(root: Path, gpu: str) -> pd.DataFrame:
    """``quality/precision.csv`` and ``precision_agreement.csv`` of the newest checkpoint: one row
    per sampler run (``sampler_summary``, judged against the FP32 baseline's DDPM 250) with, for
    every configuration but the reference, its samples' background mean minus the FP32 sample's of
    the same run, seed and subject (mean and standard error over the pairs: a shift the unpaired
    spread of subjects and seeds hides), and their voxel agreement with those FP32 samples: PSNR
    (mean and lowest) and 3D SSIM (mean)."""
    from ..sample.quality import RUN_KEYS

    runs = precision_runs(root, gpu)
    if runs.empty:
        return runs
    out = sampler_summary(runs)
    # each sample's background against the FP32 sample of the same run, seed and subject (the same noise)
    keys = ["sampler", "steps", "eta", "clip", "seed", "subject"]
    ref = runs[runs["config"] == PRECISION_REFERENCE].set_index(keys)["background_mean"]
    paired = runs[(runs["config"] != PRECISION_REFERENCE) & (runs["sampler"] != "real")]
    if len(ref) and len(paired):
        shift = paired.assign(shift=paired["background_mean"].to_numpy()
                              - ref.reindex(pd.MultiIndex.from_frame(paired[keys])).to_numpy())
        g = shift.groupby(RUN_KEYS, dropna=False)["shift"]
        out = out.merge(pd.DataFrame({"background_shift": g.mean(), "background_shift_se": g.sem()}).reset_index(),
                        on=RUN_KEYS, how="left")
    ag = quality_csv(root, [gpu], "precision_agreement")
    if not ag.empty:
        ag = ag[ag["checkpoint"] == runs["checkpoint"].iloc[0]].drop_duplicates([*RUN_KEYS, "seed", "subject"], keep="last")
        vox = ag.groupby(RUN_KEYS, dropna=False).agg(psnr_vs_fp32=("psnr_db", "mean"), psnr_vs_fp32_min=("psnr_db", "min"),
                                                    ssim_vs_fp32=("ssim", "mean")).reset_index()
        out = out.merge(vox, on=RUN_KEYS, how="left")
    return out


def fp8_convs(root: Path, gpu: str) -> pd.DataFrame:
    """``sampling/fp8_convs.csv`` (``scripts/probes/fp8_conv_probe.py``) per convolution shape: PyTorch's
    bf16 milliseconds, the fastest cuDNN FP8 plan's, the speed-up, and each one's relative error
    against an fp32 convolution of the unquantized operands."""
    p = results_csv(root, [gpu], "sampling/fp8_convs")
    if p.empty:
        return p
    shape = ["cin", "cout", "side"]
    bf = p[p["impl"] == "torch bf16"].set_index(shape)
    f8 = p[(p["impl"] == "cudnn fp8") & p["ms"].notna()].sort_values("ms").drop_duplicates(shape).set_index(shape)
    out = pd.DataFrame({"bf16_ms": bf["ms"], "fp8_ms": f8["ms"], "bf16_rel_err": bf["rel_err"],
                        "fp8_rel_err": f8["rel_err"], "fp8_plan": f8["plan"]}).dropna(subset=["bf16_ms", "fp8_ms"])
    out.insert(2, "speedup", out["bf16_ms"] / out["fp8_ms"])
    return out.reset_index()


def eps_bias(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``quality/agreement_trained.csv`` per (GPU, configuration): ε's error against the
    reference from trained weights on held-out subjects — its signed mean (a constant offset
    that a sampler sums over its steps) as the mean and the largest |value| over inputs and
    checkpoints, the worst relative L2, and how many checkpoints were measured."""
    a = quality_csv(root, gpus, "agreement_trained")
    if a.empty:
        return a
    return (a.assign(abs_mean_err=a["mean_err"].abs())
            .groupby(["gpu_slug", "config"], sort=False)
            .agg(mean_err=("mean_err", "mean"), worst_mean_err=("abs_mean_err", "max"), rel_l2=("rel_l2", "max"),
                 checkpoints=("checkpoint", "nunique"), reference=("reference", "first"))
            .reset_index())


def sampler_summary(s: pd.DataFrame) -> pd.DataFrame:
    """One row per sampler run of ``samplers`` (the real image's too): samples, the background
    mean over them, its spread and standard error, the in-brain correlation (mean and lowest), PSNR,
    SSIM, and whether the run matches DDPM 250 of its configuration."""
    from ..sample.quality import RUN_KEYS

    g = s.assign(config=s["config"].fillna("")).groupby(RUN_KEYS, dropna=False, sort=False)
    out = g.agg(samples=("subject", "size"), background=("background_mean", "mean"),
                background_sd=("background_mean", "std"), brain_corr=("brain_corr", "mean"),
                brain_corr_min=("brain_corr", "min"), psnr_db=("psnr_db", "mean"), ssim=("ssim", "mean"),
                matches_ddpm250=("matches_reference", "first")).reset_index()  # of its own or the reference's
    out["background_se"] = out["background_sd"] / np.sqrt(out["samples"])
    return out


def sampler_slices(root: Path, gpu: str) -> pd.DataFrame | None:
    """``<gpu>/quality/sampler_slices.parquet`` (the first seed's samples of every sampler run), or None."""
    path = Path(root) / gpu / "quality" / "sampler_slices.parquet"
    return pd.read_parquet(path) if path.exists() else None


def fig1_sources(sl: pd.DataFrame, configs: tuple[str, ...]) -> dict[str, str]:
    """The columns of the chapter's Fig. 1 from ``sampler_slices``: the mask, the real image, and
    DDPM 250, DDIM 50 (η = 1) and DDIM 50 (η = 0) of the last of ``configs`` that has samples."""
    have = set(sl["source"])
    cfg = next((c for c in reversed(configs) if any(s.endswith(f"-{c}") and s.startswith("dd") for s in have)), None)
    runs = {f"ddpm250-eta1-{cfg}": f"DDPM 250 ({cfg})", f"ddim50-eta1-{cfg}": "DDIM 50, η = 1",
            f"ddim50-eta0-{cfg}": "DDIM 50, η = 0"} if cfg else {}
    named = {"mask": "mask", "real": "real image", **runs}
    return {k: v for k, v in named.items() if k in have}


def quality_slices(root: Path, gpu: str) -> pd.DataFrame | None:
    """``<gpu>/quality/slices.parquet`` (``sample_quality.orthogonal_slices``), or None."""
    path = Path(root) / gpu / "quality" / "slices.parquet"
    return pd.read_parquet(path) if path.exists() else None


def sampling_roles(sb: pd.DataFrame) -> dict[str, str | None]:
    """The reference and second GPU (``wording.roles``) among those with batch-1 rows of
    ``sample_bench``: the GPUs the sampling prose quotes."""
    return roles(sb.loc[sb["batch"] == 1, "gpu_slug"] if not sb.empty else [])


def quality_gpus(root: Path, gpus: list[str]) -> tuple[list[str], str | None]:
    """The GPUs among ``gpus`` with quality results (``<gpu>/quality/``), and the one the quality
    chapters show (the reference GPU of ``wording.roles``)."""
    q = [g for g in gpus if (Path(root) / g / "quality").is_dir()]
    return q, roles(q)["ref"]


def _ddpm250_per_gpu(sb: pd.DataFrame):
    """(GPU, seconds of one 128³ volume of DDPM 250 at batch 1 by configuration, the newest row of each) of
    ``sample_bench``'s rows."""
    d = sb[(sb["sampler"] == "ddpm") & (sb["steps"] == 250) & (sb["batch"] == 1)] if len(sb) else sb
    for g, r in d.groupby("gpu_slug", sort=False) if len(d) else []:
        yield g, r.drop_duplicates("config", keep="last").set_index("config")["s_per_volume_median"]


def sampling_state(sb: pd.DataFrame) -> pd.DataFrame:
    """Chapter 10's first table from ``sample_bench``'s rows: per GPU, one 128³ volume of DDPM 250 (batch 1) in true
    FP32, under OPT1 (the paper's best) and under the fastest configuration measured, with its name."""
    rows = []
    for g, by in _ddpm250_per_gpu(sb):
        best, fp32 = by.idxmin(), by.get("baseline")
        rows.append({"gpu_slug": g, "FP32 (s)": fp32, "OPT1 (s)": by.get("opt1"), "fastest (s)": by[best],
                     "fastest configuration": best, "× FP32": fp32 / by[best] if fp32 else None})
    return pd.DataFrame(rows, columns=["gpu_slug", "FP32 (s)", "OPT1 (s)", "fastest (s)", "fastest configuration",
                                       "× FP32"])


def fp8_state(sb: pd.DataFrame) -> pd.DataFrame:
    """Chapter 12's first table: per GPU, one 128³ volume of DDPM 250 (batch 1) under the fastest bf16 configuration
    and under the fastest FP8 one, and the FP8 one's speed-up."""
    rows = []
    for g, by in _ddpm250_per_gpu(sb):
        fp8 = by[[c for c in by.index if "fp8" in c]]
        bf16 = by[[c for c in by.index if "fp8" not in c and c not in ("baseline", "opt1", "opt2", "opt12")]]
        if len(fp8) and len(bf16):
            rows.append({"gpu_slug": g, "bf16 (s)": bf16.min(), "bf16 configuration": bf16.idxmin(),
                         "FP8 (s)": fp8.min(), "FP8 configuration": fp8.idxmin(), "× bf16": bf16.min() / fp8.min()})
    return pd.DataFrame(rows, columns=["gpu_slug", "bf16 (s)", "bf16 configuration", "FP8 (s)", "FP8 configuration",
                                       "× bf16"])


def _judged(root: Path, q: str | None, config: str) -> str:
    """How ``config``'s samples were judged on the quality GPU ``q``: against the FP32 model's DDPM 250
    (``sampler_numerics``: matches or not, per chain), against its own DDPM 250 (``samplers``), or "not judged"."""
    num = sampler_numerics(root, q) if q else pd.DataFrame()
    summ = sampler_summary(num) if not num.empty else pd.DataFrame()
    mine = summ[summ["config"] == config] if not summ.empty else summ
    if len(mine):
        return "; ".join(f"{f'DDPM {r.steps}' if r.sampler == 'ddpm' else f'DDIM {r.steps} (η = {r.eta:g})'} against "
                         f"FP32 DDPM 250: {'matches' if r.matches_ddpm250 == 'yes' else 'does not match'}"
                         for r in mine.itertuples())
    sq = samplers(root, q) if q else pd.DataFrame()
    return "against its own DDPM 250" if not sq.empty and config in set(sq["config"].dropna()) else "not judged"


def sampling_targets(root: Path, sb: pd.DataFrame, q: str | None) -> pd.DataFrame:
    """Chapter 10's targets: per GPU of ``sample_bench``'s batch-1 rows, its fastest sampler (the fastest of
    ``SAMPLING_CONFIGS`` with DDIM 50) against each sampler's target (``SAMPLING_TARGETS_S``), at batch 1 and as
    throughput (the smallest batch whose seconds a volume meet it); for DDPM 250 also a step's kernel time
    (``denoise_categories``) and what the chain would take with no time between kernels; and how its samples were
    judged on the quality GPU ``q`` (``_judged``)."""
    cols = ["gpu_slug", "sampler", "configuration", "s a volume", "× opt1", "target (s)", "met", "met from batch",
            "ms a step", "kernel ms a step", "kernels alone (s)", "samples judged"]
    rows = []
    one = sb[sb["batch"] == 1] if not sb.empty else sb
    for g, mine in one.groupby("gpu_slug", sort=False) if len(one) else []:
        ddim = mine[(mine["sampler"] == "ddim") & mine["config"].isin(SAMPLING_CONFIGS)]
        if not len(ddim):
            continue
        best = ddim.loc[ddim["s_per_volume_median"].idxmin(), "config"]
        dk = denoise_categories(root, [g])
        kernel = float(dk[best].sum()) if not dk.empty and best in dk.columns else float("nan")
        judged = _judged(root, q, best)
        for smp, target in SAMPLING_TARGETS_S.items():
            by = mine[mine["sampler"] == smp].set_index("config")["s_per_volume_median"]
            if best not in by:
                continue
            steps = int(mine.loc[(mine["sampler"] == smp) & (mine["config"] == best), "steps"].iloc[0])
            batches = sb[(sb["gpu_slug"] == g) & (sb["config"] == best) & (sb["sampler"] == smp)].sort_values("batch")
            meets = batches[batches["s_per_volume_median"] <= target]["batch"]
            rows.append({"gpu_slug": g, "sampler": f"{smp.upper()} {steps}", "configuration": best,
                         "s a volume": by[best], "× opt1": by.get("opt1", float("nan")) / by[best],
                         "target (s)": target, "met": "yes" if by[best] <= target else "no",
                         "met from batch": int(meets.iloc[0]) if len(meets) else None,
                         "ms a step": 1000 * by[best] / steps,
                         "kernel ms a step": kernel if smp == "ddpm" else float("nan"),
                         "kernels alone (s)": steps * kernel / 1000 if smp == "ddpm" else float("nan"),
                         "samples judged": judged})
    return pd.DataFrame(rows, columns=cols)


def fastest_rows(root: Path, targets: pd.DataFrame) -> pd.DataFrame:
    """Every ``sample_bench`` row (each η, each batch) of the fastest sampler of ``sampling_targets``, per GPU."""
    pairs = targets[["gpu_slug", "configuration"]].drop_duplicates() if not targets.empty else targets
    every = sample_bench(root, list(pairs["gpu_slug"]), every_eta=True) if len(pairs) else pd.DataFrame()
    if every.empty:
        return every
    mine = every.merge(pairs.rename(columns={"configuration": "config"}), on=["gpu_slug", "config"])
    return mine[["gpu_slug", "config", "sampler", "steps", "eta", "batch", "s_per_volume_median"]]

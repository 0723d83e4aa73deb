"""Chapter 07's few-step samplers: the quality gate's verdicts (``quality/sampler_verdicts.csv``,
``medddpm.sample.gate``), the solvers' timings, the facts the prose quotes and the figures.

A store may hold the gate on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..core.config import SAMPLING_ALIASES
from ..sample.gate import RUN_COLUMNS
from ..diffusion.solvers import FEW_STEP
from . import quality_tables
from .wording import missing, number, roles
from .present import gpu_name

FAST, FAST_FP8 = SAMPLING_ALIASES["fast"], SAMPLING_ALIASES["fast-fp8"]
CONFIG_LABELS = {FAST: "fast", FAST_FP8: "fast-fp8", "baseline": "FP32"}  # the chapter's names for the gate's configurations
STORE_FREE = ("fs_rec",)  # facts the package states whatever the store holds (the recommended sampler)
METRIC_LABELS = {"brain_corr": "in-brain r with the real image", "background_mean": "background mean",
                 "hist_w1": "in-brain histogram W1 to the real image"}


def gate_gpu(root: Path, gpus: list[str]) -> str | None:
    """The GPU whose store holds the gate (the committed H200 first, then the H100, then any)."""
    return roles([g for g in gpus if (Path(root) / g / "quality" / "sampler_verdicts.csv").exists()])["ref"]


def verdicts(root: Path, gpu: str | None) -> pd.DataFrame:
    """Every (checkpoint, run, subject) row of the gate, the newest of duplicates, with ``label``:
    the run as the chapter names it ('dpm2m-sde 12 logsnr · fast')."""
    path = Path(root) / str(gpu) / "quality" / "sampler_verdicts.csv"
    if gpu is None or not path.exists():
        return pd.DataFrame(columns=[*RUN_COLUMNS, "subject", "checkpoint", "verdict", "label", "seeds", "brain_corr",
                                     "background_mean", "hist_w1", "ssim_between_seeds", "corr_low", "background_low",
                                     "background_high", "w1_high", "ssim_high"])
    v = pd.read_csv(path, keep_default_na=False, na_values=[""])
    v["spacing"] = v["spacing"].fillna("")
    v = v.drop_duplicates(["checkpoint", *RUN_COLUMNS, "subject"], keep="last").reset_index(drop=True)
    return v.assign(label=[run_label(*k) for k in zip(*(v[c] for c in RUN_COLUMNS))])


def config_label(config: str) -> str:
    """A configuration's public name ('fast'): its ``CONFIG_LABELS`` entry, also for the twin without
    the chain graph that DDPM and DDIM rows record (``_unchained``); else its own name."""
    return next((label for name, label in CONFIG_LABELS.items() if config in (name, _unchained(name))), config)


def run_label(sampler: str, steps: int, spacing: str, config: str) -> str:
    return f"{sampler} {steps}{' ' + spacing if spacing else ''} · {config_label(config)}"


def main_checkpoint(v: pd.DataFrame) -> str | None:
    """The checkpoint the chapter shows: the newest that judged the recommended sampler under
    ``fast``, else the one with the most judged runs (the newest of a tie)."""
    if v.empty:
        return None
    rec = v[v["label"] == run_label(FEW_STEP.sampler, FEW_STEP.steps, FEW_STEP.spacing, FAST)]
    if len(rec):
        return str(rec["checkpoint"].iloc[-1])
    counts = v.drop_duplicates(["checkpoint", *RUN_COLUMNS]).groupby("checkpoint", sort=False).size()
    return counts[counts == counts.max()].index[-1]


def runs(root: Path, gpu: str | None) -> pd.DataFrame:
    """One row per run of the main checkpoint: its verdict, its metrics' mean over subjects, the
    verdicts at the other checkpoints, and the seconds per 128³ volume (batch 1) where that run's
    configuration and chain were timed on the same GPU (``s_per_volume``; NaN where not)."""
    v = verdicts(root, gpu)
    ckpt = main_checkpoint(v)
    cols = [*RUN_COLUMNS, "label", "verdict", "brain_corr", "background_mean", "hist_w1", "ssim_between_seeds",
            "seeds", "other_checkpoints", "s_per_volume"]
    if ckpt is None:
        return pd.DataFrame(columns=cols)
    main = v[v["checkpoint"] == ckpt]
    out = main.groupby([*RUN_COLUMNS, "label", "verdict"], as_index=False, sort=False)[
        ["brain_corr", "background_mean", "hist_w1", "ssim_between_seeds", "seeds"]].mean()
    other = v[v["checkpoint"] != ckpt].drop_duplicates(["checkpoint", *RUN_COLUMNS])
    out["other_checkpoints"] = [", ".join(other.loc[other["label"] == lab, "verdict"]) or "—" for lab in out["label"]]
    times = timings(root, gpu)
    out["s_per_volume"] = [seconds(times, *k) for k in zip(*(out[c] for c in RUN_COLUMNS))]
    return out[cols]




def timings(root: Path, gpu: str | None) -> dict[tuple[str, int, str, str, int], float]:
    """Median seconds per 128³ volume of every chain timed on ``gpu`` (the newest row of each),
    keyed (sampler, steps, spacing, config, batch); DDPM's and DDIM's spacing is ""."""
    if gpu is None or not (Path(root) / gpu).is_dir():
        return {}
    out = {}
    for df, spaced in ((quality_tables.sample_bench(root, [gpu]), False), (quality_tables.solver_bench(root, [gpu]), True)):
        for _, r in df.iterrows():
            key = (r["sampler"], int(r["steps"]), r["spacing"] if spaced else "", str(r["config"]), int(r["batch"]))
            out[key] = float(r["s_per_volume_median"])
    return out


def seconds(times: dict, sampler: str, steps: int, spacing: str, config: str, batch: int = 1) -> float:
    """That chain's seconds per volume in ``timings``' table, NaN where it was not timed."""
    return times.get((sampler, int(steps), spacing, config, batch), float("nan"))


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """The few-step section's glued facts (``fs_*``): the gate's GPU, seeds, runs and checkpoints, and the package's
    recommended sampler; every measure is in a table, what the gate found when it ran in the chapter's history."""
    g = gate_gpu(root, gpus)
    v = verdicts(root, g)
    r = runs(root, g)
    ckpt = main_checkpoint(v)
    f = {"fs_gpu": gpu_name(g) if g else missing("sampler gate"),
         "fs_rec": f"{FEW_STEP.sampler}, {FEW_STEP.steps} steps, {FEW_STEP.spacing} spacing",
         "fs_seeds": number(None if v.empty else int(v["seeds"].min()), "d", "sampler gate"),
         "fs_runs": number(None if r.empty else len(r), "d", "sampler gate"),
         "fs_checkpoints": number(None if v.empty else v["checkpoint"].nunique(), "d", "sampler gate"),
         "fs_ckpt": ckpt.split(":")[0] if ckpt else missing("sampler gate")}
    return f


def passing_runs(root: Path, gpu: str | None) -> pd.DataFrame:
    """The chapter's table: every run of the main checkpoint, passing ones first, then by steps."""
    r = runs(root, gpu)
    if r.empty:
        return r
    r = r.assign(_fail=r["verdict"].ne("pass") & r["verdict"].ne("reference"))
    r = r.sort_values(["_fail", "steps"], kind="stable")
    return r[["label", "verdict", "other_checkpoints", "brain_corr", "background_mean", "hist_w1",
              "ssim_between_seeds", "s_per_volume"]].rename(columns={
        "label": "run", "other_checkpoints": "at the other checkpoints", "brain_corr": "in-brain r",
        "background_mean": "background", "hist_w1": "W1", "ssim_between_seeds": "SSIM between seeds",
        "s_per_volume": "s / volume (128³)"}).reset_index(drop=True)


def tradeoff(root: Path, gpu: str | None):
    """Time per 128³ volume against each gate metric, per held-out subject, for the runs of the
    main checkpoint that were timed; FP32 DDPM 250's band (its spread over seeds) shaded."""
    v = verdicts(root, gpu)
    ckpt = main_checkpoint(v)
    v = v[v["checkpoint"] == ckpt].copy()
    times = timings(root, gpu)
    v["s"] = [seconds(times, *k) for k in zip(*(v[c] for c in RUN_COLUMNS))]
    v = v[np.isfinite(v["s"])]
    subjects = sorted(v["subject"].unique())
    if not subjects:
        from .plots import no_data

        return no_data("timed runs of the sampler gate (quality/sampler_verdicts.csv, sample_bench.csv)", "sampling")
    fig, axes = plt.subplots(len(subjects), 3, figsize=(11, 3.2 * len(subjects)), squeeze=False)
    bands = {"brain_corr": ("corr_low", None), "background_mean": ("background_low", "background_high"),
             "hist_w1": (None, "w1_high")}
    for row, subject in zip(axes, subjects):
        d = v[v["subject"] == subject]
        for ax, (metric, (low, high)) in zip(row, bands.items()):
            for _, p in d.iterrows():
                ok = p["verdict"] in ("pass", "reference")
                ax.scatter(p["s"], p[metric], s=40, marker="o" if ok else "x", color="#009E73" if ok else "#D55E00")
                ax.annotate(p["label"], (p["s"], p[metric]), fontsize=6, xytext=(3, 3), textcoords="offset points")
            lo, hi = (d[low].iloc[0] if low else None), (d[high].iloc[0] if high else None)
            y0, y1 = ax.get_ylim()
            y0, y1 = min(y0, lo if lo is not None else y0), max(y1, hi if hi is not None else y1)
            ax.axhspan(lo if lo is not None else y0, hi if hi is not None else y1, color="0.85", zorder=0)
            ax.set_ylim(y0, y1)
            ax.set_xscale("log")
            ax.set_xlabel("seconds per 128³ volume")
            ax.set_ylabel(METRIC_LABELS[metric])
            ax.set_title(f"{subject}", fontsize=8)
    fig.suptitle(f"{gpu_name(gpu)}: grey = FP32 DDPM 250's band; o inside it on every criterion, x not", fontsize=9)
    fig.tight_layout()
    return fig


def slices(root: Path, gpu: str | None) -> tuple[pd.DataFrame, dict[str, str]] | None:
    """The gate's slices (``quality/sampler_gate_slices.parquet``: seed 0 of its main checkpoint)
    of the first held-out subject, and the figure's columns (source → title): the mask, the real
    image, FP32 DDPM 250, then each few-step run kept there."""
    path = Path(root) / str(gpu) / "quality" / "sampler_gate_slices.parquet"
    if gpu is None or not path.exists():
        return None
    sl = pd.read_parquet(path)
    sl = sl[sl["subject"] == sorted(sl["subject"].unique())[0]]
    sources = {"mask": "mask", "real": "real image"}
    for src in sl["source"].unique():
        if src not in sources:
            from ..sample.gate import GateRun

            spec, config = src.split(":")
            r = GateRun.parse(spec, config)
            sources[src] = f"{r.sampler} {r.steps}\n{(r.spacing + ' · ') if r.spacing else ''}{config_label(config)}"
    return sl, sources


def _unchained(config: str) -> str | None:
    """The configuration that differs from ``config`` only by ``chain_graph`` (which changes nothing
    for DDPM and DDIM chains), or None."""
    from dataclasses import replace

    from ..core.config import CONFIGS

    knobs = CONFIGS.get(config)
    if knobs is None or not knobs.chain_graph:
        return None
    twin = replace(knobs, chain_graph=False, name="")
    return next((name for name, k in CONFIGS.items() if replace(k, name="") == twin), None)


def fastest_passing(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Per GPU: the fastest timed sampling chain (128³, batch 1) that passed the gate at every
    checkpoint that judged it (the FP32 reference counts as passing), with its label, seconds per
    volume, and the speed-ups over DDPM 250 under the paper's OPT1 and under FP32 on the same GPU.
    A GPU's own gate judges its runs where it has one, else the store's gate GPU's; a DDPM or DDIM
    verdict of a chain-graph configuration also holds for its twin without the chain graph. A chain
    without a verdict is never quoted, and where the store holds the gate on real IXI brains
    (``anatomy.gate``) a chain must pass there too."""
    from .anatomy import anatomy_gpu, gate

    cols = ["gpu_slug", "label", "s_per_volume", "vs_opt1_ddpm250", "vs_fp32_ddpm250"]
    fallback = gate_gpu(root, gpus)
    real = gate(root, anatomy_gpu(root, gpus))
    real_ok = real.groupby(RUN_COLUMNS)["verdict"].agg(lambda x: x.isin(["pass", "reference"]).all()) if len(real) else {}
    real_passed = {(*k[:3], SAMPLING_ALIASES.get(k[3], k[3])) for k, passed in dict(real_ok).items() if passed}
    rows = []
    for g in gpus:
        v = verdicts(root, g if (Path(root) / g / "quality" / "sampler_verdicts.csv").exists() else fallback)
        if v.empty:
            continue
        ok = v.groupby(RUN_COLUMNS)["verdict"].agg(lambda x: x.isin(["pass", "reference"]).all())
        keys = [k for k, passed in ok.items() if passed and (not real_passed or k in real_passed)]
        keys += [(*k[:3], twin) for k in keys if k[0] in ("ddpm", "ddim") and (twin := _unchained(k[3]))]
        times = timings(root, g)
        timed = [(seconds(times, *k), run_label(*k)) for k in keys]
        timed = [t for t in timed if np.isfinite(t[0])]
        if not timed:
            continue
        s, label = min(timed)
        rows.append({"gpu_slug": g, "label": label, "s_per_volume": s,
                     "vs_opt1_ddpm250": seconds(times, "ddpm", 250, "", "opt1") / s,
                     "vs_fp32_ddpm250": seconds(times, "ddpm", 250, "", "baseline") / s})
    return pd.DataFrame(rows, columns=cols)

"""Chapter 13, the stretch target of a training step past ``fast`` (issue 40): each lever's rung
against ``fast``, the kernel time it moves, its training parity, and what is left per kernel
category against the roofline bound. Tables, read from the results store."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.config import KERNEL_VARIANTS, knob_changes, run_config
from .fast_tables import ceilings, roofline, roofline_gap
from .present import gpu_name
from .quality_tables import parity_curves, parity_verdict
from .tables import bench, ordered, torch_kernels
from .wording import roles

STRETCH_TARGETS_MS = {"h200": 40.0, "h100-80gb-hbm3": 44.0}  # issue 40: a training step of fast's successor, per GPU
BASE = "fast"  # the rung every lever adds to
LEVER_RUNGS = ("fast-fp8fwd", "fast-skipgrad", "fast-fp8fwd-skipgrad", "fast-skipgrad-up",
               "fast-fp8fwd-skipgrad-up")  # the stretch levers' rungs (config.KERNEL_VARIANTS), one lever more each
FP8_FORWARD = (BASE, "fast-fp8fwd")  # lever 1: the rung and the one that adds FP8 forward convolutions to it
SKIP_GRADS = (BASE, "fast-skipgrad")  # lever 3: the skip concatenations' gradients in the norm's backward
UPSAMPLE = ("fast-skipgrad", "fast-skipgrad-up")  # the ×2 upsampling's forward and backward as Triton kernels
PARITY = ("fast_path/fp8_forward/parity_heldout", "fast_path/skip_grads/parity_heldout")  # training-parity runs (scripts/quality.py parity)
assert set(LEVER_RUNGS) <= {k.name for k in KERNEL_VARIANTS}


def added_knobs(rung: str) -> str:
    """The knobs ``rung`` sets beyond ``fast``, from the configurations themselves."""
    return ", ".join(knob_changes(run_config(rung), run_config(BASE)))


def lever_steps(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Per GPU with a ``fast`` row: ``fast`` and each lever rung timed there (ms/step, 128³, batch 1),
    the knobs it adds, its difference from ``fast`` and from the GPU's stretch target."""
    b = bench(root, gpus, [BASE, *LEVER_RUNGS])
    if b.empty:
        return b
    rows = []
    for g, d in b.groupby("gpu_slug"):
        ms = d.set_index("config")["step_ms_median"]
        if BASE not in ms:
            continue
        target = STRETCH_TARGETS_MS.get(g, float("nan"))
        for c in [BASE, *LEVER_RUNGS]:
            if c in ms:
                rows.append({"gpu_slug": g, "config": c, "adds": added_knobs(c) or "—", "step_ms": ms[c],
                             "vs_fast_ms": ms[c] - ms[BASE], "target_ms": target, "above_target_ms": ms[c] - target})
    return pd.DataFrame(rows)


def lever_kernels(root: Path, gpus: list[str], rungs: tuple[str, str]) -> pd.DataFrame:
    """Kernel milliseconds of one steady step per category (torch.profiler) of the two ``rungs`` and
    their difference (second − first), on every GPU with tables of both; an "all kernels" row per
    GPU last."""
    t = torch_kernels(root, gpus, "step", list(rungs))
    if t.empty:
        return t
    ms = t.groupby(["gpu_slug", "category", "config"])["duration_us"].sum().div(1e3).unstack("config")
    if not set(rungs) <= set(ms.columns):
        return pd.DataFrame()
    ms = ms[list(rungs)].dropna(how="all").fillna(0.0)
    both = [g for g, d in ms.groupby(level=0) if (d > 0).any().all()]
    ms = ms.loc[both]
    total = ms.groupby(level=0).sum().assign(category="all kernels").set_index("category", append=True)
    out = pd.concat([ms.sort_values(rungs[0], ascending=False), total]).sort_index(level=0, sort_remaining=False)
    out["difference"] = out[rungs[1]] - out[rungs[0]]
    return out.reset_index()


def parity(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The lever rungs' training-parity runs (held-out loss after their last step, per seed) against
    the FP32 baseline's 95 % prediction band of the reference GPU among those with baseline parity
    seeds (the quality chapter's band; it may be another GPU's, whose name ``band_gpu`` holds)."""
    curves = pd.concat([parity_curves(root, gpus, name) for name in PARITY], ignore_index=True)
    verdict = parity_verdict(root, gpus)
    base = verdict[verdict["config"] == "baseline"] if not verdict.empty else verdict
    band_gpu = roles(base["gpu_slug"] if len(base) else [])["ref"]
    if curves.empty or band_gpu is None:
        return pd.DataFrame()
    band = base[base["gpu_slug"] == band_gpu].iloc[0]
    last = curves[curves["step"] == curves.groupby(["gpu_slug", "config", "seed"])["step"].transform("max")]
    out = last.rename(columns={"step": "steps"}).assign(band_gpu=gpu_name(band_gpu), band_low=band["band_low"],
                                                         band_high=band["band_high"], band_seeds=band["band_seeds"])
    out["inside_band"] = out["loss"].between(out["band_low"], out["band_high"])
    return ordered(out[["gpu_slug", "config", "seed", "size", "steps", "loss", "band_gpu", "band_low", "band_high",
                        "band_seeds", "inside_band"]], ["gpu_slug", "config", "seed"])


def best_rung(steps: pd.DataFrame, gpu: str | None, among: set[str] | None = None) -> str | None:
    """The fastest lever rung timed on ``gpu`` (of those in ``among``, if given; None without one)."""
    d = steps[(steps["gpu_slug"] == gpu) & (steps["config"] != BASE)] if gpu and not steps.empty else pd.DataFrame()
    if among is not None and not d.empty:
        d = d[d["config"].isin(among)]
    return None if d.empty else d.sort_values("step_ms")["config"].iloc[0]


def remaining(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Per GPU with a whole-step ncu roofline of ``fast`` and torch.profiler tables of ``fast`` and its
    best lever rung: per kernel category, ``fast``'s roofline bound (each kernel's FLOPs at its
    pipe's ceiling or its DRAM bytes at the bandwidth, the longer; ncu), the two rungs' kernel time
    (torch.profiler) and how far the best rung's time lies above that bound. The best rung is the
    fastest timed one with tables; its bound is ``fast``'s (an FP8 rung's would be lower)."""
    steps = lever_steps(root, gpus)
    gap = roofline_gap(roofline(root, gpus, "roofline", [BASE]), ceilings(root, gpus))
    rows = []
    profiled = torch_kernels(root, gpus, "step", list(LEVER_RUNGS))
    for g in (gap["gpu_slug"].unique() if not gap.empty else []):
        best = best_rung(steps, g, set(profiled.loc[profiled["gpu_slug"] == g, "config"]) if len(profiled) else set())
        k = lever_kernels(root, [g], (BASE, best)) if best else pd.DataFrame()
        if k.empty:
            continue
        bound = gap[gap["gpu_slug"] == g].groupby("category", observed=True)["bound_ms"].sum()
        k = k[k["category"] != "all kernels"].assign(bound_ms=lambda d: d["category"].map(bound).fillna(0.0))
        k = k.rename(columns={BASE: "fast_ms", best: "best_ms"}).assign(best=best)
        k["above_bound_ms"] = k["best_ms"] - k["bound_ms"]
        total = k[["fast_ms", "best_ms", "bound_ms", "above_bound_ms"]].sum()
        rows.append(pd.concat([k.sort_values("above_bound_ms", ascending=False),
                               pd.DataFrame([{**total, "gpu_slug": g, "category": "all kernels", "best": best}])]))
    cols = ["gpu_slug", "best", "category", "bound_ms", "fast_ms", "best_ms", "above_bound_ms"]
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def state(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Chapter 13's first table: per GPU with a lever rung timed, ``fast``'s step against the fastest rung's, what it
    saves, and the rung against the GPU's stretch target."""
    steps, rows = lever_steps(root, gpus), []
    for g, d in steps.groupby("gpu_slug", sort=False) if len(steps) else []:
        best = best_rung(steps, g)
        if best is None:
            continue
        ms = d.set_index("config")["step_ms"]
        target = STRETCH_TARGETS_MS.get(g, float("nan"))
        rows.append({"gpu_slug": g, "fast (ms)": ms[BASE], "fastest rung": best, "its step (ms)": ms[best],
                     "saved (ms)": ms[BASE] - ms[best], "stretch target (ms)": target,
                     "met": "yes" if ms[best] <= target else "no"})
    return pd.DataFrame(rows, columns=["gpu_slug", "fast (ms)", "fastest rung", "its step (ms)", "saved (ms)",
                                       "stretch target (ms)", "met"])

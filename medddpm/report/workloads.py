"""Chapter 05's second workload: the ``brats`` preset (paper Fig. 1: four modalities under a
tumour mask, 192 × 192 × 144) beside the paper's whole-head model — the training step of the
paper's baseline, its TF32 ``opt1`` and ``fast`` on each GPU (``<gpu>/brats/bench.csv``, written by
``scripts/brats_measure.sh``), the recommended sampler's time per subject, and the slices of a
trained BraTS run (``<gpu>/brats/fig1_slices.parquet``).

A store may hold BraTS results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..train.timing import steady_intervals
from .tables import bench, ordered, results_csv, train_flops, with_speedup
from .wording import roles

CONFIGS = ("baseline", "opt1", "fast")  # the rows of the side-by-side table
WORKLOADS = {"whole-head": "whole-head", "brats": "BraTS"}  # the table's names of the two models
FIG1_SOURCES = {"mask": "mask", "real_t1": "T1", "real_t2": "T2", "real_flair": "FLAIR",
                "sample_t1": "T1, sampled", "sample_t2": "T2, sampled", "sample_flair": "FLAIR, sampled"}
BENCH_COLUMNS = ["gpu_slug", "workload", "config", "size", "step_ms_median", "speedup_vs_baseline", "TFLOP a step",
                 "tflops", "peak_mem_gib", "model"]


def size_label(size: str) -> str:
    """'128x128x128' → '128³', '192x192x144' → '192²×144', else '96×80×64'."""
    sides = size.split("x")
    if len(set(sides)) == 1:
        return f"{sides[0]}³"
    return f"{sides[0]}²×{sides[2]}" if sides[0] == sides[1] else "×".join(sides)


def side_by_side(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Per GPU, workload and configuration of ``CONFIGS`` (batch 1, one micro-batch): ms/step, the
    speed-up over the same GPU's FP32 baseline of the same workload, achieved TFLOP/s and peak
    memory. Whole-head rows come from ``bench.csv``, BraTS rows from ``brats/bench.csv``; a GPU
    appears where it has BraTS rows."""
    b = results_csv(root, gpus, "brats/bench")
    if b.empty:
        return pd.DataFrame(columns=BENCH_COLUMNS)
    b = b[(b["batch"] == 1) & (b.get("grad_accum", 1) == 1) & b["config"].isin(CONFIGS)]
    b = b.drop_duplicates(["gpu_slug", "config", "model", "size"], keep="last")
    wh = bench(root, sorted(set(b["gpu_slug"])), list(CONFIGS))
    both = with_speedup(pd.concat([wh, b], ignore_index=True) if not wh.empty else b)
    both = both[both["model"].isin(list(WORKLOADS))].copy()
    both["TFLOP a step"] = [train_flops(m, s) / 1e12 for m, s in zip(both["model"], both["size"])]
    both["tflops"] = both["TFLOP a step"] / (both["step_ms_median"] * 1e-3)
    both["workload"] = [f"{WORKLOADS[m]} {size_label(s)}" for m, s in zip(both["model"], both["size"])]
    both = ordered(both, ["gpu_slug", "model", "config"])
    return both[BENCH_COLUMNS].assign(config=both["config"].astype(str))


def page_view(t: pd.DataFrame) -> pd.DataFrame:
    """``side_by_side`` as chapter 05 shows it: the workload names its size, short headers."""
    return t.drop(columns=["size", "model"]).rename(columns={
        "step_ms_median": "ms", "speedup_vs_baseline": "× FP32", "TFLOP a step": "TFLOP", "tflops": "TFLOP/s",
        "peak_mem_gib": "GiB"})


def sampling(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``brats/sample_bench.csv``: seconds per BraTS subject (all four modalities), newest row of
    each (GPU, configuration, sampler, steps, spacing, batch)."""
    sb = results_csv(root, gpus, "brats/sample_bench")
    if sb.empty:
        return sb
    sb["spacing"] = sb["spacing"].fillna("")
    return sb.drop_duplicates(["gpu_slug", "config", "sampler", "steps", "spacing", "batch"], keep="last")


def fig1_slices(root: Path, gpus: list[str]) -> tuple[pd.DataFrame, str | None]:
    """The slices of the reference GPU's BraTS run (``sample.quality.brats_fig1_slices``), and that GPU."""
    have = [g for g in gpus if (Path(root) / g / "brats" / "fig1_slices.parquet").exists()]
    g = roles(have)["ref"]
    if g is None:
        return pd.DataFrame(columns=["source", "subject", "view", "row", "col", "value"]), None
    return pd.read_parquet(Path(root) / g / "brats" / "fig1_slices.parquet"), g


def _run(root: Path, gpu: str | None, name: str) -> pd.DataFrame:
    path = Path(root) / str(gpu) / "brats" / f"fig1_run_{name}.csv"
    return pd.read_csv(path) if gpu is not None and path.exists() else pd.DataFrame()


def fig1_run(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The BraTS Fig. 1 run of ``fig1_slices``'s GPU, one row: its steps, steady ms a step, and the step and held-out
    loss (the EMA's, mean over subjects and t) of the checkpoint sampled, its lowest; no row without that run."""
    _, g = fig1_slices(root, gpus)
    log, held, timing = (_run(root, g, n) for n in ("log", "heldout", "timing"))
    cols = ["gpu", "steps", "ms a step", "sampled step", "held-out loss"]
    if not len(log):
        return pd.DataFrame(columns=cols)
    ema = held[held["weights"] == "ema"].groupby("step")["loss"].mean() if len(held) else pd.Series(dtype=float)
    return pd.DataFrame([[g, int(log["step"].max()), float(steady_intervals(timing).median()) if len(timing) > 1 else None,
                          int(ema.idxmin()) if len(ema) else None, float(ema.min()) if len(ema) else None]], columns=cols)

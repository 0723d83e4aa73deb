"""The tables of the fast-path chapters (06 the ladder, loop and GPUs; 07 the kernels; 08 the
roofline): tidy DataFrames read from the results store, one function per table."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.config import KERNEL_VARIANTS
from ..net.tiles import THIN, Tiles
from ..profiling import metrics as M
from ..profiling import store
from ..profiling.categories import CONV_PASSES, conv_pass
from .present import gpu_name
from .tables import bench, fast_path_csv, ncu_kernels, ordered, results_csv, torch_kernels, train_flops


def ladder(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The fast-path ladder (``config.LADDER``) at batch 1: ms/step, speed-up over the rung before
    and over baseline, achieved TFLOP/s (3 × forward FLOPs ÷ step time) and its share of the
    GPU's measured bf16 matmul peak (``peaks.json``, where measured)."""
    from ..core.config import LADDER

    b = bench(root, gpus, list(LADDER))
    if b.empty:
        return b
    peaks = store.load_json("peaks.json", root, gpus)
    rows = []
    for g, d in b.groupby("gpu_slug", sort=True):
        d = d.set_index("config").reindex([c for c in LADDER if c in set(d["config"])]).reset_index()
        prev = d["step_ms_median"].shift(1)
        d["speedup_vs_previous"] = prev / d["step_ms_median"]
        flops = [train_flops(m, sz) * bt for m, sz, bt in zip(d["model"], d["size"], d["batch"])]
        d["tflops"] = [f / (ms * 1e-3) / 1e12 for f, ms in zip(flops, d["step_ms_median"])]
        peak = peaks.get(g, {}).get("bf16_matmul_tflops", float("nan"))
        d["peak_fraction"] = d["tflops"] / peak
        rows.append(d)
    return pd.concat(rows, ignore_index=True)


def kernel_variants(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``bf16-graphs`` and its kernel variants (``config.KERNEL_VARIANTS``: the Triton GroupNorm kernels,
    channel padding) at batch 1, each with its speed-up over ``bf16-graphs`` on the same GPU."""
    names = ["bf16-graphs", *(k.name for k in KERNEL_VARIANTS)]
    b = bench(root, gpus, names)
    if b.empty:
        return b
    fast = b[b["config"] == "bf16-graphs"].set_index("gpu_slug")["step_ms_median"]
    return b.assign(speedup_vs_base=b["gpu_slug"].map(fast) / b["step_ms_median"])


def layer_costs(root: Path, gpus: list[str], config: str | None = None) -> pd.DataFrame:
    """``fast_path/layers.csv`` (``python -m medddpm.profiling.layers --profile``): per configuration,
    convolution shape and pass, its milliseconds in a profiled step beside cuDNN's isolated best
    for that shape, the largest first; rows of kernels no pass names (bias gradients, copies) last.
    ``config`` None keeps each GPU's newest configuration (its last rows), "all" every one; tables
    written before the column existed are ``bf16-graphs``'s."""
    t = fast_path_csv(root, gpus, "layers")
    if t.empty:
        return t
    t = t.assign(config=t["config"].fillna("bf16-graphs") if "config" in t else "bf16-graphs")
    if config is None:
        t = t[t["config"] == t["gpu_slug"].map(t.groupby("gpu_slug")["config"].last())]
    elif config != "all":
        t = t[t["config"] == config]
    t = t.assign(is_pass=t["pass"].isin(list(CONV_PASSES.values())))
    return t.sort_values(["is_pass", "ms"], ascending=False, kind="stable").drop(columns="is_pass").reset_index(drop=True)


def thin_convs(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``fast_path/thin_convs.csv`` (``scripts/probes/thin_conv_probe.py``): per GPU, thin convolution and
    pass of the GPU's newest probe run, cuDNN's autotuned milliseconds beside the Triton kernels'
    with the package's launch shapes for that pass (the defaults of ``tiles.Tiles``, a GPU's ``kernels.TILES``;
    where the run has no such row, its fastest candidate)."""
    t = fast_path_csv(root, gpus, "thin_convs")
    if t.empty:
        return t
    if "run" in t:  # the newest probe run of each GPU (earlier runs timed earlier kernels)
        t = t[t["run"].fillna("") == t.groupby("gpu_slug")["run"].transform(lambda r: r.fillna("").iloc[-1])]
    keys = ["gpu_slug", "shape", "pass"]
    tri = t[t["impl"] == "Triton"]
    is_ours = pd.Series(True, index=tri.index)
    wgrad, defaults = tri["pass"].eq("weight gradient"), Tiles()
    for c in (c for c in tri.columns if c.startswith(("conv_", "wgrad_")) or c == "stages"):
        used = wgrad if c.startswith("wgrad_") or c == "stages" else ~wgrad  # the fields of the pass's kernels
        is_ours &= ~used | (tri[c] == getattr(defaults, c))
    tri = pd.concat([tri[is_ours], tri.sort_values("ms")]).drop_duplicates(keys)  # the defaults, else the fastest
    out = t[t["impl"] == "cuDNN"][keys + ["min_mb", "ms"]].merge(tri[keys + ["ms"]], on=keys, suffixes=("_cudnn", "_triton"))
    out["speedup"] = out["ms_cudnn"] / out["ms_triton"]
    out["triton_tbs"] = out["min_mb"] / out["ms_triton"] / 1e3
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def scaling(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Multi-GPU results: every ``<machine>/scaling.csv`` under ``root`` (rows as written by
    ``medddpm.profiling.scaling table``, with a ``machine`` column and, on several GPUs, whether it reaches
    ``SCALING_TARGET``), and the all-reduce profiles
    (``profile-<config>-<N>.json``) as one table."""
    from ..profiling.scaling import load_profiles

    frames = [pd.read_csv(p).assign(machine=p.parent.name) for p in sorted(Path(root).glob("*/scaling.csv"))]
    sc = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(sc):  # several GPUs: whether the row reaches the scaling target
        sc["reaches_97pct"] = (sc["scaling_efficiency"] >= SCALING_TARGET).where(sc["world_size"] > 1)
    return (sc,
            load_profiles(sorted(Path(root).glob("*/profile-*-*.json"))))


RANK_COLUMNS = ["machine", "run", "config", "world_size", "rank", "step_ms", "allreduce_ms_per_step",
                "exposed_ms_per_step", "compute_ms_per_step"]


def rank_profiles(root: Path) -> pd.DataFrame:
    """Every rank's numbers of the all-reduce profiles that record them (``profile-<config>-<N>.json``'s
    ``ranks``: wall ms per step, NCCL kernel time, its part no other kernel hides, the other kernels),
    a machine's current ones (``run`` "") and those of its earlier runs (``<machine>/<run>/``)."""
    paths = [(p, p.parent.name, "") for p in sorted(Path(root).glob("*/profile-*-*.json"))]
    paths += [(p, p.parent.parent.name, p.parent.name) for p in sorted(Path(root).glob("*/*/profile-*-*.json"))]
    rows = [{"machine": machine, "run": run, "config": d["config"], "world_size": d["world_size"], **r}
            for p, machine, run in paths for d in [json.loads(p.read_text())] for r in d.get("ranks", [])]
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def scaling_earlier(root: Path) -> pd.DataFrame:
    """Earlier scaling tables kept beside a machine's current one (``<machine>/<run>/scaling.csv``),
    with ``machine`` and ``run`` (the subfolder's name) columns."""
    frames = [pd.read_csv(p).assign(machine=p.parent.parent.name, run=p.parent.name)
              for p in sorted(Path(root).glob("*/*/scaling.csv"))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


LOOP_TARGET = 1.03  # loop / bench per micro-batch: the loop may add at most 3 % to its benchmark
SCALING_TARGET = 0.97  # T(1 GPU) / T(N GPUs) of the real loop, weak scaling


def loop_vs_bench(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``<gpu>/loop/loop_vs_bench.csv`` of every GPU that has one (``medddpm.train.loop``): the training
    loop's steady ms per micro-batch against ``bench`` of the same configuration and grad-accum, and whether it
    keeps within ``LOOP_TARGET``."""
    lb = results_csv(root, gpus, "loop/loop_vs_bench")
    return lb.assign(within_3pct=lb["ratio"] <= LOOP_TARGET) if len(lb) else lb


def loss_parity(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Held-out losses after short training (``fast_path/loss_parity.csv``, ``kind == 'eval'``),
    each with its GPU's baseline seed-to-seed band (min–max over the baseline seeds) and whether
    it lies inside that band."""
    lp = fast_path_csv(root, gpus, "loss_parity")
    if lp.empty:
        return lp
    ev = lp[lp["kind"] == "eval"].rename(columns={"step": "steps"})
    band = ev[ev["config"] == "baseline"].groupby("gpu_slug")["loss"].agg(band_low="min", band_high="max",
                                                                        band_seeds="count")
    ev = ev.join(band, on="gpu_slug")
    ev["inside_band"] = ev["loss"].between(ev["band_low"], ev["band_high"])
    return ordered(ev[["gpu_slug", "config", "seed", "size", "steps", "loss", "band_low", "band_high", "band_seeds",
                       "inside_band"]], ["gpu_slug", "config", "seed"])


CEILINGS = {"bf16 tensor": "bf16_matmul_tflops", "TF32 tensor": "tf32_matmul_tflops", "FP32": "fp32_matmul_tflops"}


def ceilings(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Each GPU's measured roofs (``peaks.json``, ``bench.measure_peaks``): compute ceilings in
    TFLOP/s (dense matmul in bf16, TF32 and FP32) and the DRAM bandwidth in TB/s (device copy)."""
    peaks = store.load_json("peaks.json", root, gpus)
    rows = [{"gpu_slug": g, "ceiling": name, "tflops": p[key], "dram_tbps": p["copy_gbps"] / 1e3}
            for g, p in peaks.items() for name, key in CEILINGS.items() if key in p]
    return pd.DataFrame(rows, columns=["gpu_slug", "ceiling", "tflops", "dram_tbps"])


def roofline(root: Path, gpus: list[str], mode: str = "paper", configs: list[str] | None = None) -> pd.DataFrame:
    """Every kernel of each ncu report (``mode``: 'paper' = the paper's 100-kernel window with the
    full set, 'roofline' = a whole step, ``medddpm profile --mode roofline``) as a roofline point
    (``metrics.roofline_points``), per GPU and configuration; reports without DRAM counters are left out."""
    k = ncu_kernels(root, gpus, mode)
    if k.empty:
        return k
    if configs:
        k = k[k["config"].isin(configs)]
    parts = []
    for _, d in k.groupby(["gpu_slug", "config"]):
        try:
            parts.append(M.roofline_points(d, ["gpu_slug", "config"]))
        except ValueError:  # a report from a metric set without DRAM bytes
            continue
    return ordered(pd.concat(parts, ignore_index=True), ["gpu_slug", "config"]) if parts else pd.DataFrame()


def with_roofs(points: pd.DataFrame, roofs: pd.DataFrame) -> pd.DataFrame:
    """``points`` (``roofline``) with each kernel's roofs on its GPU: the measured ceiling of its
    pipe (``roof_tflops``), the DRAM bandwidth, and its bound min(ceiling, bandwidth × intensity);
    kernels of a GPU without ``peaks.json`` are left out."""
    r = roofs.rename(columns={"ceiling": "path", "tflops": "roof_tflops", "dram_tbps": "bandwidth_tbps"})
    out = points.merge(r, on=["gpu_slug", "path"], how="inner")
    out["bound_tflops"] = out[["roof_tflops"]].assign(bw=out["bandwidth_tbps"] * out["intensity"]).min(axis=1)
    return ordered(out, ["gpu_slug", "config"])


def roofline_summary(points: pd.DataFrame, roofs: pd.DataFrame) -> pd.DataFrame:
    """Per GPU × configuration: kernels, the time share of kernels with no counted FLOPs (memory-only
    work), the time share of kernels at half their roofline bound (``with_roofs``) or more, and the
    window's achieved TFLOP/s."""
    if points.empty or roofs.empty:
        return pd.DataFrame()
    k = with_roofs(points, roofs)
    k["at_half_bound"] = (k["flops"] > 0) & (k["tflops"] >= 0.5 * k["bound_tflops"])
    out = k.groupby(["gpu_slug", "config"], observed=True).apply(lambda d: pd.Series({
        "kernels": len(d), "no_flops_share": d.loc[d["flops"] <= 0, "share"].sum(),
        "half_bound_share": d.loc[d["at_half_bound"], "share"].sum(),
        "window_tflops": d["flops"].sum() / (d["duration_ns"].sum() * 1e-9) / 1e12}), include_groups=False)
    return out.reset_index()


def roofline_gap(points: pd.DataFrame, roofs: pd.DataFrame) -> pd.DataFrame:
    """Where a report's time lies above the roofline, per GPU × configuration × category: the kernel
    time, the time at the roofline bound (each kernel's FLOPs at the ceiling of its pipe or its DRAM
    bytes at the bandwidth, whichever takes longer) and the difference, in ms, with the bound as a fraction of the
    time and the share of the report's whole gap. Kernels without counted FLOPs are bound by their bytes alone."""
    if points.empty or roofs.empty:
        return pd.DataFrame()
    k = with_roofs(points, roofs)
    k["time_ms"] = k["duration_ns"] / 1e6
    k["bound_ms"] = np.maximum(k["flops"] / (k["roof_tflops"] * 1e12), k["dram_bytes"] / (k["bandwidth_tbps"] * 1e12)) * 1e3
    out = k.groupby(["gpu_slug", "config", "category"], observed=True)[["time_ms", "bound_ms"]].sum().reset_index()
    out["gap_ms"] = out["time_ms"] - out["bound_ms"]
    out["bound_fraction"] = out["bound_ms"] / out["time_ms"]  # how near its bound the category runs
    out["gap_share"] = out["gap_ms"] / out.groupby(["gpu_slug", "config"], observed=True)["gap_ms"].transform("sum")
    return out.sort_values(["gpu_slug", "config", "gap_ms"], ascending=[True, True, False]).reset_index(drop=True)


ROOF_HIGHLIGHTS = {"conv": "convolution/GEMM", "norm": "normalization", "copy": "copy"}


def roofline_highlights(points: pd.DataFrame, roofs: pd.DataFrame) -> pd.DataFrame:
    """The longest kernel of each highlighted category (``ROOF_HIGHLIGHTS``) per GPU × configuration:
    its achieved TFLOP/s against the ceiling of its pipe, and its DRAM TB/s against the bandwidth;
    ``conv_pass`` names a convolution's pass (forward, data or weight gradient) where the kernel does."""
    if points.empty or roofs.empty:
        return pd.DataFrame()
    k = with_roofs(points, roofs)
    k = k[k["category"].isin(ROOF_HIGHLIGHTS.values())]
    top = k.sort_values("duration_ns", ascending=False).groupby(["gpu_slug", "config", "category"], observed=True).head(1)
    out = top.assign(what=top["category"].map({c: w for w, c in ROOF_HIGHLIGHTS.items()}), kernel=top["short_name"],
                     conv_pass=top["short_name"].map(conv_pass))
    out["compute_fraction"] = out["tflops"] / out["roof_tflops"]
    out["bandwidth_fraction"] = out["dram_tbps"] / out["bandwidth_tbps"]
    return out[["gpu_slug", "config", "what", "kernel", "conv_pass", "share", "tflops", "roof_tflops", "dram_tbps",
                "bandwidth_tbps", "compute_fraction", "bandwidth_fraction"]].reset_index(drop=True)


STEP_TARGET_MS = 50.0  # a fast training step at 128³ on the reference GPU (chapters 06-08)
COMPASS_MS = 40.0  # the compass goal for `fast`'s training step at 128³ on an H200 (the brief's), beside the 50 ms target


STATE_COLUMNS = ["gpu_slug", "fast step (ms)", "target (ms)", "met", "goal (ms)", "× FP32 baseline",
                 "× OPT1 (the paper's best)", "TFLOP/s", "of the bf16 peak", "FLOP floor (ms)"]


def state(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Where the training step stands: per GPU of the store with bench rows, today's `fast` step at 128³ (median of
    its newest bench row) against the 50 ms target and the 40 ms goal, its speed-ups over the FP32 baseline and
    over OPT1, the paper's best configuration, its model TFLOP/s and their share of the measured bf16 matmul peak, and
    the FLOP floor: the step's FLOPs at that peak."""
    b = ladder(root, gpus)
    rows = []
    for g, d in b.groupby("gpu_slug", sort=False) if len(b) else []:
        d = d.set_index("config")
        if "fast" not in d.index:
            continue
        fast, peak = d.loc["fast", "step_ms_median"], d.loc["fast", "peak_fraction"]
        rows.append({"gpu_slug": g, "fast step (ms)": fast, "target (ms)": STEP_TARGET_MS,
                     "met": "yes" if fast <= STEP_TARGET_MS else "no", "goal (ms)": COMPASS_MS,
                     "× FP32 baseline": d.loc["fast", "speedup_vs_baseline"],
                     "× OPT1 (the paper's best)": d.loc["opt1", "step_ms_median"] / fast if "opt1" in d.index else None,
                     "TFLOP/s": d.loc["fast", "tflops"], "of the bf16 peak": peak, "FLOP floor (ms)": fast * peak})
    return pd.DataFrame(rows, columns=STATE_COLUMNS)


def kernel_split(root: Path, gpus: list[str], configs: list[str]) -> pd.DataFrame:
    """Kernel time of one steady step (torch.profiler) per GPU and configuration: the convolutions (cuDNN's implicit
    GEMMs, every pass) against everything else."""
    t = torch_kernels(root, gpus, "step", configs)
    if t.empty:
        return pd.DataFrame(columns=["gpu_slug", "config", "convolution (ms)", "other (ms)", "kernel time (ms)"])
    ms = t["duration_us"] / 1e3
    conv = ms.where(t["category"] == "convolution/GEMM", 0.0)
    out = pd.DataFrame({"gpu_slug": t["gpu_slug"], "config": t["config"], "convolution (ms)": conv, "other (ms)": ms - conv,
                        "kernel time (ms)": ms})
    return out.groupby(["gpu_slug", "config"], observed=True, as_index=False).sum()


def kernel_state(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Chapter 07's first table: per GPU, ``bf16-graphs``'s step against its fastest kernel variant's, what the
    variant saves, and the variant against the 50 ms target."""
    kv, rows = kernel_variants(root, gpus), []
    for g, d in kv.groupby("gpu_slug", sort=False) if len(kv) else []:
        base, var = d[d["config"] == "bf16-graphs"], d[d["config"] != "bf16-graphs"]
        if base.empty or var.empty:
            continue
        b, best = base["step_ms_median"].iloc[0], var.loc[var["step_ms_median"].idxmin()]
        rows.append({"gpu_slug": g, "bf16-graphs (ms)": b, "fastest variant": best["config"],
                     "its step (ms)": best["step_ms_median"], "saved (ms)": b - best["step_ms_median"],
                     "× bf16-graphs": b / best["step_ms_median"], "target (ms)": STEP_TARGET_MS,
                     "met": "yes" if best["step_ms_median"] <= STEP_TARGET_MS else "no"})
    return pd.DataFrame(rows, columns=["gpu_slug", "bf16-graphs (ms)", "fastest variant", "its step (ms)", "saved (ms)",
                                       "× bf16-graphs", "target (ms)", "met"])


def variant_checks(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Is each kernel variant still right: per GPU and configuration, its ε's worst relative L2 against FP64 over t
    (``quality/agreement.csv``, 64³) and its held-out loss after 50 training steps against the FP32 baseline's seed band
    (``loss_parity``, seed 0)."""
    names, keys = ["bf16-graphs", *(k.name for k in KERNEL_VARIANTS)], ["gpu_slug", "config"]
    a = results_csv(root, gpus, "quality/agreement")
    worst = (a[a["config"].isin(names)].groupby(keys, as_index=False)["rel_l2"].max() if len(a)
             else pd.DataFrame(columns=[*keys, "rel_l2"])).rename(columns={"rel_l2": "worst ε rel. L2 vs FP64"})
    lp = loss_parity(root, gpus)
    lp = lp[lp["config"].isin(names) & (lp["seed"] == 0)] if len(lp) else pd.DataFrame(
        columns=[*keys, "loss", "band_low", "band_high", "inside_band"])
    side = np.where(lp["inside_band"].astype(bool), "inside", np.where(lp["loss"] < lp["band_low"], "below", "above"))
    lp = lp.assign(**{"against the band": side})[[*keys, "loss", "band_low", "band_high", "against the band"]]
    out = worst.merge(lp.rename(columns={"loss": "loss after 50 steps"}), on=keys, how="outer")
    return ordered(out, keys) if len(out) else out


def norm_totals(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The GroupNorm shapes of ``fast_path/norms.csv`` summed per GPU: how many shapes and layers, the bytes forward
    and backward must move, and each implementation's time and necessary traffic per second (Inductor's kernels
    against the Triton ones)."""
    nm = fast_path_csv(root, gpus, "norms")
    if nm.empty:
        return nm
    g = nm.groupby("gpu_slug")
    out = pd.DataFrame({"shapes": g.size(), "layers": g["count"].sum(), "minimal GB (step)": g["min_step_mb"].sum() / 1e3})
    for impl in ("inductor", "triton"):
        for which in ("forward", "step"):
            out[f"{impl} {which} (ms)"] = g[f"{impl}_{which}_ms"].sum()
        out[f"{impl} step (TB/s)"] = out["minimal GB (step)"] / out[f"{impl} step (ms)"]
    return out.reset_index()


NORM_KERNELS = ("_stats_kernel", "_apply_kernel", "_bwd_reduce_kernel", "_bwd_dx_kernel")  # net/kernels.py's norm passes


def norm_tiles_largest(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Per GPU, the Triton norm kernels on the largest GroupNorm with their default launch shapes
    (``fast_path/norm_tiles.csv``, candidate 0): the TB/s each reaches on its necessary bytes."""
    nt = fast_path_csv(root, gpus, "norm_tiles")
    if nt.empty:
        return nt
    nt = nt[(nt["candidate"] == 0) & nt["kernel"].isin(NORM_KERNELS)].assign(elements=lambda d: d["channels"] * d["side"] ** 3)
    nt = nt[nt["elements"] == nt.groupby("gpu_slug")["elements"].transform("max")]
    return nt.assign(shape=nt["channels"].astype(int).astype(str) + " channels × " + nt["side"].astype(int).astype(str)
                     + "³")[["gpu_slug", "shape", "kernel", "tbs"]].reset_index(drop=True)


def _thin(signature: str) -> bool:
    """True for a 3³ convolution with a thin side ('64→1 k3 128³→128³'), the kind ``kernels.conv3d_thin`` computes."""
    m = re.match(r"(\d+)→(\d+) k3 ", signature)
    return bool(m) and min(int(m[1]), int(m[2])) <= THIN


def layer_totals(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``layer_costs`` summed per GPU (its newest configuration): the step's convolution passes against the same shapes
    on their own at cuDNN's best, how many shape-and-pass rows run slower in the step, the two thin convolutions in
    this configuration and in ``bf16-graphs``, and the kernels that compute no pass."""
    ly, every = layer_costs(root, gpus), layer_costs(root, gpus, "all")
    rows = []
    for g, d in ly.groupby("gpu_slug", sort=False) if len(ly) else []:
        passes, cfg = d[d["isolated_ms"].notna()], d["config"].iloc[0]
        thin = every[(every["gpu_slug"] == g) & every["signature"].map(_thin)].groupby("config")["ms"].sum()
        rows.append({"gpu_slug": g, "config": cfg, "convolution passes (ms)": passes["ms"].sum(),
                     "alone at cuDNN's best (ms)": passes["isolated_ms"].sum(),
                     "rows slower in the step": f"{int((passes['lost_ms'] > 0).sum())} of {len(passes)}",
                     "thin convolutions (ms)": thin.get(cfg), "thin in bf16-graphs (ms)": thin.get("bf16-graphs"),
                     "no pass (ms)": d.loc[d["isolated_ms"].isna(), "ms"].sum()})
    return pd.DataFrame(rows)


def roofline_state(gap: pd.DataFrame) -> pd.DataFrame:
    """Chapter 08's first table, from ``roofline_gap`` of the step reports: per GPU and configuration (``bf16-graphs``,
    ``fast``), the step's kernel time against the same traffic and FLOPs at the roofline bounds, the gap, the
    convolutions' share of it, and whether the 50 ms target lies within the bound."""
    if gap.empty:
        return pd.DataFrame()
    d = gap[gap["config"].isin(["bf16-graphs", "fast"])]
    g = d.groupby(["gpu_slug", "config"], observed=True)
    out = g[["time_ms", "bound_ms", "gap_ms"]].sum()
    out["convolutions' share of the gap"] = d[d["category"] == "convolution/GEMM"].groupby(
        ["gpu_slug", "config"], observed=True)["gap_share"].sum()
    out["50 ms within the bound"] = np.where(out["bound_ms"] <= STEP_TARGET_MS, "yes", "no")
    return out.reset_index().rename(columns={"time_ms": "kernel time (ms)", "bound_ms": "at the bounds (ms)",
                                             "gap_ms": "above them (ms)"})


def roofline_checks(root: Path, gpus: list[str], window: pd.DataFrame) -> pd.DataFrame:
    """What keeps the FLOP counts honest, per GPU: the probe's counted over expected FLOPs on matmuls of known size
    (``fast_path/roofline_probe.csv``), ncu's counter passes a kernel per pipe (``fast_path/ncu_passes.csv``), and on
    the paper's window (``window``, ``roofline(…, "paper")``) the longest convolution's counted TFLOP against the
    formula's and how many of its kernels are gradient convolutions."""
    rows = []
    probe = results_csv(root, gpus, "fast_path/roofline_probe")
    for g, d in probe.groupby("gpu_slug") if len(probe) else []:
        rows.append({"gpu_slug": g, "check": "roofline probe: counted / 2n³ FLOPs",
                     "value": f"{d['flops_over_expected'].min():.4f}–{d['flops_over_expected'].max():.4f}"})
    passes = results_csv(root, gpus, "fast_path/ncu_passes")
    for (g, path), d in passes.groupby(["gpu_slug", "flop_paths"]) if len(passes) else []:
        rows.append({"gpu_slug": g, "check": f"ncu counter passes a kernel, {path} pipes", "value": f"{d['passes'].max()}"})
    formula = 2 * 128**3 * 64 * 64 * 27 / 1e12  # a 64→64-channel 3³ convolution over 128³ voxels
    for g, d in window.groupby("gpu_slug", observed=True) if len(window) else []:
        conv = d[d["category"] == "convolution/GEMM"]
        if len(conv):
            rows.append({"gpu_slug": g, "check": "paper window: longest convolution's TFLOP (formula "
                         f"2·128³·64·64·27 = {formula:.3f})", "value": f"{conv.nlargest(1, 'duration_ns')['flops'].iloc[0] / 1e12:.3f}"})
        grads = d["short_name"].map(conv_pass).isin(["data gradient", "weight gradient"]).sum()
        rows.append({"gpu_slug": g, "check": "paper window: gradient convolutions in it", "value": f"{grads:,}"})
    return pd.DataFrame(rows, columns=["gpu_slug", "check", "value"])


def scaling_line(sc: pd.DataFrame) -> str | None:
    """"53.0 → 54.4 / 54.5 ms/step on 1 → 2 / 4 GPUs (97.4 % / 97.2 %, machine)": today's ``fast`` at grad-accum 1 on
    the machine that ran it on the most GPUs (then the most rows), from ``scaling``'s rows; None without such rows."""
    rows = sc[(sc["config"] == "fast") & (sc["grad_accum"] == 1)] if len(sc) else sc
    if not len(rows) or not (rows["world_size"] > 1).any():
        return None
    g = rows.groupby("machine").agg(n=("world_size", "max"), k=("world_size", "size"))
    rows = rows[rows["machine"] == g.sort_values(["n", "k"], ascending=False, kind="stable").index[0]].sort_values("world_size")
    multi = rows[rows["world_size"] > 1]
    if not (rows["world_size"] == 1).any():
        return None
    return (f"{rows['step_ms_median'].iloc[0]:.1f} → " + " / ".join(f"{ms:.1f}" for ms in multi["step_ms_median"])
            + " ms/step on 1 → " + " / ".join(str(n) for n in multi["world_size"]) + " GPUs ("
            + " / ".join(f"{100 * e:.1f} %" for e in multi["scaling_efficiency"]) + f", {gpu_name(rows['machine'].iloc[0])})")

"""Tables for the book, built from the results store (``data/results``) and the paper's numbers.
Each returns a tidy DataFrame; the notebooks only display or plot them."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.config import CONFIGS, DEFAULT_ETA, KERNEL_VARIANTS, PAPER_CONFIGS
from ..net.kernels import TILES
from ..profiling import metrics as M
from ..profiling import store
from ..profiling.categories import CATEGORY_PATTERNS, CONV_PASSES, PAPER_ABBREVIATIONS, category, conv_pass, short_name
from ..profiling.torchprof import PAPER_COUNT, PAPER_SKIP, kernels_only, window_coverage
from . import paper
from .present import gpu_name

CONFIG_ORDER = list(CONFIGS)
SCOPES = {"paper": "paper window (100 kernels)", "step": "whole step"}


def ordered(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``df`` with ``config`` in CONFIG_ORDER (an ordered categorical), stably sorted by ``keys``."""
    df = df.assign(config=pd.Categorical(df["config"], CONFIG_ORDER, ordered=True))
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def select_gpus(root: Path, gpus: list[str] | str | None) -> list[str]:
    """``None`` or 'all' → every GPU under ``root``; a comma-separated string or list otherwise.
    The GPUs' recorded names are read on the way (``present.register_gpus``)."""
    from .present import register_gpus

    register_gpus(root)
    if gpus in (None, "", "all"):
        return store.gpus(root)
    wanted = gpus.split(",") if isinstance(gpus, str) else list(gpus)
    return [g.strip() for g in wanted]


def gpu_properties(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Table 1, measured side: one row per GPU from info.json / env.json / nvidia-smi.csv."""
    rows = []
    for g in gpus:
        info = store.load_json("info.json", root, [g]).get(g, {})
        env = store.load_json("env.json", root, [g]).get(g, {})
        smi_path = root / g / "nvidia-smi.csv"
        smi = pd.read_csv(smi_path, skipinitialspace=True).iloc[0].to_dict() if smi_path.exists() else {}
        rows.append({
            "gpu": g, "name": info.get("gpu"), "paper GPU": paper.paper_gpu(g) or "—",
            "SMs": info.get("sm_count"), "memory (GiB)": info.get("memory_gib"), "L2 (MiB)": info.get("l2_mib"),
            "max SM clock": smi.get("clocks.max.sm [MHz]"), "max memory clock": smi.get("clocks.max.memory [MHz]"),
            "driver": smi.get("driver_version") or env.get("gpu", {}).get("driver"),
            "torch": info.get("torch"), "CUDA": info.get("cuda"), "cuDNN": info.get("cudnn"),
            "ncu": env.get("ncu", "—"), "bandwidth measured": "not measured",
        })
    return pd.DataFrame(rows)


def bench(root: Path, gpus: list[str], configs: list[str] | None = None, batch: int | None = 1) -> pd.DataFrame:
    """Step time, forward time, throughput (volumes/s) and peak memory per GPU × configuration
    (``configs``, default all) at ``batch`` volumes (None: every batch), in CONFIG_ORDER."""
    b = store.load_bench(root, gpus)
    if b.empty:
        return b
    if configs is not None:
        b = b[b["config"].isin(configs)]
    if batch is not None:
        b = b[b["batch"] == batch]
    b = b.copy()
    b["volumes_per_s"] = 1e3 * b["batch"] / b["step_ms_median"]
    return ordered(with_speedup(b), ["gpu_slug", "config"])


def with_speedup(b: pd.DataFrame) -> pd.DataFrame:
    """Bench rows with ``speedup_vs_baseline``: the FP32 baseline's step time over each row's, on
    the same GPU, model, size and batch (like with like; NaN where that baseline was not timed)."""
    setup = ["gpu_slug", "model", "size", "batch"]
    base = b[b["config"] == "baseline"].set_index(setup)["step_ms_median"].rename("baseline_ms")
    return b.assign(speedup_vs_baseline=b.join(base, on=setup)["baseline_ms"] / b["step_ms_median"])


@functools.lru_cache(maxsize=16)
def train_flops(model: str, size: str) -> int:
    """FLOPs of one training step of one volume of ``size`` ('128x128x128'): 3 × the forward's
    (forward + backward)."""
    from ..core.config import model_preset
    from ..net.summary import summarize

    return 3 * summarize(model_preset(model), tuple(int(s) for s in size.split("x")))["forward_flops"]


def torch_kernels(root: Path, gpus: list[str], which: str = "step", configs: list[str] | None = None) -> pd.DataFrame:
    """torch.profiler kernel tables ('first' step from process start or a steady 'step'), kernels
    only (``torchprof.kernels_only`` per GPU × configuration), with category and short name.
    ``configs`` defaults to the paper's five (the reproduction's chapters)."""
    t = store.load_table(f"torch_{which}_kernels", root, gpus)
    if t.empty:
        return t
    t = t[t["config"].isin(configs or list(PAPER_CONFIGS))]
    if t.empty:
        return t
    t = pd.concat([kernels_only(d) for _, d in t.groupby(["gpu_slug", "config"], sort=True)], ignore_index=True)
    t["category"] = t["name"].map(category)
    t["short_name"] = t["name"].map(short_name)
    return t


def coverage(root: Path, gpus: list[str]) -> pd.DataFrame:
    """How much of a steady-state step the paper's 100-kernel ncu window covers (torch.profiler),
    recomputed from the kernel tables."""
    first, step = torch_kernels(root, gpus, "first"), torch_kernels(root, gpus, "step")
    if first.empty or step.empty:
        return pd.DataFrame()
    steps = dict(list(step.groupby(["gpu_slug", "config"])))
    rows = [{"gpu_slug": g, "config": c, **window_coverage(f, steps[g, c])}
            for (g, c), f in first.groupby(["gpu_slug", "config"]) if (g, c) in steps]
    return ordered(pd.DataFrame(rows), ["gpu_slug", "config"])


def window_vs_step(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Kernel mix by category of the paper's window (kernels 10–109 from process start) and of a
    whole steady-state step, both from torch.profiler."""
    first, step = torch_kernels(root, gpus, "first"), torch_kernels(root, gpus, "step")
    if first.empty or step.empty:
        return pd.DataFrame()
    window = first[(first["launch"] >= PAPER_SKIP) & (first["launch"] < PAPER_SKIP + PAPER_COUNT)]
    both = pd.concat([window.assign(scope=SCOPES["paper"]), step.assign(scope=SCOPES["step"])])
    return ordered(M.kernel_mix(both, "category", "duration_us", ["gpu_slug", "config", "scope"]),
                   ["gpu_slug", "config", "scope"])


def ncu_kernels(root: Path, gpus: list[str], mode: str = "paper") -> pd.DataFrame:
    return store.load_table(f"ncu_{mode}_kernels", root, gpus)


def ncu_summaries(root: Path, gpus: list[str], mode: str = "paper") -> pd.DataFrame:
    """``metrics.report_summary`` per GPU × configuration of the ncu reports found."""
    k = ncu_kernels(root, gpus, mode)
    if k.empty:
        return pd.DataFrame()
    rows = [{"gpu": g, "config": c, **M.report_summary(d)} for (g, c), d in k.groupby(["gpu_slug", "config"])]
    return pd.DataFrame(rows)


def per_gpu(fn, kernels: pd.DataFrame, other: pd.DataFrame, config: str = "baseline", **kw) -> pd.DataFrame:
    """``fn(kernels, other, **kw)`` on each GPU's report of ``config`` (both tables as loaded from
    the store), stacked with a ``gpu`` column: e.g. ``metrics.priority_scores`` with the rules,
    ``metrics.ipc_stack`` or ``metrics.dominant_instruction_mix`` with the instruction classes."""
    if kernels.empty or other.empty:
        return pd.DataFrame()
    k, o = kernels[kernels["config"] == config], other[other["config"] == config]
    parts = [fn(d, o[o["gpu_slug"] == g], **kw).assign(gpu=g) for g, d in k.groupby("gpu_slug")
             if (o["gpu_slug"] == g).any()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _beside_paper(long: pd.DataFrame, figure: str) -> pd.DataFrame:
    """``long`` (gpu, config, metric, measured) with the paper's GPU for each of ours ('—' if none)
    and the paper's value for the same figure, GPU, configuration and metric (NaN where it gives none)."""
    ref = (paper.values(figure=figure)[["gpu", "config", "metric", "value"]]
           .drop_duplicates(["gpu", "config", "metric"])
           .rename(columns={"gpu": "paper GPU", "value": "paper"}))
    long = long.assign(**{"paper GPU": long["gpu"].map(lambda g: paper.paper_gpu(g) or "—")})
    return long.merge(ref, on=["paper GPU", "config", "metric"], how="left")


def normalized_vs_paper(root: Path, gpus: list[str], mode: str = "paper") -> pd.DataFrame:
    """Cycles, instructions and IPC normalized to baseline (§6.1), ours next to the paper's."""
    n = M.normalized(ncu_summaries(root, gpus, mode))
    if n.empty:
        return n
    ours = {"cycles": "norm_cycles", "instructions": "norm_instructions", "ipc_geomean": "norm_ipc"}
    long = n.rename(columns=ours).melt(["gpu", "config"], list(ours.values()), var_name="metric", value_name="measured")
    out = _beside_paper(long, "§6.1")
    return out.assign(metric=out["metric"].str.removeprefix("norm_"))


def abbreviations(kernels: pd.DataFrame) -> pd.DataFrame:
    """Table 2: the paper's abbreviations, plus the stable ones we assign, with measured time."""
    paper_rows = pd.DataFrame({"abbr": list(PAPER_ABBREVIATIONS), "paper kernel": list(PAPER_ABBREVIATIONS.values())})
    if kernels.empty:
        return paper_rows
    seen = kernels.groupby("abbr", as_index=False).agg(example=("short_name", "first"), kernels=("id", "count"),
                                                       duration_ms=("duration_ns", lambda s: s.sum() / 1e6))
    out = paper_rows.merge(seen, on="abbr", how="outer")
    return out.sort_values("duration_ms", ascending=False, na_position="last").reset_index(drop=True)


def metric_vs_paper(summaries: pd.DataFrame, metrics: list[str], figure: str) -> pd.DataFrame:
    """Long table of ``metrics`` per GPU × configuration, ours and the paper's where it gives one.
    Relative metrics (rel_*) are ours divided by baseline on the same GPU."""
    plain = [m for m in metrics if not m.startswith("rel_")]
    rel = [m.removeprefix("rel_") for m in metrics if m.startswith("rel_")]
    parts = []
    if plain and not summaries.empty:
        parts.append(summaries.melt(["gpu", "config"], plain, var_name="metric", value_name="measured"))
    norm = M.normalized(summaries) if rel else pd.DataFrame()
    if not norm.empty:
        long = norm.melt(["gpu", "config"], rel, var_name="metric", value_name="measured")
        parts.append(long.assign(metric="rel_" + long["metric"]))
    return _beside_paper(pd.concat(parts, ignore_index=True), figure) if parts else pd.DataFrame()


def normalized_scopes(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``normalized_vs_paper`` for the paper's window (ncu paper mode) and for a whole steady-state
    step (ncu step mode), one ``scope`` column telling them apart."""
    frames = [normalized_vs_paper(root, gpus, mode).assign(mode=mode, scope=scope) for mode, scope in SCOPES.items()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    return ordered(pd.concat(frames, ignore_index=True), ["gpu", "config", "metric", "scope"])


def scope_pivot(norm: pd.DataFrame) -> pd.DataFrame:
    """``normalized_scopes`` as one wide table: (metric, scope) columns of ours, (metric, 'paper')."""
    if norm.empty:
        return norm
    measured = norm.pivot_table(index=["gpu", "config"], columns=["metric", "scope"], values="measured", observed=True)
    # groupby keeps all-NaN columns (pivot_table drops them): a GPU the paper never ran has no paper values
    ref = norm.groupby(["gpu", "config", "metric"], observed=True)["paper"].first().unstack("metric")
    ref.columns = pd.MultiIndex.from_tuples([(m, "paper") for m in ref.columns])
    return measured.join(ref).sort_index(axis=1).round(3)


def step_agreement(root: Path, gpus: list[str]) -> pd.DataFrame:
    """One steady-state step seen two ways: ncu step mode (kernel replay, one counter pass) and
    torch.profiler (no replay), with kernel counts and summed kernel time side by side."""
    n = ncu_kernels(root, gpus, "step")
    t = torch_kernels(root, gpus, "step")
    if n.empty or t.empty:
        return pd.DataFrame()
    a = n.groupby(["gpu_slug", "config"]).agg(ncu_kernels=("id", "count"), ncu_ms=("duration_ns", lambda s: s.sum() / 1e6))
    b = t.groupby(["gpu_slug", "config"]).agg(torch_kernels=("name", "count"), torch_ms=("duration_us", lambda s: s.sum() / 1e3))
    out = a.join(b, how="inner").reset_index()
    out["time_ratio"] = out["ncu_ms"] / out["torch_ms"]
    return ordered(out, ["gpu_slug", "config"])


def agreement_view(a: pd.DataFrame) -> pd.DataFrame:
    """``step_agreement`` for the page: the two kernel counts in one column ('512 / 512')."""
    kernels = [f"{n} / {t}" for n, t in zip(a["ncu_kernels"], a["torch_kernels"])]
    return a.assign(kernels=kernels)[["gpu_slug", "config", "kernels", "ncu_ms", "torch_ms", "time_ratio"]]


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
    with the package's launch shapes for that pass (``kernels.TILES``; where the run has no such
    row, its fastest candidate)."""
    t = fast_path_csv(root, gpus, "thin_convs")
    if t.empty:
        return t
    if "run" in t:  # the newest probe run of each GPU (earlier runs timed earlier kernels)
        t = t[t["run"].fillna("") == t.groupby("gpu_slug")["run"].transform(lambda r: r.fillna("").iloc[-1])]
    keys = ["gpu_slug", "shape", "pass"]
    tri = t[t["impl"] == "Triton"]
    is_ours = pd.Series(True, index=tri.index)
    wgrad = tri["pass"].eq("weight gradient")
    for c in (c for c in tri.columns if c.startswith(("conv_", "wgrad_")) or c == "stages"):
        used = wgrad if c.startswith("wgrad_") or c == "stages" else ~wgrad  # the fields of the pass's kernels
        is_ours &= ~used | (tri[c] == getattr(TILES, c))
    tri = pd.concat([tri[is_ours], tri.sort_values("ms")]).drop_duplicates(keys)  # the defaults, else the fastest
    out = t[t["impl"] == "cuDNN"][keys + ["min_mb", "ms"]].merge(tri[keys + ["ms"]], on=keys, suffixes=("_cudnn", "_triton"))
    out["speedup"] = out["ms_cudnn"] / out["ms_triton"]
    out["triton_tbs"] = out["min_mb"] / out["ms_triton"] / 1e3
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def fast_path_csv(root: Path, gpus: list[str], name: str) -> pd.DataFrame:
    """``<gpu>/fast_path/<name>.csv`` of every GPU that has one (agreement, train_timing…)."""
    return results_csv(root, gpus, f"fast_path/{name}")


def results_csv(root: Path, gpus: list[str], name: str) -> pd.DataFrame:
    """``<gpu>/<name>.csv`` of every GPU that has one, with a ``gpu_slug`` column."""
    frames = [pd.read_csv(root / g / f"{name}.csv").assign(gpu_slug=g) for g in gpus
              if (root / g / f"{name}.csv").exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


FULL_SIZE = "128x128x128"  # the paper's whole-head volume, as bench tables write it


def sample_bench(root: Path, gpus: list[str], size: str | None = FULL_SIZE, every_eta: bool = False) -> pd.DataFrame:
    """``<gpu>/sample_bench.csv`` rows (seconds per sampled volume) of DDPM and DDIM chains of
    volumes of ``size`` (None: every size); the newest row of each (GPU, configuration, size,
    sampler, steps, batch, η) wins, as in ``bench``, and of a DDIM chain timed at several η the one
    at ``DEFAULT_ETA`` (η costs no time: one noise draw a step; ``every_eta`` keeps each η). Rows
    written before the table had an ``eta`` column ran DDIM at η = 0. The few-step solvers' rows:
    ``solver_bench``."""
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


def solver_bench(root: Path, gpus: list[str], size: str = FULL_SIZE) -> pd.DataFrame:
    """``sample_bench.csv`` rows of the few-step solvers (``solvers.SOLVERS``) at ``size``: the
    newest row of each (GPU, configuration, sampler, steps, spacing, batch)."""
    from ..diffusion.solvers import SOLVERS

    sb = results_csv(root, gpus, "sample_bench")
    if sb.empty or "spacing" not in sb:
        return pd.DataFrame()
    sb = sb[(sb["size"] == size) & sb["sampler"].isin(SOLVERS)]
    keys = ["gpu_slug", "config", "sampler", "steps", "spacing", "batch"]
    return sb.drop_duplicates(keys, keep="last").reset_index(drop=True)


def scaling(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Multi-GPU results: every ``<machine>/scaling.csv`` under ``root`` (rows as written by
    ``medddpm.profiling.scaling table``, with a ``machine`` column), and the all-reduce profiles
    (``profile-<config>-<N>.json``) as one table."""
    from ..profiling.scaling import load_profiles

    frames = [pd.read_csv(p).assign(machine=p.parent.name) for p in sorted(Path(root).glob("*/scaling.csv"))]
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(),
            load_profiles(sorted(Path(root).glob("*/profile-*-*.json"))))


def scaling_earlier(root: Path) -> pd.DataFrame:
    """Earlier scaling tables kept beside a machine's current one (``<machine>/<run>/scaling.csv``),
    with ``machine`` and ``run`` (the subfolder's name) columns."""
    frames = [pd.read_csv(p).assign(machine=p.parent.parent.name, run=p.parent.name)
              for p in sorted(Path(root).glob("*/*/scaling.csv"))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def loop_vs_bench(root: Path, gpus: list[str]) -> pd.DataFrame:
    """``<gpu>/loop/loop_vs_bench.csv`` of every GPU that has one (``medddpm.train.loop``): the training
    loop's steady ms per micro-batch against ``bench`` of the same configuration and grad-accum."""
    return results_csv(root, gpus, "loop/loop_vs_bench")


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


def sampling_targets(sb: pd.DataFrame, targets: dict[str, float], config: str = "bf16-graphs",
                     reference: str = "opt1") -> pd.DataFrame:
    """Per GPU and sampler: ``config``'s seconds per volume, the target, whether it is met, and the
    speed-up over ``reference`` (``sb`` from ``sample_bench``)."""
    s = sb.set_index(["gpu_slug", "config", "sampler"])["s_per_volume_median"]
    rows = []
    for (g, c, smp), v in s.items():
        if c != config or smp not in targets:
            continue
        ref = s.get((g, reference, smp), float("nan"))
        rows.append({"gpu_slug": g, "sampler": smp, "s_per_volume": v, "target_s": targets[smp],
                     "meets": v <= targets[smp], "speedup_vs_reference": ref / v})
    return pd.DataFrame(rows)


def denoise_categories(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Milliseconds per denoising step by kernel category (rows) and configuration (columns), from
    ``sampling/denoise_kernels.csv`` (``sample_bench.denoise_kernels``)."""
    dk = results_csv(root, gpus, "sampling/denoise_kernels")
    if dk.empty:
        return dk
    per = dk.pivot_table(index="category", columns="config", values="ms_per_step", aggfunc="sum").fillna(0)
    return per.sort_values(per.columns[0], ascending=False)


# ---- quality parity (``<gpu>/quality/``, scripts/quality.py) ----------------------------------

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


def parity_curves(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Held-out loss (mean over subjects and t) per (GPU, config, seed, step)."""
    ho = quality_csv(root, gpus, "parity_heldout")
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
    """Steady-state ms/step (median after the first read-back interval, ``train.steady_intervals``)
    of the run timing ``<gpu>/<name>.csv``, per GPU."""
    from ..train.trainer import steady_intervals

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


def long_run(root: Path, gpu: str, tail: int = 500) -> dict[str, float] | None:
    """The long training run of the quality study (``quality/long_log.csv``, ``long_timing.csv``):
    steps trained, steady ms/step and the mean training loss of the last ``tail`` steps."""
    log = quality_csv(root, [gpu], "long_log")
    if log.empty:
        return None
    return {"steps": int(log["step"].max()), "loss_tail": float(log["loss"].tail(tail).mean()), "tail": tail,
            "ms_per_step": float(steady_ms(root, [gpu], "quality/long_timing").get(gpu, float("nan")))}


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


# --- the paper's numbers in the same axes as ours (issue 12) --------------------------------------

INSTRUCTION_CLASS = {"fp_share_pct": "Floating Point", "int_share_pct": "Integer", "ls_share_pct": "Load/Store",
                     "control_share_pct": "Control", "ud_share_pct": "Uniform Datapath"}


def subject_share(kernels: pd.DataFrame, subject: str, duration: str) -> float:
    """The share of summed kernel time the paper's ``subject`` names: a category, categories joined
    by '+', or else a kernel-name fragment (e.g. 'sm80_xmma_fprop_implicit_gemm'). ``kernels``: an
    ncu table (column ``kernel``) or a torch.profiler one (``name``)."""
    total = kernels[duration].sum()
    parts = subject.split("+")
    if set(parts) <= {name for name, _ in CATEGORY_PATTERNS} | {"other"}:
        mask = kernels["category"].isin(parts)
    else:
        names = kernels["kernel"] if "kernel" in kernels else kernels["name"]  # ncu / torch.profiler tables
        mask = names.str.contains(subject, regex=False)
        if not mask.any():  # another GPU's kernel (e.g. V100's volta_scudnn): nothing to compare
            return float("nan")
    return float(kernels.loc[mask, duration].sum() / total) if total else float("nan")


def _paper_rows(ref: pd.DataFrame, x) -> pd.DataFrame:
    return paper.as_series(ref.assign(x=ref.apply(x, axis=1)))[["x", "series", "value", "label"]]


def kernel_shares_vs_paper(kernels: pd.DataFrame, figure: str, duration: str) -> pd.DataFrame:
    """Figs 6 and 8: every kernel-share number of ``figure`` (``kernel_share_pct``) beside the same
    subject's share in our ``kernels`` (columns gpu_slug, config, kernel, category), per GPU and
    configuration. Long table: x ('<config>: <subject>'), series (GPU name or '<GPU> (paper)'), value (%)."""
    ref = paper.values(figure=figure, metric="kernel_share_pct")
    if ref.empty:
        return pd.DataFrame(columns=["x", "series", "value", "label"])
    key = lambda r: f"{r['config']}: {r['subject']}"  # noqa: E731
    rows = []
    for (g, c), k in (kernels.groupby(["gpu_slug", "config"], observed=True) if not kernels.empty else []):
        for subject in ref.loc[ref["config"] == c, "subject"].unique():
            rows.append({"x": f"{c}: {subject}", "series": gpu_name(g), "value": 100 * subject_share(k, subject, duration)})
    ours = pd.DataFrame(rows, columns=["x", "series", "value"]).dropna(subset=["value"])
    return pd.concat([ours, _paper_rows(ref, key)], ignore_index=True)


def instruction_shares_vs_paper(kernels: pd.DataFrame, instructions: pd.DataFrame, figures: list[str],
                                only_paper: bool = False, by_config: bool = True) -> pd.DataFrame:
    """Figs 4, 7 and 9: the paper's instruction-class shares of the dominant convolution beside the
    class shares of the dominant kernel of our ncu windows (``metrics.dominant_instruction_mix``: the
    kernel function with the most time), per GPU and configuration. Long table like
    ``kernel_shares_vs_paper``; x = '<config>: <class>' (``by_config``, else '<class>'), largest
    measured first, every class we measured (``only_paper``: just those the paper gives a number for)."""
    ref = paper.values(figure=figures)
    ref = ref[ref["metric"].isin(list(INSTRUCTION_CLASS))].drop_duplicates(["gpu", "config", "metric"])

    def key(config: str, cls: str) -> str:
        return f"{config}: {cls}" if by_config else cls

    rows = [{"x": key(c, r["class"]), "series": gpu_name(r["gpu"]), "value": 100 * r["share"]}
            for c in ref["config"].unique()
            for _, r in per_gpu(M.dominant_instruction_mix, kernels, instructions, config=c).iterrows()]
    ours = pd.DataFrame(rows, columns=["x", "series", "value"])
    theirs = _paper_rows(ref, lambda r: key(r["config"], INSTRUCTION_CLASS[r["metric"]]))
    if only_paper:
        ours = ours[ours["x"].isin(set(theirs["x"]))]
    return pd.concat([ours, theirs], ignore_index=True)


def dominant_cycles_vs_paper(kernels: pd.DataFrame) -> pd.DataFrame:
    """Fig 4 / §4.1: elapsed cycles of the longest kernel of each baseline window beside the paper's
    dominant convolution on V100, A100 and H100."""
    ref = paper.values(figure="Fig 4", metric="cycles")
    base = kernels[kernels["config"] == "baseline"] if not kernels.empty else kernels
    rows = [{"x": "dominant convolution", "series": gpu_name(g), "value": float(d.nlargest(1, "duration_ns")["cycles"].iloc[0])}
            for g, d in (base.groupby("gpu_slug") if not base.empty else [])]
    return pd.concat([pd.DataFrame(rows, columns=["x", "series", "value"]),
                      _paper_rows(ref, lambda r: "dominant convolution")], ignore_index=True)


# --- roofline (issue 9) ------------------------------------------------------------------------------

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
    bytes at the bandwidth, whichever takes longer) and the difference, in ms, with the share of
    the report's whole gap. Kernels without counted FLOPs are bound by their bytes alone."""
    if points.empty or roofs.empty:
        return pd.DataFrame()
    k = with_roofs(points, roofs)
    k["time_ms"] = k["duration_ns"] / 1e6
    k["bound_ms"] = np.maximum(k["flops"] / (k["roof_tflops"] * 1e12), k["dram_bytes"] / (k["bandwidth_tbps"] * 1e12)) * 1e3
    out = k.groupby(["gpu_slug", "config", "category"], observed=True)[["time_ms", "bound_ms"]].sum().reset_index()
    out["gap_ms"] = out["time_ms"] - out["bound_ms"]
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

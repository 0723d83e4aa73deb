"""Tables for the book, built from the results store (``data/results``) and the paper's numbers.
Each returns a tidy DataFrame; the notebooks only display or plot them. This module holds what every
chapter shares and the tables of chapters 01–05; ``fast_tables`` those of 06–08 and
``quality_tables`` those of 09–12."""
from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from ..core.config import CONFIGS, PAPER_CONFIGS
from ..profiling import metrics as M
from ..profiling import store
from ..profiling.categories import CATEGORY_PATTERNS, PAPER_ABBREVIATIONS, category, short_name
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


LEVERS = (("opt1", "baseline"), ("opt2", "baseline"), ("opt12", "opt1"), ("pytorch-default", "baseline"))  # chapter
# 05's state: each of the paper's configurations against the one it changes (TF32, channels-last, both, PyTorch's own)


def lever_ratios(b: pd.DataFrame) -> pd.DataFrame:
    """Per GPU of ``bench`` rows and lever of ``LEVERS`` that both rows have: the two median step times and how many
    times faster the lever is (above 1: faster)."""
    ms = b.set_index(["gpu_slug", "config"])["step_ms_median"] if not b.empty else pd.Series(dtype=float)
    rows = [{"gpu": g, "config": lever, "against": than, "ms": ms[(g, lever)], "against ms": ms[(g, than)],
             "× faster": ms[(g, than)] / ms[(g, lever)]}
            for g in sorted({g for g, _ in ms.index}) for lever, than in LEVERS
            if (g, lever) in ms.index and (g, than) in ms.index]
    return pd.DataFrame(rows, columns=["gpu", "config", "against", "ms", "against ms", "× faster"])


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


def fast_path_csv(root: Path, gpus: list[str], name: str) -> pd.DataFrame:
    """``<gpu>/fast_path/<name>.csv`` of every GPU that has one (agreement, train_timing…)."""
    return results_csv(root, gpus, f"fast_path/{name}")


def results_csv(root: Path, gpus: list[str], name: str) -> pd.DataFrame:
    """``<gpu>/<name>.csv`` of every GPU that has one, with a ``gpu_slug`` column."""
    frames = [pd.read_csv(root / g / f"{name}.csv").assign(gpu_slug=g) for g in gpus
              if (root / g / f"{name}.csv").exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ---- quality parity (``<gpu>/quality/``, scripts/quality.py) ----------------------------------


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



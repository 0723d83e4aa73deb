"""Plots for the book (matplotlib/seaborn). Measured bars are solid; the paper's reported values
are hatched bars in the same GPU's hue, labelled "(paper)" and with the value as the paper states
it, so the two can never be confused."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from . import paper
from .present import color, colors, gpu_name, table

DIFF_MAX = 0.05  # top of the colour scale of sample difference maps (intensity scale [-1, 1])
PAPER_STYLE = {"hatch": "///", "edgecolor": "0.15", "alpha": 0.5}


def with_paper(measured: pd.DataFrame, paper_rows: pd.DataFrame, x: str, value: str = "value") -> pd.DataFrame:
    """One long table: measured rows labelled '<gpu>' and paper rows labelled '<GPU> (paper)'."""
    m = measured.assign(series=measured["gpu"].map(gpu_name), source="measured")[[x, "series", "source", value]]
    if paper_rows is None or paper_rows.empty:
        return m
    p = paper.as_series(paper_rows).assign(source="paper")[[x, "series", "source", value, "label"]]
    return pd.concat([m, p], ignore_index=True)


def bars(data: pd.DataFrame, x: str, y: str, title: str, ylabel: str, ax=None, order=None, log: bool = False):
    """Grouped bars of ``y`` by ``x`` and ``series``: measured series solid, the paper's ('… (paper)')
    hatched in the same axes, each paper bar labelled with its qualifier and value when ``data`` has
    a ``label`` column (e.g. '~78', '>70'). Missing combinations leave a gap, never a zero bar."""
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    order = list(order) if order is not None else list(dict.fromkeys(data[x]))
    present = sorted(data["series"].unique(), key=lambda s: (paper.is_paper(s), s))
    width = 0.8 / max(len(present), 1)
    handles = []
    for i, series in enumerate(present):
        rows = data[data["series"] == series].drop_duplicates(x).set_index(x)
        xs = [j for j, key in enumerate(order) if key in rows.index and pd.notna(rows.loc[key, y])]
        vals = [rows.loc[order[j], y] for j in xs]
        offset = (i - (len(present) - 1) / 2) * width
        paper_series = paper.is_paper(series)
        style = dict(PAPER_STYLE, facecolor=color(series)) if paper_series else {"color": color(series)}
        drawn = ax.bar([j + offset for j in xs], vals, width, label=series, **style)
        handles.append(drawn)
        if paper_series and "label" in rows:
            for j, v in zip(xs, vals):
                ax.annotate(str(rows.loc[order[j], "label"]), (j + offset, v), ha="center", va="bottom",
                            fontsize=6.5, xytext=(0, 2), textcoords="offset points", rotation=90)
    ax.set_xticks(range(len(order)), [str(o) for o in order])
    ax.set_xlim(-0.6, len(order) - 0.4)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    title_ = "measured GPU / (paper, hatched)" if any(map(paper.is_paper, present)) else "measured GPU"
    ax.legend(handles, present, title=title_, fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def rotate_ticks(ax, rotation: int = 25) -> None:
    """Long category labels under bars, slanted and right-aligned so they stay readable."""
    for label in ax.get_xticklabels():
        label.set(rotation=rotation, ha="right", rotation_mode="anchor")


def rank_marks(ax, order: list[str], ranks: dict[str, int], label: str = "paper's rank") -> None:
    """The paper's ranking (e.g. Fig 5) on a bar chart: '#r' with a star above each ranked
    category, added to the axes' legend."""
    from matplotlib.lines import Line2D

    top = ax.get_ylim()[1]
    ax.set_ylim(top=top * 1.15)  # room above the tallest bar
    for category, rank in ranks.items():
        if category in order:
            j = order.index(category)
            ax.plot(j, top * 1.07, marker="*", color="black", markersize=9)
            ax.annotate(f"#{rank}", (j, top * 1.07), xytext=(7, -3), textcoords="offset points", fontsize=8)
    legend = ax.get_legend()
    handles = list(legend.legend_handles) if legend else []
    labels = [t.get_text() for t in legend.get_texts()] if legend else []
    star = Line2D([], [], marker="*", color="black", linestyle="none", markersize=9)
    ax.legend(handles + [star], labels + [label], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


# The command that measures each kind of result on a GPU (`make gpu-book` runs them all).
RUN = {
    "bench": "make gpu-measure  (medddpm bench + torch-kernels)",
    "ncu": "medddpm profile --mode paper --gpu-label <gpu> --out data/results/<gpu>  (and --mode step)",
    "roofline": "medddpm profile --mode roofline --configs baseline,opt1,fast --gpu-label <gpu> --out data/results/<gpu>",
    "ladder": "scripts/fast_measure.sh data/results/<gpu> env peaks ladder batches agree train kernels",
    "sampling": "scripts/sample_measure.sh data/results/<gpu>",
    "quality": "scripts/quality_measure.sh data/results/<gpu> DEMO WORK env agree parity:baseline:0:keep … sample",
    "loop": "scripts/loop_measure.sh data/results/<gpu>/loop",
    "scaling": "scripts/ddp_scaling.sh data/results/<gpu>-x2 <gpu>-x2 opt1 fast",
    "brats": "scripts/brats_measure.sh data/results/<gpu> WORK env bench sample  (Fig. 1: MAPS=… demo train fig1)",
}


def no_data_text(what: str, run: str | None = None) -> str:
    """One line saying what this results store lacks and, with ``run`` (a ``RUN`` key or a command),
    how to measure it."""
    how = RUN.get(run, run) if run else None
    return f"No data: {what}." + (f" Run: {how}" if how else "")


def show_table(df: pd.DataFrame, what: str, run: str | None, digits: int | dict[str, int] = 2,
               columns: dict[str, str] | None = None) -> None:
    """Display ``df`` as the book's table (``present.table``, columns renamed by ``columns``) or,
    when it is empty, the line saying what the store lacks and how to measure it (``no_data_text``)."""
    from IPython.display import display

    if df.empty:
        print(no_data_text(what, run))
    else:
        display(table(df.rename(columns=columns or {}), digits))


def no_data(what: str, run: str | None = None, figsize=(8, 1.6)):
    """A placeholder figure saying what this results store lacks and the command that measures it,
    so that figure numbers stay the same whatever was measured (a store without ncu reports, say)."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.text(0.5, 0.5, no_data_text(what, run).replace(" Run: ", "\nRun: "), ha="center", va="center", fontsize=10,
            wrap=True)
    ax.set_axis_off()
    return fig


def normalized_bars(norm: pd.DataFrame, ref: pd.DataFrame, order: list[str],
                    metrics: tuple[str, ...] = ("cycles", "instructions", "ipc")):
    """§6.1: one panel per metric, bars per configuration for each GPU · scope of ``norm``
    (``tables.normalized_scopes``) and the paper's ``norm_<metric>`` rows, with a line at 1×."""
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.4 * len(metrics)), squeeze=False)  # one per row
    for ax, metric in zip(axes[:, 0], metrics):
        m = norm[(norm["metric"] == metric) & (norm["config"] != "baseline")]
        meas = m.assign(gpu=m["gpu"] + " · " + m["scope"], value=m["measured"])
        data = with_paper(meas, ref[ref["metric"] == f"norm_{metric}"], "config")
        data["config"] = data["config"].astype(str)
        bars(data, "config", "value", f"{metric} × baseline", "× baseline", ax,
             order=[c for c in order if c in set(data["config"])])
        ax.axhline(1, color="0.3", lw=0.8)
    return fig


def stacked_shares(shares: pd.DataFrame, index: list[str], column: str, title: str, top: int = 8, ax=None,
                   xlabel: str = "share of kernel time (%)"):
    """Stacked 100 % bars: one bar per ``index`` combination, segments = ``column`` (top N + other)."""
    keep = shares.groupby(column)["share"].sum().nlargest(top).index
    s = shares.assign(**{column: shares[column].where(shares[column].isin(keep), "other (rest)")})
    table = s.pivot_table(index=index, columns=column, values="share", aggfunc="sum", observed=True).fillna(0) * 100
    table = table[table.sum().sort_values(ascending=False).index]
    ax = ax or plt.subplots(figsize=(9, 0.45 * len(table) + 1.5))[1]
    table.index = [" / ".join(str(gpu_name(p)) for p in i) if isinstance(i, tuple) else str(gpu_name(i))
                   for i in table.index]
    table.plot.barh(stacked=True, ax=ax, width=0.75, color=colors(table.columns))
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, 100)
    ax.set_title(title)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return ax


def unet_diagram(summary: dict, ax=None):
    """Fig 3 drawn from the model: each block a box at its resolution level, encoder left,
    decoder right, labelled with its layers, channels and output size."""
    blocks = summary["blocks"]
    full = summary["input_shape"][2]
    ax = ax or plt.subplots(figsize=(14, 6))[1]
    colors = {"Stem": "#cfe8ff", "ResBlock": "#ffe3b3", "Attention": "#ffc2c2", "Downsample": "#d5f5d5",
              "Upsample": "#d5f5d5", "Sequential": "#e0e0e0"}
    for i, b in enumerate(blocks):
        spatial = b["out_shape"][2]
        level = int(round(math.log2(full / spatial)))
        kinds = b["layers"].split("+")
        color = colors["Attention"] if "Attention" in kinds else colors.get(kinds[0], "#eeeeee")
        ax.add_patch(plt.Rectangle((i - 0.45, -level - 0.4), 0.9, 0.8, facecolor=color, edgecolor="0.3"))
        name = "out" if b["block"] == "out" else "\n".join(k[:4] for k in kinds)
        ax.text(i, -level + 0.12, name, ha="center", va="center", fontsize=6.5)
        ax.text(i, -level - 0.25, f"{b['channels']}ch\n{spatial}³", ha="center", va="center", fontsize=6)
    ax.set_xlim(-1, len(blocks))
    levels = int(round(math.log2(full / min(b["out_shape"][2] for b in blocks))))
    ax.set_ylim(-levels - 0.8, 0.8)
    ax.set_yticks([-l for l in range(levels + 1)], [f"{full // 2 ** l}³" for l in range(levels + 1)])
    ax.set_xticks([])
    ax.set_ylabel("feature-map size")
    ax.set_title(f"Med-DDPM U-Net ({summary['model']}): {summary['parameters']:,} parameters, "
                 f"{summary['forward_flops'] / 1e12:.2f} TFLOP per forward at {summary['input_shape']}")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="0.3") for c in
               (colors["Stem"], colors["ResBlock"], colors["Attention"], colors["Downsample"], colors["Sequential"])]
    ax.legend(handles, ["input conv", "ResBlock", "with attention", "down/upsample", "output"],
              loc="lower right", fontsize=7)
    return ax


def finish(fig=None) -> None:
    """Lay the figure out (unless it carries its own layout engine) and show it."""
    fig = fig or plt.gcf()
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    plt.show()



def ladder(lad: pd.DataFrame, ax=None):
    """Issue 9's waterfall: ms/step per rung, one bar per GPU, each labelled with its speed-up over
    the rung before and over baseline (log scale: baseline is ~20× the fastest rung)."""
    ax = ax or plt.subplots(figsize=(10, 4.5))[1]
    from ..core.config import LADDER

    order = [c for c in LADDER if c in set(lad["config"])]  # rung order, whichever GPU lacks a rung
    lad = lad.assign(gpu=lad["gpu_slug"].map(gpu_name))
    hue_order = [gpu_name(g) for g in sorted(lad["gpu_slug"].unique())]
    sns.barplot(data=lad, x="config", y="step_ms_median", hue="gpu", hue_order=hue_order, order=order, ax=ax,
                errorbar=None, palette={g: color(g) for g in hue_order})
    for container, (_, d) in zip(ax.containers, lad.groupby("gpu_slug", sort=True)):
        d = d.set_index("config")
        labels = []
        for bar in container:  # a GPU without some rung has fewer bars: find each bar's rung by position
            cfg = order[round(bar.get_x() + bar.get_width() / 2)]
            if cfg not in d.index or math.isnan(bar.get_height()):
                labels.append("")
                continue
            r = d.loc[cfg]
            prev = "" if math.isnan(r["speedup_vs_previous"]) else f"×{r['speedup_vs_previous']:.2f}\n"
            labels.append(f"{prev}({r['speedup_vs_baseline']:.1f}×)")
        ax.bar_label(container, labels=labels, fontsize=6, padding=2)
    ax.set_yscale("log")
    ax.set_ylabel("ms per training step (log)")
    ax.set_xlabel("rung (each adds one thing to the one before)")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(title="measured GPU", fontsize=7, title_fontsize=7)
    return ax


def sampling(sb: pd.DataFrame, targets: dict[str, float] | None = None):
    """Seconds per sampled 128³ volume, one panel per GPU: bars per configuration and sampler (log
    scale), each labelled with its value; dashed lines at the targets (sampler → seconds)."""
    gpus_ = sorted(sb["gpu_slug"].unique())
    fig, axes = plt.subplots(len(gpus_), 1, figsize=(8, 3.6 * len(gpus_)), squeeze=False)
    for ax, g in zip(axes[:, 0], gpus_):
        d = sb[sb["gpu_slug"] == g].assign(run=lambda x: x["sampler"].str.upper() + " " + x["steps"].astype(str) + " steps")
        order = [c for c in d["config"].cat.categories if c in set(d["config"])] if hasattr(d["config"], "cat") else None
        runs = sorted(d["run"].unique())
        sns.barplot(data=d, x="config", y="s_per_volume_median", hue="run", hue_order=runs, order=order, ax=ax,
                    errorbar=None, palette=dict(zip(runs, ["#0072B2", "#E69F00", "#009E73", "#CC79A7"])))
        for container in ax.containers:
            ax.bar_label(container, fmt="%.2f s", fontsize=7, padding=2)
        for sampler, seconds in (targets or {}).items():
            ax.axhline(seconds, ls="--", lw=0.8, color="0.3")
            ax.text(ax.get_xlim()[1], seconds, f" target {sampler.upper()}: {seconds:g} s", va="center", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("seconds per volume")
        ax.set_xlabel("configuration of the denoiser")
        ax.set_title(f"{gpu_name(g)}: sampling one whole-head 128³ volume")
        ax.legend(title="sampler", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def scaling(sc: pd.DataFrame):
    """Training throughput (volumes/s) per configuration and grad-accum on 1 and N GPUs, each bar
    labelled with its step time and the scaling efficiency T(1)/T(N)."""
    fig, ax = plt.subplots(figsize=(10, 4.2))
    accum = sc["grad_accum"] if "grad_accum" in sc else pd.Series(1, index=sc.index)
    d = sc.assign(gpus=sc["world_size"].astype(str) + " GPU" + sc["world_size"].map(lambda n: "s" if n > 1 else ""),
                  setup=(sc["machine"] + "\n" if "machine" in sc and sc["machine"].nunique() > 1 else "")
                  + sc["config"] + "\ngrad-accum " + accum.astype(str))
    hue = sorted(d["gpus"].unique())
    sns.barplot(data=d, x="setup", y="volumes_per_s", hue="gpus", hue_order=hue, ax=ax, errorbar=None,
                palette=dict(zip(hue, ["#56B4E9", "#0072B2", "#009E73"])))
    for container, h in zip(ax.containers, hue):
        rows = d[d["gpus"] == h].set_index("setup")
        labels = []
        for bar in container:
            cfg = ax.get_xticklabels()[round(bar.get_x() + bar.get_width() / 2)].get_text()
            r = rows.loc[cfg] if cfg in rows.index else None
            labels.append("" if r is None else f"{r['step_ms_median']:.0f} ms/step\n{100 * r['scaling_efficiency']:.1f} %")
        ax.bar_label(container, labels=labels, fontsize=7, padding=2)
    ax.set_ylabel("volumes per second (global)")
    ax.set_xlabel("configuration, micro-batches per step")
    ax.tick_params(axis="x", labelsize=7)
    ax.margins(y=0.25)
    ax.legend(title="world size", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def parity(curves: pd.DataFrame, verdict: pd.DataFrame, gpu: str):
    """Training parity on one GPU: (top) held-out loss against optimizer steps per configuration,
    baseline seeds dashed; (bottom) the loss after training per configuration and seed, with the
    baseline seeds' 95 % prediction band shaded."""
    c, v = curves[curves["gpu_slug"] == gpu], verdict[verdict["gpu_slug"] == gpu]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5))
    for (cfg, seed), d in c.groupby(["config", "seed"], sort=False, observed=True):
        top.plot(d["step"], d["loss"], color=color(cfg), lw=1.2, ls="--" if cfg == "baseline" and seed else "-",
                 label=f"{cfg} (seed {seed})")
    top.set_xlabel("optimizer step")
    top.set_ylabel("held-out L1 loss on ε")
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    band = v.iloc[0]
    bottom.axhspan(band["band_low"], band["band_high"], color="0.85", label="baseline 95 % prediction band")
    labels = [f"{r.config}\nseed {r.seed}" for r in v.itertuples()]
    bottom.scatter(range(len(v)), v["loss"], c=[color(x) for x in v["config"]], s=40, zorder=3)
    bottom.set_xticks(range(len(v)), labels, fontsize=7)
    bottom.set_ylabel(f"held-out loss after {int(band['steps'])} steps")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def heldout_curve(curve: pd.DataFrame, best_step: int | None = None, sampled_step: int | None = None):
    """The held-out loss of a training run against its optimizer steps (``quality_tables.heldout_curve``),
    the model's and the EMA's weights, on a log scale; its lowest point (EMA) and the step of the
    checkpoint that was sampled marked."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for weights, style in (("model", ":"), ("ema", "-")):
        if weights in curve:
            ax.plot(curve["step"], curve[weights], ls=style, marker=".", lw=1.2, label=f"{weights} weights")
    if best_step is not None:
        ax.axvline(best_step, color="0.4", lw=0.8, ls="--", label=f"lowest (EMA), step {best_step:,}")
    if sampled_step is not None and sampled_step != best_step:
        ax.axvline(sampled_step, color="tab:red", lw=0.8, label=f"sampled checkpoint, step {sampled_step:,}")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out L1 loss on ε")
    ax.legend(fontsize=7)
    return fig


def histograms(h: pd.DataFrame, sources: list[str], subject: str, ax=None):
    """Intensity density inside the brain of one held-out subject, one step line per source."""
    ax = ax or plt.subplots(figsize=(8, 3.5))[1]
    for s in sources:
        d = h[(h["source"] == s) & (h["subject"] == subject)]
        ax.step(d["bin_low"], d["density"], where="post", color=color(s), lw=1.2, label=s)
    ax.set_xlabel("intensity (model scale, [−1, 1])")
    ax.set_ylabel("density inside the brain")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def slices(sl: pd.DataFrame, subjects: list[str], sources: dict[str, str], diff_to: str | None = None,
           mask_max: int = 2):
    """Orthogonal slices (rows: subject × view; columns: ``sources``, name → column title) in RAS,
    neurological display (the slice's first axis to the right, its second up); with ``diff_to``, every source but
    that one and the mask is shown as its absolute difference to it (0 to ``DIFF_MAX``). The mask's
    labels are coloured from 0 to ``mask_max`` (whole-head: 2 = lesion; BraTS: 5 = healthy brain)."""
    from ..sample.quality import VIEWS, slice_image

    rows = [(s, v) for s in subjects for v in VIEWS]
    fig, axes = plt.subplots(len(rows), len(sources), figsize=(1.7 * len(sources), 1.7 * len(rows)), squeeze=False)
    for i, (subject, view) in enumerate(rows):
        ref = slice_image(sl, diff_to, subject, view) if diff_to else None
        for j, (src, title) in enumerate(sources.items()):
            ax = axes[i, j]
            img = slice_image(sl, src, subject, view)
            if src == "mask":
                ax.imshow(img.T, origin="lower", cmap="viridis", vmin=0, vmax=mask_max, interpolation="nearest")
            elif ref is not None and src != diff_to:
                ax.imshow(abs(img - ref).T, origin="lower", cmap="magma", vmin=0, vmax=DIFF_MAX)
            else:
                ax.imshow(img.T, origin="lower", cmap="gray", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(title, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{subject}\n{view}", fontsize=7)
    return fig


ROOF_STYLES = {"bf16 tensor": "-", "TF32 tensor": "--", "FP32": ":"}


def roofline_figure(points: pd.DataFrame, roofs: pd.DataFrame, configs: list[str], what: str, run: str):
    """``roofline`` of the reports, or the no-data figure (``what`` is missing, ``run`` measures it)
    where the reports or the GPU's roofs are missing."""
    return no_data(what, run) if points.empty or roofs.empty else roofline(points, roofs, configs)


def roofline(points: pd.DataFrame, roofs: pd.DataFrame, configs: list[str]):
    """One log-log panel per configuration (rows) and GPU (columns): every kernel with counted FLOPs
    at (FLOP per DRAM byte, achieved TFLOP/s), its area its share of the report's kernel time and its
    colour its category; lines: the GPU's measured roofs, min(ceiling, bandwidth × intensity)."""
    gpus = sorted(points["gpu_slug"].unique())
    configs = [c for c in configs if c in set(points["config"].astype(str))]
    fig, axes = plt.subplots(len(configs), len(gpus), figsize=(5.2 * len(gpus), 3.9 * len(configs)),
                             squeeze=False, sharex=True, sharey=True)
    intensity = np.logspace(-2, 4, 200)
    shown = {}
    for row, c in zip(axes, configs):
        for ax, g in zip(row, gpus):
            d = points[(points["gpu_slug"] == g) & (points["config"].astype(str) == c)]
            drawn = d[(d["flops"] > 0) & d["intensity"].notna()]
            for cat, part in drawn.groupby("category"):
                shown[cat] = ax.scatter(part["intensity"], part["tflops"], s=5 + 1500 * part["share"], color=color(cat),
                                        alpha=0.7, edgecolor="0.2", linewidth=0.3)
            for _, r in roofs[roofs["gpu_slug"] == g].iterrows():
                ax.plot(intensity, np.minimum(r["tflops"], r["dram_tbps"] * intensity), color="0.25", lw=0.9,
                        ls=ROOF_STYLES.get(r["ceiling"], "-"))
                ax.annotate(f"{r['ceiling']} {r['tflops']:.0f}", (intensity[-1], r["tflops"]), ha="right", va="bottom",
                            fontsize=6.5)
            bw = roofs.loc[roofs["gpu_slug"] == g, "dram_tbps"]
            no_flops = d.loc[d["flops"] <= 0, "share"].sum()
            ax.set_title(f"{gpu_name(g)} · {c}\n(no FLOPs counted: {100 * no_flops:.0f} % of the time"
                         + (f"; DRAM {bw.iloc[0]:.2f} TB/s)" if len(bw) else ")"), fontsize=8.5)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(1e-3, 2e3)
            ax.grid(True, which="major", lw=0.3, color="0.85")
    for ax in axes[-1]:
        ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    for ax in axes[:, 0]:
        ax.set_ylabel("achieved TFLOP/s")
    handles = [plt.Line2D([], [], marker="o", ls="none", color=color(cat)) for cat in shown]
    fig.legend(handles, list(shown), loc="upper center", ncol=min(len(shown), 5), fontsize=7.5,
               bbox_to_anchor=(0.5, 1.0), title="kernel category (area: share of kernel time)", title_fontsize=7.5)
    legend_in = 0.25 + 0.16 * -(-len(shown) // 5)  # title + rows of five entries, in inches
    fig.set_layout_engine("tight", rect=(0, 0, 1, 1 - legend_in / fig.get_figheight()))  # room for the legend
    return fig


def paper_metrics(summaries: pd.DataFrame, metrics: list[str], figure: str, title: str, ylabel: str):
    """One of the paper's Figs. 10–13 measured: a panel per metric of ``summaries`` (ncu, paper mode) per GPU and
    configuration beside the paper's values (hatched); shown, then its numbers returned, ours and the paper's per GPU
    × configuration, for a cell of their own (``show_table``; empty where the store has no such report)."""
    from .tables import CONFIG_ORDER, metric_vs_paper

    t = metric_vs_paper(summaries, metrics, figure)
    if t.empty:
        finish(no_data("ncu reports in paper mode", "ncu"))
        return t
    meas = t.rename(columns={"measured": "value"})[["gpu", "config", "metric", "value"]]
    ref = paper.values(figure=figure, metric=metrics)
    ref = ref[ref["config"].isin(meas["config"].unique())]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.2 * len(metrics)), squeeze=False)  # one panel per row
    for ax, m in zip(axes[:, 0], metrics):
        data = with_paper(meas[meas["metric"] == m], ref[ref["metric"] == m], "config")
        bars(data, "config", "value", m, ylabel, ax, order=[c for c in CONFIG_ORDER if c in set(data["config"])])
    fig.suptitle(title)
    finish(fig)
    return t.pivot_table(index=["gpu", "config"], columns="metric", values=["measured", "paper"]).reset_index()

"""Plots for the book (matplotlib/seaborn). Measured bars are solid; the paper's reported values
are hatched grey bars labelled "(paper)", so the two can never be confused."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

PAPER_STYLE = {"hatch": "///", "edgecolor": "0.15", "alpha": 0.5}


def with_paper(measured: pd.DataFrame, paper_rows: pd.DataFrame, x: str, value: str = "value") -> pd.DataFrame:
    """One long table: measured rows labelled '<gpu>' and paper rows labelled '<GPU> (paper)'."""
    m = measured.assign(series=measured["gpu"], source="measured")[[x, "series", "source", value]]
    if paper_rows is None or paper_rows.empty:
        return m
    p = paper_rows.assign(series=paper_rows["gpu"] + " (paper)", source="paper")[[x, "series", "source", value]]
    return pd.concat([m, p], ignore_index=True)


def bars(data: pd.DataFrame, x: str, y: str, title: str, ylabel: str, ax=None, order=None, log: bool = False):
    """Grouped bars of ``y`` by ``x`` and ``series``; series from the paper drawn hatched."""
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    hue_order = sorted(data["series"].unique(), key=lambda s: (s.endswith("(paper)"), s))
    sns.barplot(data=data, x=x, y=y, hue="series", hue_order=hue_order, order=order, ax=ax, errorbar=None)
    present = [s for s in hue_order if s in set(data["series"])]
    for container, series in zip(ax.containers, present):
        if series.endswith("(paper)"):
            for bar in container:
                bar.set(**PAPER_STYLE)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    # legend from the styled bars themselves, so paper entries show their hatching
    title_ = "measured GPU / (paper)" if any(p.endswith("(paper)") for p in present) else "measured GPU"
    ax.legend([c.patches[0] for c in ax.containers], present, title=title_, fontsize=7, title_fontsize=7)
    return ax


def normalized_bars(norm: pd.DataFrame, ref: pd.DataFrame, order: list[str],
                    metrics: tuple[str, ...] = ("cycles", "instructions", "ipc")):
    """§6.1: one panel per metric, bars per configuration for each GPU · scope of ``norm``
    (``tables.normalized_scopes``) and the paper's ``norm_<metric>`` rows, with a line at 1×."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        m = norm[(norm["metric"] == metric) & (norm["config"] != "baseline")]
        meas = m.assign(gpu=m["gpu"] + " · " + m["scope"], value=m["measured"])
        data = with_paper(meas, ref[ref["metric"] == f"norm_{metric}"], "config")
        data["config"] = data["config"].astype(str)
        bars(data, "config", "value", f"{metric} × baseline", "× baseline", ax,
             order=[c for c in order if c in set(data["config"])])
        ax.axhline(1, color="0.3", lw=0.8)
    return fig


def stacked_shares(shares: pd.DataFrame, index: list[str], column: str, title: str, top: int = 8, ax=None):
    """Stacked 100 % bars: one bar per ``index`` combination, segments = ``column`` (top N + other)."""
    keep = shares.groupby(column)["share"].sum().nlargest(top).index
    s = shares.assign(**{column: shares[column].where(shares[column].isin(keep), "other (rest)")})
    table = s.pivot_table(index=index, columns=column, values="share", aggfunc="sum", observed=True).fillna(0) * 100
    table = table[table.sum().sort_values(ascending=False).index]
    ax = ax or plt.subplots(figsize=(9, 0.45 * len(table) + 1.5))[1]
    table.index = [" / ".join(map(str, i)) if isinstance(i, tuple) else str(i) for i in table.index]
    table.plot.barh(stacked=True, ax=ax, width=0.75, colormap="tab20")
    ax.invert_yaxis()
    ax.set_xlabel("share of kernel time (%)")
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
    (fig or plt.gcf()).tight_layout()
    plt.show()



def ladder(lad: pd.DataFrame, ax=None):
    """Issue 9's waterfall: ms/step per rung, one bar per GPU, each labelled with its speed-up over
    the rung before and over baseline (log scale: baseline is ~20× the fastest rung)."""
    ax = ax or plt.subplots(figsize=(10, 4.5))[1]
    from ..config import LADDER

    order = [c for c in LADDER if c in set(lad["config"])]  # rung order, whichever GPU lacks a rung
    sns.barplot(data=lad, x="config", y="step_ms_median", hue="gpu_slug", order=order, ax=ax, errorbar=None)
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

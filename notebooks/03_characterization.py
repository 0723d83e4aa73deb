# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Characterization (Figs. 4–7, Table 2)
#
# The paper characterizes the baseline (FP32) training step from an Nsight Compute report of 100
# kernels: `--launch-skip 10 --launch-count 100` from process start (§3.2). We ran the same options
# (`medddpm profile --mode paper`, plus `--clock-control none`) and read the same quantities from
# the report. Where the paper gives a number in its text it is drawn beside ours, hatched; its
# figures themselves are not in the text, so most bars have no paper counterpart.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: measure this machine's GPU through the package first, then render
size = 128  # volume side when measuring (the paper: 128)
configs = "baseline,opt1,opt2,opt12,pytorch-default"  # configurations to measure

# %% tags=["remove-input"]
from IPython.display import display
import matplotlib.pyplot as plt
import pandas as pd

from medddpm.profiling import metrics as M
from medddpm.profiling import store
from medddpm.report.measure import prepare
from medddpm.report import paper, plots, tables
from medddpm.report.present import colors, gpu_name, table

root, G = prepare(results_dir, gpus, measure, "ncu", size, configs)
K = tables.ncu_kernels(root, G, "paper")
base = K[K["config"] == "baseline"] if not K.empty else K
R = store.load_table("ncu_paper_rules", root, G)
I = store.load_table("ncu_paper_instructions", root, G)

# %% [markdown]
# ## Fig. 4 — IPC stack of the longest kernels
#
# For the five longest kernels of each baseline window: IPC (`sm__inst_executed.avg.per_cycle_active`)
# split by instruction class (`sass__inst_executed_per_opcode_category`), and elapsed cycles
# (`gpc__cycles_elapsed.max`).

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-4", "caption": "The paper's Fig. 4, measured: IPC of the five longest kernels of each baseline window (the paper's 100-kernel window), split by instruction class, one panel per GPU; then the instruction-class shares and the elapsed cycles of the dominant convolution beside the paper's values for V100, A100 and H100 (hatched, labelled as the paper states them, §4.1). Cycles on a log scale."}}
stacks = tables.per_gpu(M.ipc_stack, K, I, top=5)
if stacks.empty:
    fig = plots.no_data("baseline ncu reports in paper mode", "ncu")
else:
    gpus4 = sorted(stacks["gpu"].unique())
    fig, axes = plt.subplots(len(gpus4) + 2, 1, figsize=(9, 3.4 * (len(gpus4) + 2)))
    for ax, (g, stack) in zip(axes, stacks.groupby("gpu")):
        wide = stack.pivot_table(index=["abbr", "id"], columns="class", values="ipc_part", aggfunc="sum").fillna(0)
        wide.index = [f"{a} (ID {i})" for a, i in wide.index]
        wide.plot.bar(stacked=True, ax=ax, color=colors(wide.columns), rot=0)
        ax.set_ylabel("IPC (instructions / active cycle / SM)")
        ax.set_title(f"IPC stack of the five longest kernels, baseline, {gpu_name(g)}")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    shares4 = tables.instruction_shares_vs_paper(K, I, ["Fig 4"])
    plots.bars(shares4, "x", "value", "Instruction classes of the dominant convolution, baseline",
               "share of instructions (%)", axes[-2])
    plots.rotate_ticks(axes[-2])
    plots.bars(tables.dominant_cycles_vs_paper(K), "x", "value", "Elapsed cycles of the dominant convolution, baseline",
               "cycles (gpc__cycles_elapsed.max)", axes[-1], log=True)
plots.finish(fig)

# %% [markdown]
# The paper reports cycles of the *dominant* convolution on each GPU (the last panel, beside ours) — a
# kernel whose 128³ FP32 launches last tens of milliseconds. Our longest window kernels are of the
# same family (`sm80_xmma_fprop_implicit_gemm…`, KN1); their cycles and IPC are listed below.

# %% tags=["hide-input"]
if base.empty:
    print(plots.no_data_text("baseline ncu reports in paper mode", "ncu"))
else:
    longest = base.sort_values("duration_ns", ascending=False).groupby("gpu_slug").head(3)
    display(table(longest[["gpu_slug", "abbr", "short_name", "duration_ns", "cycles", "instructions", "ipc"]]))

# %% [markdown]
# ## Fig. 5 — priority scores
#
# Priority = kernel duration × estimated speedup (Eq. 1), the estimate clamped to [0, 1]. Nsight
# Compute attaches several rule estimates to one kernel; they overlap, so we take the **largest**
# OPT-rule estimate per kernel (not their sum), then sum priorities per category.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-5", "caption": "The paper's Fig. 5, measured: summed priority score (Eq. 1: kernel duration × the largest estimated speedup of its OPT rules) per kernel category over each baseline window (the paper's 100 kernels), per GPU. Stars: the paper's ranking of the categories (§4.1); it gives ranks, not values."}}
prio = tables.per_gpu(M.priority_scores, K, R)
ranks = paper.values(figure="Fig 5").set_index("subject")["value"].astype(int).to_dict()
if prio.empty:
    fig = plots.no_data("baseline ncu reports in paper mode (with rule estimates)", "ncu")
else:
    fig, ax = plt.subplots(figsize=(9, 3.8))
    order5 = prio.groupby("category")["priority"].sum().sort_values(ascending=False).index.tolist()
    plots.bars(prio.assign(series=prio["gpu"].map(gpu_name), ms=prio["priority"] / 1e6), "category", "ms",
               "Summed priority score per category, baseline", "priority (ms of estimated savings)", ax, order=order5)
    plots.rotate_ticks(ax)
    plots.rank_marks(ax, order5, ranks)
plots.finish(fig)

# %% [markdown]
# The paper ranks normalization first, then tensor-core GEMMs, then elementwise kernels (the marks on the bars); the
# bars stand in the order of our summed scores over every baseline window.
#
# ## Fig. 6 — kernel mix
#
# Share of kernel time by category, for the paper's 100-kernel window (ncu) and for a whole
# steady-state step (every kernel, from torch.profiler; see the end-to-end chapter for how little
# of a step the window is).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-6", "caption": "The paper's Fig. 6, measured: share of kernel time per category in the baseline, for the paper's 100-kernel window (ncu) and for every kernel of a whole steady-state step (torch.profiler), per GPU. Below: the share of the dominant convolution kernel in the window beside the paper's (hatched; §4.2: V100 ~80 %, A100 ~90 %, H100 ~78 %, each its own GPU's kernel)."}}
T = tables.torch_kernels(root, G, "step")
parts = []
if not base.empty:
    parts.append(M.kernel_mix(base, "category", "duration_ns", ["gpu_slug"]).assign(scope="ncu window"))
if not T.empty:
    tb = T[T["config"] == "baseline"]
    parts.append(M.kernel_mix(tb, "category", "duration_us", ["gpu_slug"]).assign(scope="whole step"))
if parts:
    mix6 = pd.concat(parts, ignore_index=True)
    rows6 = mix6.groupby(["gpu_slug", "scope"]).ngroups
    if base.empty:  # no ncu window: the whole-step mix alone
        fig, ax = plt.subplots(figsize=(10, 0.45 * rows6 + 1.5))
    else:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 0.45 * rows6 + 6.2),
                                      gridspec_kw={"height_ratios": [0.45 * rows6 + 1, 3]})
        plots.bars(tables.kernel_shares_vs_paper(base, "Fig 6", "duration_ns"), "x", "value",
                   "Share of the dominant convolution kernel, baseline window", "share of kernel time (%)", ax2)
        plots.rotate_ticks(ax2, 10)
    plots.stacked_shares(mix6, ["gpu_slug", "scope"], "category", "Kernel mix, baseline", ax=ax)
else:
    fig = plots.no_data("baseline kernel tables (ncu or torch.profiler)", "bench")
plots.finish(fig)

# %% [markdown]
# ## Fig. 7 — instruction mix of the dominant kernel

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-7", "caption": "The paper's Fig. 7, measured: instruction classes (sass__inst_executed_per_opcode_category) of the longest convolution in each baseline window (the paper's 100 kernels), per GPU, beside the paper's floating-point shares (hatched; §4.3: V100 > 50 %, H100 > 70 %)."}}
if not (K.empty or I.empty):
    fig, ax = plt.subplots(figsize=(9, 3.8))
    plots.bars(tables.instruction_shares_vs_paper(K, I, ["Fig 7"], by_config=False), "x", "value",
               "Instruction classes of the dominant convolution, baseline", "share of instructions (%)", ax)
    plots.rotate_ticks(ax)
else:
    fig = plots.no_data("instruction classes of baseline ncu reports in paper mode", "ncu")
plots.finish(fig)

# %% [markdown]
# ## Table 2 — kernel abbreviations
#
# The paper's eight abbreviations, matched against the kernels of our baseline windows; kernels it
# did not name get a stable `KX-xxxx` tag (a hash of the kernel's function name).

# %% tags=["hide-input"]
if base.empty:
    print(plots.no_data_text("baseline ncu reports in paper mode", "ncu"))
else:
    display(table(tables.abbreviations(base)))

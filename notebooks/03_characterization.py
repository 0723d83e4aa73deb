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
import matplotlib.pyplot as plt
import pandas as pd

from medddpm.profiling import metrics as M
from medddpm.profiling import store
from medddpm.report.measure import prepare
from medddpm.report import paper, plots, tables
from medddpm.report.notebook import glue
from medddpm.report.present import gpu_name, table

root, G = prepare(results_dir, gpus, measure, "ncu", size, "baseline")
K = tables.ncu_kernels(root, G, "paper")
base = K[K["config"] == "baseline"] if not K.empty else K
R = store.load_table("ncu_paper_rules", root, G)
I = store.load_table("ncu_paper_instructions", root, G)
have = sorted(base["gpu_slug"].unique()) if not base.empty else []
glue("ncu_gpus", ", ".join(gpu_name(g) for g in have) if have else "none")

# %% [markdown]
# Baseline ncu reports in paper mode exist for: {glue:text}`ncu_gpus`.
#
# ## Fig. 4 — IPC stack of the longest kernels
#
# For the five longest kernels of each baseline window: IPC (`sm__inst_executed.avg.per_cycle_active`)
# split by instruction class (`sass__inst_executed_per_opcode_category`), and elapsed cycles
# (`gpc__cycles_elapsed.max`).

# %% tags=["hide-input"]
stacks = tables.per_gpu(M.ipc_stack, K, I, top=5)
for g, stack in (stacks.groupby("gpu") if not stacks.empty else []):
    wide = stack.pivot_table(index=["abbr", "id"], columns="class", values="ipc_part", aggfunc="sum").fillna(0)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    wide.plot.bar(stacked=True, ax=ax, colormap="tab10")
    ax.set_ylabel("IPC (instructions / active cycle / SM)")
    ax.set_xlabel("kernel (abbreviation, report ID)")
    ax.set_title(f"Fig. 4 — IPC stack, baseline, {g} (measured)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    plots.finish(fig)
    top = stack.drop_duplicates("id").nlargest(1, "duration_ns").iloc[0]
    glue(f"{g}_top_cycles", f"{top['cycles']:.3g}")
    glue(f"{g}_top_ipc", f"{top['ipc']:.2f}")

# %% tags=["hide-input"]
fig4 = paper.values(figure="Fig 4")
h100_cycles = fig4[(fig4["gpu"] == "H100") & (fig4["metric"] == "cycles")]["value"].iloc[0]
glue("paper_h100_dominant_cycles", f"{h100_cycles:.2g} cycles")
table(fig4[["gpu", "subject", "metric", "qualifier", "value", "source"]])

# %% [markdown]
# The paper reports cycles of the *dominant* convolution on each GPU (H100: ~{glue:text}`paper_h100_dominant_cycles`) — a
# kernel whose 128³ FP32 launches last tens of milliseconds. Our longest window kernels are of the
# same family (`sm80_xmma_fprop_implicit_gemm…`, KN1); their cycles and IPC are listed below.

# %% tags=["hide-input"]
longest = base.sort_values("duration_ns", ascending=False).groupby("gpu_slug").head(3)
table(longest[["gpu_slug", "abbr", "short_name", "duration_ns", "cycles", "instructions", "ipc"]])

# %% [markdown]
# ## Fig. 5 — priority scores
#
# Priority = kernel duration × estimated speedup (Eq. 1), the estimate clamped to [0, 1]. Nsight
# Compute attaches several rule estimates to one kernel; they overlap, so we take the **largest**
# OPT-rule estimate per kernel (not their sum), then sum priorities per category.

# %% tags=["hide-input"]
prio = tables.per_gpu(M.priority_scores, K, R)
if not prio.empty:
    fig, ax = plt.subplots(figsize=(9, 3.5))
    plots.bars(prio.assign(series=prio["gpu"], ms=prio["priority"] / 1e6), "category", "ms",
               "Fig. 5 — summed priority score per category, baseline (measured)", "priority (ms of estimated savings)", ax)
    ax.tick_params(axis="x", rotation=20)
    plots.finish(fig)
    order = prio.groupby("category")["priority"].sum().sort_values(ascending=False).index.tolist()
    glue("prio_order", " > ".join(order[:3]))
table(paper.values(figure="Fig 5")[["subject", "metric", "value", "source"]])

# %% [markdown]
# The paper ranks normalization first, then tensor-core GEMMs, then elementwise kernels; in our
# baseline windows the order is {glue:text}`prio_order`.
#
# ## Fig. 6 — kernel mix
#
# Share of kernel time by category, for the paper's 100-kernel window (ncu) and for a whole
# steady-state step (every kernel, from torch.profiler; see the end-to-end chapter for how little
# of a step the window is).

# %% tags=["hide-input"]
T = tables.torch_kernels(root, G, "step")
parts = []
if not base.empty:
    parts.append(M.kernel_mix(base, "category", "duration_ns", ["gpu_slug"]).assign(scope="ncu window"))
if not T.empty:
    tb = T[T["config"] == "baseline"]
    parts.append(M.kernel_mix(tb, "category", "duration_us", ["gpu_slug"]).assign(scope="whole step"))
mix6 = pd.concat(parts, ignore_index=True)
fig, ax = plt.subplots(figsize=(10, 3.2))
plots.stacked_shares(mix6, ["gpu_slug", "scope"], "category", "Fig. 6 — kernel mix, baseline (measured)", ax=ax)
plots.finish(fig)

# %% tags=["hide-input"]
dom = (M.kernel_mix(base, "short_name", "duration_ns", ["gpu_slug"]).groupby("gpu_slug").head(1)
       if not base.empty else pd.DataFrame())
for _, r in dom.iterrows():
    glue(f"{r['gpu_slug']}_dominant_share", f"{100 * r['share']:.0f} %")
dom.assign(kernel=dom.get("short_name", pd.Series(dtype=str)).str[:60])[["gpu_slug", "kernel", "share"]] if not dom.empty else dom

# %% tags=["hide-input"]
table(paper.values(figure="Fig 6")[["gpu", "subject", "qualifier", "value", "source"]])

# %% [markdown]
# ## Fig. 7 — instruction mix of the dominant kernel

# %% tags=["hide-input"]
imix = tables.per_gpu(M.dominant_instruction_mix, K, I)
if not imix.empty:
    fig, ax = plt.subplots(figsize=(9, 3.5))
    plots.bars(imix.assign(series=imix["gpu"], pct=100 * imix["share"]), "class", "pct",
               "Fig. 7 — instruction classes of the dominant convolution, baseline (measured)", "share of instructions (%)", ax)
    ax.tick_params(axis="x", rotation=30)
    plots.finish(fig)
table(paper.values(figure="Fig 7")[["gpu", "subject", "metric", "qualifier", "value", "source"]])

# %% [markdown]
# ## Table 2 — kernel abbreviations
#
# The paper's eight abbreviations, matched against the kernels of our baseline windows; kernels it
# did not name get a stable `KX-xxxx` tag (a hash of the kernel's function name).

# %% tags=["hide-input"]
table(tables.abbreviations(base))
